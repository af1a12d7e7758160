"""The whole experiment path on the fake vLLM in seconds (see :mod:`tests.experiment.fast_e2e`):
a SIGKILL of the fake's VLLM::Worker under real locust load must pass, and known defects
(output that changes, a server that never comes back) must fail with the right check."""

from __future__ import annotations

import json

import pytest

from tests.asserts import assert_failed
from tests.experiment.fast_e2e import run_fast
from tests.procs import leaked_since, sut_pids

pytestmark = pytest.mark.timeout(180)


def by_name(report: dict) -> dict:
    return {c["name"]: c for c in report["checks"]}


@pytest.mark.nightly   # make test runs the same experiment on the real stack (tests/experiment/test_run_e2e.py)
def test_kill_the_worker_passes_end_to_end(tmp_path):
    before = sut_pids()
    code, rep, seconds, out = run_fast(tmp_path)
    print(f"fast end-to-end run: {seconds:.1f} s, verdict {rep['verdict']}")
    failed = [c for c in rep["checks"] if not c["passed"]]
    assert code == 0 and rep["verdict"] == "pass", (rep["errors"], failed)
    assert rep["stack"]["launcher"] == "fake"
    (fault,) = rep["faults"]
    assert fault["kind"] == "process-kill" and fault["acted"] and fault["target"] == "spec/worker"
    assert rep["restarts"] == 1
    assert set(rep["phases"]) == {"baseline", "fault", "recovery", "after"}
    assert rep["integrity"]["compared"] >= 10 and rep["integrity"]["mismatched"] == 0
    assert rep["recovery"]["time_to_slo_s"] is not None
    assert rep["fail_fast"]["in_flight"] >= 1
    names = by_name(rep)
    assert {"steady_state.before.health-is-200", "steady_state.after.current-phase-within-slo",
            "integrity.mismatched", "recovery.time_to_healthy_s", "fail_fast.hung"} <= set(names)
    for f in ("report.json", "journal.json", "records.jsonl", "reference.jsonl", "timeline.jsonl", "ledger.jsonl",
              "run.json", "config.json", "experiment.json", "prompts.json", "metrics.jsonl", "timeline.png",
              "specchaos.prom"):   # harness.report.prometheus
        assert (out / f).is_file(), f
    assert len(list((out / "allure-results").glob("*-result.json"))) == 1   # harness.report.allure
    assert json.loads((out / "report.json").read_text())["verdict"] == "pass"
    assert not leaked_since(before, wait_s=10)


def test_output_that_changes_under_speculation_fails_on_integrity(tmp_path):
    code, rep, _, _ = run_fast(tmp_path, stack={"launcher": "fake-mismatch"})
    assert code == 1 and rep["verdict"] == "fail", rep["errors"]
    c = by_name(rep)["integrity.mismatched"]
    assert c["passed"] is False and c["observed"] >= 1
    assert "token 2" in rep["integrity"]["first_divergence"]


def test_a_server_that_never_comes_back_fails_on_recovery(tmp_path):
    # No restart allowed: the killed server stays down. The kill acted (its worker is
    # gone); the system under test failed to recover: exit 1 (fail), not 2 (error).
    code, rep, _, _ = run_fast(tmp_path, stack={"restart": {"max_restarts": 0}},
                               phases={"fault_timeout_s": 5, "recovery_timeout_s": 3, "after_s": 2})
    assert code == 1 and rep["verdict"] == "fail", rep["errors"]
    names = by_name(rep)
    assert names[f"fault.{rep['faults'][0]['fault_id']}.acted"]["passed"]
    assert_failed(names["recovery.time_to_healthy_s"])
    assert rep["recovery"]["time_to_first_success_s"] is None

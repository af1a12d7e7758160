"""The strict verdict over a Chaos Toolkit journal: any steady-state probe out of
tolerance, before or after the method, fails the run (pure logic, no server)."""

from __future__ import annotations

import copy

from harness.experiment.runner import EXIT_CODES, apply_strict_verdict, strict_checks
from harness.report.judge import NO_FAULT_ERROR


def probe(name: str, output, tolerance, met: bool, status: str = "succeeded") -> dict:
    return {"activity": {"name": name, "tolerance": tolerance}, "output": output,
            "tolerance_met": met, "status": status}


def journal(before: list[dict] | None, after: list[dict] | None, deviated: bool = False) -> dict:
    ss = {}
    for when, probes in (("before", before), ("after", after)):
        if probes is not None:
            ss[when] = {"steady_state_met": all(p["tolerance_met"] for p in probes), "probes": probes}
    return {"status": "completed", "deviated": deviated, "steady_states": ss, "run": [], "rollbacks": []}


GOOD = [probe("health-is-200", 200, 200, True), probe("a-real-generation-completes", True, True, True)]
PASSING_REPORT = {
    "verdict": "pass", "errors": [], "interrupted": False,
    "faults": [{"fault_id": "f1", "kind": "process-kill", "target": "spec/worker", "acted": True}],
    "checks": [{"name": "slo.after.ttft_p95_s", "category": "slo", "passed": True, "observed": 0.1, "limit": 3.0,
                "detail": ""}],
}


def test_all_probes_met_keeps_pass():
    rep = apply_strict_verdict(copy.deepcopy(PASSING_REPORT), journal(GOOD, GOOD))
    assert rep["verdict"] == "pass" and EXIT_CODES[rep["verdict"]] == 0
    names = [c["name"] for c in rep["checks"]]
    assert "steady_state.before.health-is-200" in names and "steady_state.after.a-real-generation-completes" in names


def test_missed_after_hypothesis_fails():
    after = [probe("health-is-200", 503, 200, False), GOOD[1]]
    rep = apply_strict_verdict(copy.deepcopy(PASSING_REPORT), journal(GOOD, after, deviated=True))
    assert rep["verdict"] == "fail" and EXIT_CODES["fail"] == 1
    failed = {c["name"]: c for c in rep["checks"] if not c["passed"]}
    assert failed["steady_state.after.health-is-200"]["observed"] == 503
    assert "steady_state.deviated" in failed


def test_missed_before_hypothesis_fails_where_chaos_toolkit_would_pass():
    # Chaos Toolkit skips the method and exits 0 here; the judge saw no fault at all and,
    # told the hypothesis was missed before the method, marked the method skipped.
    before = [GOOD[0], probe("a-real-generation-completes", False, True, False)]
    report = {"verdict": "error", "errors": [], "interrupted": False, "faults": [], "checks": [],
              "method_skipped": "steady-state hypothesis not met before the method"}
    j = journal(before, None)
    j["status"] = "failed"
    rep = apply_strict_verdict(report, j)
    assert rep["verdict"] == "fail"
    assert rep["method_skipped"] and rep["errors"] == []
    assert [c["name"] for c in rep["checks"] if not c["passed"]] == ["steady_state.before.a-real-generation-completes"]


def test_a_probe_that_raised_is_a_failed_check_even_if_its_output_matches():
    raised = [probe("health-is-200", 200, 200, True, status="failed")]
    assert strict_checks(journal(raised, None))[0]["passed"] is False


def test_missed_before_hypothesis_does_not_hide_a_real_run_error():
    before = [probe("health-is-200", 503, 200, False)]
    report = {"verdict": "error", "errors": [NO_FAULT_ERROR, "interrupted by a signal"], "interrupted": True,
              "faults": [], "checks": []}
    assert apply_strict_verdict(report, journal(before, None))["verdict"] == "error"

"""The strict verdict over a Chaos Toolkit journal: any steady-state probe out of
tolerance, before or after the method, fails the run. The steady-state checks are a
check family over the journal (pure logic, no server); the verdict is the judge's."""

from __future__ import annotations

from harness.checks.steady_state import steady_state_checks
from harness.experiment.config import SpecchaosConfig
from harness.experiment.runner import EXIT_CODES
from harness.report.judge import NO_FAULT_ERROR, judge
from harness.checks.run import recorded_run
from tests.factories import make_record, phase_events


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


def names(report: dict, failed_only: bool = False) -> list[str]:
    return [c["name"] for c in report["checks"] if not failed_only or c["passed"] is False]


def test_all_probes_met_adds_passing_checks():
    checks = steady_state_checks(journal(GOOD, GOOD))
    assert all(c.passed for c in checks)
    assert {c.name for c in checks} >= {"steady_state.before.health-is-200",
                                         "steady_state.after.a-real-generation-completes"}


def test_missed_after_hypothesis_fails():
    after = [probe("health-is-200", 503, 200, False), GOOD[1]]
    failed = {c.name: c for c in steady_state_checks(journal(GOOD, after, deviated=True)) if c.passed is False}
    assert failed["steady_state.after.health-is-200"].observed == 503
    assert "steady_state.deviated" in failed


def test_a_probe_that_raised_is_a_failed_check_even_if_its_output_matches():
    raised = [probe("health-is-200", 200, 200, True, status="failed")]
    assert steady_state_checks(journal(raised, None))[0].passed is False


def _no_fault_run(j: dict | None):
    evs = phase_events({"baseline": 1000.0}, 1030.0)
    recs = [make_record(send_time=1000.0 + i, prompt_id=i % 3) for i in range(20)]
    ref = [make_record(prompt_id=p, source="reference") for p in range(3)]
    cfg = SpecchaosConfig(integrity={"min_compared": 1})
    return recorded_run(recs, ref, evs, cfg, journal=j)


def test_missed_before_hypothesis_fails_where_chaos_toolkit_would_pass():
    # Chaos Toolkit skips the method and exits 0 here; the judge sees no fault at all,
    # knows from the journal that the method was skipped, and fails on the missed probe.
    before = [GOOD[0], probe("a-real-generation-completes", False, True, False)]
    j = journal(before, None)
    j["status"] = "failed"
    rep = judge(_no_fault_run(j), {"errors": [], "interrupted": False})
    assert rep["verdict"] == "fail" and EXIT_CODES["fail"] == 1
    assert rep["method_skipped"] and rep["errors"] == []
    assert "steady_state.before.a-real-generation-completes" in names(rep, failed_only=True)
    assert "fault.injected" not in names(rep)


def test_missed_before_hypothesis_does_not_hide_a_real_run_error():
    before = [probe("health-is-200", 503, 200, False)]
    rep = judge(_no_fault_run(journal(before, None)), {"errors": ["interrupted by a signal"], "interrupted": True})
    assert rep["verdict"] == "error"


def test_no_fault_and_no_journal_is_an_error():
    rep = judge(_no_fault_run(None), {"errors": [], "interrupted": False})
    assert rep["verdict"] == "error" and NO_FAULT_ERROR in rep["errors"]
    assert "fault.injected" in names(rep, failed_only=True)

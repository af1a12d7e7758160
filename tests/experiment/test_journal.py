"""Reading the Chaos Toolkit journal: a steady-state probe that raised measured nothing,
so it is a run error (verdict error, exit 2), never a failed hypothesis blamed on the
system under test."""

from harness.checks.run import recorded_run
from harness.experiment.config import SpecchaosConfig
from harness.experiment.journal import journal_errors
from harness.report.judge import judge
from tests.factories import make_record, phase_events

RAISED = {"activity": {"name": "health-is-200", "tolerance": 200}, "status": "failed", "output": None,
          "tolerance_met": False, "exception": ["Traceback ...\n", "KeyError: 'nope'\n"]}


def journal() -> dict:
    return {"status": "failed", "deviated": False, "run": [], "rollbacks": [],
            "steady_states": {"before": {"steady_state_met": False, "probes": [RAISED]}}}


def test_a_probe_that_raised_is_a_run_error():
    assert journal_errors(journal()) == ["steady-state probe (before the method) 'health-is-200': KeyError: 'nope'"]
    run = recorded_run([make_record(send_time=1001.0)], [make_record(source="reference")],
                       phase_events({"baseline": 1000.0}, 1010.0), SpecchaosConfig(integrity={"min_compared": 0}),
                       journal=journal())
    rep = judge(run, {"errors": journal_errors(journal()), "interrupted": False})
    assert rep["verdict"] == "error"

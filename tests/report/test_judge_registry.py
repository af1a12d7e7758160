"""The judge over the check registry: a check family that raises is a run error (and the
report is still written); a family may not take a name report.json already uses."""

import pytest

from harness.checks.registry import CheckFamily, register_check, unregister_check
from harness.checks.run import recorded_run
from harness.experiment.config import SpecchaosConfig
from harness.report.judge import judge
from tests.factories import make_record, phase_events


def _boom(run):
    raise ZeroDivisionError("division by zero")


def test_a_check_that_raises_is_a_run_error_and_the_others_still_judge():
    register_check(CheckFamily("boom", _boom))
    try:
        run = recorded_run([make_record(send_time=1001.0)], [], phase_events({"baseline": 1000.0}, 1010.0),
                           SpecchaosConfig(integrity={"min_compared": 0}))
        rep = judge(run, {"errors": [], "interrupted": False})
    finally:
        unregister_check("boom")
    assert rep["verdict"] == "error"
    assert "check family 'boom' raised ZeroDivisionError: division by zero" in rep["errors"]
    assert any(c["name"].startswith("slo.") for c in rep["checks"])


def test_a_family_may_not_shadow_a_report_key():
    with pytest.raises(ValueError, match="report.json uses that key"):
        register_check(CheckFamily("requests", _boom))

"""The availability section and ``degradation.unavailable_s`` over a recorded kill
(:mod:`harness.checks.availability`)."""

import dataclasses

import pytest

from harness.checks.availability import check, section
from harness.checks.run import recorded_run
from harness.experiment.config import SpecchaosConfig
from tests.factories import phase_events
from tests.metrics.test_availability import kill_phase

STARTS = {"baseline": 100.0, "fault": 130.0, "recovery": 160.0, "after": 165.0}
STOP = 175.0


def cfg(**degradation):
    return SpecchaosConfig.model_validate({"degradation": degradation})


def run_of(records, limits=None):
    return recorded_run(records, [], phase_events(STARTS, STOP), limits or cfg())


def test_section_per_server_and_phase():
    recs, _ = kill_phase(logical=True)
    ref = [dataclasses.replace(r, server="ref", request_id=r.request_id + "-ref") for r in recs[:29]]
    sec = section(run_of(recs + ref))
    assert "first output chunk" in sec["definition"]
    spec = sec["servers"]["spec"]
    assert spec["intervals"] == [[pytest.approx(130.05), pytest.approx(150.3)]]
    assert spec["unavailable_s"] == pytest.approx(20.25)
    assert spec["phases"]["fault"]["unavailable_s"] == pytest.approx(20.25)
    assert spec["phases"]["baseline"]["unavailable_s"] == 0.0
    assert spec["phases"]["fault"]["requests"] == 7 and spec["phases"]["fault"]["failed"] == 2
    assert spec["phases"]["fault"]["tries"] == 86
    assert sec["servers"]["ref"]["unavailable_s"] == 0.0      # mirror mode: the reference stayed up


def test_an_outage_never_ended_lasts_to_the_end_of_the_load():
    recs, _ = kill_phase(logical=True)
    down = [r for r in recs if r.send_time < 150.0]            # the server never came back
    sec = section(run_of(down))["servers"]["spec"]
    assert sec["intervals"] == [[pytest.approx(130.05), STOP]]
    assert sec["phases"]["after"]["unavailable_s"] == pytest.approx(10.0)


def test_no_limit_no_check():
    recs, _ = kill_phase()
    assert check(run_of(recs)) == []


def test_unavailability_within_the_limit_passes_and_a_longer_outage_fails():
    recs, _ = kill_phase()
    (ok,) = check(run_of(recs, cfg(max_unavailable_s=30)))
    assert ok.name == "degradation.unavailable_s" and ok.passed and ok.observed == pytest.approx(20.25)
    assert "fault 20.25 s" in ok.detail
    (bad,) = check(run_of(recs, cfg(max_unavailable_s=10)))   # the defect: 20 s down, 10 s allowed
    assert bad.passed is False and bad.limit == 10 and "> 10 s" in bad.detail


def test_without_a_fault_phase_the_limit_fails_never_passes_vacuously():
    recs, _ = kill_phase()
    run = recorded_run(recs, [], phase_events({"baseline": 100.0}, 130.0), cfg(max_unavailable_s=10))
    (c,) = check(run)
    assert c.passed is False and c.observed is None

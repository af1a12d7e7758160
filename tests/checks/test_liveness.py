import pytest

from harness.checks import liveness
from harness.checks.config import LivenessConfig
from harness.checks.liveness import health_lie, liveness_checks
from harness.checks.run import recorded_run
from harness.experiment.config import SpecchaosConfig
from tests.factories import ev, phase_events

from .stalls import health, users

FAULT = 1000.0
LC = LivenessConfig(max_health_lie_s=5.0)


def run_events(*extra):
    evs = phase_events({"baseline": 970.0, "fault": FAULT, "recovery": 1020.0}, 1030.0)
    for group in extra:
        evs += group
    return evs


def judged(records, events, lc=LC):
    lie = health_lie(records, events, lc, fault_time=FAULT)
    (c,) = liveness_checks(lie)
    return c, lie


def test_healthy_run_is_quiet():
    c, lie = judged(users(970, 1030), run_events(health(970, 1030)))
    assert c.passed and c.name == "liveness.health_lie_s" and c.category == "liveness"
    assert c.observed < 0.11                      # a 200 while the first token is on its way
    assert lie["health_samples_judged"] > 200


def test_health_200_through_a_freeze_is_a_lie():
    c, lie = judged(users(970, 1030, freeze=(FAULT, 1010.0)), run_events(health(970.1, 1030)))
    assert c.passed is False and c.limit == 5.0
    assert FAULT - 0.05 <= lie["start"] <= FAULT
    assert lie["last_200_at"] == pytest.approx(1009.85)       # the last sample before the tokens came back
    assert c.observed == pytest.approx(lie["last_200_at"] - lie["start"])
    assert 9.7 < c.observed < 10.0 and lie["samples_200"] == 40 and lie["in_flight"] == 4
    assert "while requests were in flight and no output chunk arrived: from fault -0.01 s to its 200 at fault +9.9 s " \
           "(40 samples of 200" in c.detail


def test_a_server_that_stops_answering_does_not_lie():
    # the API process itself frozen: /health unanswered for the whole freeze
    status = lambda t: None if FAULT <= t < 1010.0 else 200  # noqa: E731
    c, _ = judged(users(970, 1030, freeze=(FAULT, 1010.0)), run_events(health(970.1, 1030, status=status)))
    assert c.passed and c.observed < 0.1


def test_admitted_trouble_restarts_the_lie():
    status = lambda t: 503 if 1001.0 <= t < 1001.2 else 200  # noqa: E731
    c, lie = judged(users(970, 1030, freeze=(FAULT, 1010.0)), run_events(health(970.1, 1030, status=status)))
    assert lie["start"] == pytest.approx(1001.1)            # the last 503
    assert c.passed is False and c.observed == pytest.approx(1009.85 - 1001.1)
    c, _ = judged(users(970, 1030, freeze=(FAULT, 1010.0)), run_events(health(970.1, 1030, status=status)),
                  lc=LivenessConfig(max_health_lie_s=9.0))
    assert c.passed


def test_a_killed_and_restarted_server_is_not_a_lie():
    status = lambda t: None if FAULT < t < 1019.0 else 200  # noqa: E731
    lifecycle = [ev(1000.3, "server_exited", source="stack", server="spec", returncode=0, expected=False),
                 ev(1018.8, "server_ready", source="stack", server="spec", incarnation=1)]
    c, _ = judged(users(970, 1030, down=(FAULT, 1019.0)), run_events(health(970.1, 1030, status=status), lifecycle))
    assert c.passed and c.observed < 0.35


def test_health_of_another_server_or_outside_the_load_is_not_judged():
    recs = users(970, 1030, freeze=(FAULT, 1010.0))
    c, lie = judged(recs, run_events(health(970.1, 1030, server="ref"), health(1030.5, 1040)))
    assert c.passed is None and not c.judged and c.observed is None and lie["health_samples_judged"] == 0
    assert c.detail.startswith("not judged: ") and "nothing to judge" in c.detail


def test_check_and_section_through_a_recorded_run():
    events = run_events(health(970.1, 1030), [ev(FAULT, "fault_injected", source="fault", fault_id="f1",
                                                 kind="process-freeze", target="spec/engine")])
    run = recorded_run(users(965, 1030, freeze=(FAULT, 1010.0)), [], events, SpecchaosConfig())
    (c,) = liveness.check(run)
    sec = liveness.section(run)
    assert c.passed is False and sec["max_health_lie_s"] == 5.0 and sec["server"] == "spec"
    assert sec["start_after_fault_s"] == pytest.approx(0.0, abs=0.05) and sec["measured_from"] == FAULT

import pytest

from harness.checks.config import FailFastConfig
from harness.checks.fail_fast import fail_fast_checks, in_flight
from tests.asserts import assert_failed
from tests.factories import cut, fail, make_record

FAULT = 1000.0
FF = FailFastConfig(max_error_latency_s=5.0)


def by_name(checks):
    return {c.name: c for c in checks}


def test_in_flight_selection():
    before = make_record(send_time=990.0)  # ended at ~990.25
    flying = make_record(send_time=999.9, ttft=0.5)
    hung = fail(send_time=999.0, after_s=None)
    after = make_record(send_time=1001.0)
    assert {r.request_id for r in in_flight([before, flying, hung, after], FAULT)} == {flying.request_id, hung.request_id}


def test_in_flight_requests_failing_fast_pass():
    recs = [fail(send_time=999.0, after_s=1.3), cut(make_record(send_time=999.5, ttft=0.2), 1, at_s=0.9),
            make_record(send_time=999.8, ttft=0.5)]
    c = by_name(fail_fast_checks(recs, FAULT, FF))
    assert c["fail_fast.hung"].passed and c["fail_fast.hung"].observed == 0
    lat = c["fail_fast.error_latency_s"]
    assert lat.passed and lat.observed == pytest.approx(0.4) and lat.limit == 5.0


def test_hung_in_flight_request_fails():
    recs = [fail(send_time=999.0, after_s=None), make_record(send_time=999.8, ttft=0.5)]
    c = by_name(fail_fast_checks(recs, FAULT, FF))
    assert c["fail_fast.hung"].passed is False and c["fail_fast.hung"].observed == 1
    assert_failed(c["fail_fast.error_latency_s"])


def test_in_flight_error_too_late_fails():
    recs = [fail(send_time=999.0, after_s=31.0, status=None, error="timeout"), fail(send_time=999.5, after_s=0.6)]
    c = by_name(fail_fast_checks(recs, FAULT, FF))["fail_fast.error_latency_s"]
    assert_failed(c)
    assert c.observed == pytest.approx(30.0)  # the worst one
    assert "timeout" in c.detail


def test_all_in_flight_completed_passes():
    c = by_name(fail_fast_checks([make_record(send_time=999.9, ttft=30.0)], FAULT, FF))
    assert c["fail_fast.hung"].passed
    assert c["fail_fast.error_latency_s"].passed and c["fail_fast.error_latency_s"].observed is None


def test_nothing_in_flight_is_not_judged_with_the_reason():
    """Issue 17: whether a request was in flight at the kill is timing; a fault that caught
    no request is N/J (neither passed nor failed), never a failure."""
    checks = fail_fast_checks([make_record(send_time=990.0), make_record(send_time=1001.0)], FAULT, FF)
    assert [c.name for c in checks] == ["fail_fast.hung", "fail_fast.error_latency_s"]
    assert all(c.passed is None and not c.judged and not c.failed for c in checks)
    assert all(c.detail.startswith("not judged: ") and "no request was in flight" in c.detail for c in checks)
    assert checks[1].limit == 5.0 and checks[1].observed is None


def test_nothing_in_flight_leaves_a_passing_run_passing():
    """A kill that caught no request: the fail-fast checks are N/J, the fault acted and
    every other check passed, so the verdict is still "pass" (and a run where nothing at
    all was judged is an error, never a pass)."""
    from harness.checks.base import CheckResult
    from harness.checks.verdict import verdict

    ff = fail_fast_checks([make_record(send_time=990.0)], FAULT, FF)
    others = [CheckResult("hang.longest_stall_s", "hang", True, 0.1, 5.0)]
    assert verdict(ff + others, fault_acted=True, errors=[]) == "pass"
    assert verdict(ff, fault_acted=True, errors=[]) == "error"


def test_nothing_in_flight_through_a_recorded_run():
    """The recorded-run path (check + section): a kill with no request in flight gives two
    N/J checks and a section that says 0 in flight, no latency."""
    from harness.checks import fail_fast
    from harness.checks.run import recorded_run
    from harness.experiment.config import SpecchaosConfig
    from tests.factories import ev

    events = [ev(FAULT, "fault_injected", source="fault", fault_id="k", kind="process-kill",
                 target="spec/worker", recovery_from="injected")]
    ended_before = make_record(send_time=998.0, ttft=0.05)            # ended well before the kill
    run = recorded_run([ended_before, make_record(send_time=1002.0, ttft=0.05)], [], events, SpecchaosConfig())
    checks = fail_fast.check(run)
    assert len(checks) == 2 and all(not c.judged for c in checks)
    sec = fail_fast.section(run)
    assert sec["in_flight"] == 0 and sec["worst_error_latency_s"] is None


def test_in_flight_hung_and_late_error_still_fail():
    """The defect the check exists for is unchanged by N/J: requests in flight at the
    kill that hang, or end in error after the limit, fail."""
    hung = fail_fast_checks([fail(send_time=999.0, after_s=None)], FAULT, FF)
    late = fail_fast_checks([fail(send_time=999.5, after_s=6.0, status=None, error="timeout")], FAULT, FF)
    assert all(c.failed for c in hung)
    h, lat = late
    assert h.passed is True and lat.failed and lat.observed == pytest.approx(5.5)


def test_with_several_faults_fail_fast_is_judged_at_the_kill():
    """A hog (damage while active) injected first, a worker kill 10 s later: the requests
    that must fail fast are those in flight at the kill, not at the hog's start."""
    from harness.checks import fail_fast
    from harness.checks.run import recorded_run
    from harness.experiment.config import SpecchaosConfig
    from tests.factories import ev

    KILL = 1010.0
    events = [ev(FAULT, "fault_injected", source="fault", fault_id="h", kind="memory-hog", target="host",
                 recovery_from="cleared"),
              ev(KILL, "fault_injected", source="fault", fault_id="k", kind="process-kill", target="spec/worker",
                 recovery_from="injected")]
    hung_at_kill = fail(send_time=KILL - 0.1, after_s=None)          # never ended: hung at the kill
    run = recorded_run([make_record(send_time=999.9, ttft=0.05), hung_at_kill], [], events, SpecchaosConfig())
    assert fail_fast.judged_at(run) == KILL
    c = by_name(fail_fast.check(run))
    assert c["fail_fast.hung"].passed is False and c["fail_fast.hung"].observed == 1
    assert fail_fast.section(run)["judged_at"] == KILL and fail_fast.section(run)["in_flight"] == 1
    only_hog = recorded_run([make_record(send_time=999.9, ttft=0.05)], [], events[:1], SpecchaosConfig())
    assert fail_fast.judged_at(only_hog) == FAULT


def test_a_kill_is_judged_from_when_it_began_to_act():
    """A fast server fails the requests it held within milliseconds of the signal, before
    the injection is recorded: those requests are judged (from ``acting_at``), not lost
    into "nothing in flight"."""
    from harness.checks import fail_fast
    from harness.checks.run import recorded_run
    from harness.experiment.config import SpecchaosConfig
    from tests.factories import ev

    events = [ev(FAULT + 0.02, "fault_injected", source="fault", fault_id="k", kind="process-kill",
                 target="spec/worker", recovery_from="injected", acting_at=FAULT)]
    failed_at_once = fail(send_time=FAULT - 0.3, after_s=0.31)       # ended 10 ms after the signal
    run = recorded_run([failed_at_once], [], events, SpecchaosConfig())
    assert fail_fast.judged_at(run) == FAULT
    c = by_name(fail_fast.check(run))
    assert c["fail_fast.hung"].passed and c["fail_fast.error_latency_s"].passed
    assert c["fail_fast.error_latency_s"].observed == pytest.approx(0.01)
    legacy = [dict(events[0])]
    del legacy[0]["acting_at"]      # a timeline written before acting_at: judged at the recorded injection
    assert fail_fast.judged_at(recorded_run([failed_at_once], [], legacy, SpecchaosConfig())) == FAULT + 0.02

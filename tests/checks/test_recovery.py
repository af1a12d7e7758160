import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.checks import recovery
from harness.checks.base import RecordedRun
from harness.checks.recovery import (first_slo_window_end, measured_startup_s, recovery_checks, recovery_times, resolution,
                                     time_to_healthy)
from harness.checks.config import RecoveryConfig
from tests.asserts import assert_failed
from tests.factories import ev, fail, make_record

FAULT = 1000.0
BASE = {"ttft_s": {"p50": 0.1, "p95": 0.2, "p99": 0.3}, "e2e_s": {"p50": 0.5, "p95": 1.0, "p99": 1.2}}
RC = RecoveryConfig(time_to_healthy_s=30, time_to_first_success_s=40, time_to_slo_s=60,
                    slo_window_s=5.0, baseline_p95_factor=2.0)


def health(t, status, server="spec"):
    return ev(t, "health", source="health", server=server, status=status)


def by_name(checks):
    return {c.name: c for c in checks}


# --------------------------------------------------------------- healthy

def test_healthy_after_down_samples():
    evs = [health(999, 200), health(1000.5, 200), health(1001, 503), health(1002, None),
           health(1003, None), health(1010, 200), health(1011, 200)]
    assert time_to_healthy(evs, FAULT) == 1010
    # the 200 right after the fault, before it went down, does not count


def test_healthy_after_server_exited():
    evs = [health(1000.2, 200), ev(1000.3, "server_exited", source="stack", server="spec", returncode=-9),
           health(1020, 200)]
    assert time_to_healthy(evs, FAULT) == 1020


def test_never_seen_down_is_healthy_at_first_200_after_fault():
    evs = [health(999, 200), health(1000.25, 200), health(1000.5, 200)]
    assert time_to_healthy(evs, FAULT) == 1000.25


def test_tear_down_after_the_run_is_not_a_fault():
    evs = [health(1000.5, 200), health(1001, 200), ev(1100, "load_stopped"), health(1101, None),
           ev(1102, "server_exited", source="stack", server="spec", returncode=0, expected=True)]
    assert time_to_healthy(evs, FAULT) == 1000.5
    evs = [health(1000.5, 200), ev(1050, "server_exited", source="stack", server="spec", returncode=0,
                                     expected=True)]
    assert time_to_healthy(evs, FAULT) == 1000.5


def test_other_server_ignored_and_never_back_is_none():
    evs = [health(1001, None), health(1005, 200, server="ref"), health(1006, 503)]
    assert time_to_healthy(evs, FAULT) is None
    assert time_to_healthy([], FAULT) is None


# --------------------------------------------------------------- SLO window

def window_records(start, n=4, ttft=0.1, step=0.5):
    return [make_record(send_time=start + i * step, ttft=ttft) for i in range(n)]


def test_first_slo_window_end():
    # records end at send + 0.1 + 3*0.05 + 0.001 = send + 0.251
    slow = window_records(1001.0, ttft=5.0)  # TTFT far over 2x baseline
    assert first_slo_window_end(slow, FAULT, BASE, RC) is None
    overlapping = window_records(1010.0)  # every window also holds a slow one
    assert first_slo_window_end(slow + overlapping, FAULT, BASE, RC) is None
    good = window_records(1020.0)
    end = first_slo_window_end(slow + overlapping + good, FAULT, BASE, RC)
    assert end == pytest.approx(1020.0 + 0.251 + 0.5 * 2)  # third good request completes the window


def test_window_must_start_after_since_and_needs_three_requests():
    recs = window_records(999.0, n=2) + window_records(1003.0, n=2)
    assert first_slo_window_end(recs, FAULT, BASE, RC) is None


def test_window_with_an_error_does_not_count():
    recs = window_records(1010.0, n=3) + [fail(send_time=1010.6, after_s=0.1)]
    later = window_records(1020.0, n=3)
    end = first_slo_window_end(recs + later, FAULT, BASE, RC)
    assert end == pytest.approx(1020.0 + 0.251 + 1.0)


def test_window_needs_baseline_data():
    assert first_slo_window_end(window_records(1010.0), FAULT, {}, RC) is None
    empty = {"ttft_s": {"p95": None}, "e2e_s": {"p95": None}}
    assert first_slo_window_end(window_records(1010.0), FAULT, empty, RC) is None


def test_window_e2e_over_tolerance_fails():
    recs = [make_record(send_time=1010 + i * 0.1, gaps=[0.9] * 3) for i in range(5)]  # e2e 2.8 > 2.0
    assert first_slo_window_end(recs, FAULT, BASE, RC) is None


@given(st.lists(st.floats(1000.0, 1100.0), min_size=0, max_size=30))
def test_window_end_is_a_completion_at_least_one_window_after_since(sends):
    recs = [make_record(send_time=s) for s in sends]
    end = first_slo_window_end(recs, FAULT, BASE, RC)
    if end is not None:
        assert end - RC.slo_window_s >= FAULT
        assert end in {r.end_time for r in recs}
        assert sum(1 for r in recs if end - RC.slo_window_s <= r.end_time <= end) >= 3


# --------------------------------------------------------------- recovery_times / checks

def test_recovery_times_all_reached():
    evs = [health(1001, None), health(1012, 200)]
    recs = [fail(send_time=1001), make_record(send_time=999.9)] + window_records(1015.0)
    t = recovery_times(recs, evs, FAULT, BASE, RC)
    assert t["time_to_healthy_s"] == pytest.approx(12)
    # the request sent before the fault does not count as a success after it
    assert t["time_to_first_success_s"] == pytest.approx(15.251)
    assert t["time_to_slo_s"] == pytest.approx(15.0 + 0.251 + 1.0)
    checks = recovery_checks(t, RC)
    assert [c.name for c in checks] == ["recovery.time_to_healthy_s", "recovery.time_to_first_success_s",
                                        "recovery.time_to_slo_s"]
    assert all(c.passed for c in checks)


def test_cut_stream_is_not_a_first_success():
    from tests.factories import cut

    recs = [cut(make_record(send_time=1005), 2, labelled_ok=True)]
    t = recovery_times(recs, [], FAULT, BASE, RC)
    assert t["time_to_first_success_s"] is None


def test_server_that_never_comes_back_fails_every_recovery_check():
    evs = [health(1000.5, 503)] + [health(1001 + i, None) for i in range(100)]
    recs = [fail(send_time=1001 + i, status=None, error="connect", after_s=0.01) for i in range(50)]
    t = recovery_times(recs, evs, FAULT, BASE, RC)
    assert t == {"time_to_healthy_s": None, "time_to_first_success_s": None, "time_to_slo_s": None}
    checks = recovery_checks(t, RC)
    assert all(c.passed is False for c in checks)
    assert all(c.observed is None and "never recovered" in c.detail for c in checks)


def test_recovery_too_slow_fails_against_limits():
    checks = by_name(recovery_checks({"time_to_healthy_s": 31.0, "time_to_first_success_s": 1.0,
                                      "time_to_slo_s": 61.0}, RC))
    assert_failed(checks["recovery.time_to_healthy_s"])
    assert checks["recovery.time_to_first_success_s"].passed
    assert_failed(checks["recovery.time_to_slo_s"])
    assert checks["recovery.time_to_slo_s"].limit == 60


# --------------------------------------------------------------- resolution (dense probes)

def _outage(step_health: float, step_gen: float, back: float = 1030.0) -> tuple[list, list]:
    """Health sampled every ``step_health`` s and a one-token probe every ``step_gen`` s
    from the kill at 1000 s; the server answers again from ``back``."""
    evs, t = [], FAULT + step_health
    while t < back + 1:
        evs.append(health(round(t, 6), 200 if t >= back else None))
        t += step_health
    t = FAULT + step_gen
    while t < back + 1:
        ok = t >= back
        evs.append(ev(round(t + (0.02 if ok else 0.001), 6), "generation_probe", source="health", server="spec",
                      send_time=round(t, 6), ok=ok, status=200 if ok else None, error=None if ok else "connect"))
        t += step_gen
    return [], evs


def test_dense_probes_resolve_the_recovery_to_100_ms_and_sparse_ones_do_not():
    records, dense = _outage(0.025, 0.05)
    res = resolution(records, dense, FAULT)
    assert res["time_to_healthy_s"] <= 0.025 + 1e-6 and res["time_to_first_success_s"] <= 0.05 + 1e-6
    assert res["resolution_s"] <= 0.1
    times = recovery_times(records, dense, FAULT, BASE, RC)
    assert times["time_to_first_success_s"] == pytest.approx(30.02, abs=0.06)   # a probe counts as a success
    # the regular 4 Hz health sampler and a load retrying once a second resolve far worse
    _, sparse = _outage(0.25, 1.0)
    res = resolution([], sparse, FAULT)
    assert res["resolution_s"] > 0.1 and res["time_to_first_success_s"] == pytest.approx(0.999, abs=0.01)


def test_resolution_is_none_without_a_transition():
    evs = [health(1001, 200), health(1002, 200)]
    assert resolution([make_record(send_time=1001)], evs, FAULT) == {
        "time_to_healthy_s": None, "time_to_first_success_s": None, "resolution_s": None}


def test_load_failures_before_the_first_success_bound_its_resolution():
    recs = [fail(send_time=1001.0, after_s=0.01, error="connect", status=None),
            fail(send_time=1029.9, after_s=0.01, error="connect", status=None),
            make_record(send_time=1029.96)]
    res = resolution(recs, [], FAULT)
    assert res["time_to_first_success_s"] == pytest.approx(0.05, abs=1e-6)


def test_probes_waiting_in_a_backlog_watch_the_server_until_it_answers():
    # refused until 1030.0; then the port listens but answers only from 1030.4: probes sent
    # every 25 ms meanwhile wait and all get their 200 at 1030.4 — the instant is pinned
    evs = [ev(1029.0 + k * 0.025, "health", source="health", server="spec", status=None, latency_s=0.001)
           for k in range(41)]
    evs += [ev(1030.4, "health", source="health", server="spec", status=200, latency_s=1030.4 - s)
            for s in (1030.02, 1030.045, 1030.07)]
    assert resolution([], evs, FAULT)["time_to_healthy_s"] == pytest.approx(0.02, abs=1e-6)
    # without the waiting probes (answered one by one at 4 Hz) the doubt is the whole 0.4 s
    sparse = evs[:41] + [ev(1030.4, "health", source="health", server="spec", status=200, latency_s=0.001)]
    assert resolution([], sparse, FAULT)["time_to_healthy_s"] == pytest.approx(0.399, abs=1e-6)


# --------------------------------------------------------------- limits relative to the measured start-up

def _run_with_startup(startup_s: float, healthy_after_s: float, limits: dict) -> RecordedRun:
    """A kill at FAULT on a stack whose speculative server started in ``startup_s`` (its
    ``server_ready`` before the fault), healthy again ``healthy_after_s`` later."""
    from harness.experiment.config import SpecchaosConfig

    events = [ev(FAULT - 100, "server_ready", source="stack", server="spec", incarnation=0, startup_s=startup_s),
              ev(FAULT + 0.1, "server_exited", source="stack", server="spec", returncode=-9),
              health(FAULT + healthy_after_s, 200),
              # the restart's own start-up is the recovery, not the host's speed: never the reference
              ev(FAULT + healthy_after_s - 1, "server_ready", source="stack", server="spec", incarnation=1,
                 startup_s=healthy_after_s - 2)]
    cfg = SpecchaosConfig.model_validate({"recovery": limits})
    return RecordedRun(records=[], reference={}, events=sorted(events, key=lambda e: e["t"]), limits=cfg,
                       faults=[{"injected_at": FAULT, "cleared_at": FAULT, "kind": "process_kill"}])


def test_a_slow_host_passes_a_start_up_relative_limit_and_the_report_says_how_it_was_derived():
    run = _run_with_startup(60.0, 80.0, {"time_to_healthy_s": {"startup_factor": 1.5}})
    c = by_name(recovery.check(run))["recovery.time_to_healthy_s"]
    assert (c.passed, c.observed, c.limit) == (True, pytest.approx(80.0), pytest.approx(90.0))
    assert c.detail == "health 200 after 80 s (≤ 90 s = 1.5 × start-up 60.0 s)"
    sec = recovery.section(run)
    assert sec["startup_s"] == 60.0
    assert sec["limits"]["time_to_healthy_s"] == {"limit_s": 90.0, "derived": "1.5 × start-up 60.0 s"}
    assert sec["limits"]["time_to_slo_s"] == {"limit_s": 180.0, "derived": "configured"}


def test_a_regression_fails_a_start_up_relative_limit():
    run = _run_with_startup(20.0, 80.0, {"time_to_healthy_s": {"startup_factor": 1.5}})
    c = by_name(recovery.check(run))["recovery.time_to_healthy_s"]
    assert c.passed is False
    assert (c.limit, c.detail) == (pytest.approx(30.0), "health 200 after 80 s (> 30 s = 1.5 × start-up 20.0 s)")


def test_start_up_plus_seconds_and_both_forms():
    run = _run_with_startup(20.0, 45.0, {"time_to_healthy_s": {"startup_plus_s": 30},
                                         "time_to_slo_s": {"startup_factor": 2, "startup_plus_s": 10}})
    checks = by_name(recovery.check(run))
    assert checks["recovery.time_to_healthy_s"].passed is True and checks["recovery.time_to_healthy_s"].limit == 50.0
    assert "= start-up 20.0 s + 30 s" in checks["recovery.time_to_healthy_s"].detail
    assert checks["recovery.time_to_slo_s"].limit == 50.0   # 2 × 20 + 10; never reached (no records)
    assert checks["recovery.time_to_slo_s"].passed is False


def test_without_a_measured_start_up_a_relative_limit_is_not_judged_and_a_pooled_stack_carries_its_own():
    checks = recovery_checks({"time_to_healthy_s": 80.0}, RecoveryConfig(time_to_healthy_s={"startup_factor": 1.5}))
    c = by_name(checks)["recovery.time_to_healthy_s"]
    assert c.passed is None and c.limit is None
    assert c.detail.startswith("not judged: the limit is 1.5 × start-up, and this run measured no start-up")
    pooled = [ev(900, "stack_pooled", source="stack", uses=2, startup_s={"spec": 41.5, "ref": 30.0})]
    assert measured_startup_s(pooled, FAULT) == 41.5
    assert measured_startup_s([], FAULT) is None


def test_a_relative_limit_needs_a_factor_or_seconds():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="give startup_factor"):
        RecoveryConfig(time_to_healthy_s={})
    with pytest.raises(ValidationError):
        RecoveryConfig(time_to_healthy_s={"startup_factor": 0})
    assert RecoveryConfig(time_to_healthy_s=45).time_to_healthy_s == 45.0

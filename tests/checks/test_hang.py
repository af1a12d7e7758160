import pytest

from harness.checks import hang
from harness.checks.config import HangConfig
from harness.checks.hang import Stall, hang_checks, observation_end, stall_summary, stalls
from harness.checks.run import recorded_run
from harness.experiment.config import SpecchaosConfig
from tests.asserts import assert_failed
from tests.factories import ev, fail, make_record, phase_events

from .stalls import users

FAULT = 1000.0
GAP = 0.05          # between chunks of the synthetic users
HC = HangConfig(max_stall_s=5.0)


def judged(records, until=1030.0, hc=HC, fault=FAULT):
    s = stall_summary(records, until, hc, fault)
    (c,) = hang_checks(s)
    return c, s


def test_healthy_load_is_quiet():
    c, s = judged(users(970, 1030))
    assert c.passed and c.name == "hang.longest_stall_s" and c.category == "hang"
    assert c.observed == pytest.approx(0.1, abs=0.02)      # waiting for a first token is the longest wait
    assert s["detected_at"] is None and s["stalls_over_limit"] == 0 and "longest stall" in c.detail


def test_a_freeze_is_a_hang_detected_at_its_start_plus_the_limit():
    c, s = judged(users(970, 1030, freeze=(FAULT, 1010.0)))
    assert_failed(c)
    assert c.observed == pytest.approx(10.0, abs=0.1) and c.limit == 5.0
    start = s["stall_start"]
    assert FAULT - GAP <= start <= FAULT                    # the last chunk before the freeze
    assert s["detected_at"] == pytest.approx(start + 5.0)
    assert s["detected_after_fault_s"] == pytest.approx(start + 5.0 - FAULT)
    assert s["in_flight_at_detection"] == 4 and s["stalls_over_limit"] == 1
    assert s["longest_stall_ended_by"] == "output"
    # instants relative to the fault, not epoch seconds (the report keeps those)
    assert c.detail.startswith(f"hang detected at fault +{s['detected_after_fault_s']:.1f} s: 4 request(s) in flight, "
                               f"no output token since fault {start - FAULT:+.2f} s;")



def test_the_limit_is_inclusive():
    recs = [make_record(send_time=1000.0, ttft=0.1, gaps=[5.0, 0.05])]
    assert judged(recs, hc=HangConfig(max_stall_s=5.0))[0].passed
    assert_failed(judged(recs, hc=HangConfig(max_stall_s=4.99))[0])


def test_a_killed_server_whose_requests_fail_fast_is_not_a_hang():
    c, s = judged(users(970, 1030, down=(FAULT, 1020.0)))
    assert c.passed, c.detail
    assert c.observed < 0.5                                  # the in-flight requests failed after 0.3 s


def test_requests_waiting_on_a_server_that_accepts_but_never_answers_are_a_hang():
    # a port accepting into its backlog while the restarted server is not ready: 20 s of waiting
    waiting = [fail(send_time=1001.0 + 0.1 * i, after_s=19.0 - 0.1 * i, status=200, error="timeout")
               for i in range(4)]
    c, _ = judged(users(970, FAULT) + waiting + users(1020.5, 1030))
    assert c.passed is False and c.observed == pytest.approx(19.0, abs=0.01)


def test_requests_that_never_end_stall_until_the_load_stopped():
    recs = users(970, FAULT) + [fail(send_time=1000.5, after_s=None, status=200, error=None)]
    events = phase_events({"baseline": 970.0, "fault": FAULT}, 1030.0)
    until = observation_end(recs, events)
    assert until == 1030.0
    c, s = judged(recs, until=until)
    assert c.passed is False and c.observed == pytest.approx(29.5) and s["longest_stall_ended_by"] == "end"


def test_stall_boundaries():
    a = make_record(send_time=100.0, ttft=0.5, gaps=[1.0])          # chunks at 100.5, 101.5, ends 101.501
    b = make_record(send_time=101.0, ttft=2.0, gaps=[])             # chunk at 103.0
    c = fail(send_time=110.0, after_s=0.2)                          # in flight alone, no output
    assert stalls([a, b, c], 200.0) == [
        Stall(100.0, 100.5, "output"), Stall(100.5, 101.5, "output"), Stall(101.5, 103.0, "output"),
        Stall(103.0, 103.001, "idle"), Stall(110.0, 110.2, "idle")]
    assert stalls([a, b, c], 101.0) == [Stall(100.0, 100.5, "output"), Stall(100.5, 101.0, "end")]


def test_nothing_in_flight_is_not_judged():
    (c,) = hang_checks(stall_summary([], None, HC))
    assert c.passed is None and not c.judged and c.observed is None
    assert c.detail.startswith("not judged: ") and "nothing to judge" in c.detail


def test_check_and_section_through_a_recorded_run():
    events = phase_events({"baseline": 970.0, "fault": FAULT, "recovery": 1010.0}, 1030.0)
    events.append(ev(FAULT, "fault_injected", source="fault", fault_id="f1", kind="process-freeze",
                     target="spec/engine"))
    run = recorded_run(users(965, 1030, freeze=(FAULT, 1010.0)), [], events, SpecchaosConfig())
    (c,) = hang.check(run)
    sec = hang.section(run)
    assert c.passed is False and sec["max_stall_s"] == 5.0 and sec["measured_from"] == FAULT
    assert sec["detected_after_fault_s"] == pytest.approx(5.0, abs=GAP)


def test_an_instant_reads_by_phase_then_by_fault_then_epoch():
    from harness.checks.base import instant

    windows = {"baseline": (900.0, 1000.0), "fault": (1000.0, 1020.0), "recovery": (1020.0, 1030.0)}
    assert instant(1025.42, 1000.0, windows) == "recovery +5.4 s"
    assert instant(1000.004, 1000.0, windows) == "fault +0.00 s"
    assert instant(899.5, None, windows) == "baseline -0.50 s"   # before the first phase
    assert instant(1796478303.759, 1796478298.7) == "fault +5.1 s"
    assert instant(1796478303.759) == "epoch 1796478303.759"

"""The breaker checks over recorded data (pure): a healthy fallback passes; a trip too slow,
a trip that never happens while the recorded rate breached, and a plain server that never
serves fail; a run with the breaker off is not judged; nothing recorded is no pass."""

from __future__ import annotations

import json

import pytest

from harness.checks import breaker
from harness.checks.run import recorded_run
from harness.experiment.config import SpecchaosConfig
from harness.stack.breaker import ACCEPTED, DRAFT_TOKENS
from tests.factories import ev, make_record


def cfg(mechanism: str = "restart", **fallback) -> SpecchaosConfig:
    return SpecchaosConfig.model_validate({
        "stack": {"breaker": {"enabled": True, "window_s": 2.0, "min_draft_tokens": 10, "fallback": mechanism}},
        "fallback": fallback})


def metric_lines(t0: float, t1: float, acceptance: float, start=(0.0, 0.0)) -> list[dict]:
    out, t, (d, a) = [], t0, start
    while t <= t1 + 1e-9:
        out.append({"t": t, "server": "spec", "ok": True, "counters": {DRAFT_TOKENS: d, ACCEPTED: a}})
        t, d, a = t + 0.5, d + 50, a + 50 * acceptance
    return out


#: good draft 990-1000, swap (new incarnation 1, counters from 0) to a bad one 1000-1006:
#: the recorded window first breaches at 1002.
LINES = metric_lines(990, 999.5, 0.95, start=(1000, 950)) + metric_lines(1000, 1006, 0.2)


def trip(t: float = 1002.5, inc: int = 2) -> dict:
    return ev(t, "breaker_tripped", source="breaker", server="spec", level="hard", breach_t=t, rejection_rate=0.8,
              limit=0.3, window_s=2.0, draft_tokens=200, old={}, new={"method": None}, incarnation=inc)


def ready(t: float, inc: int = 2, startup_s: float | None = None) -> dict:
    extra = {} if startup_s is None else {"startup_s": startup_s}
    return ev(t, "server_ready", source="stack", server="spec", pid=1, incarnation=inc, **extra)


def judged(tmp_path, events, records, lines=LINES, config=None):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(ln) + "\n" for ln in lines))
    run = recorded_run(records, [], events, config or cfg(), run_dir=tmp_path)
    return {c.name: c for c in breaker.check(run)}, breaker.section(run)


def test_a_timely_fallback_passes(tmp_path):
    recs = [make_record(send_time=1010.0), make_record(send_time=1024.9), make_record(send_time=1030.0)]
    checks, sec = judged(tmp_path, [trip(), ready(1025.0)], recs)
    assert checks["breaker.tripped"].passed and checks["breaker.tripped"].observed == pytest.approx(0.8)
    fb = checks["breaker.fallback_s"]
    # breach 1002 -> ready 1025 -> the first complete response ending after it: 1024.9 + 0.251
    assert fb.passed and fb.observed == pytest.approx(1025.151 - 1002.0, abs=1e-3) and fb.limit == 30.0
    assert sec["first_breach"]["t"] == 1002.0 and sec["plain_ready_at"] == 1025.0


def test_a_trip_too_slow_fails(tmp_path):
    recs = [make_record(send_time=1050.0)]
    checks, _ = judged(tmp_path, [trip(1040.0), ready(1045.0)], recs)
    fb = checks["breaker.fallback_s"]
    assert checks["breaker.tripped"].passed
    assert fb.passed is False and fb.observed == pytest.approx(48.251, abs=1e-3)


def test_the_limit_is_configurable(tmp_path):
    recs = [make_record(send_time=1050.0)]
    checks, _ = judged(tmp_path, [trip(1040.0), ready(1045.0)], recs, config=cfg(max_s=60))
    assert checks["breaker.fallback_s"].passed and checks["breaker.fallback_s"].limit == 60


#: the draft swap's restart (incarnation 1, ready at 999 after a 40 s start-up), then the trip
#: at 1002.5 and the plain server (incarnation 2) ready 50 s later after its own 49.5 s start-up
SWAP = ready(999.0, inc=1, startup_s=40.0)


def test_a_slow_host_start_up_left_out_passes_on_the_breakers_part(tmp_path):
    recs = [make_record(send_time=1052.4)]
    events = [SWAP, trip(), ready(1052.5, startup_s=49.5)]
    included, _ = judged(tmp_path, events, recs)
    assert included["breaker.fallback_s"].passed is False and "breaker.fallback_startup_ratio" not in included
    checks, sec = judged(tmp_path, events, recs, config=cfg(startup="excluded"))
    fb, ratio = checks["breaker.fallback_s"], checks["breaker.fallback_startup_ratio"]
    # breach 1002 -> first response ends 1052.651: 50.651 s, of which 49.5 s start-up
    assert fb.passed and fb.observed == pytest.approx(1.151, abs=1e-3) and "start-up (49.5 s) left out" in fb.detail
    assert ratio.passed and ratio.observed == pytest.approx(49.5 / 40.0, abs=1e-3) and ratio.limit == 2.0
    assert sec["plain_startup_s"] == 49.5 and sec["earlier_startups_s"] == [40.0]


def test_with_the_start_up_left_out_a_late_trip_still_fails(tmp_path):
    recs = [make_record(send_time=1090.0)]
    checks, _ = judged(tmp_path, [SWAP, trip(1040.0), ready(1090.0, startup_s=45.0)], recs,
                       config=cfg(startup="excluded"))
    fb = checks["breaker.fallback_s"]
    assert fb.passed is False and fb.observed == pytest.approx(88.251 - 45.0, abs=1e-3)


def test_a_start_up_far_slower_than_the_servers_own_fails_the_ratio(tmp_path):
    recs = [make_record(send_time=1110.0)]
    checks, _ = judged(tmp_path, [SWAP, trip(), ready(1110.0, startup_s=105.0)], recs,
                       config=cfg(startup="excluded", max_startup_ratio=2.0))
    ratio = checks["breaker.fallback_startup_ratio"]
    assert checks["breaker.fallback_s"].passed
    assert ratio.passed is False and ratio.observed == pytest.approx(105.0 / 40.0, abs=1e-3)


def test_the_ratio_is_not_judged_without_an_earlier_start_up_or_a_plain_server(tmp_path):
    recs = [make_record(send_time=1030.0)]
    checks, _ = judged(tmp_path, [trip(), ready(1030.0, startup_s=27.0)], recs, config=cfg(startup="excluded"))
    ratio = checks["breaker.fallback_startup_ratio"]
    assert ratio.passed is None and "no earlier start-up of spec" in ratio.detail
    checks, _ = judged(tmp_path, [SWAP, trip()], recs, config=cfg(startup="excluded"))
    assert checks["breaker.fallback_startup_ratio"].passed is None and checks["breaker.fallback_s"].passed is False


def test_a_breach_without_a_trip_fails_both(tmp_path):
    checks, sec = judged(tmp_path, [], [make_record(send_time=1010.0)])
    assert checks["breaker.tripped"].passed is False and "never fell back" in checks["breaker.tripped"].detail
    assert checks["breaker.fallback_s"].passed is False and checks["breaker.fallback_s"].observed is None
    assert "never tripped" in checks["breaker.fallback_s"].detail


def test_a_plain_server_that_never_serves_fails(tmp_path):
    failed = make_record(send_time=1030.0, status=500, error="http", done=False, ok=False)
    checks, _ = judged(tmp_path, [trip(), ready(1025.0)], [failed])
    assert checks["breaker.fallback_s"].passed is False and "no complete response" in checks["breaker.fallback_s"].detail


def test_healthy_acceptance_passes_without_fallback(tmp_path):
    checks, sec = judged(tmp_path, [], [], lines=metric_lines(990, 1010, 0.9))
    assert set(checks) == {"breaker.tripped"} and checks["breaker.tripped"].passed
    assert sec["windows_judged"] > 10 and sec["first_breach"] is None


def test_nothing_recorded_is_no_pass(tmp_path):
    checks, _ = judged(tmp_path, [], [], lines=[])
    assert checks["breaker.tripped"].passed is False and checks["breaker.tripped"].observed is None


def test_a_breaker_that_is_off_is_not_judged(tmp_path):
    run = recorded_run([], [], [], SpecchaosConfig(), run_dir=tmp_path)
    assert breaker.check(run) == [] and breaker.section(run) is None


def test_failed_scrapes_are_gaps_not_zeros(tmp_path):
    gaps = [{"t": t, "server": "spec", "ok": False, "error": "timeout"} for t in (1003.1, 1003.2)]
    checks, sec = judged(tmp_path, [trip(), ready(1025.0)], [make_record(send_time=1020.0)], lines=LINES + gaps)
    checks, sec = judged(tmp_path, [trip(), ready(1025.0)], [make_record(send_time=1025.0)], lines=LINES + gaps)
    assert sec["first_breach"]["t"] == 1002.0 and checks["breaker.fallback_s"].passed


# ---------------------------------------------------------------- fallback: route


def routed(t: float = 1002.5, switched_at: float = 1002.6) -> list[dict]:
    """A route trip at ``t`` (the router switched at ``switched_at``) and its router event."""
    tr = trip(t, inc=None)
    tr.update(mechanism="route", routed_to="ref", switched_at=switched_at)
    return [tr, ev(switched_at, "routed", source="router", server="spec", to="ref", switched_at=switched_at)]


def test_a_route_fallback_counts_from_the_breach_to_the_plain_servers_first_response(tmp_path):
    recs = [make_record(send_time=1002.4, served_by="spec"),       # in flight on the bad draft: not plain
            make_record(send_time=1002.7, served_by="ref"), make_record(send_time=1003.0, served_by="ref")]
    checks, sec = judged(tmp_path, routed(), recs, config=cfg("route", startup="excluded"))
    fb = checks["breaker.fallback_s"]
    # breach 1002 -> switch 1002.6 -> the first response ref served ends at 1002.7 + 0.251
    assert fb.passed and fb.observed == pytest.approx(0.951, abs=1e-3)
    assert "routed to the warm plain server ref 0.6 s" in fb.detail and "left out" not in fb.detail
    assert checks["breaker.fallback_startup_ratio"].passed is None
    assert "starts nothing" in checks["breaker.fallback_startup_ratio"].detail
    assert sec["mechanism"] == "route" and sec["routed_to"] == "ref" and sec["plain_ready_at"] == 1002.6
    assert sec["complete_by_server"] == {"spec": 1, "ref": 2} and [e["event"] for e in sec["routes"]] == ["routed"]


def test_a_route_fallback_slower_than_max_s_fails(tmp_path):
    recs = [make_record(send_time=1040.0, served_by="ref")]
    checks, _ = judged(tmp_path, routed(1039.0, 1039.5), recs, config=cfg("route", max_s=30))
    fb = checks["breaker.fallback_s"]
    assert fb.passed is False and fb.observed == pytest.approx(38.251, abs=1e-3)


def test_a_route_that_never_happens_fails(tmp_path):
    """The breaker said it routed, but every later response still came from the speculative
    server (a router that never switched): no plain response, the fallback fails."""
    recs = [make_record(send_time=1003.0 + i, served_by="spec") for i in range(5)]
    checks, sec = judged(tmp_path, routed(), recs, config=cfg("route"))
    fb = checks["breaker.fallback_s"]
    assert fb.passed is False and fb.observed is None and "no complete response came from ref" in fb.detail
    checks, _ = judged(tmp_path, [], recs, config=cfg("route"))   # and no trip at all
    assert checks["breaker.tripped"].passed is False and checks["breaker.fallback_s"].passed is False

"""The speculation circuit breaker: the windowed rejection rate (resets, gaps), the policy
fed scraper lines (soft and hard trips, re-enable with hysteresis, hold time), its config
rules, and once against the harness's real supervisor around the fake vLLM, fed by a tiny
poller of the fake's ``/metrics`` (the run uses the metrics scraper's lines instead)."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from harness.metrics.prometheus import sample_total
from harness.errors import SpecchaosError, StackError
from harness.stack.breaker import (ACCEPTED, DRAFT_TOKENS, STANDBY, BreakerConfig, RejectionWindow,
                                   SpeculationBreaker, first_breach, rejection_series, route_upstream)
from harness.stack.vllm import speculative_config
from harness.timeline import Timeline



def feed_breaker(breaker: SpeculationBreaker, base_url: str, stop: threading.Event, interval_s: float = 0.25) -> None:
    """The run's metrics scraper, in small: every ``interval_s`` seconds until ``stop`` is set,
    read ``base_url``'s /metrics and hand the breaker one ``spec`` line of its counters."""
    with httpx.Client(trust_env=False, timeout=5) as c:
        while not stop.is_set():
            try:
                text = c.get(base_url + "/metrics").text
                breaker.observe({"t": time.time(), "server": "spec", "ok": True,
                                 "counters": {n: sample_total(text, n) for n in (DRAFT_TOKENS, ACCEPTED)}})
            except httpx.HTTPError:
                pass
            stop.wait(interval_s)

def line(t: float, drafted: float | None, accepted: float | None, server: str = "spec", ok: bool = True) -> dict:
    if not ok:
        return {"t": t, "server": server, "ok": False, "error": "timeout"}
    counters = {} if drafted is None else {DRAFT_TOKENS: drafted, ACCEPTED: accepted}
    return {"t": t, "server": server, "ok": True, "counters": counters}


def ramp(t0: float, t1: float, acceptance: float, start=(0.0, 0.0), per_s: float = 100.0, step: float = 0.5):
    """Lines every ``step`` s from t0 to t1 with ``per_s`` draft tokens/s accepted at ``acceptance``."""
    out, t, (d, a) = [], t0, start
    while t <= t1 + 1e-9:
        out.append(line(t, d, a))
        t += step
        d += per_s * step
        a += per_s * step * acceptance
    return out


class StubServer:
    """Stands in for LocalServer's ``respeculate``/``speculative``/``incarnation`` (the policy is
    the unit under test; the real restart is tested in test_respeculate.py)."""

    name = "spec"

    def __init__(self) -> None:
        self.speculative: dict[str, Any] = {"method": "draft_model", "draft": "/m/draft-acc20", "num_speculative_tokens": 4}
        self.incarnation = 0
        self.calls: list[tuple] = []

    def respeculate(self, method, draft=None, num_speculative_tokens=None, *, reason=""):
        self.calls.append((method, draft, num_speculative_tokens))
        self.incarnation += 1
        self.speculative = {"method": method, "draft": draft if method else None,
                            "num_speculative_tokens": num_speculative_tokens if method else None}
        return self.incarnation


def test_window_rate_needs_a_full_window_and_enough_tokens():
    w = RejectionWindow(window_s=2.0, min_draft_tokens=50)
    w.add(0.0, 0, 0)
    w.add(1.0, 100, 80)
    assert w.rate() == (None, 100)            # not a whole window yet
    w.add(2.0, 200, 160)
    assert w.rate() == (pytest.approx(0.2), 200)
    w.add(3.0, 210, 160)
    w.add(4.0, 220, 160)                       # the window slides: 1 − 0 / 20 over [2, 4]
    assert w.rate() == (None, 20)              # too few draft tokens to judge


def test_window_counter_reset_and_plain_start_afresh():
    w = RejectionWindow(window_s=1.0, min_draft_tokens=1)
    for t, d, a in ((0, 1000, 900), (1, 1100, 990)):
        w.add(t, d, a)
    assert w.rate()[0] == pytest.approx(0.1)
    w.add(2, 50, 10)                           # restarted: counters from 0
    assert w.rate() == (None, 0.0)             # never a negative rate
    w.add(3, 150, 30)
    assert w.rate()[0] == pytest.approx(0.8)
    w.add(4, None, None)                       # plain decoding: no counters
    assert w.rate() == (None, 0.0)


def test_series_skips_gaps_and_other_servers():
    lines = ramp(0, 4, 0.9) + [line(2.2, 0, 0, ok=False), line(2.3, 5, 5, server="ref")]
    s = rejection_series(lines, "spec", window_s=2.0, min_draft_tokens=10)
    assert s[0]["t"] == 2.0 and all(p["rejection_rate"] == pytest.approx(0.1) for p in s)
    assert first_breach(s, 0.3) is None and first_breach(s, 0.1)["t"] == 2.0


def test_hard_trip_goes_plain_and_records_the_breach():
    tl, srv = Timeline(), StubServer()
    b = SpeculationBreaker(BreakerConfig(enabled=True, window_s=2.0, min_draft_tokens=10), srv, tl)
    for ln in ramp(0, 5, 0.2):
        b.observe(ln)
    assert srv.calls == [(None, None, None)]
    (ev,) = tl.select(event="breaker_tripped")
    assert ev["level"] == "hard" and ev["breach_t"] == 2.0 and ev["rejection_rate"] == pytest.approx(0.8)
    assert ev["new"]["method"] is None and ev["old"]["num_speculative_tokens"] == 4 and ev["incarnation"] == 1
    assert b.level == 2


def test_soft_trip_fewer_tokens_then_reenable_with_hysteresis():
    tl, srv = Timeline(), StubServer()
    cfg = BreakerConfig(enabled=True, window_s=2.0, min_draft_tokens=10, soft_rejection=0.2, hard_rejection=0.3,
                        soft_num_speculative_tokens=2, reenable_after_s=0.01, hysteresis=0.05)
    b = SpeculationBreaker(cfg, srv, tl)
    for ln in ramp(0, 3, 0.75):               # rejection 0.25: soft
        b.observe(ln)
    assert srv.calls == [("draft_model", "/m/draft-acc20", 2)] and b.level == 1
    for ln in ramp(10, 13, 0.82, start=(0, 0)):   # 0.18: below soft but not below soft − hysteresis
        b.observe(ln)
    assert len(srv.calls) == 1
    time.sleep(0.02)
    for ln in ramp(20, 23, 0.9, start=(0, 0)):    # 0.10 < 0.15 for a whole window: back to k = 4
        b.observe(ln)
    assert srv.calls[-1] == ("draft_model", "/m/draft-acc20", 4) and b.level == 0
    assert [e["event"] for e in tl.select(source="breaker")] == ["breaker_tripped", "breaker_reenabled"]


def test_hard_trip_reenables_after_the_hold_time_and_trips_again():
    srv = StubServer()
    b = SpeculationBreaker(BreakerConfig(enabled=True, window_s=1.0, min_draft_tokens=1, reenable_after_s=1.0),
                           srv, Timeline())
    for ln in ramp(0, 1, 0.5):
        b.observe(ln)
    assert srv.calls == [(None, None, None)]
    b.observe(line(1.5, None, None))           # plain: nothing to judge, hold time not over
    assert len(srv.calls) == 1
    b.observe(line(2.1, None, None))
    assert srv.calls[-1] == ("draft_model", "/m/draft-acc20", 4)
    for ln in ramp(3, 4.5, 0.5):               # still bad: trips again (at 4)
        b.observe(ln)
    assert srv.calls[-1] == (None, None, None) and len(srv.calls) == 3


def test_healthy_acceptance_never_trips_and_a_pending_restart_is_waited_for():
    srv = StubServer()
    b = SpeculationBreaker(BreakerConfig(enabled=True, window_s=1.0, min_draft_tokens=1), srv, Timeline())
    for ln in ramp(0, 10, 0.95):
        b.observe(ln)
    assert srv.calls == []
    srv.speculative = {"method": None, "draft": None, "num_speculative_tokens": None}   # someone else went plain
    b.observe(line(11, None, None))
    assert srv.calls == [] and b.level == 0


def test_config_rules():
    with pytest.raises(ValidationError, match="soft_rejection 0.3 must be below hard_rejection 0.3"):
        BreakerConfig(soft_rejection=0.3, hard_rejection=0.3)
    with pytest.raises(ValidationError):
        BreakerConfig(window_s=0)
    with pytest.raises(ValidationError):
        BreakerConfig(colour="red")
    assert BreakerConfig().enabled is False
    assert BreakerConfig(soft_rejection=None, hard_rejection=0.5).soft_rejection is None


class StubRouter:
    """Stands in for the load router's control (:class:`harness.stack.router.RouterProcess`;
    the real router is tested in test_router.py): records where new requests were sent."""

    url = "http://127.0.0.1:1"

    def __init__(self, plain: str = "ref", fail: bool = False) -> None:
        self.upstreams = {"spec": "http://127.0.0.1:2", plain: "http://127.0.0.1:3"}
        self.calls: list[str] = []
        self.fail = fail

    def route(self, name: str) -> dict:
        if self.fail:
            raise StackError("the load router did not answer")
        self.calls.append(name)
        return {"active": name, "switched_at": 1000.0 + len(self.calls)}


def routing(**kw) -> tuple[SpeculationBreaker, StubServer, StubRouter, Timeline]:
    tl, srv, router = Timeline(), StubServer(), StubRouter()
    cfg = BreakerConfig(enabled=True, window_s=1.0, min_draft_tokens=1, fallback="route", **kw)
    return SpeculationBreaker(cfg, srv, tl, router=router), srv, router, tl


def test_route_hard_trip_sends_new_requests_to_the_plain_server_and_restarts_nothing():
    b, srv, router, tl = routing()
    for ln in ramp(0, 2, 0.2):
        b.observe(ln)
    assert router.calls == ["ref"] and srv.calls == [] and b.level == 2 and b.routed
    (trip,) = tl.select(event="breaker_tripped")
    assert trip["mechanism"] == "route" and trip["routed_to"] == "ref" and trip["incarnation"] is None
    assert trip["switched_at"] == 1001.0 and trip["breach_t"] == 1.0
    (routed,) = tl.select(source="router")
    assert routed["event"] == "routed" and routed["to"] == "ref" and routed["url"] == "http://127.0.0.1:3"
    for ln in ramp(2.5, 5, 0.2, start=(0, 0)):   # the server still runs the bad draft: no second trip
        b.observe(ln)
    assert router.calls == ["ref"]


def test_route_reenables_after_the_hold_time_and_routes_away_again():
    b, srv, router, tl = routing(reenable_after_s=1.0)
    for ln in ramp(0, 1, 0.5):
        b.observe(ln)
    assert router.calls == ["ref"]
    b.observe(line(1.5, 100, 50))              # no traffic reaches it: flat counters, hold not over
    assert router.calls == ["ref"]
    b.observe(line(2.1, 100, 50))
    assert router.calls == ["ref", "spec"] and b.level == 0 and not b.routed
    for ln in ramp(3, 4.5, 0.5, start=(100, 50)):   # still bad once judged afresh: routed away again
        b.observe(ln)
    assert router.calls == ["ref", "spec", "ref"] and srv.calls == []
    assert [e["event"] for e in tl.select(source="router")] == ["routed", "routed_back", "routed"]
    assert [e["event"] for e in tl.select(source="breaker")] == ["breaker_tripped", "breaker_reenabled",
                                                                 "breaker_tripped"]


def test_route_without_reenable_stays_on_the_plain_server():
    b, _srv, router, _tl = routing()
    for ln in ramp(0, 1, 0.5) + [line(100.0, 50, 25)]:
        b.observe(ln)
    assert router.calls == ["ref"] and b.routed


def test_route_back_when_someone_else_changes_the_speculative_settings():
    """A fault's clear (a swap rolled back) restarts the routed-away server with other settings:
    the breaker closes and new requests go back to it, judged afresh."""
    b, srv, router, tl = routing()
    for ln in ramp(0, 1, 0.5):
        b.observe(ln)
    srv.speculative = {"method": "draft_model", "draft": "/m/draft-exact", "num_speculative_tokens": 4}
    b.observe(line(2.0, 0, 0))
    assert router.calls == ["ref", "spec"] and b.level == 0 and not b.routed
    assert tl.select(event="routed_back")[0]["reason"] == "the speculative server's settings changed"


def test_route_soft_trip_still_restarts_with_fewer_tokens():
    b, srv, router, _tl = routing(soft_rejection=0.2, hard_rejection=0.3)
    for ln in ramp(0, 1, 0.75):               # rejection 0.25: soft
        b.observe(ln)
    assert srv.calls == [("draft_model", "/m/draft-acc20", 2)] and router.calls == [] and b.level == 1


def test_route_a_router_that_fails_is_no_trip_and_is_tried_again():
    b, srv, router, tl = routing()
    router.fail = True
    for ln in ramp(0, 1.5, 0.2):
        b.observe(ln)
    assert b.level == 0 and not tl.select(event="breaker_tripped") and srv.calls == []
    router.fail = False
    b.observe(line(2.0, 200, 40))
    assert router.calls == ["ref"] and b.level == 2


def test_route_config_rules():
    assert BreakerConfig().fallback == "restart"
    assert route_upstream(BreakerConfig(fallback="route")) == "ref"
    standby = BreakerConfig(fallback="route", route_to="http://127.0.0.1:8100/")
    assert standby.route_to == "http://127.0.0.1:8100" and route_upstream(standby) == STANDBY
    for bad in ("spec", "http://10.0.0.1:8000", "http://127.0.0.1", "ftp://127.0.0.1:21"):
        with pytest.raises(ValidationError, match="route_to"):
            BreakerConfig(fallback="route", route_to=bad)
    with pytest.raises(ValidationError):
        BreakerConfig(fallback="reroute")
    with pytest.raises(SpecchaosError, match="needs the load router"):
        SpeculationBreaker(BreakerConfig(enabled=True, fallback="route"), StubServer(), Timeline())
    with pytest.raises(SpecchaosError, match="needs the load router"):
        SpeculationBreaker(BreakerConfig(enabled=True, fallback="route"), StubServer(), Timeline(),
                           router=StubRouter(plain="other"))


def test_breaker_on_the_supervised_fake_falls_back_to_plain(fake_server, tmp_path):
    """A bad draft (the fake accepts draft-acc20's positions with p = 0.2) under greedy load:
    the breaker, fed /metrics lines, restarts the server without speculation."""
    for name in ("target", "draft-acc20"):
        (tmp_path / "models" / name).mkdir(parents=True)
        (tmp_path / "models" / name / "config.json").write_text("{}")
    tl = Timeline()
    srv = fake_server(model_dir=tmp_path / "models" / "target", ready=True, timeline=tl,
                      speculative_config=speculative_config("draft_model", tmp_path / "models" / "draft-acc20", 4))
    b = SpeculationBreaker(BreakerConfig(enabled=True, window_s=1.0, min_draft_tokens=20), srv, tl)
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(trust_env=False, timeout=10) as c:
            while not stop.is_set():
                try:
                    c.post(srv.base_url + "/v1/completions", json={"model": srv.model, "prompt": "p", "max_tokens": 32,
                                                                   "temperature": 0, "ignore_eos": True})
                except httpx.HTTPError:
                    stop.wait(0.1)

    def poll() -> None:   # the tiny local poller (the run feeds the metrics scraper's lines)
        feed_breaker(b, srv.base_url, stop)

    threads = [threading.Thread(target=f, daemon=True) for f in (load, load, poll)]
    for th in threads:
        th.start()
    try:
        ready = srv.wait_for_incarnation(1, 30)
    finally:
        stop.set()
        for th in threads:
            th.join(15)
    assert ready is not None
    (ev,) = tl.select(event="breaker_tripped")
    assert ev["level"] == "hard" and ev["rejection_rate"] > 0.6
    assert srv.speculative["method"] is None and srv.restarts == []
    assert ready - ev["breach_t"] < 10

"""The dense recovery probes (:class:`harness.metrics.health.RecoveryProber`) against the
fake vLLM over real HTTP: a server that goes away and comes back on the same port is seen
back to within 100 ms, and the probes stop once both kinds succeeded after the release."""

from __future__ import annotations

import socket
import time

import pytest

from harness.checks.recovery import recovery_times, resolution
from harness.checks.config import RecoveryConfig
from harness.clock import now
from harness.load.prompts import Prompt
from harness.metrics.health import RecoveryProber
from harness.timeline import Timeline

pytestmark = pytest.mark.timeout(120)

PROMPT = Prompt(prompt_id=0, prompt_class="short", text="hello there", prompt_tokens=2, max_tokens=16)


def test_a_restart_is_resolved_to_100_ms_and_the_probes_stop(fake_vllm, tmp_path):
    first = fake_vllm()
    tl = Timeline(tmp_path / "timeline.jsonl")
    prober = RecoveryProber(tl, "spec", first.base_url, first.base_url, "fake", PROMPT, max_s=60)
    prober.start()
    time.sleep(0.3)
    outage = now()
    first.stop()                                         # the server is gone ...
    time.sleep(1.0)
    prober.release()                                     # ... the fault is cleared, the server not back yet
    second = fake_vllm(port=first.port)                  # back on the same port
    back = now()
    deadline = time.monotonic() + 20
    while not prober.done() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert prober.done()
    time.sleep(0.3)
    prober.stop()
    evs = tl.select()
    res = resolution([], evs, outage)
    print(f"resolution: {res}; server back {back - outage:.3f} s after the outage began")
    assert res["resolution_s"] is not None and res["resolution_s"] <= 0.1, res
    times = recovery_times([], evs, outage, {}, RecoveryConfig())
    assert times["time_to_healthy_s"] is not None and times["time_to_first_success_s"] is not None
    # the probes stopped once done: nothing after a short tail
    last = max(e["t"] for e in evs)
    time.sleep(0.3)
    assert max(e["t"] for e in tl.select()) == last
    assert second.base_url == first.base_url


def test_probes_never_pile_up_on_a_server_that_does_not_answer(tmp_path):
    """A listening socket that never answers: at most ``max_in_flight`` probes of each kind."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    url = f"http://127.0.0.1:{srv.getsockname()[1]}"
    tl = Timeline()
    prober = RecoveryProber(tl, "spec", url, url, "fake", PROMPT, health_timeout_s=1.0, generation_timeout_s=1.0,
                            max_in_flight=3, max_s=1.5)
    prober.start()
    time.sleep(0.6)
    assert prober._in_flight["health"] <= 3 and prober._in_flight["generation"] <= 3
    prober.stop()
    srv.close()
    assert len(tl.select(event="health")) <= 3 * 3    # ~1.5 s of 1 s timeouts, 3 at a time


def test_port_refuses():
    from harness.metrics.health import port_refuses
    srv = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{srv.getsockname()[1]}"
    assert not port_refuses(url, 0.5)
    srv.close()
    assert port_refuses(url, 0.5)
    assert not port_refuses("http://no-such-host.invalid:80", 0.5)   # unresolvable: not "refused"


def test_a_closed_port_is_probed_by_tcp_connects_with_the_same_outcomes(fake_vllm, tmp_path):
    """While nothing listens, the probes after the first of each kind are bare TCP connects
    (``via: "tcp"``) recording what an HTTP probe records (no status, a ``connect`` error),
    on the same schedule; the server's return is seen by HTTP probes within the interval."""
    first = fake_vllm()
    url = first.base_url
    first.stop()
    tl = Timeline(tmp_path / "timeline.jsonl")
    prober = RecoveryProber(tl, "spec", url, url, "fake", PROMPT, max_s=30)
    prober.start()
    prober.release()
    time.sleep(1.0)
    down = tl.select()
    health = [e for e in down if e["event"] == "health"]
    gen = [e for e in down if e["event"] == "generation_probe"]
    assert all(e["status"] is None for e in health)
    assert all(e["ok"] is False and e["error"] == "connect" and e["status"] is None for e in gen)
    tcp_h = [e for e in health if e.get("via") == "tcp"]
    tcp_g = [e for e in gen if e.get("via") == "tcp"]
    assert len(tcp_h) >= len(health) - 3 and len(tcp_g) >= len(gen) - 3   # HTTP only for the first few
    assert 25 <= len(health) <= 45 and 12 <= len(gen) <= 23              # 25 ms and 50 ms over 1 s
    for e in tcp_g:
        # a refused connect: the probe's own time, no absolute bound (a loaded host stretches it)
        assert e["t"] >= e["send_time"] and e["latency_s"] == pytest.approx(e["t"] - e["send_time"], abs=0.01)
    outage = now()
    second = fake_vllm(port=first.port)
    deadline = time.monotonic() + 20
    while not prober.done() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert prober.done()
    prober.stop()
    evs = tl.select()
    res = resolution([], evs, outage - 0.5)
    assert res["resolution_s"] is not None and res["resolution_s"] <= 0.1, res
    assert any(e["event"] == "health" and e["status"] == 200 and "via" not in e for e in evs)
    second.stop()


def test_health_sampler_checks_a_refusing_port_first(fake_vllm):
    from harness.metrics.health import HealthSampler
    first = fake_vllm()
    first.stop()
    tl = Timeline()
    sampler = HealthSampler(tl, "spec", first.base_url, interval_s=0.05)
    sampler.start()
    time.sleep(0.5)
    second = fake_vllm(port=first.port)
    time.sleep(0.5)
    sampler.stop()
    evs = tl.select(event="health")
    down = [e for e in evs if e["status"] is None]
    assert len(down) >= 5 and all(e.get("via") == "tcp" for e in down[1:])
    assert "via" not in down[0]                      # the first refusal came from an HTTP request
    assert evs[-1]["status"] == 200 and "via" not in evs[-1]
    second.stop()

"""The metrics scraper against the fake vLLM (the one streaming fake, real process tree)
and against a tiny local HTTP server that answers wrong (non-200, garbage, too slowly):
successful scrapes carry the counters, failed ones are gap lines (never zeros),
subscribers see every line, non-loopback is refused, stop is bounded."""

from __future__ import annotations

import contextlib
import http.server
import json
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import httpx
import psutil
import pytest

from harness.errors import SpecchaosError
from harness.metrics.scraper import METRICS_FILE, MetricsScraper, tree_rss_bytes
from harness.metrics.speculation import DRAFT_TOKENS, SpeculationSeries, acceptance, read_series
from harness.timeline import Timeline


def generate(base_url: str, n: int, model: str = "fake") -> None:
    with httpx.Client(timeout=10) as c:
        for i in range(n):
            r = c.post(f"{base_url}/v1/completions",
                       json={"model": model, "prompt": f"p{i}", "max_tokens": 16, "temperature": 0})
            r.raise_for_status()


def test_scrapes_the_fake_vllm_and_subscribers_see_every_line(tmp_path, fake_vllm):
    fake = fake_vllm(num_speculative_tokens=4)
    seen: list[dict] = []
    tl = Timeline()
    s = MetricsScraper(tmp_path / METRICS_FILE, {"spec": fake}, interval_s=0.1, timeline=tl)
    s.subscribe(seen.append)
    s.subscribe(lambda line: 1 / 0)        # a broken subscriber: logged, recording goes on
    s.start()
    time.sleep(0.3)
    generate(fake.base_url, 4)
    time.sleep(0.4)
    t0 = time.monotonic()
    s.stop()
    assert time.monotonic() - t0 < s.timeout_s + 1.0   # no join ran out (that would leave a thread alive)
    assert not any(th.is_alive() for th in s._threads)
    lines = read_series(tmp_path / METRICS_FILE)
    assert len(lines) >= 5 and lines == seen
    assert all(ln["ok"] and ln["server"] == "spec" and ln["pid"] == fake.pid for ln in lines)
    last = lines[-1]
    assert set(last) >= {"t", "server", "ok", "counters", "per_position", "gauges", "histograms", "rss_bytes"}
    assert last["counters"][DRAFT_TOKENS] > 0 and set(last["per_position"]) == {"0", "1", "2", "3"}
    assert "vllm:num_requests_running" in last["gauges"] and "vllm:kv_cache_usage_perc" in last["gauges"]
    assert last["rss_bytes"] == pytest.approx(tree_rss_bytes(fake.api_process()), rel=0.5)
    a = acceptance(SpeculationSeries(lines), lines[0]["t"], lines[-1]["t"] + 1)
    assert 0.5 < a["acceptance_rate"] <= 1.0 and 1 < a["mean_acceptance_length"] <= 5.0
    (ev,) = tl.select(event="metrics_scraper")
    assert ev["servers"] == ["spec"] and ev["interval_s"] == 0.1


def test_a_dead_server_is_a_gap_never_zeros(tmp_path, fake_vllm):
    fake = fake_vllm(num_speculative_tokens=4)
    s = MetricsScraper(tmp_path / METRICS_FILE, {"spec": fake}, interval_s=0.1, timeout_s=1.0)
    s.start()
    time.sleep(0.35)
    fake.stop()
    time.sleep(0.5)
    s.stop()
    lines = read_series(tmp_path / METRICS_FILE)
    gaps = [ln for ln in lines if not ln["ok"]]
    assert lines[0]["ok"] and gaps and not lines[-1]["ok"]
    for g in gaps:
        assert "counters" not in g and g["error"] and "\n" not in g["error"]
    assert gaps[-1]["rss_bytes"] is None and gaps[-1]["pid"] is None


class _Wrong(http.server.BaseHTTPRequestHandler):
    mode = "500"

    def do_GET(self):   # noqa: N802
        if self.mode == "slow":
            time.sleep(1.0)
        body = b"vllm:x{unterminated 1\n" if self.mode == "garbage" else b"oops"
        try:
            self.send_response(200 if self.mode in ("garbage", "slow") else 500)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:   # the scraper timed out and hung up first
            pass

    def log_message(self, *a):
        pass


@pytest.mark.parametrize("mode,error", [("500", "HTTP 500"), ("garbage", "ValueError"), ("slow", "TimeoutError")])
def test_non_200_unparsable_and_slow_answers_are_gaps(tmp_path, mode, error):
    handler = type("H", (_Wrong,), {"mode": mode})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        server = SimpleNamespace(base_url=f"http://127.0.0.1:{srv.server_port}", api_process=lambda: psutil.Process(),
                                 roles=lambda: {})   # process ids (capability processes): RSS recorded
        s = MetricsScraper(tmp_path / METRICS_FILE, {"spec": server}, interval_s=0.1, timeout_s=0.3)
        s.start()
        time.sleep(0.5)
        s.stop()
    finally:
        srv.shutdown()
        srv.server_close()
    lines = read_series(tmp_path / METRICS_FILE)
    assert lines and all(not ln["ok"] and ln["error"].startswith(error) for ln in lines), lines
    assert all(ln["rss_bytes"] > 0 for ln in lines)      # the process still has memory: recorded anyway


def test_non_loopback_is_refused(tmp_path):
    server = SimpleNamespace(base_url="http://10.1.2.3:8000", api_process=lambda: None)
    with pytest.raises(SpecchaosError, match="not loopback"):
        MetricsScraper(tmp_path / METRICS_FILE, {"spec": server})
    with pytest.raises(ValueError):
        MetricsScraper(tmp_path / METRICS_FILE, {}, interval_s=0)


def test_tree_rss_sums_the_process_tree(fake_vllm):
    fake = fake_vllm(num_speculative_tokens=4)
    tree = fake.tree()
    assert len(tree) >= 3                               # api, engine, worker
    assert tree_rss_bytes(fake.api_process()) >= sum(p.memory_info().rss for p in tree) * 0.8
    assert tree_rss_bytes(None) is None
    json.dumps(tree_rss_bytes(fake.api_process()))


def test_the_tree_cache_walks_the_host_only_when_the_tree_may_have_changed(monkeypatch):
    from harness.metrics.scraper import TreeCache, tree_memory

    with parent_with_child(reaps=True) as api:
        walks = []
        real = psutil.Process.children
        monkeypatch.setattr(psutil.Process, "children", lambda self, recursive=False: walks.append(1) or real(self, recursive=recursive))
        cache = TreeCache(refresh_s=60)
        first = cache.memory(api)
        assert first[1] == tree_memory(api)[1] and len(first[1]) == 2 and first[0] > 0
        n = len(walks)
        assert cache.memory(api)[1] == first[1] and len(walks) == n       # known members only: no walk
        child = api.children()[0]
        child.kill()            # the parent reaps it
        assert psutil.wait_procs([child], timeout=5)[1] == []
        assert cache.memory(api)[1] == [api.pid] and len(walks) > n       # a member gone: walked again
        assert cache.memory(None) == (None, [])


def test_a_zombie_member_is_not_counted_so_a_dying_tree_is_another_tree():
    """Measured in the bad-draft run: vLLM's API process answered /metrics while its killed
    engine awaited reaping; its RSS then read 632 MiB against 3043 a moment before, under the
    same tree_pids, and the memory check called that a swing of 3.8. A zombie (exited, not
    reaped: its RSS reads 0) is no member: the tree's pids change with it."""
    from harness.metrics.scraper import TreeCache, tree_memory

    with parent_with_child(reaps=False) as api:   # once killed, the child stays a zombie
        cache = TreeCache(refresh_s=60)
        (child,) = api.children()
        assert len(cache.memory(api)[1]) == 2
        child.kill()
        for _ in range(100):
            if child.status() == psutil.STATUS_ZOMBIE:
                break
            time.sleep(0.05)
        assert tree_memory(api)[1] == [api.pid]
        assert cache.memory(api)[1] == [api.pid]


@contextlib.contextmanager
def parent_with_child(*, reaps: bool):
    """A Python process with one sleeping child, as a psutil.Process once the child exists;
    ``reaps``: the parent waits for (reaps) its child, else a killed child stays a zombie.
    Both are killed on the way out."""
    wait = "c.wait(); " if reaps else ""
    code = ("import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; "
            f"time.sleep(60)']); {wait}time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        api = psutil.Process(parent.pid)
        for _ in range(100):
            if api.children():
                break
            time.sleep(0.05)
        yield api
    finally:
        for p in psutil.Process(parent.pid).children(recursive=True):
            p.kill()
        parent.kill()
        parent.wait()


class _Supervised:
    """A supervised server's face over the fake vLLM: its processes, and an incarnation
    number that a restart beginning mid-read (``bump_on_read``) moves on."""

    def __init__(self, fake, incarnation: int, bump_on_read: bool = False):
        self.fake, self.base_url, self._n, self.bump = fake, fake.base_url, incarnation, bump_on_read

    @property
    def incarnation(self) -> int:
        n = self._n
        self._n += int(self.bump)
        return n

    def api_process(self):
        return self.fake.api_process()

    def roles(self):
        return self.fake.roles()


def test_lines_carry_the_supervisor_s_incarnation_number(fake_vllm):
    """Every line names the incarnation of the process it read; a restart that began while
    the line was read leaves it without one (which process answered is then unknown)."""
    from harness.metrics.scraper import scrape_line

    fake = fake_vllm(num_speculative_tokens=4)
    with httpx.Client(timeout=5) as client:
        line = scrape_line(client, "spec", _Supervised(fake, 3))
        assert line["ok"] and line["incarnation"] == 3 and line["pid"] == fake.pid
        assert scrape_line(client, "spec", _Supervised(fake, 3, bump_on_read=True))["incarnation"] is None
        assert scrape_line(client, "spec", fake)["incarnation"] is None    # no supervisor counting

"""The fault proxy (:mod:`faults.proxy`) as its own process, against a local echo server:
every toxic measured on real sockets with fixed seeds, toxics added and removed without
dropping a healthy connection, the same seed giving the same decisions, bad input, and no
proxy left after its harness was SIGKILLed and ``specchaos cleanup`` ran."""

from __future__ import annotations

import json
import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from faults.cleanup import cleanup
from faults.proxied import ProxyProcess
from harness.ports import port_in_use
from faults.toxics import affected, connection_rng
from harness.errors import FaultError

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        try:
            while data := self.request.recv(65536):
                self.request.sendall(data)
        except OSError:
            pass


@pytest.fixture
def echo():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def proxy(echo):
    made = []

    def make(seed: int = 1234) -> ProxyProcess:
        p = ProxyProcess.start("echo", echo, seed)
        made.append(p)
        return p

    yield make
    for p in made:
        p.stop()
        assert not psutil.pid_exists(p.pid) or psutil.Process(p.pid).status() == psutil.STATUS_ZOMBIE


def connect(p: ProxyProcess) -> socket.socket:
    host, port = p.listen.split(":")
    s = socket.create_connection((host, int(port)), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def roundtrip(s: socket.socket, data: bytes) -> tuple[bytes, float]:
    t0 = time.perf_counter()
    s.sendall(data)
    got = b""
    while len(got) < len(data):
        piece = s.recv(65536)
        if not piece:
            break
        got += piece
    return got, time.perf_counter() - t0


def test_without_toxics_bytes_pass_unchanged(proxy):
    p = proxy()
    with connect(p) as s:
        payload = os.urandom(200_000)
        got, _ = roundtrip(s, payload)
    assert got == payload


def test_latency_is_measured_and_toxics_come_and_go_without_dropping_the_connection(proxy):
    p = proxy()
    with connect(p) as s:
        _, fast = roundtrip(s, b"ping")
        p.client.add_toxic("echo", {"name": "lag", "type": "latency", "stream": "downstream",
                                    "attributes": {"latency": 300, "jitter": 0}})
        got, slow = roundtrip(s, b"ping")
        assert got == b"ping" and 0.295 < slow < fast + 1.5, (fast, slow)   # fast: the control, same connection
        assert p.client.remove_toxic("echo", "lag") and not p.client.remove_toxic("echo", "lag")
        got, again = roundtrip(s, b"ping")                      # the same connection, healthy again
        assert got == b"ping" and again < (fast + slow) / 2, (fast, slow, again)   # nearer the control than the lag
    added = p.client.stats()["toxics"]["lag"]["added_ms"]
    assert added["count"] == 1 and 299 <= added["mean"] < 1000


def test_upstream_latency_with_normal_jitter(proxy):
    p = proxy()
    p.client.add_toxic("echo", {"name": "j", "type": "latency", "stream": "upstream",
                                "attributes": {"latency": 40, "jitter": 10, "distribution": "normal"}})
    with connect(p) as s:
        times = [roundtrip(s, b"x")[1] for _ in range(10)]
    assert min(times) > 0.005 and 0.03 < sorted(times)[5] < 0.2, times


def test_the_same_seed_gives_the_same_toxic_decisions_for_the_same_connections(proxy):
    """Timing-free: a ``limit_data`` of 1 byte marks each affected connection (it gets 1 byte
    back, then the close); an unaffected one gets its whole echo."""
    def pattern(seed: int) -> list[bool]:
        p = proxy(seed)
        p.client.add_toxic("echo", {"name": "half", "type": "limit_data", "toxicity": 0.5, "attributes": {"bytes": 1}})
        cut = []
        for _ in range(12):
            with connect(p) as s:
                got, _ = roundtrip(s, b"hello")
                cut.append(got == b"h")
                assert got in (b"h", b"hello")
        p.stop()
        return cut

    first = pattern(42)
    assert pattern(42) == first
    assert first == [affected(connection_rng(42, "half", i), 0.5) for i in range(12)]   # as the seed predicts
    assert 0 < sum(first) < 12 and pattern(43) != first


def test_bandwidth_limits_throughput(proxy):
    p = proxy()
    p.client.add_toxic("echo", {"name": "bw", "type": "bandwidth", "attributes": {"rate": 100}})   # 100 KB/s
    with connect(p) as s:
        got, took = roundtrip(s, b"y" * 50_000)
    assert len(got) == 50_000 and 0.4 < took < 3.0, took


def test_slicer_splits_but_keeps_every_byte(proxy):
    p = proxy()
    p.client.add_toxic("echo", {"name": "sl", "type": "slicer",
                                "attributes": {"average_size": 10, "size_variation": 5, "delay": 1000}})
    payload = bytes(range(256)) * 4
    with connect(p) as s:
        got, took = roundtrip(s, payload)
    st = p.client.stats()["toxics"]["sl"]
    assert got == payload and st["pieces"] >= len(payload) // 15 and took > 0.05


def test_limit_data_cuts_after_n_bytes(proxy):
    p = proxy()
    p.client.add_toxic("echo", {"name": "lim", "type": "limit_data", "attributes": {"bytes": 1000}})
    with connect(p) as s:
        s.sendall(b"z" * 5000)
        got = b""
        while piece := s.recv(65536):
            got += piece
    assert got == b"z" * 1000
    st = p.client.stats()["toxics"]["lim"]
    assert st["closed"] == 1 and st["bytes_cut"] > 0


def test_reset_peer_resets_the_client(proxy):
    p = proxy()
    p.client.add_toxic("echo", {"name": "rst", "type": "reset_peer", "stream": "upstream", "attributes": {"timeout": 50}})
    with connect(p) as s:
        s.sendall(b"hello")
        with pytest.raises(ConnectionResetError):
            for _ in range(50):
                if not s.recv(100):
                    break
    assert p.client.stats()["toxics"]["rst"]["resets"] == 1


def test_timeout_blackholes_then_closes(proxy):
    p = proxy()
    p.client.add_toxic("echo", {"name": "bh", "type": "timeout", "attributes": {"timeout": 300}})
    with connect(p) as s:
        t0 = time.perf_counter()
        s.sendall(b"anyone?")
        assert s.recv(100) == b""                              # nothing came back, then the close
        assert time.perf_counter() - t0 >= 0.28
    assert p.client.stats()["toxics"]["bh"]["bytes_dropped"] == 7


def test_bad_toxics_are_refused_with_the_field(proxy):
    p = proxy()
    for toxic, needle in [({"type": "nope"}, "type"), ({"type": "latency", "attributes": {"latency": -5}}, "latency"),
                          ({"type": "latency", "toxicity": 2}, "toxicity"), ({"type": "latency", "stream": "x"}, "stream")]:
        with pytest.raises(FaultError) as err:
            p.client.add_toxic("echo", toxic)
        assert needle in str(err.value) and "HTTP 400" in str(err.value)
    assert p.client.toxics("echo") == []


def test_a_port_in_use_or_a_remote_upstream_starts_nothing(echo):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(FaultError, match="in use|Address already"):
            ProxyProcess.start("echo", echo, 1, listen_port=port)
    with pytest.raises(FaultError, match="not a loopback address"):
        ProxyProcess.start("echo", "10.1.2.3:80", 1)


HARNESS = r'''
import sys, time
from harness.state import RunState, set_current
from faults.proxied import ProxyProcess
state = RunState(sys.argv[2])
set_current(state)
p = ProxyProcess.start("echo", sys.argv[1], 1)
print(p.pid, p.listen, flush=True)
time.sleep(600)
'''


def test_a_sigkilled_harness_leaves_no_proxy_after_cleanup(echo, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAOS_STATE_DIR", str(tmp_path / "state"))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    harness = subprocess.Popen([sys.executable, "-c", HARNESS, echo, str(tmp_path)], stdout=subprocess.PIPE,
                               env=env, cwd=ROOT, text=True)
    try:
        pid, listen = harness.stdout.readline().split()
        pid, port = int(pid), int(listen.split(":")[1])
        assert psutil.pid_exists(pid) and port_in_use("127.0.0.1", port)
        state = json.loads(next((tmp_path / "state" / "runs").glob("*.json")).read_text())
        assert [p["role"] for p in state["processes"]] == ["proxy"]
    finally:   # never leave the stand-in harness (and its proxy) behind, even when a check fails
        harness.send_signal(signal.SIGKILL)
        harness.wait(10)
        harness.stdout.close()
    result = cleanup(tmp_path / "state", grace_s=2)
    deadline = time.monotonic() + 10
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the proxy survived cleanup"
        time.sleep(0.1)
    assert not port_in_use("127.0.0.1", port), "the proxy's port is still bound"
    assert result["errors"] == [] and not list((tmp_path / "state" / "runs").glob("*.json"))


def test_a_sliced_sse_stream_reaches_the_client_intact(fake_vllm):
    """The slicer splits vLLM's SSE chunks (here the fake's) into 7 ± 5 byte pieces: the
    load's client still reassembles exactly the same events."""
    from harness.load.client import make_client, stream_completion
    from harness.load.prompts import Prompt

    fake = fake_vllm()
    p = ProxyProcess.start("spec", fake.base_url.split("//")[1], 3)
    try:
        prompt = Prompt(prompt_id=0, prompt_class="short", text="hello there", prompt_tokens=3, max_tokens=12)
        with make_client() as c:
            direct = stream_completion(c, fake.base_url, "fake", prompt, timeout_s=10)
            p.client.add_toxic("spec", {"name": "sl", "type": "slicer",
                                        "attributes": {"average_size": 7, "size_variation": 5, "delay": 200}})
            sliced = stream_completion(c, f"http://{p.listen}", "fake", prompt, timeout_s=10)
        assert direct.ok and sliced.ok, (sliced.error, sliced.error_detail)
        assert sliced.token_ids == direct.token_ids and sliced.text == direct.text
        assert sliced.chunk_tokens == direct.chunk_tokens and sliced.output_tokens == direct.output_tokens
        assert p.client.stats()["toxics"]["sl"]["pieces"] > 50
    finally:
        p.stop()

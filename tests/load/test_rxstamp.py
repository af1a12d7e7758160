"""Chunks are stamped when their data arrived, not when the client got round to parsing
them (:mod:`harness.load.rxstamp`): a client busy for 40 ms per chunk records every chunk
without that backlog, while its own parse instants (the control, in the same request) and the
same client without stamps carry it (the defect this guards against). How close the stamps
come to the server's send instant is measured by bench/loadgen_capacity.py (timing_error_ms), not
asserted here (a host's own delay is not the client's)."""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from harness.load import client as client_mod
from harness.load import rxstamp
from harness.load.client import make_client, stream_completion
from harness.load.prompts import Prompt

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from sse_server import send_times_ns  # noqa: E402

PROMPT = Prompt(prompt_id=0, prompt_class="short", text="hi", prompt_tokens=2, max_tokens=8)
BUSY_S = 0.04


@pytest.fixture(scope="module")
def sse_server():
    """bench/sse_server.py: 4 chunks, 5 ms apart, each stamped with its send instant."""
    import subprocess
    srv = subprocess.Popen([sys.executable, str(Path(__file__).resolve().parents[2] / "bench" / "sse_server.py"),
                            "--port", "0", "--chunks", "4", "--tokens-per-chunk", "2", "--gap-ms", "5"],
                           stdout=subprocess.PIPE, text=True)
    try:
        line = srv.stdout.readline()
        assert line.startswith("listening "), line
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        srv.terminate()
        srv.wait(5)


def lateness_ms(rec) -> list[float]:
    sent = send_times_ns(rec.text)
    assert len(sent) == len(rec.chunk_offsets_s) == 4
    return [((rec.send_time + off) - ns / 1e9) * 1000.0 for off, ns in zip(rec.chunk_offsets_s, sent)]


def arrival_ahead_of_parse_ms(rec) -> float:
    """How far the last chunk's arrival stamp is ahead of the instant the client parsed it (ms):
    the backlog a parse-time stamp would carry (0 for such a stamp)."""
    return (rec.read_offsets_s[-1] - rec.chunk_offsets_s[-1]) * 1000.0


def busy_take_chunk(monkeypatch):
    """The client spends BUSY_S on every chunk after stamping it (a loaded load process)."""
    real = client_mod._take_chunk

    def slow(*args, **kwargs):
        real(*args, **kwargs)
        time.sleep(BUSY_S)
    monkeypatch.setattr(client_mod, "_take_chunk", slow)


def test_stamps_are_arrival_not_parse_time(sse_server, monkeypatch):
    with make_client(2) as c:
        # the host turns receive stamping on a moment after the first socket asks for it
        # (rxstamp's module doc): one request before measuring
        assert stream_completion(c, sse_server, "m", PROMPT, timeout_s=10).ok
        time.sleep(0.05)
        busy_take_chunk(monkeypatch)
        recs = [stream_completion(c, sse_server, "m", PROMPT, timeout_s=10, read_stamps=True) for _ in range(3)]
    assert all(r.ok for r in recs)
    late = [x for r in recs for x in lateness_ms(r)]
    # the client fell 40, 80, 120 ms behind: its parse instants show it, the stamps do not
    for r in recs:
        assert arrival_ahead_of_parse_ms(r) > 2 * BUSY_S * 1000.0 * 0.9, (late, arrival_ahead_of_parse_ms(r))
    assert min(late) > -1.0, late   # never before the server sent it
    for r in recs:
        assert r.chunk_offsets_s == sorted(r.chunk_offsets_s)
        assert r.ttft_s == r.chunk_offsets_s[0]
        assert r.e2e_s >= r.chunk_offsets_s[-1]


def test_read_stamps_keep_the_parse_instants_beside_the_arrivals(sse_server, monkeypatch):
    """``read_stamps``: the same busy client also records when it parsed each chunk (where
    ``vllm bench serve`` stamps): those show the backlog the arrival stamps leave out."""
    with make_client(2) as c:
        plain = stream_completion(c, sse_server, "m", PROMPT, timeout_s=10)
        time.sleep(0.05)
        busy_take_chunk(monkeypatch)
        rec = stream_completion(c, sse_server, "m", PROMPT, timeout_s=10, read_stamps=True)
    assert plain.read_offsets_s is None and plain.e2e_read_s is None
    assert rec.ok and len(rec.read_offsets_s) == len(rec.chunk_offsets_s) == 4
    behind = [(r - a) * 1000.0 for r, a in zip(rec.read_offsets_s, rec.chunk_offsets_s)]
    assert all(b >= 0 for b in behind), behind      # an arrival is never after its parse
    assert behind[-1] > 2 * BUSY_S * 1000.0 * 0.9, behind   # 3 chunks of 40 ms backlog
    assert rec.e2e_read_s >= rec.read_offsets_s[-1] and rec.e2e_read_s >= rec.e2e_s
    assert min(lateness_ms(rec)) > -1.0


def test_without_stamps_the_backlog_shows(sse_server, monkeypatch):
    """The same busy client on a plain httpx.Client (parse-time stamps): chunks read late."""
    busy_take_chunk(monkeypatch)
    with httpx.Client(trust_env=False) as c:
        rec = stream_completion(c, sse_server, "m", PROMPT, timeout_s=10)
    late = lateness_ms(rec)
    assert late[-1] > 2 * BUSY_S * 1000.0 * 0.9, late


def test_make_client_streams_are_stamped(sse_server):
    with make_client(2) as c:
        seen = []

        def hook(response):
            seen.append(response.extensions.get("network_stream"))
        c.event_hooks["response"] = [hook]
        assert stream_completion(c, sse_server, "m", PROMPT, timeout_s=10).ok
    assert isinstance(seen[0], rxstamp.StampedStream)   # fails if httpx's internals moved
    assert seen[0].kernel == rxstamp.KERNEL_STAMPS
    assert rxstamp.last_rx_s(seen[0]) == pytest.approx(time.time(), abs=5.0)
    assert rxstamp.last_rx_s(object()) is None


@pytest.mark.skipif(not rxstamp.KERNEL_STAMPS, reason="kernel receive stamps need Linux")
def test_kernel_stamp_is_the_arrival_of_the_bytes():
    """Bytes that waited 100 ms in the socket buffer carry their arrival, not the read."""
    backend = rxstamp.StampingBackend()
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    accepted: list[socket.socket] = []
    th = threading.Thread(target=lambda: accepted.append(srv.accept()[0]))
    th.start()
    stream = backend.connect_tcp("127.0.0.1", port, timeout=2)
    th.join(2)
    try:
        # Linux turns receive stamping on for the host a moment after the first socket asks
        # (a deferred static key), so the very first segments may come unstamped (the stream
        # then stamps the read, as documented): one exchange first
        accepted[0].sendall(b"w")
        assert stream.read(10, timeout=2) == b"w"
        time.sleep(0.05)
        before = time.time_ns()
        accepted[0].sendall(b"x")   # on loopback the kernel stamps inside the sender's send
        after = time.time_ns()
        time.sleep(0.1)
        assert stream.read(10, timeout=2) == b"x"
        read_at = time.time_ns()
        assert stream.kernel
        assert stream.last_rx_ns >= before - 1_000_000    # never before the send
        # the stamp is the arrival, not the read 100 ms later (on a busy host the kernel may
        # stamp a little after the send returned: its receive work can be deferred)
        assert read_at - stream.last_rx_ns >= 50_000_000, (stream.last_rx_ns - after, read_at - after)
        accepted[0].close()
        assert stream.read(10, timeout=2) == b""
    finally:
        stream.close()
        srv.close()


def test_read_errors_map_to_httpcore():
    import httpcore
    backend = rxstamp.StampingBackend()
    srv = socket.create_server(("127.0.0.1", 0))
    stream = backend.connect_tcp("127.0.0.1", srv.getsockname()[1], timeout=2)
    try:
        with pytest.raises(httpcore.ReadTimeout):
            stream.read(10, timeout=0.05)
    finally:
        stream.close()
        srv.close()

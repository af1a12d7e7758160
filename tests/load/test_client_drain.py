"""The client reads the body to its end after ``data: [DONE]`` so keep-alive connections are
reused (as ``vllm bench serve``'s client and the OpenAI SDK do), and that drain is bounded:
a server that keeps the body open after ``[DONE]`` costs the connection, never the request.

A hand-written HTTP/1.1 server (threads, raw sockets) counts the connections it accepts."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.load import client as client_mod
from harness.load.client import make_client, stream_completion
from harness.load.prompts import Prompt

PROMPT = Prompt(prompt_id=0, prompt_class="short", text="hi", prompt_tokens=2, max_tokens=4)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj) -> bytes:
    return _chunk(b"data: " + (obj if isinstance(obj, str) else json.dumps(obj)).encode() + b"\n\n")


class KeepAliveServer:
    """Answers each completion with a 2-chunk stream; ``after_done``: ``"end"`` (the chunked
    terminator right after ``[DONE]``, as uvicorn), ``"hold"`` (nothing more, socket kept
    open for ``hold_s``), ``"extra"`` (one more event, then the terminator)."""

    def __init__(self, after_done: str = "end", hold_s: float = 5.0):
        self.after_done, self.hold_s = after_done, hold_s
        self.connections = 0
        self.requests = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(buf) < length:
                    buf += conn.recv(65536)
                buf = buf[length:]
                self.requests += 1
                out = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                for i, finish in ((0, None), (1, "length")):
                    out += _event({"choices": [{"index": 0, "text": f" w{i}", "token_ids": [2 * i, 2 * i + 1],
                                                "finish_reason": finish}], "usage": None})
                out += _event({"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 4}})
                out += _event("[DONE]")
                if self.after_done == "hold":
                    conn.sendall(out)
                    time.sleep(self.hold_s)
                    return
                if self.after_done == "extra":
                    out += _event({"choices": [{"index": 0, "text": "late", "finish_reason": None}]})
                conn.sendall(out + b"0\r\n\r\n")

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


@pytest.fixture()
def server(request):
    srv = KeepAliveServer(*getattr(request, "param", ("end",)))
    yield srv
    srv.close()


def test_connection_is_reused_across_requests(server):
    with make_client(2) as c:
        recs = [stream_completion(c, server.url, "m", PROMPT, timeout_s=5) for _ in range(5)]
    assert all(r.ok for r in recs), [r.error for r in recs]
    assert recs[0].chunk_tokens == [2, 2] and recs[0].output_tokens == 4
    assert (server.requests, server.connections) == (5, 1)


@pytest.mark.parametrize("server", [("extra",)], indirect=True)
def test_events_after_done_are_ignored(server):
    with make_client(2) as c:
        recs = [stream_completion(c, server.url, "m", PROMPT, timeout_s=5) for _ in range(2)]
    assert all(r.ok for r in recs) and recs[0].text == " w0 w1"
    assert server.connections == 1


@pytest.mark.parametrize("server", [("hold", 5.0)], indirect=True)
def test_a_body_held_open_after_done_costs_the_connection_not_the_request(server):
    with make_client(2) as c:
        t0 = time.monotonic()
        r = stream_completion(c, server.url, "m", PROMPT, timeout_s=30)
        took = time.monotonic() - t0
    assert r.ok and r.error is None and r.done
    assert took >= client_mod.DRAIN_LIMIT_S * 0.9
    # E2E ends at [DONE], not at the drain's end: the drain (DRAIN_LIMIT_S) is most of the call
    assert r.e2e_s < took - 0.8 * client_mod.DRAIN_LIMIT_S, (r.e2e_s, took)
    # the drain gave up after DRAIN_LIMIT_S, not after the 30 s timeout nor the body's 5 s hold
    assert took - r.e2e_s < client_mod.DRAIN_LIMIT_S + 0.5 * (5.0 - client_mod.DRAIN_LIMIT_S), (r.e2e_s, took)


GEVENT_SCRIPT = r"""
from gevent import monkey; monkey.patch_all()
import sys, time, gevent, json
from harness.load.client import make_client, stream_completion
from harness.load.prompts import Prompt
p = Prompt(0, "short", "x", 1, 4)
url = sys.argv[1]
out = {}
with make_client() as c:
    t0 = time.monotonic()
    r = stream_completion(c, url, "m", p, timeout_s=30)
    out["drained"] = [r.ok, r.error, round(time.monotonic() - t0, 3)]
    seen = []
    g = gevent.spawn(stream_completion, c, url, "m", p, timeout_s=30, on_interrupt=seen.append)
    gevent.sleep(0.4)
    g.kill(block=True)
    out["interrupted"] = [seen[0].ok, seen[0].error, seen[0].done] if seen else None
print(json.dumps(out))
"""


@pytest.mark.parametrize("server", [("hold", 5.0)], indirect=True)
def test_under_gevent_the_drain_is_bounded_and_an_interrupt_there_keeps_the_record(server, tmp_path):
    """Locust runs the client in greenlets: the drain's bound must hold there, and a user
    stopped while draining (locust's stop) hands over its complete record as a success."""
    script = tmp_path / "g.py"
    script.write_text(GEVENT_SCRIPT)
    res = subprocess.run([sys.executable, str(script), server.url], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2])
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    ok, error, took = out["drained"]
    assert ok and error is None and took < client_mod.DRAIN_LIMIT_S + 1.0
    assert out["interrupted"] == [True, None, True]

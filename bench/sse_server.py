"""A trivial streaming completions server for benchmarking the load generator (no vLLM).

It answers every ``POST /v1/completions`` at once with a vLLM-shaped SSE stream (HTTP/1.1,
chunked, keep-alive, one HTTP chunk per SSE event, as uvicorn writes vLLM's stream):
``--chunks`` output events of ``--tokens-per-chunk`` token ids each, ``--gap-ms`` apart,
the last with ``finish_reason`` ``"length"``, then a usage event and ``data: [DONE]``; a
request whose ``model`` is ``gap:<ms>`` gets that gap instead of ``--gap-ms``.
Each output event's ``text`` is `` t<ns>``: the server's wall clock (``time.time_ns()``)
taken just before that event was written to the socket, so a client can compare its own
arrival time of the chunk with the send time (:func:`send_times_ns`).
``GET /health`` answers 200. Anything else: 404.

    python bench/sse_server.py --port P [--chunks 8] [--tokens-per-chunk 4] [--gap-ms 1]

Prints ``listening <port>`` once it accepts connections. asyncio with uvloop when installed
(vllm brings it), a bare ``asyncio.Protocol``: it costs far less CPU per request than the
client it measures, so a client pinned to its own core is the bottleneck.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from typing import Iterator

_TEXT = re.compile(r" t(\d+)")


@contextlib.contextmanager
def serving(chunks: int, tokens_per_chunk: int, gap_ms: float,
            cpu: int | None = None) -> Iterator[tuple[str | None, subprocess.Popen]]:
    """This server in a child process on a free loopback port (pinned to core ``cpu`` when
    given): ``(base URL, process)``, the URL None when it did not start (its first line is
    then printed on stderr); terminated (killed after 5 s) on leaving."""
    cmd = [sys.executable, __file__, "--port", "0", "--chunks", str(chunks), "--tokens-per-chunk",
           str(tokens_per_chunk), "--gap-ms", str(gap_ms)]
    srv = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                           preexec_fn=(lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None)
    try:
        line = srv.stdout.readline() if srv.stdout else ""
        if not line.startswith("listening "):
            print(f"the SSE server did not start: {line!r}", file=sys.stderr)
            yield None, srv
        else:
            yield f"http://127.0.0.1:{int(line.split()[1])}", srv
    finally:
        srv.terminate()
        try:
            srv.wait(timeout=5)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()


def send_times_ns(text: str) -> list[int]:
    """The server's send instants (epoch ns) carried in a response's joined ``text``, one
    per output chunk, in order."""
    return [int(m) for m in _TEXT.findall(text)]


def _chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj: dict | str) -> bytes:
    body = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return _chunk(b"data: " + body.encode() + b"\n\n")


_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
         b"transfer-encoding: chunked\r\n\r\n")
_HEALTH = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"
_DONE = _event("[DONE]") + b"0\r\n\r\n"


class Stream(asyncio.Protocol):
    """One connection: reads requests (Content-Length bodies), answers each in turn."""

    def __init__(self, args: argparse.Namespace, counter: list[int]):
        self.args = args
        self.counter = counter
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.busy: asyncio.Task | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        if self.busy is not None:
            self.busy.cancel()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.busy is None:
            self._next()

    def _next(self) -> None:
        head_end = self.buf.find(b"\r\n\r\n")
        if head_end < 0:
            return
        head = self.buf[:head_end].decode("latin-1")
        length = 0
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        end = head_end + 4 + length
        if len(self.buf) < end:
            return
        body, self.buf = self.buf[head_end + 4:end], self.buf[end:]
        method, path = (head.split(" ", 2) + ["", ""])[:2]
        if method == "POST" and path == "/v1/completions":
            self.busy = asyncio.ensure_future(self._answer(body))
            self.busy.add_done_callback(self._finished)
            return
        assert self.transport is not None
        self.transport.write(_HEALTH if path == "/health" else _NOT_FOUND)
        self._next()

    def _finished(self, task: asyncio.Task) -> None:
        self.busy = None
        if not task.cancelled() and self.transport is not None and not self.transport.is_closing():
            self._next()

    async def _answer(self, body: bytes) -> None:
        a, w = self.args, self.transport
        assert w is not None
        try:
            model = str(json.loads(body or b"{}").get("model", "bench"))
        except ValueError:
            model = "bench"
        gap_ms = a.gap_ms
        if model.startswith("gap:"):
            try:
                gap_ms = float(model[4:])
            except ValueError:
                pass
        self.counter[0] += 1
        rid = f"cmpl-{self.counter[0]}"
        w.write(_HEAD)
        base = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model}
        for i in range(a.chunks):
            if i and gap_ms > 0:
                await asyncio.sleep(gap_ms / 1000.0)
            last = i == a.chunks - 1
            ids = list(range(i * a.tokens_per_chunk, (i + 1) * a.tokens_per_chunk))
            choice = {"index": 0, "text": f" t{time.time_ns()}", "token_ids": ids, "logprobs": None,
                      "finish_reason": "length" if last else None, "stop_reason": None}
            w.write(_event({**base, "choices": [choice], "usage": None}))
        n = a.chunks * a.tokens_per_chunk
        w.write(_event({**base, "choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": n,
                                                          "total_tokens": 8 + n}}))
        w.write(_DONE)


async def serve(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    counter = [0]
    server = await loop.create_server(lambda: Stream(args, counter), args.host, args.port, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(f"listening {port}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--tokens-per-chunk", type=int, default=4)
    ap.add_argument("--gap-ms", type=float, default=1.0)
    args = ap.parse_args(argv)
    try:
        import uvloop  # optional, a faster event loop
        run = uvloop.run
    except ImportError:
        run = asyncio.run
    try:
        run(serve(args))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A stand-in for ``vllm.entrypoints.openai.api_server`` to test supervision in seconds.

Answers ``GET /health`` (200) and ``POST /v1/completions`` (a fixed 2-token completion),
starts a child titled ``VLLM::EngineCore`` that starts ``VLLM::Worker`` (both ignore
their parent's death, like vLLM's), and exits on ``POST /exit?code=N`` or SIGTERM.

Usage: ``python fake_vllm.py --port P [--crash MESSAGE] [--ready-after S] [--no-bind-check]
[--ignore-sigterm] [--term-delay S]``

``--ignore-sigterm``: from the first instant, SIGTERM is logged (``fake vllm ignoring
SIGTERM``) and ignored, like vLLM while it loads; only SIGKILL ends it. Otherwise SIGTERM
is logged (``fake vllm got SIGTERM``) and the process exits with code 0 after
``--term-delay`` seconds (a graceful shutdown that takes a while; default 0).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

CHILD = r"""
import subprocess, sys, time, setproctitle
setproctitle.setproctitle(sys.argv[1])
if len(sys.argv) > 2:
    subprocess.Popen([sys.executable, "-c", sys.argv[2], *sys.argv[3:]])
while True:
    time.sleep(1)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--crash", default=None, help="print this and exit 1 at once")
    ap.add_argument("--ready-after", type=float, default=0.0)
    ap.add_argument("--ignore-sigterm", action="store_true")
    ap.add_argument("--term-delay", type=float, default=0.0)
    args, _ = ap.parse_known_args()
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, lambda *a: print("fake vllm ignoring SIGTERM", flush=True))
    print(f"fake vllm pid {os.getpid()} starting", flush=True)
    if args.crash:
        print("Traceback (most recent call last):", flush=True)
        print(f"  File \"fake.py\", line 1", flush=True)
        print(args.crash, flush=True)
        sys.exit(1)
    engine = subprocess.Popen([sys.executable, "-c", CHILD, "VLLM::EngineCore", CHILD, "VLLM::Worker"])
    import psutil

    while len(psutil.Process(engine.pid).children()) < 1:   # like vLLM: ready once the worker runs
        time.sleep(0.02)
    started = time.monotonic()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            ok = time.monotonic() - started >= args.ready_after
            self._send(200 if ok and self.path == "/health" else 503, {})

        def do_POST(self):
            n = int(self.headers.get("content-length") or 0)
            self.rfile.read(n)
            url = urlparse(self.path)
            if url.path == "/exit":
                code = int(parse_qs(url.query).get("code", ["0"])[0])
                self._send(200, {})
                threading.Timer(0.05, lambda: os._exit(code)).start()
                return
            if url.path == "/v1/completions" and time.monotonic() - started >= args.ready_after:
                self._send(200, {"choices": [{"text": "ab", "finish_reason": "length"}],
                                 "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
                return
            self._send(503, {})

    srv = ThreadingHTTPServer((args.host, args.port), Handler)
    if not args.ignore_sigterm:
        def on_term(*a):
            print("fake vllm got SIGTERM", flush=True)
            if args.term_delay > 0:
                threading.Timer(args.term_delay, lambda: os._exit(0)).start()
            else:
                os._exit(0)

        signal.signal(signal.SIGTERM, on_term)
    print("fake vllm ready to serve", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()

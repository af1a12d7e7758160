"""A tiny hand-made SSE server on 127.0.0.1 for unit tests of the streaming client's parser.

The scenario is chosen by the request body's ``model`` field (see ``SCENARIOS``); the
server speaks HTTP/1.1 with chunked transfer encoding, like uvicorn does for vLLM.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def chunk(text: str, ids: list[int] | None = None, finish: str | None = None) -> dict:
    choice: dict = {"index": 0, "text": text, "finish_reason": finish}
    if ids is not None:
        choice["token_ids"] = ids
    return {"id": "cmpl-x", "object": "text_completion", "model": "m", "choices": [choice]}


USAGE = {"id": "cmpl-x", "object": "text_completion", "model": "m", "choices": [],
         "usage": {"prompt_tokens": 7, "completion_tokens": 6, "total_tokens": 13}}
UNICODE = [chunk("é ü", [1, 2]), chunk(" 日本語", [3, 4, 5, 6]), chunk(" ✓", [7], "stop"),
           {**USAGE, "usage": {"prompt_tokens": 2, "completion_tokens": 7, "total_tokens": 9}}]
NORMAL = [chunk("a b", [10, 11]), chunk(" c d e", [12, 13, 14]), chunk("", []), chunk(" f", [15], "length"), USAGE]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "SSEServer"

    def log_message(self, *args) -> None:  # quiet
        pass

    def _head(self, status: int = 200, ctype: str = "text/event-stream") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _raw(self, text: str) -> None:
        data = text.encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _event(self, obj) -> None:
        self._raw(f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n")

    def _end(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _wait(self, seconds: float) -> None:
        self.server.release.wait(seconds)

    def do_POST(self) -> None:  # noqa: N802 - http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append(body)
        scenario = body["model"]
        if scenario.startswith("split:"):
            return self.s_split(int(scenario[6:]))
        getattr(self, "s_" + scenario.replace("-", "_"))()

    # ---- scenarios ------------------------------------------------------------------
    def s_normal(self) -> None:
        self._head()
        for c in NORMAL:
            self._event(c)
            time.sleep(0.02)
        self._event("[DONE]")
        self._end()

    def s_split(self, seed: int) -> None:
        """The UNICODE stream written in random pieces (inside lines, inside UTF-8 characters)."""
        import random

        rng = random.Random(seed)
        blob = "".join(f"data: {json.dumps(c, ensure_ascii=False)}\n\n" for c in UNICODE).encode()
        blob += b"data: [DONE]\n\n"
        self._head()
        i = 0
        while i < len(blob):
            n = rng.choice((1, 2, 3, 7, 50, 400))
            piece = blob[i:i + n]
            self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            self.wfile.flush()
            i += n
        self._end()

    def s_slow(self) -> None:  # the normal stream over ~1.2 s
        self._head()
        for c in NORMAL:
            self._event(c)
            self._wait(0.25)
        self._event("[DONE]")
        self._end()

    def s_no_token_ids(self) -> None:
        self._head()
        for c in [chunk("x"), chunk("y"), chunk("", finish="stop")]:
            self._event(c)
        self._event("[DONE]")
        self._end()

    def s_cut(self) -> None:  # dies mid-stream: no terminating chunk, socket closed
        self._head()
        self._event(NORMAL[0])
        self._event(NORMAL[1])
        self.close_connection = True

    def s_clean_end_no_done(self) -> None:  # well-formed HTTP end, but no [DONE]
        self._head()
        self._event(NORMAL[0])
        self._end()

    def s_stream_error(self) -> None:  # what vLLM sends when the engine dies mid-stream
        self._head()
        self._event(NORMAL[0])
        self._event({"error": {"message": "EngineCore encountered an issue", "type": "InternalServerError",
                               "param": None, "code": 500}})
        self._event("[DONE]")
        self._end()

    def s_http500(self) -> None:
        data = b'{"error": {"message": "engine dead", "code": 500}}'
        self.send_response(500)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def s_bad_json(self) -> None:
        self._head()
        self._event(NORMAL[0])
        self._event("{not json")
        self._event("[DONE]")
        self._end()

    def s_wrong_content_type(self) -> None:
        self._head(ctype="application/json")
        self._raw('{"choices": []}')
        self._end()

    def s_done_without_finish(self) -> None:
        self._head()
        self._event(NORMAL[0])
        self._event("[DONE]")
        self._end()

    def s_hang_head(self) -> None:  # accepts, never answers
        self._wait(10)
        self.close_connection = True

    def s_hang_after_chunk(self) -> None:  # one chunk at 0.3 s, then silence
        self._head()
        self._wait(0.3)
        self._event(NORMAL[0])
        self._wait(10)
        self.close_connection = True

    def s_trickle(self) -> None:  # a keep-alive comment every 0.1 s, forever
        self._head()
        for _ in range(100):
            self._raw(": ping\n\n")
            self._event(chunk("z", [1]))
            if self.server.release.wait(0.1):
                break
        self.close_connection = True


class SSEServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.release = threading.Event()
        self.bodies: list[dict] = []
        self.seen: dict[str, int] = {}
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    def handle_error(self, request, client_address) -> None:  # clients hang up on purpose here
        pass

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> "SSEServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.shutdown()
        self.server_close()


def _flaky(self: _Handler) -> None:
    """Fails (HTTP 503) the first two requests for each prompt text, then streams normally."""
    text = self.server.bodies[-1]["prompt"]
    n = self.server.seen[text] = self.server.seen.get(text, 0) + 1
    if n <= 2:
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()
        return
    self.s_normal()


_Handler.s_flaky = _flaky  # type: ignore[attr-defined]

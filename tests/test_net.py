"""harness.net.LoopbackGet: keep-alive GETs to a loopback server; a kept connection the
server closed (a restart) is retried once on a new one, so it never reads as a failure."""

from __future__ import annotations

import http.server
import threading

import pytest

from harness.net import LoopbackGet


DROP = {"on": False}   # drop a kept connection's next request unanswered (as a restarted server)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    served = 0

    def do_GET(self):
        if DROP["on"] and self.served:
            self.close_connection = True
            return
        self.served += 1
        body = self.path.encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _serve(port: int = 0) -> http.server.ThreadingHTTPServer:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_gets_reuse_the_connection_and_survive_a_restart():
    srv = _serve()
    port = srv.server_address[1]
    try:
        with LoopbackGet(f"http://127.0.0.1:{port}", 2.0) as g:
            assert g.get("/health") == (200, b"/health")
            conn = g._conn
            assert g.get("/metrics") == (200, b"/metrics") and g._conn is conn   # kept alive
            DROP["on"] = True            # the kept connection is cut: retried once on a new one
            assert g.get("/health") == (200, b"/health") and g._conn is not conn
    finally:
        DROP["on"] = False
        srv.shutdown()
        srv.server_close()
    with LoopbackGet(f"http://127.0.0.1:{port}", 2.0) as g:
        with pytest.raises(ConnectionRefusedError):    # nothing listens: the error, no retry loop
            g.get("/health")


def test_refuses_a_non_loopback_url():
    with pytest.raises(ValueError, match="loopback"):
        LoopbackGet("http://10.0.0.1:80", 1.0)
    with pytest.raises(ValueError):
        LoopbackGet("https://127.0.0.1:80", 1.0)

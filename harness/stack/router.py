"""The load router: a small loopback HTTP reverse proxy the harness owns, in front of the
speculative server, so the circuit breaker can fall back by *routing* new requests to a
warm plain server instead of restarting the speculative one (``stack.breaker.fallback:
route``; :mod:`harness.stack.breaker`). Production rolls speculation back the same way: the
plain deployment is already running, the load balancer stops sending to the speculative one.

Run as ``python -m harness.stack.router --upstream spec=http://127.0.0.1:8000 --upstream
ref=http://127.0.0.1:8001 --active spec [--listen 127.0.0.1:0]``; it prints one JSON line on
stdout once it listens::

    {"listen": "127.0.0.1:41234", "pid": 1234}

or ``{"error": "..."}`` and exits 2 (a non-loopback address, an unknown ``--active``, the port
in use). Loopback only (:func:`harness.net.is_loopback_host`), for listening and upstreams.

Forwarding: each request is sent whole to the upstream *active when it arrives* (its method,
path, query, body and end-to-end headers), and the response is relayed as it streams (SSE
chunks as they come), with the header ``x-specchaos-upstream: NAME``
(:data:`harness.net.UPSTREAM_HEADER`), which the load client records as the record's
``served_by``. A switch therefore changes only where *new* requests go: a request in flight
finishes, or fails, on the upstream it started on. An upstream that refuses the connection
is answered ``502`` with ``{"error": {"message", "type": "upstream_unreachable"}}`` (what a
production load balancer answers); an upstream that cuts its stream gets the client's
connection cut too (the client records ``stream_cut``, as it would without the router), and a
client that disconnects has the upstream connection closed at once (vLLM aborts the request,
as it would without the router).
Upstreams must serve the same model name (a standby deployment of the same target does).

Control, under the reserved path ``/_specchaos/router`` on the same address:

* ``GET`` → ``{"active", "upstreams": {name: url}, "switched_at": epoch s of the last switch
  or None, "requests": {name: {"forwarded", "finished", "failed"}}}``
* ``POST`` ``{"active": NAME}`` → the same, once new requests go to NAME (``switched_at`` is
  the router's clock at the switch); 404 ``{"error"}`` for an unknown name.

:class:`RouterProcess` starts it, switches it and ends it from the harness.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from harness import state as run_state
from harness.errors import StackError
from harness.net import LOOPBACK_HINT, UPSTREAM_HEADER, is_loopback_host
from harness.proc import announced_main, end_process, start_announced

__all__ = ["CONTROL_PATH", "RouterProcess", "main"]

log = logging.getLogger(__name__)

#: The router's own control path (never forwarded).
CONTROL_PATH = "/_specchaos/router"
#: Seconds :meth:`RouterProcess.start` waits for the ready line.
START_TIMEOUT_S = 20.0
#: Seconds a control call may take.
CONTROL_TIMEOUT_S = 5.0
#: Hop-by-hop headers (RFC 9110 §7.6.1) and those the relay sets itself: never copied.
_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                  "transfer-encoding", "upgrade", "host", "content-length"})


class _Router:
    """The router's state in its process: upstreams, the active one, counts."""

    def __init__(self, upstreams: dict[str, str], active: str):
        self.upstreams = upstreams
        self.active = active
        self.switched_at: float | None = None
        self.requests = {name: {"forwarded": 0, "finished": 0, "failed": 0} for name in upstreams}

    def describe(self) -> dict[str, Any]:
        return {"active": self.active, "upstreams": dict(self.upstreams), "switched_at": self.switched_at,
                "requests": {k: dict(v) for k, v in self.requests.items()}}


def _app(router: _Router) -> Any:
    # deferred: aiohttp is imported in the router's own process only (the harness never serves HTTP)
    import aiohttp
    from aiohttp import web

    session: dict[str, aiohttp.ClientSession] = {}

    async def control(request: web.Request) -> web.Response:
        if request.method == "POST":
            try:
                name = (await request.json()).get("active")
            except (ValueError, AttributeError):
                return web.json_response({"error": "body must be a JSON object with 'active'"}, status=400)
            if name not in router.upstreams:
                return web.json_response({"error": f"unknown upstream {name!r}; known: {sorted(router.upstreams)}"},
                                         status=404)
            if name != router.active:
                router.active, router.switched_at = name, time.time()
                log.info("new requests now go to %s (%s)", name, router.upstreams[name])
        return web.json_response(router.describe())

    async def forward(request: web.Request) -> web.StreamResponse:
        if request.path.rstrip("/") == CONTROL_PATH:
            return await control(request)
        name = router.active   # chosen when the request arrives: a switch never moves it
        counts = router.requests[name]
        counts["forwarded"] += 1
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        if "client" not in session:
            session["client"] = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
        try:
            up = await session["client"].request(request.method, router.upstreams[name] + request.path_qs,
                                                 data=body, headers=headers, allow_redirects=False)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            counts["failed"] += 1
            return web.json_response({"error": {"message": f"upstream {name} unreachable: {exc}",
                                                "type": "upstream_unreachable"}},
                                     status=502, headers={UPSTREAM_HEADER: name})
        async with up:
            resp = web.StreamResponse(status=up.status, reason=up.reason)
            for k, v in up.headers.items():
                if k.lower() not in _HOP:
                    resp.headers[k] = v
            resp.headers[UPSTREAM_HEADER] = name
            await resp.prepare(request)
            try:
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
            except asyncio.CancelledError:   # the client went away: the upstream connection closes with it
                counts["failed"] += 1
                raise
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
                counts["failed"] += 1
                if request.transport is not None:
                    request.transport.abort()   # cut the client's stream as the upstream cut ours
                return resp
            await resp.write_eof()
        counts["finished"] += 1
        return resp

    async def close_session(_app: web.Application) -> None:
        if "client" in session:
            await session["client"].close()

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", forward)
    app.on_cleanup.append(close_session)
    return app


def _loopback_url(text: str, what: str) -> str:
    u = urlsplit(text)
    if u.scheme not in ("http", "https") or not u.hostname or not is_loopback_host(u.hostname):
        raise ValueError(f"{what} {text!r} is not a loopback http URL ({LOOPBACK_HINT})")
    return text.rstrip("/")


async def _serve(router: _Router, host: str, port: int) -> None:
    # deferred: aiohttp is imported in the router's own process only
    from aiohttp import web

    # handler_cancellation: a client that disconnects cancels its relay, which closes the
    # upstream connection at once, so the server sees the disconnect as it would without us
    runner = web.AppRunner(_app(router), access_log=None, handle_signals=False, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=256)
    await site.start()
    bound = getattr(site._server, "sockets", None) or []
    lh, lp = bound[0].getsockname()[:2]   # the bound port (0 asked: the kernel's pick)
    print(json.dumps({"listen": f"{lh}:{lp}", "pid": os.getpid()}), flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.stack.router",
                                 description="specchaos load router (loopback only)")
    ap.add_argument("--listen", default="127.0.0.1:0")
    ap.add_argument("--upstream", action="append", required=True, help="NAME=URL (repeatable)")
    ap.add_argument("--active", required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s router %(message)s", stream=sys.stderr)

    def serve() -> None:
        host, _, port = args.listen.rpartition(":")
        if not is_loopback_host(host):
            raise ValueError(f"--listen {args.listen!r} is not a loopback address ({LOOPBACK_HINT})")
        upstreams = {}
        for item in args.upstream:
            name, sep, url = item.partition("=")
            if not sep or not name:
                raise ValueError(f"--upstream {item!r}: expected NAME=URL")
            upstreams[name] = _loopback_url(url, f"--upstream {name}")
        if args.active not in upstreams:
            raise ValueError(f"--active {args.active!r} is not an upstream ({', '.join(upstreams)})")
        asyncio.run(_serve(_Router(upstreams, args.active), host.strip("[]"), int(port)))

    return announced_main(args.listen, serve)


class RouterProcess:
    """A running router (module doc), seen from the harness.

    Attributes:
        url: ``http://host:port`` the load sends to.
        upstreams: name → base URL.
        pid: the router's pid (registered in the run state, role ``router``: ``specchaos
            cleanup`` ends it after a crash).
    """

    def __init__(self, popen: Any, listen: str, upstreams: dict[str, str]):
        self.popen = popen
        self.pid: int = popen.pid
        self.url = f"http://{listen}"
        self.upstreams = dict(upstreams)
        self._http = httpx.Client(timeout=CONTROL_TIMEOUT_S, trust_env=False)

    @classmethod
    def start(cls, upstreams: dict[str, str], active: str, timeout_s: float = START_TIMEOUT_S) -> "RouterProcess":
        """Start the router with new requests going to ``active``.

        Args:
            upstreams: name → loopback base URL, e.g. ``{"spec": "http://127.0.0.1:8000",
                "ref": "http://127.0.0.1:8001"}``.
            active: the upstream new requests go to first.
            timeout_s: seconds to wait for its ready line.

        Raises:
            StackError: it did not start (an address not on loopback, an unknown ``active``,
                no ready line within ``timeout_s``).
        """
        cmd = [sys.executable, "-m", "harness.stack.router", "--active", active]
        for name, url in upstreams.items():
            cmd += ["--upstream", f"{name}={url}"]
        popen, ready = start_announced(cmd, Path(__file__).resolve().parents[2], timeout_s)
        if "listen" not in ready:
            end_process(popen)
            raise StackError(f"the load router did not start: {ready.get('error') or f'no ready line within {timeout_s:g} s'}",
                             where="stack.breaker.route_to", hint="route to a loopback URL of a running plain server")
        proc = cls(popen, ready["listen"], upstreams)
        run_state.register_process(proc.pid, "router")
        log.info("load router %s: %s (pid %d), new requests to %s", proc.url,
                 ", ".join(f"{k}={v}" for k, v in upstreams.items()), proc.pid, active)
        return proc

    def state(self) -> dict[str, Any]:
        """The control's ``GET`` answer (module doc).

        Raises:
            StackError: the router did not answer.
        """
        return self._call("GET")

    def route(self, name: str) -> dict[str, Any]:
        """Send new requests to upstream ``name`` from now on; returns the control's answer
        (``switched_at``: the router's epoch s of the switch).

        Raises:
            StackError: unknown name, or the router did not answer.
        """
        return self._call("POST", {"active": name})

    def _call(self, method: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            r = self._http.request(method, self.url + CONTROL_PATH, json=body)
        except httpx.HTTPError as exc:
            raise StackError(f"the load router did not answer: {type(exc).__name__}: {exc}", where=self.url) from exc
        if r.status_code != 200:
            raise StackError(f"the load router refused {method} {body}: {r.text[:200]}", where=self.url)
        return r.json()

    def stop(self) -> None:
        """End the router (SIGTERM, then SIGKILL) and forget it in the run state. Idempotent."""
        self._http.close()
        end_process(self.popen)
        run_state.unregister_process(self.pid)


if __name__ == "__main__":
    sys.exit(main())

"""The fault proxy: a seeded asyncio TCP proxy with toxiproxy's toxics (:mod:`faults.toxics`),
run as its own process so the run state registers it (``specchaos cleanup`` and the
watchdog end it like a server) and so it never competes with the harness for the GIL.

Run as ``python -m faults.proxy --name spec --listen 127.0.0.1:0 --upstream 127.0.0.1:8000
--seed 1234``; it prints one JSON line on stdout once both sockets listen::

    {"listen": "127.0.0.1:41234", "control": "127.0.0.1:41235", "pid": 1234}

or ``{"error": "..."}`` and exits 2 (e.g. the port is in use). Listens on and connects to
loopback only (:func:`harness.net.is_loopback_host`).

Control: a subset of toxiproxy's HTTP API on the control address, so the same client
(:class:`ProxyClient`) drives this proxy or a real toxiproxy server:

* ``GET /proxies`` → ``{name: {"name", "listen", "upstream", "enabled", "toxics"}}``
* ``GET /proxies/{name}/toxics`` → ``[toxic]``
* ``POST /proxies/{name}/toxics`` (a toxic's JSON) → the toxic; 400 ``{"error"}`` when
  invalid, 409 when the name exists
* ``POST /proxies/{name}/toxics/{toxic}`` (``toxicity``, ``attributes``) → the toxic,
  changed in place (404 when absent)
* ``DELETE /proxies/{name}/toxics/{toxic}`` → 204 (404 when absent)
* ``GET /stats`` (ours) → the measurements (:meth:`Proxy.stats`).

Toxics apply to connections open when they are added and to new ones; removing a toxic
stops it on every connection; no healthy connection is dropped by either.

Measurements (never "applied"): per toxic (:class:`faults.toxics.ToxicStats`), the
connections and chunks on its stream while it was there and those it acted on; for every
chunk written on an affected connection, the delay from its arrival at the proxy to the
end of its write (``added_ms``: count, mean, p50, p99, max); the type's own counters:
pieces (``slicer``), bytes dropped (``timeout``), bytes cut and connections closed
(``limit_data``), connections reset (``reset_peer``), SSE events corrupted with what was
done (``corrupt``, the first 50), streams aborted (``abort``); and the same delay for
chunks no toxic touched (``passthrough_ms``, the proxy's own overhead).

A connection holds one :class:`faults.toxics.ToxicPipe` per toxic on it (the toxic's
state there); each chunk passes through them in the order the toxics were added.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import socket
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from faults.toxics import TOXICS, Delays, Segments, Toxic, ToxicPipe, ToxicStats, connection_rng, parse_toxic
from harness.net import LOOPBACK_HINT, is_allowed_host, is_loopback_host
from harness.proc import announced_main

log = logging.getLogger(__name__)

READ_SIZE = 65536


class _Connection:
    """One client connection and its upstream; the :class:`faults.toxics.Link` its toxics act on."""

    def __init__(self, proxy: Proxy, index: int, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter):
        self.proxy, self.index, self.client, self.upstream = proxy, index, client, upstream
        self.pipes: dict[tuple[str, int], ToxicPipe] = {}
        self.closed = False
        self.downstream_bytes = 0
        #: a request was sent and its response has not ended yet (set by request bytes,
        #: cleared when an ``abort`` toxic's re-framer sees the response end)
        self.pending = False

    def pipe(self, toxic: Toxic, generation: int) -> ToxicPipe:
        """The toxic's pipe on this connection (made on its first chunk here)."""
        pipe = self.pipes.get((toxic.name, generation))
        if pipe is None:
            stats = self.proxy.stats_of(toxic.name)
            pipe = self.pipes[(toxic.name, generation)] = TOXICS[toxic.type](
                toxic, connection_rng(self.proxy.seed, toxic.name, self.index), stats, self, self.downstream_bytes > 0)
            stats.count["connections_seen"] += 1
            stats.count["connections_affected"] += pipe.affected
        pipe.toxic = toxic                  # the control API may change its toxicity in place
        return pipe

    def later(self, pipe: ToxicPipe, delay_s: float, act: Callable[[], None]) -> None:
        def fire() -> None:
            current = self.proxy.toxics.get(pipe.toxic.name)
            if current is not None and self.pipes.get((pipe.toxic.name, current[1])) is pipe and not self.closed:
                act()

        asyncio.get_running_loop().call_later(delay_s, fire)

    def close(self, reset: bool = False) -> None:
        """Close both sides; ``reset``: an RST to the client (SO_LINGER 0)."""
        if self.closed:
            return
        self.closed = True
        if reset:
            sock = self.client.get_extra_info("socket")
            if sock is not None:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except OSError:
                    pass
        for w in (self.client, self.upstream):
            if reset and w is self.client:
                w.transport.abort()
            else:
                w.close()


class Proxy:
    """One proxy: ``listen`` → ``upstream``, with a toxic table shared by its connections."""

    def __init__(self, name: str, upstream: tuple[str, int], seed: int):
        self.name, self.upstream, self.seed = name, upstream, seed
        self.listen = ""
        self.toxics: dict[str, tuple[Toxic, int]] = {}     # name -> (toxic, generation)
        self._generation = 0
        self._stats: dict[str, ToxicStats] = {}
        self.connections = 0
        self.open = 0
        self.passthrough = Delays()
        self.bytes = {"upstream": 0, "downstream": 0}
        self.upstream_errors = 0
        self.requests_started = 0        # requests sent on a connection with none pending
        self._conns: set[_Connection] = set()

    # ---------------------------------------------------------------- toxics
    def add(self, toxic: Toxic) -> None:
        if toxic.name in self.toxics:
            raise KeyError(toxic.name)
        self._generation += 1
        self.toxics[toxic.name] = (toxic, self._generation)
        self.stats_of(toxic.name)
        log.info("toxic %s added: %s", toxic.name, toxic.public())

    def update(self, name: str, toxicity: float | None, attributes: dict | None) -> Toxic:
        """Change a toxic in place (toxiproxy's ``POST /proxies/{p}/toxics/{t}``): its
        connections keep their state (and their count of streams in flight).

        Raises:
            KeyError: no such toxic. ValueError: invalid values (one line naming the field).
        """
        toxic, gen = self.toxics[name]
        data = toxic.public()
        if toxicity is not None:
            data["toxicity"] = toxicity
        if attributes is not None:
            data["attributes"] = attributes
        new = parse_toxic(data)
        if new.attributes != toxic.attributes:
            self._generation += 1
            gen = self._generation                 # new attributes: new per-connection state
        self.toxics[name] = (new, gen)
        log.info("toxic %s updated: %s", name, new.public())
        return new

    def remove(self, name: str) -> bool:
        found = self.toxics.pop(name, None) is not None
        if found:
            log.info("toxic %s removed", name)
        return found

    def stats_of(self, name: str) -> ToxicStats:
        return self._stats.setdefault(name, ToxicStats())

    def stats(self) -> dict[str, Any]:
        """``{"connections", "open", "streams_in_flight": {abort toxic: requests sent on an
        open connection whose response has not ended (counted from the request, as the
        server counts it)}, "requests_started", "bytes": {"upstream", "downstream"}, "passthrough_ms":
        {count, mean, p50, p99, max}, "upstream_errors", "toxics": {name: {...}},
        "active": [names]}`` (delays in ms)."""
        live = sum(1 for c in self._conns if not c.closed and c.pending)
        in_flight = {name: live for name, (t, _) in self.toxics.items() if TOXICS[t.type].per_response}
        return {"connections": self.connections, "open": self.open, "bytes": dict(self.bytes),
                "streams_in_flight": in_flight, "requests_started": self.requests_started,
                "passthrough_ms": self.passthrough.summary(), "upstream_errors": self.upstream_errors,
                "toxics": {n: s.as_dict() for n, s in self._stats.items()}, "active": list(self.toxics)}

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "listen": self.listen, "upstream": f"{self.upstream[0]}:{self.upstream[1]}",
                "enabled": True, "toxics": [t.public() for t, _ in self.toxics.values()]}

    # ---------------------------------------------------------------- data path
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = self.connections
        self.connections += 1
        try:
            up_r, up_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            self.upstream_errors += 1
            writer.transport.abort()
            return
        for w in (writer, up_w):
            sock = w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Connection(self, index, writer, up_w)
        self._conns.add(conn)
        self.open += 1
        try:
            await asyncio.gather(self._pipe(conn, "upstream", reader, up_w),
                                 self._pipe(conn, "downstream", up_r, writer))
        finally:
            conn.close()
            self._conns.discard(conn)
            self.open -= 1

    async def _pipe(self, conn: _Connection, stream: str, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue = asyncio.Queue()

        async def read() -> None:
            try:
                while True:
                    data = await src.read(READ_SIZE)
                    queue.put_nowait((time.perf_counter(), data))
                    if not data:
                        return
            except (OSError, asyncio.IncompleteReadError):
                queue.put_nowait((time.perf_counter(), b""))

        reader = asyncio.create_task(read())
        try:
            while True:
                arrived, data = await queue.get()
                if not data or conn.closed:
                    break
                self.bytes[stream] += len(data)
                if stream == "upstream" and not conn.pending:
                    conn.pending = True
                    self.requests_started += 1
                forwarded = await self._forward(conn, stream, arrived, data, dst)
                if stream == "downstream":
                    conn.downstream_bytes += len(data)
                if not forwarded:
                    break
        except (OSError, ConnectionError):
            pass
        finally:
            reader.cancel()
            if stream == "upstream":
                # the client closed its side: let the server see it
                if dst.can_write_eof() and not conn.closed:
                    try:
                        dst.write_eof()
                    except OSError:
                        pass
            else:
                conn.close()

    async def _forward(self, conn: _Connection, stream: str, arrived: float, data: bytes,
                       dst: asyncio.StreamWriter) -> bool:
        """Pass one chunk through the stream's toxics and write it; False once the connection ends."""
        segments: Segments = [(arrived, data)]
        touched: list[ToxicStats] = []
        for toxic, gen in list(self.toxics.values()):
            if toxic.stream != stream:
                continue
            pipe = conn.pipe(toxic, gen)
            count = pipe.stats.count
            count["chunks_seen"] += 1
            if not pipe.affected:
                continue
            count["chunks"] += 1
            count["bytes"] += sum(len(b) for _, b in segments)
            touched.append(pipe.stats)
            segments = pipe.pipe(segments, arrived, time.perf_counter())
            if pipe.end:
                await self._write(segments, dst)
                conn.close()
                return False
        await self._write(segments, dst)
        ms = (time.perf_counter() - arrived) * 1000.0
        for st in touched:
            st.added.add(ms)
        if not touched:
            self.passthrough.add(ms)
        return True

    async def _write(self, segments: Segments, dst: asyncio.StreamWriter) -> None:
        for t, b in segments:
            wait = t - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            if b:
                dst.write(b)
                await dst.drain()


# -------------------------------------------------------------------- control API (toxiproxy subset)

def control_app(proxy: Proxy) -> web.Application:
    """The control API (module doc) as an aiohttp application. Errors answer ``{"error"}``:
    404 for an unknown proxy or toxic, 400 for invalid input (one line naming the field)."""
    def reply(data: Any, status: int = 200) -> web.Response:
        return web.json_response(data, status=status)

    @web.middleware
    async def errors(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.match_info.get("proxy", proxy.name) != proxy.name:
            return reply({"error": f"proxy {request.match_info['proxy']} not found"}, 404)
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except KeyError as exc:
            return reply({"error": f"toxic {exc.args[0]} not found"}, 404)
        except Exception as exc:  # noqa: BLE001 - answer, never die
            return reply({"error": str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"}, 400)

    async def version(request: web.Request) -> web.Response:
        return reply({"version": "specchaos-proxy"})

    async def stats(request: web.Request) -> web.Response:
        return reply(proxy.stats())

    async def proxies(request: web.Request) -> web.Response:
        return reply({proxy.name: proxy.describe()})

    async def describe(request: web.Request) -> web.Response:
        return reply(proxy.describe())

    async def toxics(request: web.Request) -> web.Response:
        return reply([t.public() for t, _ in proxy.toxics.values()])

    async def add(request: web.Request) -> web.Response:
        toxic = parse_toxic(json.loads(await request.read() or b"{}"))
        if toxic.name in proxy.toxics:
            return reply({"error": f"toxic {toxic.name} already exists"}, 409)
        proxy.add(toxic)
        return reply(toxic.public())

    async def update(request: web.Request) -> web.Response:
        body = json.loads(await request.read() or b"{}")
        return reply(proxy.update(request.match_info["toxic"], body.get("toxicity"), body.get("attributes")).public())

    async def remove(request: web.Request) -> web.Response:
        if not proxy.remove(request.match_info["toxic"]):
            raise KeyError(request.match_info["toxic"])
        return web.Response(status=204)

    app = web.Application(middlewares=[errors])
    toxic = "/proxies/{proxy}/toxics/{toxic}"
    app.add_routes([web.get("/version", version), web.get("/stats", stats), web.get("/proxies", proxies),
                    web.get("/proxies/{proxy}", describe), web.get("/proxies/{proxy}/toxics", toxics),
                    web.post("/proxies/{proxy}/toxics", add), web.post(toxic, update), web.delete(toxic, remove)])
    return app


def _address(text: str, what: str, allowed: bool = False) -> tuple[str, int]:
    """``(host, port)`` of ``text``; the host must be loopback (or, with ``allowed``, in
    the run's allow-list: :func:`harness.net.is_allowed_host`)."""
    host, _, port = text.rpartition(":")
    host = host.strip("[]")
    if not (is_allowed_host(host) if allowed else is_loopback_host(host)):
        raise ValueError(f"{what} {text!r} is not a loopback address ({LOOPBACK_HINT})")
    return host, int(port)


async def serve(name: str, listen: tuple[str, int], upstream: tuple[str, int], seed: int) -> None:
    """Run the proxy until cancelled; prints the ready line (module doc) on stdout."""
    proxy = Proxy(name, upstream, seed)
    server = await asyncio.start_server(proxy.handle, listen[0], listen[1], backlog=256)
    control = web.AppRunner(control_app(proxy), access_log=None)
    await control.setup()
    await web.TCPSite(control, listen[0], 0).start()
    lh, lp = server.sockets[0].getsockname()[:2]
    ch, cp = control.addresses[0][:2]
    proxy.listen = f"{lh}:{lp}"
    print(json.dumps({"listen": proxy.listen, "control": f"{ch}:{cp}", "pid": os.getpid()}), flush=True)
    try:
        async with server:
            await server.serve_forever()
    finally:
        await control.cleanup()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m faults.proxy", description="specchaos fault proxy (loopback only)")
    ap.add_argument("--name", default="spec")
    ap.add_argument("--listen", default="127.0.0.1:0")
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s proxy %(message)s", stream=sys.stderr)

    def run() -> None:
        listen = _address(args.listen, "--listen")
        upstream = _address(args.upstream, "--upstream", allowed=True)   # an external server
        asyncio.run(serve(args.name, listen, upstream, args.seed))

    return announced_main(args.listen, run)


if __name__ == "__main__":
    sys.exit(main())

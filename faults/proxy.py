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

Measurements (never "applied"): per toxic, connections seen and affected; for every chunk
written on an affected connection, the delay from its arrival at the proxy to the end of
its write (``added_ms``: count, mean, p50, p99, max); bytes dropped (``timeout``), bytes cut
and connections closed (``limit_data``), connections reset (``reset_peer``), SSE events
corrupted with what was done (``corrupt``, the first 50); and the same delay for chunks no
toxic touched (``passthrough_ms``, the proxy's own overhead).
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
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from faults.toxics import AbortPlan, CorruptPlan, SseReframer, Toxic, affected, connection_rng, latency_s, parse_toxic, slice_sizes
from harness.net import LOOPBACK_HINT, is_allowed_host, is_loopback_host
from harness.proc import announced_main

log = logging.getLogger(__name__)

READ_SIZE = 65536
_SAMPLES = 2000


class _Delays:
    """Running summary of delays in ms (count, mean, max; p50/p99 over the last samples)."""

    def __init__(self) -> None:
        self.count, self.total, self.max = 0, 0.0, 0.0
        self.recent: deque[float] = deque(maxlen=_SAMPLES)

    def add(self, ms: float) -> None:
        self.count += 1
        self.total += ms
        self.max = max(self.max, ms)
        self.recent.append(ms)

    def summary(self) -> dict[str, Any]:
        xs = sorted(self.recent)

        def q(p: float) -> float | None:
            return round(xs[min(len(xs) - 1, int(p * len(xs)))], 3) if xs else None

        return {"count": self.count, "mean": round(self.total / self.count, 3) if self.count else None,
                "p50": q(0.5), "p99": q(0.99), "max": round(self.max, 3)}


@dataclass
class _ToxicStats:
    connections_seen: int = 0
    connections_affected: int = 0
    chunks: int = 0
    bytes: int = 0
    added: _Delays = field(default_factory=_Delays)
    bytes_dropped: int = 0
    bytes_cut: int = 0
    closed: int = 0
    resets: int = 0
    pieces: int = 0
    corrupted: list[dict] = field(default_factory=list)
    corrupted_count: int = 0
    aborted: int = 0
    abort_times: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"connections_seen": self.connections_seen, "connections_affected": self.connections_affected,
                "chunks": self.chunks, "bytes": self.bytes, "added_ms": self.added.summary(),
                "bytes_dropped": self.bytes_dropped, "bytes_cut": self.bytes_cut, "closed": self.closed,
                "resets": self.resets, "pieces": self.pieces, "events_corrupted": self.corrupted_count,
                "corruptions": self.corrupted[:50], "aborted": self.aborted, "abort_times": self.abort_times[-200:]}


class _State:
    """One toxic on one connection: the toxicity draw and the toxic's own state."""

    def __init__(self, toxic: Toxic, seed: int, conn: int, mid_stream: bool):
        self.rng = connection_rng(seed, toxic.name, conn)
        self.attrs = toxic.attrs
        self.t_next = 0.0
        # abort draws per response (its plan), every other toxic per connection
        self.affected = True if toxic.type == "abort" else affected(self.rng, toxic.toxicity)
        self.first_seen: float | None = None
        self.bytes = 0
        self.plan: CorruptPlan | AbortPlan | None = None
        if toxic.type == "corrupt":
            self.plan = CorruptPlan(self.rng, self.attrs)
        elif toxic.type == "abort":
            self.plan = AbortPlan(self.rng, self.attrs, toxic.toxicity)
        self.reframer = SseReframer(self.plan, mid_stream) if self.plan is not None else None
        self.reported = 0
        self.completed = 0
        self.timer: asyncio.TimerHandle | None = None


class _Connection:
    def __init__(self, proxy: "Proxy", index: int, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter):
        self.proxy, self.index, self.client, self.upstream = proxy, index, client, upstream
        self.states: dict[tuple[str, int], _State] = {}
        self.closed = False
        self.downstream_bytes = 0
        #: a request was sent and its response has not ended yet (set by request bytes,
        #: cleared when an ``abort`` toxic's re-framer sees the response end)
        self.pending = False

    def state(self, toxic: Toxic, generation: int) -> _State:
        key = (toxic.name, generation)
        st = self.states.get(key)
        if st is None:
            st = self.states[key] = _State(toxic, self.proxy.seed, self.index, mid_stream=self.downstream_bytes > 0)
            ts = self.proxy.stats_of(toxic.name)
            ts.connections_seen += 1
            ts.connections_affected += st.affected
        return st

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
        self._stats: dict[str, _ToxicStats] = {}
        self.connections = 0
        self.open = 0
        self.passthrough = _Delays()
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
        self._stats.setdefault(toxic.name, _ToxicStats())
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

    def stats_of(self, name: str) -> _ToxicStats:
        return self._stats.setdefault(name, _ToxicStats())

    def stats(self) -> dict[str, Any]:
        """``{"connections", "open", "streams_in_flight": {abort toxic: requests sent on an
        open connection whose response has not ended (counted from the request, as the
        server counts it)}, "requests_started", "bytes": {"upstream", "downstream"}, "passthrough_ms":
        {count, mean, p50, p99, max}, "upstream_errors", "toxics": {name: {...}},
        "active": [names]}`` (delays in ms)."""
        live = sum(1 for c in self._conns if not c.closed and c.pending)
        in_flight = {name: live for name, (t, _) in self.toxics.items() if t.type == "abort"}
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
        """Apply the stream's toxics to one chunk and write it; False once the connection ends."""
        segments = [(arrived, data)]          # (not before, perf_counter s; bytes)
        touched: list[_ToxicStats] = []
        for toxic, gen in list(self.toxics.values()):
            if toxic.stream != stream:
                continue
            st = conn.state(toxic, gen)
            if not st.affected:
                continue
            ts = self.stats_of(toxic.name)
            ts.chunks += 1
            ts.bytes += sum(len(b) for _, b in segments)
            touched.append(ts)
            now = time.perf_counter()
            if st.first_seen is None:
                st.first_seen = now
            a = st.attrs
            if toxic.type == "latency":
                segments = [(max(t, arrived + latency_s(a, st.rng)), b) for t, b in segments]
            elif toxic.type == "bandwidth":
                out, t_next = [], max(now, st.t_next)
                step = max(1, int(a.rate * 1000 * 0.1))          # 100 ms worth of bytes per piece
                for t, b in segments:
                    for i in range(0, len(b), step):
                        piece = b[i:i + step]
                        t_next = max(t_next, t)
                        out.append((t_next, piece))
                        t_next += len(piece) / (a.rate * 1000.0)
                st.t_next = t_next
                segments = out
            elif toxic.type == "slicer":
                out = []
                for t, b in segments:
                    pos = 0
                    for j, n in enumerate(slice_sizes(len(b), a, st.rng)):
                        out.append((t + j * a.delay / 1e6, b[pos:pos + n]))
                        pos += n
                ts.pieces += len(out)
                segments = out
            elif toxic.type == "timeout":
                ts.bytes_dropped += sum(len(b) for _, b in segments)
                segments = []
                if a.timeout > 0 and st.timer is None:
                    st.timer = asyncio.get_running_loop().call_later(
                        a.timeout / 1000.0, self._fire, conn, toxic.name, gen, False)
            elif toxic.type == "reset_peer":
                if st.timer is None:
                    st.timer = asyncio.get_running_loop().call_later(
                        a.timeout / 1000.0, self._fire, conn, toxic.name, gen, True)
            elif toxic.type == "limit_data":
                allowed = max(0, a.bytes - st.bytes)
                out = []
                for t, b in segments:
                    keep = b[:allowed]
                    allowed -= len(keep)
                    st.bytes += len(keep)
                    ts.bytes_cut += len(b) - len(keep)
                    if keep:
                        out.append((t, keep))
                segments = out
                if st.bytes >= a.bytes:
                    await self._write(segments, dst)
                    ts.closed += 1
                    conn.close()
                    return False
            elif toxic.type == "corrupt":
                segments = [(t, st.reframer.feed(b)) for t, b in segments]
                done = st.plan.done
                if len(done) > st.reported:
                    ts.corrupted_count += len(done) - st.reported
                    ts.corrupted += [c.as_dict() | {"connection": conn.index} for c in done[st.reported:]]
                    st.reported = len(done)
            elif toxic.type == "abort":
                st.plan.fraction = toxic.toxicity          # updated in place by the control API
                segments = [(t, st.reframer.feed(b)) for t, b in segments]
                if st.reframer.completed > st.completed:
                    st.completed = st.reframer.completed
                    conn.pending = st.reframer.in_response
                if st.plan.abort_now:
                    await self._write(segments, dst)
                    ts.aborted += 1
                    ts.abort_times.append(time.time())
                    conn.close()
                    return False
        await self._write(segments, dst)
        ms = (time.perf_counter() - arrived) * 1000.0
        for ts in touched:
            ts.added.add(ms)
        if not touched:
            self.passthrough.add(ms)
        return True

    async def _write(self, segments: list[tuple[float, bytes]], dst: asyncio.StreamWriter) -> None:
        for t, b in segments:
            wait = t - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            if b:
                dst.write(b)
                await dst.drain()

    def _fire(self, conn: _Connection, name: str, gen: int, reset: bool) -> None:
        """A ``timeout``/``reset_peer`` timer: acts only if the toxic is still there."""
        current = self.toxics.get(name)
        if current is None or current[1] != gen or conn.closed:
            return
        ts = self.stats_of(name)
        if reset:
            ts.resets += 1
        else:
            ts.closed += 1
        conn.close(reset=reset)


# -------------------------------------------------------------------- control API (toxiproxy subset)

async def _control(proxy: Proxy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        lines = head.decode("latin-1").split("\r\n")
        method, path = lines[0].split(" ")[:2]
        length = 0
        for line in lines[1:]:
            k, _, v = line.partition(":")
            if k.strip().lower() == "content-length":
                length = int(v.strip() or 0)
        body = await reader.readexactly(length) if length else b""
        status, payload = _route(proxy, method, path.split("?")[0].rstrip("/"), body)
    except Exception as exc:  # noqa: BLE001 - answer, never die
        status, payload = 400, {"error": f"{type(exc).__name__}: {exc}"}
    data = b"" if payload is None else json.dumps(payload).encode()
    reason = {200: "OK", 201: "Created", 204: "No Content", 400: "Bad Request", 404: "Not Found",
              409: "Conflict"}.get(status, "OK")
    writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
    try:
        await writer.drain()
    finally:
        writer.close()


def _route(proxy: Proxy, method: str, path: str, body: bytes) -> tuple[int, Any]:
    parts = [p for p in path.split("/") if p]
    if method == "GET" and parts == ["version"]:
        return 200, {"version": "specchaos-proxy"}
    if method == "GET" and parts == ["stats"]:
        return 200, proxy.stats()
    if method == "GET" and parts == ["proxies"]:
        return 200, {proxy.name: proxy.describe()}
    if len(parts) >= 2 and parts[0] == "proxies":
        if parts[1] != proxy.name:
            return 404, {"error": f"proxy {parts[1]} not found"}
        if len(parts) == 2 and method == "GET":
            return 200, proxy.describe()
        if len(parts) == 3 and parts[2] == "toxics":
            if method == "GET":
                return 200, [t.public() for t, _ in proxy.toxics.values()]
            if method == "POST":
                try:
                    toxic = parse_toxic(json.loads(body or b"{}"))
                except ValueError as exc:
                    return 400, {"error": str(exc)}
                try:
                    proxy.add(toxic)
                except KeyError:
                    return 409, {"error": f"toxic {toxic.name} already exists"}
                return 200, toxic.public()
        if len(parts) == 4 and parts[2] == "toxics" and method == "POST":
            body_json = json.loads(body or b"{}")
            try:
                return 200, proxy.update(parts[3], body_json.get("toxicity"), body_json.get("attributes")).public()
            except KeyError:
                return 404, {"error": f"toxic {parts[3]} not found"}
            except ValueError as exc:
                return 400, {"error": str(exc)}
        if len(parts) == 4 and parts[2] == "toxics" and method == "DELETE":
            return (204, None) if proxy.remove(parts[3]) else (404, {"error": f"toxic {parts[3]} not found"})
    return 404, {"error": f"no route {method} {path}"}


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
    control = await asyncio.start_server(lambda r, w: _control(proxy, r, w), listen[0], 0)
    lh, lp = server.sockets[0].getsockname()[:2]
    ch, cp = control.sockets[0].getsockname()[:2]
    proxy.listen = f"{lh}:{lp}"
    print(json.dumps({"listen": proxy.listen, "control": f"{ch}:{cp}", "pid": os.getpid()}), flush=True)
    async with server, control:
        await asyncio.gather(server.serve_forever(), control.serve_forever())


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

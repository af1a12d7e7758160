"""Samplers of the stack's health: ``GET /health`` polled into the timeline, and the dense
recovery probes (health and a one-token generation, every 25/50 ms) around a recovery.

Health alone can lie (a frozen engine still answers 200), so recovery is also judged
from real generations in the load records; this sampler only records what ``/health``
said, when, and how fast.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import http.client
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import httpx

from harness.clock import now
from harness.net import LoopbackGet
from harness.load.client import make_client, stream_completion
from harness.load.prompts import Prompt
from harness.load.records import is_complete
from harness.timeline import Timeline

__all__ = ["HealthSampler", "RecoveryProber", "port_refuses"]


def port_refuses(url: str, timeout_s: float) -> bool:
    """Whether a TCP connect to ``url``'s host and port is refused (``ECONNREFUSED``: nothing
    listens there), the one answer an HTTP request would also get as a ``connect`` error.
    Any other outcome (connected, timed out after ``timeout_s`` seconds, another error)
    is False: then only an HTTP request can tell. A connection made is closed at once.
    The address is resolved once per URL (loopback: an IP literal or ``localhost``)."""
    try:
        family, addr = _address(url)
        sock = socket.socket(family, socket.SOCK_STREAM)
    except (OSError, ValueError):   # unresolvable, a bad port: only an HTTP request can tell
        return False
    try:
        sock.settimeout(timeout_s)
        return sock.connect_ex(addr) == errno.ECONNREFUSED
    except OSError:
        return False
    finally:
        sock.close()


@functools.lru_cache(maxsize=32)
def _address(url: str) -> tuple[int, Any]:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    family, _, _, _, addr = socket.getaddrinfo(parts.hostname or "127.0.0.1", port, type=socket.SOCK_STREAM)[0]
    return family, addr


class HealthSampler:
    """Polls ``GET /health`` of one server every ``interval_s`` and writes ``health``
    timeline events (``status`` None when no HTTP answer came; ``latency_s`` seconds).
    After a refused connection the next sample checks the port first (:func:`port_refuses`)
    and, still refused, records the same ``status`` None with ``via: "tcp"``.
    Health alone can lie (a frozen engine still answers 200), so recovery is also
    judged from real generations in the load records."""

    def __init__(self, timeline: Timeline, server_name: str, base_url: str, interval_s: float):
        self.timeline = timeline
        self.server_name = server_name
        self.base_url = base_url
        self.interval_s = interval_s
        self._stop = threading.Event()
        # http.client, not httpx: ~0.3 ms less CPU per sample (harness.net.LoopbackGet)
        self._client = LoopbackGet(base_url, max(0.5, min(2.0, interval_s * 4)))
        self._thread = threading.Thread(target=self._loop, name=f"health-{server_name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        refused = False   # the last sample's connection was refused: check the port first
        with self._client as client:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                status: int | None = None
                extra = {}
                if refused and port_refuses(self.base_url, min(0.05, self.interval_s)):
                    extra["via"] = "tcp"   # as RecoveryProber: the outcome an HTTP request gets, for less CPU
                else:
                    try:
                        status = client.get("/health")[0]
                        refused = False
                    except (OSError, http.client.HTTPException) as exc:
                        refused = isinstance(exc, ConnectionRefusedError)
                self.timeline.emit("health", "health", server=self.server_name, status=status,
                                   latency_s=round(time.perf_counter() - t0, 6), **extra)
                self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)


class RecoveryProber:
    """Dense probes around a recovery, so its instants are known to ≤ 100 ms.

    ``GET /health`` every ``health_interval_s`` (default 25 ms) and a one-token streaming
    generation every ``generation_interval_s`` (default 50 ms), each kind with at most
    ``max_in_flight`` requests outstanding (a server that accepts and never answers gets no
    pile of requests), from :meth:`start` until it has been :meth:`release`\\ d (every fault
    cleared) and both a health 200 and a complete generation were *sent* after the release;
    or at most ``max_s`` seconds.

    While a kind's last probe found its port closed (connection refused), its next probes
    are a bare TCP connect first (:func:`port_refuses`, on the scheduling thread: tens of
    µs instead of an HTTP request's ~1 ms of CPU, sixty times a second through an outage):
    refused again, it writes the event the HTTP probe would have written (no status,
    ``error: "connect"``) with ``via: "tcp"``; anything else, the HTTP probe is sent at
    once, on the same schedule. Kinds due in the same tick at the same address share one
    connect. So the probe instants and the recorded outcomes are the
    same as with HTTP probes alone.

    Writes ``health`` timeline events (as :class:`HealthSampler`, with ``dense: true``) and
    ``generation_probe`` events (``server``, ``send_time`` epoch s, ``latency_s``, ``ok``:
    complete as :func:`harness.load.records.is_complete`, ``status``, ``error``), the event's
    ``t`` being the probe's end. The recovery checks read both
    (:mod:`harness.checks.recovery`).
    """

    def __init__(self, timeline: Timeline, server_name: str, health_url: str, generation_url: str, model: str,
                 prompt: Prompt, *, health_interval_s: float = 0.025, generation_interval_s: float = 0.05,
                 health_timeout_s: float = 0.5, generation_timeout_s: float = 5.0, max_in_flight: int = 3,
                 max_s: float = 600.0):
        self.timeline = timeline
        self.server_name = server_name
        self.health_url = health_url
        self.generation_url = generation_url
        self.model = model
        self.prompt = dataclasses.replace(prompt, max_tokens=1)
        self.health_interval_s = health_interval_s
        self.generation_interval_s = generation_interval_s
        self.health_timeout_s = health_timeout_s
        self.generation_timeout_s = generation_timeout_s
        self.max_in_flight = max_in_flight
        self.max_s = max_s
        self.released_at: float | None = None
        self._ok_after_release = {"health": False, "generation": False}
        self._in_flight = {"health": 0, "generation": 0}
        #: per kind: its last probe's connection was refused (the next one checks the port first)
        self._refused = {"health": False, "generation": False}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"recovery-probe-{server_name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def release(self) -> None:
        """Every fault is cleared: stop once a health 200 and a complete generation sent
        from now on came back."""
        with self._lock:
            if self.released_at is None:
                self.released_at = now()

    def done(self) -> bool:
        with self._lock:
            return self.released_at is not None and all(self._ok_after_release.values())

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.generation_timeout_s + 2)

    def _run(self, kind: str, client: httpx.Client) -> None:
        try:
            (self._health if kind == "health" else self._generation)(client)
        finally:
            with self._lock:
                self._in_flight[kind] -= 1

    def _note(self, kind: str, sent: float, ok: bool) -> None:
        with self._lock:
            if ok and self.released_at is not None and sent >= self.released_at:
                self._ok_after_release[kind] = True

    def _health(self, client: httpx.Client) -> None:
        sent, t0 = now(), time.perf_counter()
        refused = False
        try:
            status: int | None = client.get(f"{self.health_url}/health", timeout=self.health_timeout_s).status_code
        except httpx.HTTPError as exc:
            status, refused = None, isinstance(exc, httpx.ConnectError)
        self._refused["health"] = refused
        self.timeline.emit("health", "health", server=self.server_name, status=status,
                           latency_s=round(time.perf_counter() - t0, 6), dense=True)
        self._note("health", sent, status == 200)

    def _generation(self, client: httpx.Client) -> None:
        rec = stream_completion(client, self.generation_url, self.model, self.prompt,
                                timeout_s=self.generation_timeout_s, source="probe", server=self.server_name)
        self._refused["generation"] = rec.error == "connect"
        ok = is_complete(rec)[0]
        self.timeline.emit("health", "generation_probe", t=rec.end_time, server=self.server_name,
                           send_time=rec.send_time, latency_s=rec.e2e_s, ok=ok, status=rec.status, error=rec.error)
        self._note("generation", rec.send_time, ok)

    def _still_refused(self, kind: str, checked: dict[str, tuple[bool, float, float]]) -> bool:
        """The port-first probe (class doc): True (and the event written) when ``kind``'s
        port still refuses connections; False when the HTTP probe must go. ``checked``:
        this tick's port checks by URL (``(refused, sent, latency)``), so both kinds share
        one connect when they go to the same address."""
        if not self._refused[kind]:
            return False
        url = self.health_url if kind == "health" else self.generation_url
        if url not in checked:
            sent, t0 = now(), time.perf_counter()
            refused = port_refuses(url, min(self.health_interval_s, self.generation_interval_s))
            checked[url] = (refused, sent, round(time.perf_counter() - t0, 6))
        refused, sent, latency = checked[url]
        if not refused:
            self._refused[kind] = False
            return False
        if kind == "health":
            self.timeline.emit("health", "health", server=self.server_name, status=None, latency_s=latency,
                               dense=True, via="tcp")
        else:
            self.timeline.emit("health", "generation_probe", server=self.server_name, send_time=sent,
                               latency_s=latency, ok=False, status=None, error="connect", via="tcp")
        return True

    def _loop(self) -> None:
        start = time.monotonic()
        due = {"health": start, "generation": start}
        interval = {"health": self.health_interval_s, "generation": self.generation_interval_s}
        with make_client(max_connections=2 * self.max_in_flight + 2) as client, \
                ThreadPoolExecutor(max_workers=2 * self.max_in_flight, thread_name_prefix="recovery-probe") as pool:
            while not self._stop.is_set() and not self.done() and time.monotonic() - start < self.max_s:
                t = time.monotonic()
                checked: dict[str, tuple[bool, float, float]] = {}
                for kind in ("health", "generation"):
                    if t < due[kind]:
                        continue
                    due[kind] = max(due[kind] + interval[kind], t)   # no burst to catch up
                    if self._still_refused(kind, checked):
                        continue
                    with self._lock:
                        if self._in_flight[kind] >= self.max_in_flight:
                            continue
                        self._in_flight[kind] += 1
                    pool.submit(self._run, kind, client)
                self._stop.wait(max(0.0, min(due.values()) - time.monotonic()))

"""Fault family ``network``: a toxic (toxiproxy's semantics, :mod:`faults.toxics`) on the
load's path to one server, through a fault proxy.

Where: when an experiment declares a ``network`` fault, :meth:`Network.prepare` (after
the stack started, before the load starts) puts a proxy between the load and the server
and points ``ctx.load_urls[server]`` at it; without a network fault there is no proxy.
The load (locust, its own process) reaches the proxy over loopback TCP.

Backends (argument ``backend``):

* ``proxy`` (default): :mod:`faults.proxy` as its own process, registered in the run state
  (role ``proxy``) so ``specchaos cleanup`` and the watchdog end it after a crash like any
  server, started to die with the harness (``PR_SET_PDEATHSIG``). Why a process and not a
  task of the harness: it survives nothing it should not (registered, dies with the
  harness), it does not share the harness's GIL with the health sampler and the runner,
  and the load reaches it over TCP anyway.
* ``toxiproxy``: a real toxiproxy server at ``toxiproxy_url`` (loopback), through its HTTP
  API as the Chaos Toolkit toxiproxy extension drives it (``POST /proxies`` with
  ``name``/``listen``/``upstream``/``enabled``, ``POST /proxies/{name}/toxics`` with
  ``name``/``type``/``stream``/``toxicity``/``attributes``, ``DELETE`` both). Evidence there
  is the added latency of ``GET /health`` through the proxy against direct (toxiproxy
  measures nothing itself), so only ``latency`` is measurable.
* ``netem``: ``tc qdisc ... netem``; refused at validate time where the kernel lacks
  ``sch_netem`` (these machines: one line, exit 2).

Inject adds the toxic at run time (connections stay open); clear removes it (idempotent);
release ends the proxy. Every random draw of the proxy comes from ``seed`` (see
:func:`faults.toxics.connection_rng`).

Evidence (measured by the proxy, never "applied"), from its ``/stats`` since injection:
``latency``: affected chunks whose arrival→written delay averages at least half the
toxic's latency; ``bandwidth``/``slicer``: affected chunks (and pieces written);
``timeout``: bytes dropped; ``limit_data``: bytes cut or connections closed;
``reset_peer``: connections reset; ``corrupt``: SSE events corrupted (with what was done).
Each says how much of the traffic the toxic reached: the chunks and connections on its
stream while it was there, and how many of them it acted on ("delayed 412 of 3,020 chunks
(13.6%) on 41 of 185 connections"). The injector takes the evidence as soon as the toxic
acted; at clear, the toxic's counters over the whole fault are recorded as a second
``fault_evidence`` event (``observations.over: "the whole fault"``), which the report
keeps as the fault's evidence.

Example::

    - type: action
      name: downstream-jitter
      provider:
        type: python
        module: harness.experiment.actions
        func: network_toxic
        arguments: {server: spec, toxic: latency, stream: downstream,
                    attributes: {latency: 50, jitter: 25, distribution: normal}, duration_s: 20}
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

import httpx
from pydantic import Field, ValidationInfo, field_validator

from faults.base import Evidence, FaultContext, FaultParams
from faults.proxied import ListenPort, ProxiedFault, ProxyRoute
from faults.toxics import TOXIC_TYPES, LatencyAttrs, attributes_error, max_chunk_delay_s
from harness.errors import FaultError
from harness.net import LOOPBACK_HINT, is_loopback_host

log = logging.getLogger(__name__)

def netem_available() -> bool:
    """Whether the kernel offers the ``netem`` qdisc (module loaded or installed)."""
    if Path("/sys/module/sch_netem").exists():
        return True
    release = os.uname().release
    return any(Path(f"/lib/modules/{release}/kernel/net/sched").glob("sch_netem.ko*"))


class NetworkParams(FaultParams):
    """Arguments of ``network`` (how long: the action's ``duration_s``).

    Fields:
        server: whose load path (``"spec"`` or ``"ref"``).
        toxic: ``latency``, ``bandwidth``, ``slicer``, ``reset_peer``, ``timeout``,
            ``limit_data``, ``corrupt`` or ``abort`` (:mod:`faults.toxics`; ``abort`` is
            what the ``client-abort`` family uses).
        stream: ``downstream`` (server → client, default) or ``upstream``.
        toxicity: fraction of connections affected, in [0, 1] (default 1).
        attributes: the toxic's attributes, toxiproxy's names and units (``latency``,
            ``jitter`` ms; ``rate`` KB/s; ``average_size``, ``size_variation`` bytes,
            ``delay`` µs; ``timeout`` ms; ``bytes``; ``mode``, ``max_event``; ``after_events``).
        seed: seed of every random draw of the proxy (toxicity, jitter, slices, corrupt).
        listen_port: the proxy's port on 127.0.0.1 (0: any free port).
        toxiproxy_url: a toxiproxy server's API, e.g. ``http://127.0.0.1:8474`` (loopback).
        backend: ``proxy`` (default), ``toxiproxy`` (needs ``toxiproxy_url``) or ``netem``.
    """

    server: str = "spec"
    toxic: Literal["latency", "bandwidth", "slicer", "reset_peer", "timeout", "limit_data", "corrupt", "abort"] = "latency"
    stream: Literal["upstream", "downstream"] = "downstream"
    toxicity: float = Field(1.0, ge=0, le=1)
    attributes: dict[str, Any] = Field(default_factory=dict)
    seed: int = 1234
    listen_port: ListenPort = 0
    toxiproxy_url: str | None = None
    backend: Literal["proxy", "toxiproxy", "netem"] = "proxy"

    @field_validator("attributes")
    @classmethod
    def _attributes(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        toxic = info.data.get("toxic")
        if toxic in TOXIC_TYPES:
            problem = attributes_error(toxic, v)
            if problem:
                raise ValueError(f"{problem} ({toxic} toxic)")
        return v


    @field_validator("toxiproxy_url")
    @classmethod
    def _loopback(cls, v: str | None) -> str | None:
        if v is not None and not is_loopback_host(urlsplit(v).hostname or ""):
            raise ValueError(f"refusing non-loopback toxiproxy {v!r} ({LOOPBACK_HINT})")
        return v

    @field_validator("backend")
    @classmethod
    def _backend(cls, v: str, info: ValidationInfo) -> str:
        if v == "netem":
            if not netem_available():
                raise ValueError("backend 'netem' is not available on this host (the kernel has no sch_netem "
                                 "qdisc); use backend: proxy")
            raise ValueError("backend 'netem' is not implemented yet; use backend: proxy")
        if v == "toxiproxy" and not info.data.get("toxiproxy_url"):
            raise ValueError("backend 'toxiproxy' needs toxiproxy_url (e.g. http://127.0.0.1:8474)")
        return v

    def toxic_json(self, name: str) -> dict[str, Any]:
        """The toxic as toxiproxy's API takes it."""
        return {"name": name, "type": self.toxic, "stream": self.stream, "toxicity": self.toxicity,
                "attributes": dict(self.attributes)}


# -------------------------------------------------------------------- the family

class Network(ProxiedFault):
    """A toxic on the load path of one server, through a fault proxy."""

    kind: ClassVar[str] = "network"
    activity: ClassVar[str] = "network_toxic"
    Params: ClassVar[type[FaultParams]] = NetworkParams
    params: NetworkParams

    def __init__(self, params: NetworkParams):
        super().__init__(params, ProxyRoute(server=params.server, seed=params.seed, listen_port=params.listen_port,
                                            toxic_name=f"{params.toxic}_{params.stream}", backend=params.backend,
                                            toxiproxy_url=params.toxiproxy_url))
        self.first: Evidence | None = None

    def describe_target(self, ctx: FaultContext) -> str:
        """``"<server>/<stream>"``, e.g. ``"spec/downstream"``."""
        return f"{self.params.server}/{self.params.stream}"

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        """Add the toxic on the running proxy.

        Returns:
            ``{"toxic": {...}, "listen", "upstream", "backend", "proxy_pid",
            "proxy_create_time", "control"}``.

        Raises:
            FaultError: no proxy (the fault was not declared before the load started) or
                the proxy refused the toxic.
        """
        client = self.proxy_client(ctx, "network faults are set up before the load starts; declare it in the method")
        self.before = client.stats()
        self.facts = self.proxy_facts(client.add_toxic(self.proxy_name, self.params.toxic_json(self.toxic_name)))
        return dict(self.facts)

    def evidence(self, ctx: FaultContext, timeout_s: float) -> Evidence:
        """Wait up to ``timeout_s`` for the toxic's measured effect (module doc).

        Observations: ``toxic``, ``server``, ``stream``, ``toxicity``, ``measured_by``,
        ``declared_added_latency_s`` (:meth:`declared_added_latency_s`), and the toxic's
        counters since injection: ``connections_seen`` and ``chunks_seen`` (on its stream
        while it was there), ``connections_affected`` and ``chunks`` (those it acted on),
        ``added_latency_ms`` ({count, mean, p50, p99, max}), ``bytes_dropped``,
        ``bytes_cut``, ``connections_closed``, ``connections_reset``, ``pieces``,
        ``events_corrupted``, ``corruptions`` (the first ones: response, event, mode,
        before, after).
        """
        if self.facts is None or self.client is None:
            raise FaultError("network evidence asked before injection", where=self.describe_target(ctx))
        if self.params.backend == "toxiproxy" and self.client.stats() is None:
            return self._probe_evidence(ctx, timeout_s)
        self.first = self.wait_for_evidence(timeout_s, self._judge)
        return self.first

    def declared_added_latency_s(self) -> float | None:
        """What this toxic adds to one request's TTFT and E2E by its declaration, in seconds
        (:func:`faults.toxics.max_chunk_delay_s`): a ``latency`` toxic only; None for the
        others (their effect is not a declared delay). Recorded in the evidence so that
        :mod:`harness.checks.slo` judges the fault phase's degradation beyond it."""
        if self.params.toxic != "latency":
            return None
        return round(max_chunk_delay_s(LatencyAttrs(**self.params.attributes)), 6)

    def _judge(self, st: dict[str, Any], over: str = "so far") -> Evidence:
        p, a = self.params, self.params.attributes
        added = st.get("added_ms") or {}
        obs = {"toxic": p.toxic, "server": p.server, "stream": p.stream, "toxicity": p.toxicity, "attributes": dict(a),
               "declared_added_latency_s": self.declared_added_latency_s(),
               "measured_by": f"the fault proxy's /stats ({self.client.api if self.client else '?'})",
               "connections_seen": st.get("connections_seen", 0), "connections_affected": st.get("connections_affected", 0),
               "chunks_seen": st.get("chunks_seen", 0), "chunks": st.get("chunks", 0),
               "added_latency_ms": added, "bytes_dropped": st.get("bytes_dropped", 0),
               "bytes_cut": st.get("bytes_cut", 0), "connections_closed": st.get("closed", 0),
               "connections_reset": st.get("resets", 0), "pieces": st.get("pieces", 0),
               "events_corrupted": st.get("events_corrupted", 0), "corruptions": (st.get("corruptions") or [])[:5]}
        t = p.toxic
        if t == "latency":
            want = float(a.get("latency", 0)) / 2
            ok = (added.get("count") or 0) >= 3 and (added.get("mean") or 0) >= want
            what = f"mean {added.get('mean')} ms added (p99 {added.get('p99')} ms)"
        elif t in ("bandwidth", "slicer"):
            ok = obs["chunks"] >= 3
            what = f"{obs['pieces']} pieces written, mean delay {added.get('mean')} ms"
        elif t == "timeout":
            ok = obs["bytes_dropped"] > 0
            what = f"{obs['bytes_dropped']} bytes dropped, {obs['connections_closed']} connections closed"
        elif t == "limit_data":
            ok = obs["bytes_cut"] > 0 or obs["connections_closed"] > 0
            what = f"{obs['bytes_cut']} bytes cut, {obs['connections_closed']} connections closed"
        elif t == "reset_peer":
            ok = obs["connections_reset"] > 0
            what = f"{obs['connections_reset']} connections reset"
        elif t == "abort":
            obs["streams_aborted"] = st.get("aborted", 0)
            ok = obs["streams_aborted"] > 0
            what = f"{obs['streams_aborted']} streams closed by the client side after {a.get('after_events', 1)} events"
        else:
            ok = obs["events_corrupted"] > 0
            what = f"{obs['events_corrupted']} SSE events corrupted"
        verb = {"latency": "delayed", "bandwidth": "throttled", "slicer": "sliced", "timeout": "blackholed"}.get(t, "reached")
        detail = f"{t} on {p.server}/{p.stream}: {verb} {reach(obs)} {over}; {what} (measured by the proxy)"
        return Evidence(ok, obs, detail)

    def _final_evidence(self, ctx: FaultContext) -> None:
        """Record the toxic's counters over the whole fault (before it is removed) as a second
        ``fault_evidence`` event, when the injector's evidence showed it acted (once)."""
        st = self.toxic_stats() if self.first is not None and self.first.acted else {}
        self.first = None
        if st and self.fault_id is not None:
            ev = self._judge(st, over="over the whole fault")
            ev.observations["over"] = "the whole fault"
            ctx.timeline.emit("fault", "fault_evidence", fault_id=self.fault_id, acted=True,
                              evidence=asdict(Evidence(True, ev.observations, ev.detail)))

    def _probe_evidence(self, ctx: FaultContext, timeout_s: float) -> Evidence:
        """A toxiproxy server measures nothing: time ``GET /health`` through it and direct."""
        obs: dict[str, Any] = {"toxic": self.params.toxic, "server": self.params.server,
                               "declared_added_latency_s": self.declared_added_latency_s(),
                               "measured_by": "GET /health through the proxy vs direct"}
        if self.params.toxic != "latency":
            return Evidence(False, obs, f"a toxiproxy server gives no measurement for {self.params.toxic}")

        def timed(base: str) -> float | None:
            try:
                with httpx.Client(trust_env=False, timeout=timeout_s) as c:
                    t0 = time.perf_counter()
                    c.get(f"{base}/health")
                    return (time.perf_counter() - t0) * 1000
            except httpx.HTTPError:
                return None

        via = [timed(f"http://{self.listen}") for _ in range(5)]
        direct = [timed(f"http://{self.upstream}") for _ in range(5)]
        if None in via or None in direct:
            return Evidence(False, obs, "GET /health did not answer through the proxy or direct")
        added = statistics.median([v for v in via if v is not None]) - statistics.median(
            [v for v in direct if v is not None])
        obs["added_latency_ms"] = {"p50": round(added, 3)}
        ok = added >= float(self.params.attributes.get("latency", 0)) / 2
        return Evidence(ok, obs, f"GET /health {added:.1f} ms slower through the toxiproxy proxy")

    def clear(self, ctx: FaultContext) -> None:
        """Remove the toxic (idempotent; a proxy already gone counts as cleared)."""
        if self.client is None or self.facts is None:
            return
        self._final_evidence(ctx)
        try:
            self.client.remove_toxic(self.proxy_name, self.toxic_name)
        except httpx.HTTPError:
            if not self.proxy_gone():
                raise


def reach(obs: dict[str, Any]) -> str:
    """How much of the traffic on its stream a toxic acted on, from the evidence's
    observations: ``"412 of 3,020 chunks (13.6%) on 41 of 185 connections"``."""
    chunks, seen = obs.get("chunks", 0), obs.get("chunks_seen", 0)
    share = f" ({chunks / seen:.1%})" if seen else ""
    return (f"{chunks:,} of {seen:,} chunks{share} on {obs.get('connections_affected', 0):,} of "
            f"{obs.get('connections_seen', 0):,} connections")

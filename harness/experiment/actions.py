"""Chaos Toolkit actions of the harness (``provider: {type: python, module:
harness.experiment.actions, func: ...}``). Each is a small typed function; the
session (opened by the ``specchaos`` control) carries the stack, load and ledger.

Phases are marked here, on the run's one clock: ``inject_fault`` starts the
``fault`` phase and, once the fault is cleared, the ``recovery`` phase;
``await_recovery`` then waits for the stack to be back within SLO;
``hold_phase("after", ...)`` runs the ``after`` phase.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from harness.errors import FaultError
from harness.experiment import session as sess

log = logging.getLogger(__name__)

__all__ = ["inject_fault", "await_recovery", "hold_phase", "clear_faults"]


def inject_fault(kind: str, arguments: dict | None = None, duration_s: float = 0.0,
                 evidence_timeout_s: float | None = None) -> dict[str, Any]:
    """Inject one fault, prove it acted, hold it ``duration_s``, then clear it.

    Args:
        kind: fault family name (see ``faults.registry.REGISTRY``), e.g. ``"process-kill"``.
        arguments: the family's parameters (e.g. ``{"server": "spec", "role": "worker",
            "signal": "SIGKILL"}``).
        duration_s: seconds the fault stays active, counted from injection (0: clear as
            soon as evidence is in; for a kill, evidence includes the supervised restart).
        evidence_timeout_s: how long to wait for evidence; default ``phases.fault_timeout_s``.

    Returns:
        ``{"fault_id", "kind", "target", "acted", "evidence"}``.

    Raises:
        FaultError: the fault could not act or left no evidence (the run becomes an error).
    """
    s = sess.current()
    timeout = evidence_timeout_s if evidence_timeout_s is not None else s.cfg.phases.fault_timeout_s
    s.mark_phase("fault")
    t0 = time.monotonic()
    handle = s.injector.inject(kind, arguments or {})
    ev = s.injector.collect_evidence(handle, timeout)
    left = duration_s - (time.monotonic() - t0)
    if left > 0:
        s.sleep(left)
    s.injector.clear(handle)
    s.mark_phase("recovery")
    out = {"fault_id": handle.fault_id, "kind": kind, "target": handle.target,
           "acted": ev.acted, "evidence": ev.observations}
    if not ev.acted:
        raise FaultError(f"fault {kind} on {handle.target} left no evidence that it acted: {ev.detail}",
                         hint="a fault that did not happen cannot pass; check the target and the logs")
    return out


def await_recovery(timeout_s: float | None = None) -> dict[str, Any]:
    """Wait until the speculative server is healthy, serves a complete generation, and a
    rolling window of load requests is back within the baseline tolerance
    (``recovery.slo_window_s``, ``recovery.slo_tolerance``) — or until ``timeout_s``
    (default ``phases.recovery_timeout_s``). Never raises on a stack that does not come
    back: that is judged (and failed) by the recovery checks, not an error of the run.

    Returns:
        ``{"recovered": bool, "waited_s": float, "slo_window_end": float|None}``.
    """
    from harness.checks.recovery import first_slo_window_end
    from harness.load.records import read_records
    from harness.metrics.phases import assign_phases, phase_metrics, phase_windows
    from harness.report.judge import fault_summary

    s = sess.current()
    timeout = timeout_s if timeout_s is not None else s.cfg.phases.recovery_timeout_s
    events = s.timeline.select()
    windows = phase_windows(events)
    faults = fault_summary(events)
    since = windows["recovery"][0] if "recovery" in windows else time.time()
    # Measured from the fault, exactly as the judge measures time_to_slo_s.
    fault_t = faults[0]["injected_at"] if faults else windows["fault"][0] if "fault" in windows else since

    def load_records() -> list:
        return [r for r in read_records(s.records_path) if r.source == "load"]

    # The baseline is closed: its requests ended before the fault (the ones still in flight
    # then belong to the fault phase), so its metrics are computed once.
    b0, b1 = windows.get("baseline", (fault_t, fault_t))
    records = load_records()
    members = assign_phases(records, windows).get("baseline") if "baseline" in windows else None
    baseline = phase_metrics(records, b0, b1, s.cfg.slo, members=members)
    start = time.monotonic()
    end_t: float | None = None
    while time.monotonic() - start < timeout:
        end_t = first_slo_window_end(load_records(), fault_t, baseline, s.cfg.recovery)
        if end_t is not None:
            break
        s.sleep(0.5)
    waited = time.monotonic() - start
    if end_t is not None:
        log.info("back within the baseline SLO %.1f s after the fault (waited %.1f s in recovery)", end_t - fault_t, waited)
    else:
        log.warning("NOT back within the baseline SLO after waiting %.1f s in recovery", waited)
    s.mark_phase("after")
    return {"recovered": end_t is not None, "waited_s": round(waited, 3), "slo_window_end": end_t}


def hold_phase(phase: str | None = None, duration_s: float | None = None) -> dict[str, Any]:
    """Keep the load running for ``duration_s`` (default ``phases.after_s``).

    Args:
        phase: if given, mark the start of this phase first (``baseline``, ``fault``,
            ``recovery`` or ``after``); ``await_recovery`` already marks ``after``.
        duration_s: seconds to hold.
    """
    s = sess.current()
    if phase:
        s.mark_phase(phase)
    seconds = duration_s if duration_s is not None else s.cfg.phases.after_s
    s.sleep(seconds)
    return {"phase": phase, "held_s": seconds}


def clear_faults() -> list[dict[str, Any]]:
    """Rollback: clear every fault still active (idempotent). Returns the fault summary."""
    s = sess.peek()
    if s is None:
        return []
    s.injector.clear_all()
    return s.injector.summary()

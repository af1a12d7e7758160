"""The run's progress display (:mod:`harness.report.progress`), tied to the live session:
which phase the run is in and how long that phase is planned to last.

Started and stopped by :func:`harness.experiment.runner.run` (``specchaos run``; off
with ``--no-progress``).
"""

from __future__ import annotations

from harness.experiment.session import Session
from harness.report.progress import PhaseStatus, ProgressMonitor, make_renderer

__all__ = ["session_status", "start_progress"]


def session_status(s: Session) -> PhaseStatus | None:
    """The session's phase with its planned length (``phases`` of the configuration):
    ``start-up`` until the load starts (stack, prompts, reference), then ``warm-up``
    (``warmup_s``), ``baseline`` (``baseline_s``), ``fault`` and ``recovery`` (their
    timeouts, upper bounds), ``after`` (``after_s``); other phases without a plan. A
    phase marked on the timeline carries its ``phase_start`` instant."""
    ph = s.cfg.phases
    if s.closed:
        return None
    if s.phase is None:
        return PhaseStatus("warm-up", ph.warmup_s) if s.load is not None else PhaseStatus("start-up")
    planned = {"baseline": (ph.baseline_s, False), "fault": (ph.fault_timeout_s, True),
               "recovery": (ph.recovery_timeout_s, True), "after": (ph.after_s, False)}
    p, limit = planned.get(s.phase, (None, False))
    starts = s.timeline.select("runner", "phase_start", phase=s.phase)   # in memory
    return PhaseStatus(s.phase, p, limit, starts[-1]["t"] if starts else None)


def start_progress(s: Session) -> ProgressMonitor:
    """Start the display for session ``s`` (rich on a terminal, plain lines otherwise)."""
    return ProgressMonitor(s.records_path, lambda: session_status(s), make_renderer()).start()

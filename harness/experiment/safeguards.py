"""The live safeguard monitor: during the method, watch the load records as they are
written and abort the experiment when a safeguard (``configuration.specchaos.safeguards``,
:class:`~harness.checks.config.SafeguardConfig`) is breached.

As Chaos Toolkit's safeguards control (``chaosaddons.controls.safeguards``) does, the abort
is Chaos Toolkit's graceful exit: SIGUSR1 to this process (``chaoslib.exit.exit_gracefully``),
whose handler (installed by chaostoolkit-lib while it runs an experiment) ends the current
activity at once; the method stops, rollbacks still run, the control tears everything down
and the judge writes the verdict ``aborted`` (exit 1). Actions running in the background
end too: :meth:`Session.sleep <harness.experiment.session.Session.sleep>` raises once
``Session.aborted`` is set.

The monitor thread reads ``records.jsonl`` incrementally every ``INTERVAL_S`` (0.2 s) and
judges the span since its previous tick with :func:`harness.checks.safeguards.scan` — the
same pure function the judge re-derives breaches with — up to ``SETTLE_S`` before now
(a record is written just after its request ended). It writes to the timeline:
``safeguards_armed`` / ``safeguards_disarmed``, ``safeguard_breached`` (the breach, as
measured) and ``safeguard_abort`` (the reason, the signal sent).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import TYPE_CHECKING

from harness.checks.config import SafeguardConfig
from harness.checks.safeguards import ABORT_PREFIX, SOURCE, Breach, Obs, armed_windows, observations, scan
from harness.clock import now
from harness.load.records import RecordTail, is_spec_load

if TYPE_CHECKING:
    from harness.experiment.session import Session

log = logging.getLogger(__name__)

__all__ = ["INTERVAL_S", "SETTLE_S", "SafeguardMonitor", "arm", "disarm", "abort_reason"]

#: Seconds between two ticks of the monitor.
INTERVAL_S = 0.2
#: A tick judges up to this many seconds before now: a record lands in the file a few
#: milliseconds after its request ended.
SETTLE_S = 0.1
#: Seconds of ended requests kept in memory beyond a safeguard's window and for_s.
KEEP_EXTRA_S = 10.0


def abort_reason(b: Breach) -> str:
    """The abort's one-line reason, e.g. ``aborted by safeguard error_rate: error_rate 0.92
    over 25 requests > 0.5 for 2 s (window 2 s)``."""
    return (f"{ABORT_PREFIX} {b.safeguard}: {b.metric} {b.observed:.3g} over {b.n} requests > {b.limit:g} "
            f"for {b.for_s:g} s (window {b.window_s:g} s)")


class SafeguardMonitor:
    """Watches one session's load during the method (see module doc).

    Args:
        session: the live session (its config, timeline, records file, ``aborted``).
        safeguards: what to watch.
        interval_s: seconds between ticks.
    """

    def __init__(self, session: "Session", safeguards: list[SafeguardConfig], interval_s: float = INTERVAL_S):
        self.s = session
        self.safeguards = list(safeguards)
        self.interval_s = interval_s
        self.tail = RecordTail(session.records_path)   # every records file: a distributed load's workers too
        self.obs: list[Obs] = []
        self.armed_at: float | None = None
        self.since: dict[str, float] = {}
        self.over_since: dict[str, float | None] = {}
        self.breach: Breach | None = None
        self._lock = threading.Lock()
        self._armed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="safeguards", daemon=True)
        keep = max((sg.window_s + sg.for_s for sg in self.safeguards), default=0.0)
        self.keep_s = keep + KEEP_EXTRA_S

    def start(self) -> None:
        """Arm: from now on a breach aborts the method."""
        self.armed_at = self.s.timeline.emit(SOURCE, "safeguards_armed",
                                             safeguards=[sg.label for sg in self.safeguards])["t"]
        for sg in self.safeguards:
            self.since[sg.label] = self.armed_at - 1e-9
            self.over_since[sg.label] = None
        self._armed = True
        self._thread.start()
        log.info("safeguards armed: %s", ", ".join(f"{sg.label} ({sg.metric} <= {sg.limit:g} for {sg.for_s:g} s, "
                                                   f"window {sg.window_s:g} s, {'/'.join(sg.phases)})"
                                                   for sg in self.safeguards))

    def stop(self) -> None:
        """Disarm (idempotent): no abort can be sent after this returns."""
        with self._lock:
            was = self._armed
            self._armed = False
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if was:
            self.s.timeline.emit(SOURCE, "safeguards_disarmed")

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                if self.tick(now()):
                    return
            except Exception:  # noqa: BLE001 — a bug here must not kill the run; it is logged
                log.exception("the safeguard monitor failed; safeguards are off for the rest of the run")
                self.s.timeline.emit(SOURCE, "safeguards_failed")
                return

    def tick(self, t: float) -> Breach | None:
        """Judge the span since the previous tick up to ``t − SETTLE_S``; on a breach,
        record it and abort. Returns the breach (None while quiet)."""
        new = [r for r in self.tail.read_new() if is_spec_load(r)]
        if new:
            self.obs = sorted(self.obs + observations(new), key=lambda o: o.end)
        horizon = t - self.keep_s
        if self.obs and self.obs[0].end < horizon:
            self.obs = [o for o in self.obs if o.end >= horizon]
        until = t - SETTLE_S
        phases = self.s.timeline.select(source="runner", event="phase_start")
        events = phases + [{"t": self.armed_at, "source": SOURCE, "event": "safeguards_armed"}]
        for sg in self.safeguards:
            armed = armed_windows(events, sg.phases, until=float("inf"))   # the current phase is still open
            since = self.since[sg.label]
            if until <= since:
                continue
            breach, self.over_since[sg.label] = scan(self.obs, sg, armed, since, until, self.over_since[sg.label])
            self.since[sg.label] = until
            if breach is not None:
                self._fire(breach)
                return breach
        return None

    def _fire(self, b: Breach) -> None:
        with self._lock:
            if not self._armed or self.breach is not None:
                return
            self.breach = b
            reason = abort_reason(b)
            self.s.timeline.emit(SOURCE, "safeguard_breached", **b.to_dict())
            log.error("%s: aborting the method (rollbacks still run)", reason)
            handler = signal.getsignal(signal.SIGUSR1)
            sent = callable(handler)   # chaostoolkit-lib's graceful exit is installed while it runs
            self.s.timeline.emit(SOURCE, "safeguard_abort", safeguard=b.safeguard, reason=reason,
                                 signal="SIGUSR1" if sent else None)
            if sent:
                os.kill(os.getpid(), signal.SIGUSR1)
            else:
                log.error("no SIGUSR1 handler (not run by Chaos Toolkit): the method ends at its next wait")
            self.s.aborted = reason   # after the signal: every wait of the method ends too


_monitors: dict[int, SafeguardMonitor] = {}


def arm(s: "Session") -> SafeguardMonitor | None:
    """Start the monitor of session ``s`` (once; None when no safeguard is configured)."""
    sgs = list(s.cfg.safeguards)
    if not sgs or id(s) in _monitors:
        return _monitors.get(id(s))
    m = _monitors[id(s)] = SafeguardMonitor(s, sgs)
    m.start()
    return m


def disarm(s: "Session") -> None:
    """Stop the monitor of session ``s`` (idempotent; nothing when none runs)."""
    m = _monitors.pop(id(s), None)
    if m is not None:
        m.stop()

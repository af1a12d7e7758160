"""Progress on the terminal while a run is long: phase, elapsed/planned seconds, requests,
errors, live p95 TTFT and output tokens/s (figures: :mod:`harness.metrics.progress`).

Two renderers, chosen by :func:`make_renderer`:

* :class:`RichRenderer`: a live ``rich.progress`` bar on stderr, refreshed a few times a
  second, when stderr is a terminal. Log lines keep printing above it.
* :class:`PlainRenderer`: one plain line per phase change, and at most one per
  ``interval_s`` (default 30 s) during a long phase — when stderr is not a terminal, or
  under CI (``CI=true``), or ``TERM=dumb``: a CI log gets a handful of lines, never a flood.

:class:`ProgressMonitor` is the thread that reads the records files incrementally
(:class:`harness.load.records.RecordTail`, workers' files included), folds them and hands
a snapshot to the renderer; it asks a ``status`` callable for the phase, so it knows
nothing of the session that owns it.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn

from harness.clock import now as epoch_now
from harness.load.records import RecordTail
from harness.metrics.progress import WINDOW_S, LiveState, ProgressSnapshot, fold, snapshot, start_phase

__all__ = ["PhaseStatus", "Renderer", "PlainRenderer", "RichRenderer", "ProgressMonitor", "make_renderer",
           "format_line", "wants_plain"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PhaseStatus:
    """What the owner of the run says about now: the phase's name, its planned length in
    seconds (None: unknown), whether that is an upper bound rather than a plan, and when
    it began (epoch s; None: unknown, then the monitor counts from when it saw it)."""

    phase: str
    planned_s: float | None = None
    planned_is_limit: bool = False
    started_at: float | None = None


class Renderer(Protocol):
    def update(self, snap: ProgressSnapshot) -> None: ...

    def close(self, snap: ProgressSnapshot | None) -> None: ...


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v * 1000:.0f} ms"


def format_line(snap: ProgressSnapshot) -> str:
    """One plain line, e.g. ``"baseline 12/30 s · 340 requests · 2 errors · p95 TTFT 104 ms
    (n=40, last 10 s) · 512 tok/s"``; a limit is written ``≤120``."""
    if snap.planned_s is None:
        when = f"{snap.elapsed_s:.0f} s"
    else:
        when = f"{snap.elapsed_s:.0f}/{'≤' if snap.planned_is_limit else ''}{snap.planned_s:.0f} s"
    return (f"{snap.phase} {when} · {snap.requests} requests · {snap.errors} errors · "
            f"p95 TTFT {_ms(snap.p95_ttft_s)} (n={snap.n_window}, last {snap.window_s:.0f} s) · "
            f"{snap.tokens_per_s:.0f} tok/s")


class PlainRenderer:
    """Plain lines on ``stream`` (see module doc): a line when the phase changes, else at
    most one per ``interval_s`` seconds (monotonic ``clock``), and a last line at close.
    A phase change's line ends with the phase that ended: ``(baseline: 175 requests, 0
    errors in 30 s)``."""

    def __init__(self, stream: TextIO, interval_s: float = 30.0, clock: Callable[[], float] = time.monotonic):
        self.stream = stream
        self.interval_s = interval_s
        self.clock = clock
        self._phase: str | None = None
        self._last: float | None = None
        self._prev: ProgressSnapshot | None = None

    def _emit(self, snap: ProgressSnapshot, ended: ProgressSnapshot | None = None) -> None:
        tail = "" if ended is None else (f" ({ended.phase}: {ended.requests} requests, {ended.errors} errors "
                                         f"in {ended.elapsed_s:.0f} s)")
        self.stream.write(f"progress: {format_line(snap)}{tail}\n")
        self.stream.flush()
        self._last = self.clock()

    def update(self, snap: ProgressSnapshot) -> None:
        if snap.phase != self._phase:
            self._phase = snap.phase
            self._emit(snap, self._prev)
        elif self._last is None or self.clock() - self._last >= self.interval_s:
            self._emit(snap)
        self._prev = snap

    def close(self, snap: ProgressSnapshot | None) -> None:
        if snap is not None and self._last is not None and self.clock() - self._last >= 1.0:
            self._emit(snap)


class RichRenderer:
    """A live ``rich.progress`` bar on a stderr console (see module doc). While it is
    shown, the standard library's log handlers that wrote to stderr write through rich's
    redirect, so their lines print above the bar instead of tearing it."""

    def __init__(self, console=None):
        self.console = console or Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]{task.description:<9}"), BarColumn(bar_width=24),
            TextColumn("{task.fields[when]:>10}"),
            TextColumn("{task.fields[figures]}"),
            console=self.console, transient=False, redirect_stderr=True, redirect_stdout=False,
            refresh_per_second=4,
        )
        self._task = None
        self._phase: str | None = None
        self._handlers: list[tuple[logging.StreamHandler, TextIO]] = []

    def _start(self) -> None:
        self.progress.start()
        for h in logging.getLogger().handlers:   # route stderr logging through rich's redirect
            if isinstance(h, logging.StreamHandler) and h.stream in (sys.__stderr__, getattr(self.progress.live, "_restore_stderr", None)):
                self._handlers.append((h, h.stream))
                h.setStream(sys.stderr)

    def update(self, snap: ProgressSnapshot) -> None:
        if self._task is None:
            self._start()
        when = (f"{snap.elapsed_s:.0f}/{'≤' if snap.planned_is_limit else ''}{snap.planned_s:.0f} s"
                if snap.planned_s is not None else f"{snap.elapsed_s:.0f} s")
        figures = (f"{snap.requests} req · {snap.errors} err · p95 TTFT {_ms(snap.p95_ttft_s)} · "
                   f"{snap.tokens_per_s:.0f} tok/s")
        if snap.phase != self._phase:
            if self._task is not None:
                self.progress.stop_task(self._task)
            self._task = self.progress.add_task(snap.phase, total=snap.planned_s, when=when, figures=figures)
            self._phase = snap.phase
        self.progress.update(self._task, completed=min(snap.elapsed_s, snap.planned_s or snap.elapsed_s),
                             when=when, figures=figures)

    def close(self, snap: ProgressSnapshot | None) -> None:
        if snap is not None and self._task is not None:
            self.update(snap)
        if self._task is not None:
            self.progress.stop()
        for h, stream in self._handlers:
            h.setStream(stream)
        self._handlers.clear()


def wants_plain(stream: TextIO, env: dict[str, str] | os._Environ = os.environ) -> bool:
    """True where a live display would be noise: ``stream`` is not a terminal, ``CI`` is
    set to a true value (as GitHub Actions, GitLab CI and most CI systems set it), or
    ``TERM=dumb``."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    ci = env.get("CI", "").strip().lower() in ("1", "true", "yes", "on")
    return not tty or ci or env.get("TERM", "") == "dumb"


def make_renderer(stream: TextIO | None = None, env: dict[str, str] | os._Environ = os.environ) -> Renderer:
    """The renderer for ``stream`` (default stderr): rich on a terminal, plain otherwise
    (:func:`wants_plain`)."""
    stream = stream or sys.stderr
    if wants_plain(stream, env):
        return PlainRenderer(stream)
    return RichRenderer()


class ProgressMonitor:
    """A daemon thread that, every ``interval_s`` seconds, folds the records appended to
    ``records_path`` (and its workers' files) since the last look and renders a snapshot.

    Args:
        records_path: the run's records.jsonl.
        status: returns the current :class:`PhaseStatus`, or None while there is nothing
            to show yet (nothing is rendered then).
        renderer: where snapshots go (:func:`make_renderer`).
        interval_s: seconds between looks.
        window_s: the live figures' window (:mod:`harness.metrics.progress`).

    The thread never raises into the run: an error in a look is logged once at debug
    level and the next look goes on. :meth:`stop` is idempotent.
    """

    def __init__(self, records_path: str | os.PathLike, status: Callable[[], PhaseStatus | None],
                 renderer: Renderer, interval_s: float = 0.5, window_s: float = WINDOW_S):
        self.tail = RecordTail(Path(records_path))
        self.status = status
        self.renderer = renderer
        self.interval_s = interval_s
        self.window_s = window_s
        self.state = LiveState(started_at=epoch_now())
        self._status: PhaseStatus | None = None
        self._phase_t0 = time.monotonic()
        self._last: ProgressSnapshot | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="specchaos-progress", daemon=True)

    def start(self) -> "ProgressMonitor":
        self._thread.start()
        return self

    def look(self) -> ProgressSnapshot | None:
        """One look: read, fold, snapshot, render (also what the thread does each tick).
        At a phase change the records that ended before the new phase began
        (``PhaseStatus.started_at``, else now) count for the phase that ended, which gets
        a last snapshot before the new phase's first."""
        st = self.status()
        now = epoch_now()
        new = self.tail.read_new()
        changed = st is not None and (self._status is None or st.phase != self._status.phase)
        if changed and self._status is not None:
            cut = st.started_at if st.started_at is not None else now
            before = [r for r in new if r.end_time is not None and r.end_time < cut]
            new = [r for r in new if not (r.end_time is not None and r.end_time < cut)]
            self.state = fold(self.state, before, now, self.window_s)
            self.renderer.update(self._snapshot(self._status, now))   # the ended phase, complete
        if changed:
            self.state = start_phase(self.state)
            self._phase_t0 = time.monotonic() - (max(0.0, now - st.started_at) if st.started_at is not None else 0.0)
        self.state = fold(self.state, new, now, self.window_s)
        if st is None:
            return None
        self._status = st
        snap = self._snapshot(st, now)
        self.renderer.update(snap)
        self._last = snap
        return snap

    def _snapshot(self, st: PhaseStatus, now: float) -> ProgressSnapshot:
        return snapshot(self.state, phase=st.phase, elapsed_s=time.monotonic() - self._phase_t0,
                        planned_s=st.planned_s, planned_is_limit=st.planned_is_limit, now=now,
                        window_s=self.window_s)

    def _loop(self) -> None:
        failed = False
        while not self._stop.wait(self.interval_s):
            try:
                self.look()
            except Exception as exc:  # noqa: BLE001 - the display must never break the run
                if not failed:
                    log.debug("progress display failed: %s", exc)
                failed = True

    def stop(self) -> None:
        """Stop the thread and close the renderer (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        try:
            self.renderer.close(self._last)
        except Exception as exc:  # noqa: BLE001
            log.debug("closing the progress display failed: %s", exc)

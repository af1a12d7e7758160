"""Stopping processes by signal, for good or in a duty cycle: the mechanism shared by
``process-freeze`` (one role, SIGSTOP for the duration or ``duty_cycle`` of each period) and
``cpu-throttle``'s ``duty_cycle`` mechanism (every role stopped ``1 - cpu_fraction`` of each
period where no cgroup is writable).

Below the fault families: each builds a :class:`StopCycle` per role it stops; neither
imports the other. Every signal is pid-reuse safe (:func:`harness.stack.procs.send_signal_exact`).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import psutil

from faults.targets import signal_recorded
from harness.stack.procs import Recorded, same_process, send_signal_exact

log = logging.getLogger(__name__)

#: Shortest stopped or running slice of a duty cycle (seconds).
MIN_SLICE_S = 0.02
#: Seconds :meth:`StopCycle.release` and :func:`resume` wait for the resumed processes to
#: leave the ``stopped`` state.
RESUME_TIMEOUT_S = 2.0

_POLL_S = 0.02


def slice_error(duty_cycle: float, period_s: float) -> str | None:
    """Why ``duty_cycle`` (fraction of each period stopped, in (0, 1)) over ``period_s``
    seconds cannot be run, or None: a stopped or running slice under :data:`MIN_SLICE_S`."""
    if min(duty_cycle * period_s, (1 - duty_cycle) * period_s) < MIN_SLICE_S:
        return (f"a duty cycle of {duty_cycle:g} over {period_s:g} s makes a slice shorter than {MIN_SLICE_S:g} s; "
                f"lengthen period_s")
    return None


def process_state(pid: int, create_time: float, cmdline: list[str] | None = None) -> str | None:
    """psutil's status of the recorded process (``"stopped"``, ``"running"``, ``"sleeping"``...),
    or None when it is gone or its pid now belongs to another process."""
    if not same_process(pid, create_time, cmdline):
        return None
    try:
        return psutil.Process(pid).status()
    except psutil.Error:
        return None


def resume(targets: Sequence[tuple[int, float, list[str] | None]], timeout_s: float = RESUME_TIMEOUT_S) -> list[int]:
    """SIGCONT every recorded ``(pid, create_time, cmdline)`` that still is that process,
    then wait up to ``timeout_s`` seconds until none is ``stopped``.

    Returns:
        The pids still stopped at the end (normally none).

    Raises:
        PermissionError: a process may not be signalled by this user.
    """
    for pid, ct, cmd in targets:
        send_signal_exact(pid, ct, signal.SIGCONT, cmd)
    deadline = time.monotonic() + timeout_s
    while True:
        left = [pid for pid, ct, cmd in targets if process_state(pid, ct, cmd) == psutil.STATUS_STOPPED]
        if not left or time.monotonic() >= deadline:
            return left
        for pid, ct, cmd in targets:   # a SIGSTOP that raced the first SIGCONT
            if pid in left:
                send_signal_exact(pid, ct, signal.SIGCONT, cmd)
        time.sleep(_POLL_S)


def resume_facts(facts: dict[str, Any]) -> list[int]:
    """After a crash: :func:`resume` the processes of a stop's recorded facts (``pids``,
    ``create_times``, ``cmdlines`` as :meth:`StopCycle.facts` gives them); the pids still
    stopped. Raises PermissionError as :func:`resume`."""
    pids, cts = facts.get("pids") or [], facts.get("create_times") or []
    cmds = facts.get("cmdlines") or [None] * len(pids)
    return resume([(int(pid), float(ct), cmd) for pid, ct, cmd in zip(pids, cts, cmds)])


class StopCycle:
    """SIGSTOP a recorded set of processes, then either leave them stopped (``duty_cycle``
    None) or resume and stop them in turn on a thread: stopped ``duty_cycle * period_s``
    seconds of every ``period_s``, boundaries scheduled from the first stop (no drift).

    ``name`` names the target in logs (``"spec/engine"``). Thread-safe against
    :meth:`release` from another thread."""

    def __init__(self, name: str, duty_cycle: float | None, period_s: float):
        self.name, self.duty_cycle, self.period_s = name, duty_cycle, period_s
        self.targets: list[Recorded] = []          # every process this cycle stopped
        self._lock = threading.RLock()             # signals: the cycle thread against release()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._slices = threading.Condition()
        self._stopped: list[tuple[float, float]] = []   # monotonic (start, planned end) per stopped slice

    def start(self, recorded: list[Recorded], target: str) -> int:
        """SIGSTOP each recorded process that still is itself (``target`` names them in
        errors) and start the duty cycle; how many were stopped (0: every one was gone, and
        nothing runs).

        Raises:
            harness.errors.FaultError: not permitted to signal one of them (those already
                stopped are in :attr:`targets`, for :meth:`release`).
        """
        with self._lock:
            signal_recorded(recorded, signal.SIGSTOP, target, into=self.targets)
            if not self.targets:
                return 0
            t0 = time.monotonic()
            with self._slices:
                self._stopped.append((t0, t0 + self.duty_cycle * self.period_s if self.duty_cycle else float("inf")))
        if self.duty_cycle:
            self._thread = threading.Thread(target=self._run, args=(t0,), name=f"stop-cycle-{self.name}", daemon=True)
            self._thread.start()
        return len(self.targets)

    def facts(self) -> dict[str, Any]:
        """``{"pids": [int], "create_times": [epoch s], "cmdlines": [[str]]}`` of the stopped
        processes (what :func:`resume_facts` needs after a crash)."""
        return {"pids": [t[0] for t in self.targets], "create_times": [t[1] for t in self.targets],
                "cmdlines": [t[2] for t in self.targets]}

    def _signal_all(self, signum: int) -> int:
        n = 0
        for pid, ct, cmd in self.targets:
            try:
                n += bool(send_signal_exact(pid, ct, signum, cmd))
            except PermissionError:
                log.error("not permitted to signal pid %d", pid)
        return n

    def _run(self, t0: float) -> None:
        """Resume and stop the targets in turn until :meth:`release` (or every target is gone)."""
        assert self.duty_cycle is not None
        stop_s = self.duty_cycle * self.period_s
        k = 0
        while True:
            if self._done.wait(max(0.0, t0 + k * self.period_s + stop_s - time.monotonic())):
                return
            with self._lock:
                if self._done.is_set():
                    return
                self._signal_all(signal.SIGCONT)
            k += 1
            if self._done.wait(max(0.0, t0 + k * self.period_s - time.monotonic())):
                return
            with self._lock:
                if self._done.is_set():
                    return
                stopped = self._signal_all(signal.SIGSTOP)
                at = time.monotonic()
            if not stopped:
                log.warning("%s: every stopped process is gone; duty cycle ended", self.name)
                return
            with self._slices:
                self._stopped.append((at, t0 + k * self.period_s + stop_s))
                self._slices.notify_all()

    def stopped_slice(self, deadline: float) -> tuple[float, float] | None:
        """A stopped stretch to measure in, monotonic ``(start, planned end)``: the current
        one if at least half of it is left, else the next (None at ``deadline``, monotonic)."""
        want = (self.duty_cycle * self.period_s / 2) if self.duty_cycle else 0.0
        with self._slices:
            while True:
                if not self._stopped:
                    return None
                start, end = self._stopped[-1]
                if end - time.monotonic() >= want:
                    return start, end
                n = len(self._stopped)
                left = deadline - time.monotonic()
                if left <= 0 or not self._slices.wait_for(self._more_than(n), left):
                    return None

    def _more_than(self, n: int) -> Callable[[], bool]:
        return lambda: len(self._stopped) > n

    def slices_begun(self) -> int:
        """Stopped slices begun so far (1 for a stop without duty cycle)."""
        with self._slices:
            return len(self._stopped)

    def states(self) -> dict[int, str | None]:
        """pid → :func:`process_state` of every stopped process."""
        return {pid: process_state(pid, ct, cmd) for pid, ct, cmd in self.targets}

    def release(self) -> list[int]:
        """End the duty cycle and :func:`resume` every process; the pids still stopped
        (normally none). Idempotent. Raises PermissionError as :func:`resume`."""
        self._done.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        with self._lock:
            return resume(self.targets)

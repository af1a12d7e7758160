"""Stopping processes by signal, for good or in a duty cycle (:class:`StopCycle`): the
``process-freeze`` of a role (:class:`faults.mechanisms.signal.SignalStop`) and
``cpu-throttle``'s ``duty_cycle`` mechanism (:class:`DutyCycleCpu`: every role stopped
``1 - cpu_fraction`` of each period, where no cgroup is writable or when asked).

Every signal is pid-reuse safe (:func:`harness.stack.procs.send_signal_exact`).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import psutil

from faults.mechanisms.base import Mechanism, Target, cpu_seconds
from faults.targets import record_role, signal_recorded
from harness.clock import now
from harness.errors import FaultError
from harness.stack.base import ROLES
from harness.stack.procs import Recorded, same_process, send_signal_exact

log = logging.getLogger(__name__)

#: Shortest stopped or running slice of a duty cycle (seconds).
MIN_SLICE_S = 0.02
#: Seconds :meth:`StopCycle.release` and :func:`resume` wait for the resumed processes to
#: leave the ``stopped`` state.
RESUME_TIMEOUT_S = 2.0

#: Largest distance between the observed stopped share and 1 − cpu_fraction (cpu-throttle).
DUTY_TOLERANCE = 0.25

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


class DutyCycleCpu(Mechanism):
    """``cpu-throttle`` by stopping every targeted role ``1 - cpu_fraction`` of each period
    (one :class:`StopCycle` per role): a wall-clock approximation of a quota. Evidence: the
    share of polls that saw the processes ``stopped``, within :data:`DUTY_TOLERANCE` of
    ``1 - cpu_fraction``; the tree's CPU use (psutil), reported."""

    name: ClassVar[str] = "duty_cycle"
    action: ClassVar[str] = "cpu"
    answers: ClassVar[tuple[str, ...]] = ("duty_cycle", "auto")
    needs: ClassVar[tuple[str, ...]] = ("processes",)

    def __init__(self, t: Target):
        super().__init__(t)
        self.cycles: list[StopCycle] = []
        self.cpu_fraction = 1.0
        self.measured_by = "psutil CPU times of the tree over the window; process states; "

    def apply(self, cpu_fraction: float, period_s: float) -> dict[str, Any]:
        t, self.cpu_fraction = self.t, cpu_fraction
        if cpu_fraction >= 1:
            raise FaultError("cpu_fraction 1 leaves the duty cycle nothing to stop", where=t.where,
                             hint="use a cpu_fraction below 1, or a host with writable cgroups")
        present = t.srv.roles() or {}
        freezes: list[dict[str, Any]] = []
        for role in list(t.roles) if t.roles else [r for r in ROLES if present.get(r)]:   # None: the whole tree
            period = max(period_s, 1.01 * MIN_SLICE_S / min(cpu_fraction, 1 - cpu_fraction))
            where = f"{t.server}/{role}"
            incarnation, procs = record_role(t.srv, t.server, role, where, verb="stopped")
            cycle = StopCycle(where, 1 - cpu_fraction, period)
            self.cycles.append(cycle)
            stopped_at = now()
            if not cycle.start(procs, where):
                raise FaultError(f"every {role} process of server {t.server} went away before the signal", where=where,
                                 hint="the server may be restarting; inject once it is ready")
            freezes.append({**cycle.facts(), "role": role, "duty_cycle": 1 - cpu_fraction, "period_s": period,
                            "incarnation": incarnation, "stopped_at": stopped_at})
        self.targets = [r for c in self.cycles for r in c.targets]
        return {"freezes": freezes}

    def observe(self, window_s: float, limit_cpus: float, obs: dict[str, Any]) -> tuple[bool, str]:
        c0, w0 = cpu_seconds([(pid, ct) for pid, ct, _ in self.targets]), time.monotonic()
        polls, stopped = 0, 0
        while time.monotonic() - w0 < window_s:
            live = [s for s in (process_state(pid, ct) for pid, ct, _ in self.targets) if s is not None]
            polls += 1
            stopped += bool(live) and all(s == psutil.STATUS_STOPPED for s in live)
            time.sleep(_POLL_S)
        w1 = time.monotonic()
        c1 = cpu_seconds([(pid, ct) for pid, ct, _ in self.targets])
        share = stopped / polls if polls else 0.0
        obs.update(window_s=round(w1 - w0, 3), cpu_seconds=round(c1 - c0, 4),
                   cpu_used_cpus=round((c1 - c0) / (w1 - w0), 4), stopped_share=round(share, 3))
        head = (f"{self.t.where}: duty cycle ({obs['fallback_reason'] or 'asked'}): stopped {share:.0%} of "
                f"{obs['window_s']:.1f} s (planned {1 - self.cpu_fraction:.0%}), tree used "
                f"{obs['cpu_used_cpus']:.3f} CPU")
        if abs(share - (1 - self.cpu_fraction)) > DUTY_TOLERANCE:
            return False, head + " — not the planned share"
        return True, head

    def restore(self) -> None:
        errors = []
        for cycle in list(self.cycles):
            if left := cycle.release():
                errors.append(f"{cycle.name}: pids {left} still stopped after SIGCONT")
            else:
                self.cycles.remove(cycle)
        if errors:
            raise FaultError("; ".join(errors))

    @classmethod
    def recover(cls, facts: dict[str, Any], fault_id: str) -> None:
        """SIGCONT the processes of every recorded role (``freezes``)."""
        errors = []
        for ff in facts.get("freezes") or []:
            try:
                if left := resume_facts(ff):
                    errors.append(f"pids {left} still stopped after SIGCONT")
            except PermissionError as exc:
                errors.append(str(exc))
        if errors:
            raise FaultError("; ".join(errors))

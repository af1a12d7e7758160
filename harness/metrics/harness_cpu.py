"""The harness's own CPU use while it drives the load: the load process tree (locust) and
the controller (the process running the experiment: health sampler, /metrics scraper,
Chaos Toolkit, fault actions), so a user can see how much of the machine the measuring
instrument took from the system under test.

:class:`CpuMeter` samples both with psutil (user + system CPU seconds) from the load's
start to its stop; :func:`harness_cpu` turns the figures into ``report.json``'s
``harness_cpu`` section (a pure function). Target of the project: at most 10 % of one
core at 20 requests/s.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import psutil

from harness.load.records import iter_records

log = logging.getLogger(__name__)

__all__ = ["harness_cpu", "process_tree_cpu_s", "CpuMeter", "load_requests"]


def harness_cpu(locust_cpu_s: float, controller_cpu_s: float, wall_s: float, requests: int,
                controller_threads: dict[str, float] | None = None) -> dict[str, Any]:
    """``report.json``'s ``harness_cpu``: the harness's CPU use over a load window.

    Args:
        locust_cpu_s: CPU seconds (user + system) of the load process tree in the window.
        controller_cpu_s: CPU seconds of the controller process in the window.
        wall_s: the window's length, seconds (load start → load stop).
        requests: load requests sent in the window.
        controller_threads: optional CPU seconds per controller thread name (threads of one
            name summed), to see where the controller's CPU went; the five largest are kept.

    Returns:
        ``{"locust_cpu_s", "controller_cpu_s", "wall_s", "requests", "requests_per_s",
        "per_request_ms" (both processes' CPU milliseconds per request; None without
        requests), "percent_of_core" (both, CPU seconds ÷ wall seconds × 100; None for an
        empty window), "locust_percent_of_core", "controller_percent_of_core"}``, plus
        ``"controller_threads": {name: cpu_s}`` (the five largest) when given.

    Raises:
        ValueError: a negative CPU time, wall time or request count.
    """
    for name, v in (("locust_cpu_s", locust_cpu_s), ("controller_cpu_s", controller_cpu_s),
                    ("wall_s", wall_s), ("requests", requests)):
        if v < 0:
            raise ValueError(f"{name} must be >= 0, got {v}")
    total = locust_cpu_s + controller_cpu_s

    def pct(cpu: float) -> float | None:
        return round(cpu / wall_s * 100.0, 2) if wall_s > 0 else None

    out = {
        "locust_cpu_s": round(locust_cpu_s, 3),
        "controller_cpu_s": round(controller_cpu_s, 3),
        "wall_s": round(wall_s, 3),
        "requests": int(requests),
        "requests_per_s": round(requests / wall_s, 3) if wall_s > 0 else None,
        "per_request_ms": round(total * 1000.0 / requests, 3) if requests else None,
        "percent_of_core": pct(total),
        "locust_percent_of_core": pct(locust_cpu_s),
        "controller_percent_of_core": pct(controller_cpu_s),
    }
    if controller_threads is not None:
        top = sorted(controller_threads.items(), key=lambda kv: -kv[1])[:5]
        out["controller_threads"] = {name: round(cpu, 3) for name, cpu in top}
    return out


def process_tree_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) of process ``pid`` and its live descendants; None if
    ``pid`` is gone. Descendants that already exited are not counted."""
    try:
        proc = psutil.Process(pid)
        procs = [proc] + proc.children(recursive=True)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return _tree_cpu_s(procs)


def _tree_cpu_s(procs: list[psutil.Process]) -> float | None:
    """CPU seconds of ``procs`` (the root first); None if the root is gone; a descendant
    that is gone is skipped."""
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            if p is procs[0]:
                return None
            continue
        total += t.user + t.system
    return total


def load_requests(records_path: str | os.PathLike) -> int:
    """Load requests in ``records_path`` (records with ``source == "load"``)."""
    return sum(1 for r in iter_records(Path(records_path)) if r.source == "load")


class CpuMeter:
    """Samples the load processes' trees' and this process's CPU seconds every ``interval_s``
    in a daemon thread, from :meth:`start` to :meth:`stop` (call it before stopping the
    load: the last sample of a live load process is the one that counts, so the load's
    CPU up to at most ``interval_s`` before it exited is counted).

    A load process's descendants are found by walking the host's processes
    (``children(recursive=True)`` reads every process: 2-5 ms with ~100 of them) at the
    start, every :data:`WALK_EVERY` samples and at the last sample; in between, the
    members found are read alone (locust has no children of its own, so the walk finds
    nothing new; a descendant born and gone between two walks is missed).

    Args:
        load_pid: the load process (locust), or all of them (distributed mode: the master
            and its workers, each with its tree).
        interval_s: sampling period, seconds.
    """

    #: Samples between two walks of the host's processes (class doc).
    WALK_EVERY = 5

    def __init__(self, load_pid: int | Sequence[int], interval_s: float = 1.0):
        self.load_pids = [load_pid] if isinstance(load_pid, int) else list(load_pid)
        self.interval_s = interval_s
        self._me = psutil.Process()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = self._t1 = 0.0
        self._c0 = self._c1 = 0.0
        self._l0: dict[int, float] = {}   # per load pid: the first and the last CPU seconds seen
        self._l1: dict[int, float] = {}
        self._th0: dict[int, float] = {}
        self._th1: dict[int, float] = {}
        self._names: dict[int, str] = {}
        self._trees: dict[int, list[psutil.Process]] = {}   # per load pid: its tree at the last walk
        self._samples = 0

    def _controller_s(self) -> float:
        t = self._me.cpu_times()
        return t.user + t.system

    def _threads_s(self) -> dict[int, float]:
        try:
            return {t.id: t.user_time + t.system_time for t in self._me.threads()}
        except psutil.Error:
            return {}

    def _load_cpu_s(self, pid: int, walk: bool) -> float | None:
        """:func:`process_tree_cpu_s` of ``pid`` over the members of its last walk (a new
        walk when ``walk``, or when it has none or lost a member)."""
        procs = self._trees.get(pid)
        if procs is not None and not walk:
            alive = all(p.is_running() for p in procs[1:])
            if alive:
                return _tree_cpu_s(procs)
        try:
            root = psutil.Process(pid)
            self._trees[pid] = procs = [root, *root.children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            self._trees.pop(pid, None)
            return None
        return _tree_cpu_s(procs)

    def _sample(self, walk: bool = False) -> None:
        walk = walk or self._samples % self.WALK_EVERY == 0
        self._samples += 1
        load = {pid: cpu for pid in self.load_pids if (cpu := self._load_cpu_s(pid, walk)) is not None}
        threads = self._threads_s()
        names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
        with self._lock:
            self._t1, self._c1 = time.monotonic(), self._controller_s()
            self._th1.update(threads)
            self._names.update({k: v for k, v in names.items() if k in threads})
            for pid, cpu in load.items():
                self._l0.setdefault(pid, cpu)
                self._l1[pid] = cpu

    def start(self) -> "CpuMeter":
        self._t0, self._c0 = time.monotonic(), self._controller_s()
        self._th0 = self._threads_s()
        self._l0 = {pid: cpu for pid in self.load_pids if (cpu := self._load_cpu_s(pid, True)) is not None}
        self._l1 = dict(self._l0)
        self._t1, self._c1 = self._t0, self._c0
        self._thread = threading.Thread(target=self._run, name="harness-cpu", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._sample()
            except Exception as exc:  # noqa: BLE001 - a meter never breaks the run
                log.debug("harness CPU sample failed: %s", exc)

    def stop(self) -> None:
        """Take a last sample and stop sampling. Idempotent."""
        if self._thread is None or self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self._sample(walk=True)
        except Exception as exc:  # noqa: BLE001
            log.debug("harness CPU sample failed: %s", exc)

    def section(self, requests: int) -> dict[str, Any]:
        """:func:`harness_cpu` over the sampled window with ``requests`` load requests."""
        with self._lock:
            load = sum(cpu - self._l0[pid] for pid, cpu in self._l1.items())
            threads: dict[str, float] = {}
            for tid, cpu in self._th1.items():   # threads seen alive at a sample (ended ones are lost)
                name = self._names.get(tid, "other")
                name = name.split("(")[0].rstrip("-0123456789 ") or name   # Thread-12 (run) -> Thread
                threads[name] = threads.get(name, 0.0) + max(0.0, cpu - self._th0.get(tid, 0.0))
            return harness_cpu(max(0.0, load), max(0.0, self._c1 - self._c0),
                               max(0.0, self._t1 - self._t0), requests, threads)

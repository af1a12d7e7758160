"""Child processes that die with the harness (Linux ``prctl(PR_SET_PDEATHSIG)``), and the
start of a helper process that announces itself with one JSON line (the fault proxy, the
load router).

Shared by every room that starts a process (the stack's servers, the locust load, the
proxies), so the rule is written once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import selectors
import signal
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["die_with_parent", "start_announced", "announced_main", "end_process"]

_PR_SET_PDEATHSIG = 1
_libc = None


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child receive ``sig`` when the *thread* that
    started it dies, or None where ``prctl`` is unavailable.

    Start long-lived children from a thread that lives as long as they do. libc is
    resolved before the fork, so the child only makes the system call; if the parent
    already died before the call took effect, the child exits at once (status 1).
    """
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        prctl = _libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    signum = int(sig)

    def _preexec() -> None:  # runs in the child between fork and exec: keep it minimal
        prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return _preexec


def start_announced(cmd: Sequence[str], cwd: str | Path, timeout_s: float) -> tuple[subprocess.Popen, dict[str, Any]]:
    """Start ``cmd`` (its own session, dying with the harness, stderr discarded) and read the
    one JSON line it prints on stdout once it is ready (e.g. ``{"listen": "127.0.0.1:41234",
    ...}`` or ``{"error": "..."}``).

    Returns:
        ``(popen, line)``: ``line`` is ``{}`` when nothing parsable came within ``timeout_s``
        seconds; the caller decides whether the process is usable and ends it
        (:func:`end_process`) when not.
    """
    popen = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                             preexec_fn=die_with_parent(), cwd=str(cwd),
                             start_new_session=True)   # a terminal's Ctrl-C is the harness's to handle
    sel = selectors.DefaultSelector()
    sel.register(popen.stdout, selectors.EVENT_READ)
    try:
        text = popen.stdout.readline().decode("utf-8", "replace").strip() if sel.select(timeout_s) else ""
    finally:
        sel.close()
    try:
        line = json.loads(text) if text else {}
    except ValueError:
        line = {}
    return popen, line if isinstance(line, dict) else {}


def announced_main(listen: str, serve: Callable[[], None]) -> int:
    """The helper process's side of :func:`start_announced`: run ``serve`` (it validates its
    arguments, prints the ready line and serves until interrupted) and turn a refusal into
    the one ``{"error": ...}`` line the starter reads.

    Args:
        listen: the ``--listen`` address, named in the error when it cannot be bound.
        serve: the body; raises ValueError for a bad argument, OSError when it cannot listen.

    Returns:
        The exit status: 0 (served, or ended by Ctrl-C), 2 (refused, its error line printed).
    """
    try:
        serve()
    except ValueError as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        return 2
    except OSError as exc:
        print(json.dumps({"error": f"cannot listen on {listen}: {exc.strerror or exc}"}), flush=True)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0


def end_process(popen: subprocess.Popen, wait_s: float = 3.0) -> None:
    """End a process of :func:`start_announced`: SIGTERM, ``wait_s`` seconds, then SIGKILL;
    closes its stdout. Idempotent."""
    if popen.poll() is None:
        popen.terminate()
        try:
            popen.wait(wait_s)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(wait_s)
    if popen.stdout is not None:
        popen.stdout.close()

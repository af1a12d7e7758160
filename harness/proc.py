"""Child processes that die with the harness (Linux ``prctl(PR_SET_PDEATHSIG)``).

Shared by every room that starts a process (the stack's servers, the locust load), so
the rule is written once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
from collections.abc import Callable

__all__ = ["die_with_parent"]

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

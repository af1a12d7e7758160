"""Crash-safe record of what a run has started and injected, for ``specchaos cleanup``.

Every run writes ``<state dir>/runs/<run_id>.json`` while it lives::

    {"run_id": str, "owner_pid": int, "owner_create_time": float, "owner_cwd": str, "out_dir": str,
     "ledger": str, "processes": [{"pid": int, "create_time": float, "role": str}]}

(``owner_cwd``: the working directory of the process that runs it, usually its checkout:
cleanup names it for a run it leaves alone because its owner lives.)

Launchers register each process they start (servers, locust); the fault ledger path
is named so cleanup can revert open faults. On a clean end the file is removed.
After a crash, ``specchaos cleanup`` finds files whose owner is gone and tears down
what they list (pid-reuse safe: a pid is only signalled if its create_time matches).

The state dir is ``$SPECCHAOS_STATE_DIR`` or ``~/.local/state/specchaos``.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from pathlib import Path
from typing import Any

import psutil


def state_dir() -> Path:
    """The directory holding run state files (created on demand)."""
    d = Path(os.environ.get("SPECCHAOS_STATE_DIR") or Path.home() / ".local" / "state" / "specchaos")
    (d / "runs").mkdir(parents=True, exist_ok=True)
    return d


class RunState:
    """The state file of one live run. Thread-safe; every change rewrites the file atomically."""

    def __init__(self, out_dir: str | os.PathLike, ledger: str | os.PathLike | None = None, run_id: str | None = None):
        self.run_id = run_id or uuid.uuid4().hex[:12]
        me = psutil.Process()
        self._lock = threading.Lock()
        self.data: dict[str, Any] = {
            "run_id": self.run_id,
            "owner_pid": me.pid,
            "owner_create_time": me.create_time(),
            "owner_cwd": os.getcwd(),
            "out_dir": str(Path(out_dir).resolve()),
            "ledger": str(Path(ledger).resolve()) if ledger else None,
            "processes": [],
            "containers": [],
        }
        self.path = state_dir() / "runs" / f"{self.run_id}.json"
        self._write()

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        os.replace(tmp, self.path)

    def set_ledger(self, ledger: str | os.PathLike) -> None:
        with self._lock:
            self.data["ledger"] = str(Path(ledger).resolve())
            self._write()

    def register_process(self, pid: int, role: str) -> None:
        """Remember a process this run started (its whole tree is killed by cleanup)."""
        try:
            ct = psutil.Process(pid).create_time()
        except psutil.Error:
            return
        with self._lock:
            self.data["processes"].append({"pid": pid, "create_time": ct, "role": role})
            self._write()

    def unregister_process(self, pid: int) -> None:
        with self._lock:
            self.data["processes"] = [p for p in self.data["processes"] if p["pid"] != pid]
            self._write()

    def register_container(self, container_id: str, name: str, engine: str) -> None:
        """Remember a container this run created (``engine``: the Docker engine's URL, e.g.
        ``unix:///tmp/specchaos-docker/docker.sock``): cleanup removes it."""
        with self._lock:
            self.data.setdefault("containers", []).append({"id": container_id, "name": name, "engine": engine})
            self._write()

    def unregister_container(self, container_id: str) -> None:
        with self._lock:
            self.data["containers"] = [c for c in self.data.get("containers", []) if c["id"] != container_id]
            self._write()

    def set_processes(self, processes: list[dict[str, Any]]) -> None:
        """Replace the registered processes (``[{"pid", "create_time", "role"}]``), e.g. with
        the live trees of a stack that outlives the run that started it (:mod:`harness.stack.pool`)."""
        with self._lock:
            self.data["processes"] = list(processes)
            self._write()

    def close(self) -> None:
        """Clean end: forget the run."""
        with self._lock:
            self.path.unlink(missing_ok=True)


_current: RunState | None = None


def set_current(state: RunState | None) -> None:
    """Make ``state`` the run state launchers register into (None to unset)."""
    global _current
    _current = state


def current() -> RunState | None:
    """The live run's state, or None (e.g. in unit tests or a bare library use)."""
    return _current


def register_process(pid: int, role: str) -> None:
    """Register into the current run state, if there is one."""
    if _current is not None:
        _current.register_process(pid, role)


def unregister_process(pid: int) -> None:
    if _current is not None:
        _current.unregister_process(pid)


def register_container(container_id: str, name: str, engine: str) -> None:
    """Register a container into the current run state, if there is one."""
    if _current is not None:
        _current.register_container(container_id, name, engine)


def unregister_container(container_id: str) -> None:
    if _current is not None:
        _current.unregister_container(container_id)

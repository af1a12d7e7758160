"""Fixtures for fault tests: real process trees (see proctree.py) behind a minimal stack.

Every process a test starts is remembered (pid + create_time) and, at teardown, killed
if it still is that process; nothing else is ever signalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from faults.inject import FaultContext, FaultInjector
from faults.ledger import Ledger
from harness.clock import now
from harness.stack.procs import CREATE_TIME_TOLERANCE_S
from harness.timeline import Timeline

PROCTREE = Path(__file__).with_name("proctree.py")
ROLE_TITLES = {"engine": "VLLM::EngineCore", "worker": "VLLM::Worker"}


class Started:
    """Every process started by a test (roots and their descendants), for teardown."""

    def __init__(self) -> None:
        self.seen: dict[int, float] = {}
        self.popens: list[subprocess.Popen] = []
        self.servers: list[TreeServer] = []

    def popen(self, args: list[str]) -> subprocess.Popen:
        p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.popens.append(p)
        self.note(p.pid)
        return p

    def note(self, pid: int) -> None:
        try:
            proc = psutil.Process(pid)
            self.seen[pid] = proc.create_time()
            for c in proc.children(recursive=True):
                self.seen[c.pid] = c.create_time()
        except psutil.Error:
            pass

    def kill_all(self) -> None:
        for server in self.servers:  # first, so no supervisor restarts what is killed below
            server._stopping = True
        for pid, ct in list(self.seen.items()):
            try:
                p = psutil.Process(pid)
                if abs(p.create_time() - ct) <= CREATE_TIME_TOLERANCE_S:
                    p.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        for p in self.popens:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass
        for server in self.servers:
            server.stop()


def start_tree(started: Started, *flags: str, timeout_s: float = 20.0) -> subprocess.Popen:
    """Start api → engine → worker and wait until the worker carries its title."""
    p = started.popen([sys.executable, str(PROCTREE), "api", *flags])
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if tree_roles(p)["worker"]:
            started.note(p.pid)
            return p
        if p.poll() is not None:
            raise RuntimeError(f"proctree exited with {p.returncode}")
        time.sleep(0.02)
    raise RuntimeError("proctree did not come up")


def tree_roles(p: subprocess.Popen) -> dict[str, list[psutil.Process]]:
    """Live processes per role of a tree started by :func:`start_tree` (found by title)."""
    out: dict[str, list[psutil.Process]] = {"api": [], "engine": [], "worker": []}
    if p.poll() is not None:
        return out
    try:
        api = psutil.Process(p.pid)
        children = api.children(recursive=True)
    except psutil.Error:
        return out
    out["api"].append(api)
    for c in children:
        try:
            title = " ".join(c.cmdline())
        except psutil.Error:
            continue
        for role, prefix in ROLE_TITLES.items():
            if title.startswith(prefix):
                out[role].append(c)
    return out


class TreeServer:
    """A minimal ``Server``: one proctree, optionally supervised (restarted when it exits)."""

    def __init__(self, name: str, started: Started, *flags: str, supervise: bool = False):
        self.name, self.started, self.flags, self.supervise = name, started, flags, supervise
        self.base_url, self.model = "http://127.0.0.1:1", "test"
        self.incarnation = 0
        self.restarts: list[dict[str, Any]] = []
        self._ready: dict[int, float] = {}
        self._cond = threading.Condition()
        self._stopping = False
        started.servers.append(self)
        self.popen = start_tree(started, *flags)
        self._ready[0] = now()
        self._thread = None
        if supervise:
            self._thread = threading.Thread(target=self._supervise, daemon=True)
            self._thread.start()

    def _supervise(self) -> None:
        while True:
            rc = self.popen.wait()
            if self._stopping:
                return
            with self._cond:
                self.incarnation += 1
                self.restarts.append({"t": now(), "returncode": rc, "incarnation": self.incarnation})
                inc = self.incarnation
            if self._stopping:
                return
            self.popen = start_tree(self.started, *self.flags)
            with self._cond:
                self._ready[inc] = now()
                self._cond.notify_all()

    def roles(self) -> dict[str, list[psutil.Process]]:
        return tree_roles(self.popen)

    def api_process(self) -> psutil.Process | None:
        r = self.roles()["api"]
        return r[0] if r else None

    def wait_for_incarnation(self, incarnation: int, timeout_s: float) -> float | None:
        with self._cond:
            self._cond.wait_for(lambda: incarnation in self._ready, timeout_s)
            return self._ready.get(incarnation)

    def _kill_tree(self) -> None:
        try:
            root = psutil.Process(self.popen.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            procs = []
        for proc in procs:
            try:
                proc.kill()
            except psutil.Error:
                pass
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            pass

    def stop(self) -> None:
        """Kill the tree and the supervisor (which may be starting a new tree right now)."""
        self._stopping = True
        deadline = time.monotonic() + 20
        while True:
            self._kill_tree()
            if self._thread is None or not self._thread.is_alive() or time.monotonic() > deadline:
                break
            self._thread.join(0.2)
        self._kill_tree()


class TreeStack:
    launcher = "test"
    vllm_version = "none"
    speculative: dict[str, Any] = {}

    def __init__(self, servers: dict[str, Any]):
        self.servers = servers

    def start(self) -> None:
        pass

    def stop(self) -> None:
        for s in self.servers.values():
            s.stop()


@pytest.fixture
def started():
    s = Started()
    yield s
    s.kill_all()


@pytest.fixture
def make_injector(tmp_path):
    """``make_injector(stack)`` → FaultInjector writing tmp_path/{ledger,timeline}.jsonl."""

    def make(stack: Any = None) -> FaultInjector:
        ctx = FaultContext(stack if stack is not None else TreeStack({}),
                           Timeline(tmp_path / "timeline.jsonl"), Ledger(tmp_path / "ledger.jsonl"))
        return FaultInjector(ctx)

    return make


def alive(pid: int, create_time: float) -> bool:
    try:
        p = psutil.Process(pid)
        return abs(p.create_time() - create_time) <= CREATE_TIME_TOLERANCE_S and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_until(pred, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def dead_owner(started: Started) -> tuple[int, float]:
    """(pid, create_time) of a process that existed and is now gone."""
    p = started.popen(["sleep", "30"])
    ct = psutil.Process(p.pid).create_time()
    os.kill(p.pid, signal.SIGKILL)
    p.wait(5)
    return p.pid, ct

"""Fixtures for fault tests: fake vLLM servers (tests/fakes) behind a minimal stack.

Servers are the harness's own supervisor around the fake (``fake_server``, a
:class:`~tests.fakes.FakeServer`), so the roles a fault finds are those of
``LocalServer.roles()`` (:func:`harness.stack.procs.tree_roles`) and restarts are real
supervised restarts; ``fake_vllm`` starts unsupervised fakes. Both fixtures (in
``tests/conftest.py``) tear every tree down. Other processes a test starts go through
:class:`Started`: remembered (pid + create_time) and, at teardown, killed if it still is
that process; nothing else is ever signalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any

import psutil
import pytest

from faults.inject import FaultInjector, InjectionContext
from faults.ledger import Ledger
from harness.stack.procs import CREATE_TIME_TOLERANCE_S
from harness.timeline import Timeline


class Started:
    """Every plain process started by a test, for teardown."""

    def __init__(self) -> None:
        self.seen: dict[int, float] = {}
        self.popens: list[subprocess.Popen] = []

    def popen(self, args: list[str]) -> subprocess.Popen:
        p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.popens.append(p)
        try:
            self.seen[p.pid] = psutil.Process(p.pid).create_time()
        except psutil.Error:
            pass
        return p

    def kill_all(self) -> None:
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


class ServersStack:
    """A started stack as faults see it: its servers by name (started and stopped by the
    ``fake_server`` fixture, so :meth:`stop` leaves them to it)."""

    launcher = "fake"
    vllm_version = "fake"
    speculative: dict[str, Any] = {}

    def __init__(self, **servers: Any):
        self.servers = servers

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


@pytest.fixture
def started():
    s = Started()
    yield s
    s.kill_all()


@pytest.fixture
def make_injector(tmp_path):
    """``make_injector(stack=None)`` → FaultInjector writing tmp_path/{ledger,timeline}.jsonl."""

    def make(stack: Any = None) -> FaultInjector:
        ctx = InjectionContext(stack, Timeline(tmp_path / "timeline.jsonl"), Ledger(tmp_path / "ledger.jsonl"))
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

"""Helpers for the cgroup tests: plain child processes (a busy loop, an allocator, a
parent with children) and a minimal server whose ``roles()`` are such a tree, so the
cgroup families can be driven through the real injector without vLLM."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

from faults import cgroup
from faults.ledger import Ledger
from harness.errors import FaultError

T = TypeVar("T")

BUSY = "import time\nwhile True:\n    pass\n"
#: A parent that starts ``n`` busy children and then sleeps (a "server tree").
TREE = ("import subprocess, sys, time\n"
        "kids = [subprocess.Popen([sys.executable, '-c', 'while True: pass']) for _ in range({n})]\n"
        "time.sleep(600)\n")
#: Allocates ``step`` MiB every 50 ms up to ``total`` MiB, touching every page; prints each step.
ALLOC = ("import sys, time\nblocks = []\n"
         "for i in range({total} // {step}):\n"
         "    b = bytearray({step} << 20)\n    b[::4096] = b'x' * len(b[::4096])\n    blocks.append(b)\n"
         "    print(i, flush=True)\n    time.sleep(0.05)\n"
         "time.sleep(600)\n")


def writable(controller: str) -> bool:
    try:
        cgroup.check_writable(controller)
        return True
    except FaultError:
        return False


def needs_cgroup(controller: str):
    return pytest.mark.skipif(not writable(controller),
                              reason=f"needs a writable {controller} cgroup (root, cgroup v1 here)")


def cpu_rate(pids: list[int], seconds: float) -> float:
    """CPUs used by these processes together over ``seconds`` (psutil user+system)."""
    return sum(cpu_rates(pids, seconds))


def cpu_rates(pids: list[int], seconds: float) -> list[float]:
    """CPUs used by each of these processes over one window of ``seconds`` (psutil
    user+system; 0.0 for one that is gone): compare a process with a control measured in
    the same window, which a busy host slows alike."""
    return cpu_rates_during(pids, lambda: time.sleep(seconds))[0]


def cpu_rates_during(pids: list[int], call: Callable[[], T]) -> tuple[list[float], T]:
    """(CPUs used by each of these processes while ``call()`` ran, as :func:`cpu_rates`,
    what ``call`` returned)."""
    procs = [psutil.Process(p) for p in pids]

    def used(p: psutil.Process) -> float:
        try:
            t = p.cpu_times()
            return t.user + t.system
        except psutil.Error:
            return 0.0

    c0, t0 = [used(p) for p in procs], time.monotonic()
    result = call()
    dt = time.monotonic() - t0
    return [(used(p) - c) / dt for p, c in zip(procs, c0)], result


def specchaos_cgroups(controller: str) -> list[Path]:
    """Every ``specchaos-*`` directory in the controller's hierarchy (none may be left)."""
    h = cgroup.hierarchy(controller)
    return [Path(d) / n for d, dirs, _ in os.walk(h.mount) for n in dirs if n.startswith(cgroup.PREFIX)
            and not n.startswith(f"{cgroup.PREFIX}probe-")]


class PlainServer:
    """A "server" whose process tree is a plain child process (role ``api``) and its
    descendants; no HTTP (``/metrics`` unanswered)."""

    name = "spec"
    model = "none"
    incarnation = 0
    restarts: list[dict[str, Any]] = []

    def __init__(self, proc: psutil.Process, base_url: str = "http://127.0.0.1:9"):
        self.proc = proc
        self.base_url = base_url

    def roles(self) -> dict[str, list[psutil.Process]]:
        """``api``: the process; ``worker``: its children (busy loops of :data:`TREE`)."""
        try:
            kids = self.proc.children()
        except psutil.Error:
            kids = []
        return {"api": [self.proc], "engine": [], "worker": kids}

    def api_process(self) -> psutil.Process:
        return self.proc


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def not_writable_root(tmp_path: Path, controller: str) -> Path:
    """A ``SPECCHAOS_CGROUP_ROOT`` whose ``<controller>/<this process's cgroup>`` is a
    directory even root cannot create a cgroup in (sysfs refuses mkdir: EPERM)."""
    h = cgroup.hierarchy(controller)
    own = cgroup.cgroup_of("self", h).relative_to(h.mount)
    root = tmp_path / "cgroot"
    leaf = root / controller / own
    leaf.parent.mkdir(parents=True, exist_ok=True)
    if leaf == root / controller / ".":
        leaf = root / controller
    leaf.symlink_to("/sys/kernel", target_is_directory=True)
    return root


#: Cgroup ids a test makes without a fault (``TreeCgroup`` directly) start with this, then the
#: test process's pid: ``test-<pid>-<hex>``.
TEST_ID_PREFIX = "test-"


@pytest.fixture(autouse=True)
def no_cgroup_left(tmp_path):
    """Autouse in the cgroup test modules: a ``specchaos-*`` cgroup a test leaves behind (e.g.
    after a failed assertion) is reverted, then reported as a failure. A cgroup counts as this
    test's when its fault id is in a ledger under the test's ``tmp_path`` (every fault it
    injects, in this process or in a ``specchaos run`` it starts, is recorded there first) or
    it is ``test-<this pid>-*``: another xdist worker's cgroups, made meanwhile, are never taken
    for a leak or reverted."""
    def ours() -> set[Path]:
        out: set[Path] = set()
        for c in ("cpu", "memory"):
            try:
                out |= set(specchaos_cgroups(c))
            except FaultError:
                pass
        return out

    before = ours()
    yield
    ids = {e.get("fault_id") for led in tmp_path.rglob("ledger.jsonl") for e in Ledger(led).entries()}
    mine = f"{TEST_ID_PREFIX}{os.getpid()}-"
    left = sorted(d for d in ours() - before
                  if d.name.removeprefix(cgroup.PREFIX) in ids or d.name.removeprefix(cgroup.PREFIX).startswith(mine))
    for d in left:
        cgroup.revert({"path": str(d), "parent": str(d.parent)})
    assert not left, f"cgroups left behind: {left}"

"""Test helpers: find processes of the system under test (to prove nothing leaks), and
wait for a run to reach a point."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import psutil

MARKERS = ("VLLM::", "vllm.entrypoints", "locust", "fake_vllm.py", "faults.proxy")

#: Every process this test session starts inherits this variable (set in tests/conftest.py
#: before anything starts), so a leak check sees this session's processes — orphans
#: included — and not those of another run sharing the machine.
TAG_VAR = "SPECCHAOS_TEST_SESSION"


def _isolate_xdist_worker() -> str:
    """This process's session tag. Under pytest-xdist each worker gets its own tag and its
    own state directory (``$SPECCHAOS_STATE_DIR/<worker>``), so a leak check or a
    ``specchaos cleanup`` in one worker never sees what another worker started."""
    tag = os.environ.setdefault(TAG_VAR, uuid.uuid4().hex)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and not tag.endswith(f"-{worker}"):
        tag = os.environ[TAG_VAR] = f"{tag}-{worker}"
        base = Path(os.environ.get("SPECCHAOS_STATE_DIR") or Path.home() / ".local" / "state" / "specchaos")
        if base.name != worker:
            os.environ["SPECCHAOS_STATE_DIR"] = str(base / worker)
    return tag


TAG = _isolate_xdist_worker()


def _ours(p: psutil.Process) -> bool:
    try:
        return p.environ().get(TAG_VAR) == TAG
    except psutil.Error:
        return False


def sut_pids() -> set[int]:
    """Pids of every vLLM server/engine/worker, fake vLLM and locust process that this test
    session started (tagged through the environment, see :data:`TAG`)."""
    pids = set()
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info.get("cmdline") or [])
        if any(m in cmd for m in MARKERS) and "pytest" not in cmd and _ours(p):
            pids.add(p.info["pid"])
    return pids


def leaked_since(before: set[int], wait_s: float = 20.0, pool=None) -> list[str]:
    """Processes of the SUT that appeared after ``before`` and are still alive after
    ``wait_s`` seconds (gives a torn-down tree time to exit). Returns their cmdlines.
    ``pool``: a :class:`~harness.stack.pool.StackPool` whose stacks outlive the test (a run
    on a pooled stack restarts a server: its new processes belong to the pool, not leaked)."""
    deadline = time.monotonic() + wait_s
    while True:
        new = sut_pids() - before - (pool.pids() if pool is not None else set())
        alive = []
        for pid in new:
            try:
                p = psutil.Process(pid)
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{pid}: {' '.join(p.cmdline())[:120]}")
            except psutil.Error:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.5)


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.2) -> None:
    """Poll ``predicate`` until it is true; AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise AssertionError(f"timed out waiting for {what}")


def phase_started(out: Path, phase: str) -> bool:
    """Whether the run writing ``out`` has started ``phase`` (from its timeline)."""
    tl = Path(out) / "timeline.jsonl"
    return tl.exists() and f'"phase": "{phase}"' in tl.read_text()

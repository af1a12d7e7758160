"""Test helpers: find processes of the system under test, to prove nothing leaks."""

from __future__ import annotations

import time

import psutil

MARKERS = ("VLLM::", "vllm.entrypoints", "locust", "fake_vllm.py")


def sut_pids() -> set[int]:
    """Pids of every vLLM server/engine/worker and locust process on the machine."""
    pids = set()
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info.get("cmdline") or [])
        if any(m in cmd for m in MARKERS) and "pytest" not in cmd:
            pids.add(p.info["pid"])
    return pids


def leaked_since(before: set[int], wait_s: float = 20.0) -> list[str]:
    """Processes of the SUT that appeared after ``before`` and are still alive after
    ``wait_s`` seconds (gives a torn-down tree time to exit). Returns their cmdlines."""
    deadline = time.monotonic() + wait_s
    while True:
        new = sut_pids() - before
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

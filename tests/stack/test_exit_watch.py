"""The supervisor's exit watch: sees a child's exit at once, and sleeps (no polling) while
the child runs."""

from __future__ import annotations

import subprocess
import sys
import time

from harness.stack.supervisor import ExitWatch


def test_sees_the_exit_at_once_and_reaps():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    with ExitWatch(child.pid, lambda: child.poll() is not None) as w:
        assert not w.wait(0.05)
        t0 = time.monotonic()
        assert w.wait(10)
        waited = time.monotonic() - t0
    assert child.returncode == 0
    assert waited < 5


def test_sleeps_while_the_child_runs():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with ExitWatch(child.pid, lambda: child.poll() is not None) as w:
            t0, wall0 = time.thread_time(), time.monotonic()
            for _ in range(5):
                assert not w.wait(0.1)
            cpu, wall = time.thread_time() - t0, time.monotonic() - wall0
        # asleep: a small share of the window's own wall time (Popen.wait(0.1) polls ~10 times
        # per call: 4 % here); a busy poll would use all of it
        assert cpu < 0.15 * wall, (cpu, wall)
    finally:
        child.kill()
        child.wait()


def test_a_child_already_gone():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    time.sleep(0.5)
    with ExitWatch(child.pid, lambda: child.poll() is not None) as w:
        assert w.wait(1)
    assert child.returncode == 0

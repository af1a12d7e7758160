"""Running ci/gate.sh and the plugin in their own processes, as CI and users do."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GATE = ROOT / "ci" / "gate.sh"
SHORT = ROOT / "tests" / "ci" / "experiments" / "short-freeze.yaml"
#: The plugin loaded by module name, the installed entry point blocked (the same module).
PLUGIN = ["-p", "no:specchaos", "-p", "harness.pytest_plugin", "-p", "no:cacheprovider"]


def env(**extra: str) -> dict[str, str]:
    """This process's environment with this checkout first on PYTHONPATH, plus ``extra``."""
    e = dict(os.environ, PYTHONUNBUFFERED="1", SPECCHAOS_PYTHON=sys.executable, **extra)
    e["PYTHONPATH"] = str(ROOT) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    return e


def gate(*args: str, timeout: float = 900, **extra: str) -> subprocess.CompletedProcess:
    """``ci/gate.sh ARGS`` (prints the tail of its output and its wall time)."""
    t0 = time.monotonic()
    proc = subprocess.run([str(GATE), *args], cwd=ROOT, env=env(**extra), capture_output=True, text=True,
                          timeout=timeout)
    print(proc.stdout[-5000:], proc.stderr[-2000:], f"\nci/gate.sh {' '.join(args)}: rc {proc.returncode}, "
          f"{time.monotonic() - t0:.0f} s", sep="\n")
    return proc


def pytest_plugin(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m pytest -p harness.pytest_plugin ARGS`` in the repository root."""
    return subprocess.run([sys.executable, "-m", "pytest", *PLUGIN, *args], cwd=ROOT, env=env(),
                          capture_output=True, text=True, timeout=timeout)


def stderr_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.strip()]

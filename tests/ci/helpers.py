"""Running ci/gate.sh and the plugin in their own processes, as CI and users do."""

from __future__ import annotations

import json
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


#: Runs pytest once per JSON argument list in one Python process (the imports paid once) and
#: prints a JSON list of ``{"rc": exit code, "out": its terminal output}``.
_MANY = """
import contextlib, io, json, sys
import pytest
runs = []
for args in json.loads(sys.argv[1]):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = pytest.main(args)
    runs.append({"rc": int(rc), "out": buf.getvalue()})
sys.__stdout__.write(json.dumps(runs))
"""


def collect_many(*arg_lists: list[str], timeout: float = 180) -> list[tuple[int, str]]:
    """``pytest -p harness.pytest_plugin --collect-only -q ARGS`` for each of ``arg_lists``,
    one after the other in one Python process of its own (``pytest.main`` per list: the
    imports are paid once, not per collection). Returns ``(exit code, terminal output)`` per
    list, in order. Raises AssertionError when the process itself fails."""
    runs = [[*PLUGIN, "-s", "--collect-only", "-q", *args] for args in arg_lists]
    proc = subprocess.run([sys.executable, "-c", _MANY, json.dumps(runs)], cwd=ROOT, env=env(), capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return [(r["rc"], r["out"]) for r in json.loads(proc.stdout.strip().splitlines()[-1])]


def stderr_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.strip()]

"""The static type check of the system-under-test seam and everything that uses it
(``[tool.mypy]`` in pyproject.toml: harness/stack, the fault families, the injector,
cleanup, validation, the session's actions), run by make test's fast group."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_seam_and_its_users_type_check():
    pytest.importorskip("mypy", reason="mypy is in the test extra (make setup-test)")
    res = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", "--cache-dir", str(ROOT / ".mypy_cache")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, "mypy found type errors:\n" + res.stdout[-6000:] + res.stderr[-2000:]


def test_the_type_check_can_fail(tmp_path):
    """The defect: a caller that uses a capability the protocol does not declare."""
    pytest.importorskip("mypy", reason="mypy is in the test extra (make setup-test)")
    bad = tmp_path / "bad.py"
    bad.write_text("from harness.stack.capabilities import Readiness\n\n"
                   "def f(s: Readiness) -> None:\n    s.respeculate('ngram')\n")
    res = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", "--config-file",
                          str(ROOT / "pyproject.toml"), str(bad)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 1 and '"Readiness" has no attribute "respeculate"' in res.stdout, res.stdout

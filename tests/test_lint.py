"""Errors a linter finds before a test run does: undefined names, syntax errors, invalid
comparisons (ruff's E9, F63, F7, F82 — the selection flake8's docs call the serious ones).

A renamed helper whose last caller still used the old name once reached CI this way: the
property tests that called it fail only against a running stack, 40 minutes in.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SELECT = "E9,F63,F7,F82"
SOURCES = ("harness", "faults", "chaosspecchaos", "tests", "bench", "ci", "docs")


def ruff() -> list[str]:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if exe is None:
        pytest.skip("ruff is not installed (the test extra installs it)")
    return [exe]


def check(paths: list[Path | str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*ruff(), "check", "--no-cache", "--isolated", "--select", SELECT,
                           "--output-format", "concise", *map(str, paths)],
                          cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_sources_have_no_undefined_names_or_syntax_errors():
    proc = check([p for p in SOURCES if (ROOT / p).exists()], ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_check_can_fail(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(payload):\n    return _error(payload)\n")
    proc = check([bad], tmp_path)
    assert proc.returncode == 1
    assert "F821" in proc.stdout and "_error" in proc.stdout

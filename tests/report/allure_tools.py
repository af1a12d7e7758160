"""Run ``ci/allure-report.sh`` and ``ci/check_report.py`` from tests. Without the Allure
command line (and no way to install it) or without Chromium, a test is skipped on a
developer's machine and fails in CI (``CI=true``, or ``SPECCHAOS_REQUIRE_REPORT_TOOLS=1``
which ``.ci/run`` sets): there the browser check must run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ALLURE_REPORT = ROOT / "ci" / "allure-report.sh"
CHECK_REPORT = ROOT / "ci" / "check_report.py"
IN_CI = os.environ.get("CI", "").lower() == "true" or os.environ.get("SPECCHAOS_REQUIRE_REPORT_TOOLS") == "1"


def need(ok: bool, why: str) -> None:
    """Skip (or, in CI, fail) unless ``ok``."""
    if not ok:
        (pytest.fail if IN_CI else pytest.skip)(why)


def generate(results: Path, report: Path, **env: str) -> subprocess.CompletedProcess:
    """``ci/allure-report.sh results report``; skips/fails when the Allure CLI is missing."""
    res = subprocess.run([str(ALLURE_REPORT), str(results), str(report)], capture_output=True, text=True,
                         timeout=600, env=dict(os.environ, **env))
    need(not (res.returncode == 2 and "Allure command line is missing" in res.stderr),
         f"Allure command line unavailable: {res.stderr.strip()}")
    assert res.returncode == 0, res.stderr
    assert (report / "index.html").is_file()
    return res


def check(report: Path, shots: Path) -> subprocess.CompletedProcess:
    """``ci/check_report.py report shots``; skips/fails when Chromium is missing."""
    need(bool(os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
              or shutil.which("google-chrome")), "headless Chromium unavailable (apt-get install -y chromium)")
    return subprocess.run([sys.executable, str(CHECK_REPORT), str(report), str(shots)], capture_output=True,
                          text=True, timeout=900)

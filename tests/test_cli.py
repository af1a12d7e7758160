"""The small things a new user meets at the command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("command", [["cleanup"], ["models", "build"], ["run"], ["report"], []])
def test_flags_are_shown_without_a_value(command):
    res = cli(*command, "--help")
    assert res.returncode == 0, res.stderr
    assert "<bool>" not in res.stdout and "--help" in res.stdout
    if command == ["cleanup"]:
        assert "--force " in res.stdout


def test_faults_lists_each_family_its_action_and_the_roles():
    res = cli("faults")
    assert res.returncode == 0, res.stderr
    out = " ".join(res.stdout.split())
    for needle in ("process-kill", "kill_process", "role='worker'", "duration_s=0.0", "VLLM::EngineCore",
                   "VLLM::Worker", "api", "engine", "worker", "processes", "a URL"):
        assert needle in out, needle


def test_version_names_vllm():
    res = cli("--version")
    assert res.returncode == 0 and res.stdout.startswith("specchaos ") and "vLLM" in res.stdout

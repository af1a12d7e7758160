"""ci/junit_check.py, the closing step of ci/test.sh: the total line, and in CI
(``--require-listed``) a failure for every skipped test that tests/allowed-skips.txt does not
name with its reason; on synthetic JUnit XML."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ci.junit_check import (
    ALLOWED,
    Allowed,
    Skip,
    main,
    node_id,
    read_allowed,
    read_groups,
    unlisted,
)

ROOT = Path(__file__).resolve().parents[2]


def junit(d: Path, *cases: str, name: str = "fast") -> Path:
    """A JUnit file of ``cases`` (``<testcase>`` elements) in ``d``; the suite's counts from them."""
    d.mkdir(parents=True, exist_ok=True)
    skipped = sum("<skipped" in c for c in cases)
    failures = sum("<failure" in c for c in cases)
    (d / f"{name}.xml").write_text(
        f'<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0" '
        f'failures="{failures}" skipped="{skipped}" tests="{len(cases)}">{"".join(cases)}</testsuite></testsuites>')
    return d


def case(classname: str, name: str, skip: str | None = None, kind: str = "pytest.skip") -> str:
    inner = f'<skipped type="{kind}" message="{skip}">x.py:1: {skip}</skipped>' if skip is not None else ""
    return f'<testcase classname="{classname}" name="{name}" time="0.1">{inner}</testcase>'


PASSED = case("tests.test_lint", "test_the_check_can_fail")
GPU = case("tests.metrics.test_gpu_telemetry", "test_no_gpu_here_is_one_note_and_no_samples",
           "this host has an NVIDIA GPU")
CGROUP = case("tests.faults.test_cgroup", "test_sigkill_of_the_harness_then_cleanup_leaves_no_cgroup_and_no_limit[x]",
              "needs a writable cpu cgroup")


def run(junit_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "ci" / "junit_check.py"), str(junit_dir), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)


def test_an_unlisted_skip_fails_ci_and_is_named_with_its_message(tmp_path):
    d = junit(tmp_path / "j", PASSED, GPU, CGROUP)
    proc = run(d, "--require-listed")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        "total: 1 passed, 0 failed, 2 skipped",
        ("skipped: tests/faults/test_cgroup.py::test_sigkill_of_the_harness_then_cleanup_leaves_no_cgroup_and_no_limit[x]: "
         "needs a writable cpu cgroup")]
    assert "1 skipped test(s) not in" in proc.stderr
    # outside CI the same skips are listed, and the run's status is its tests'
    assert run(d).returncode == 0


def test_listed_skips_and_xfails_pass(tmp_path):
    xfail = case("tests.ci.test_x", "test_expected", "", kind="pytest.xfail")
    d = junit(tmp_path / "j", PASSED, GPU, xfail)
    proc = run(d, "--require-listed")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == ["total: 1 passed, 0 failed, 2 skipped"]


def test_a_listed_test_skipping_for_another_reason_fails(tmp_path):
    gone = case("tests.metrics.test_gpu_telemetry", "test_no_gpu_here_is_one_note_and_no_samples",
                "vLLM is not installed")
    assert run(junit(tmp_path / "j", gone), "--require-listed").returncode == 1


def test_an_allow_list_entry_without_a_reason_is_refused(tmp_path):
    bad = tmp_path / "allowed.txt"
    bad.write_text("# a comment\n\ntests/faults/test_cgroup.py::*\n")
    proc = run(junit(tmp_path / "j", CGROUP), "--require-listed", "--allowed-skips", str(bad))
    assert proc.returncode == 2 and "allowed.txt:3: expected 'NODE-ID-PATTERN | REASON'" in proc.stderr
    with pytest.raises(ValueError, match="allowed.txt:3"):
        read_allowed(bad)


def test_node_ids_from_junit_names():
    assert node_id("tests.faults.test_cgroup", "test_a[x]") == "tests/faults/test_cgroup.py::test_a[x]"
    assert node_id("tests.ci.test_plugin.TestC", "test_c") == "tests/ci/test_plugin.py::TestC::test_c"
    assert node_id("experiments.kill-draft-worker.yaml", "Kill") == "experiments.kill-draft-worker.yaml::Kill"


def test_pure_parts(tmp_path):
    totals, skips = read_groups(junit(tmp_path / "j", PASSED, CGROUP, GPU))
    assert totals == {"tests": 3, "failures": 0, "errors": 0, "skipped": 2}
    allowed = [Allowed("tests/metrics/*", "NVIDIA GPU")]
    assert unlisted(skips, allowed) == [Skip("tests/faults/test_cgroup.py::test_sigkill_of_the_harness_then_cleanup"
                                             "_leaves_no_cgroup_and_no_limit[x]", "needs a writable cpu cgroup")]
    assert main([str(tmp_path / "j"), "--require-listed", "--allowed-skips", str(tmp_path / "none.txt")]) == 1


def test_every_allowed_skip_names_a_test_that_exists():
    """A renamed or removed test leaves no stale entry in tests/allowed-skips.txt."""
    entries = read_allowed(ALLOWED)
    assert entries, "tests/allowed-skips.txt has no entry"
    for e in entries:
        path, _, rest = e.pattern.partition("::")
        func = re.split(r"[\[*]", rest.split("::")[-1])[0]
        tree = ast.parse((ROOT / path).read_text())
        assert func in {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}, e

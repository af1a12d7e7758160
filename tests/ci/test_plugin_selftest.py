"""The plugin's self-test inversion (harness/pytest_plugin.py): an experiment tagged
``selftest`` must fail, so its item is a strict xfail. A self-test whose verdict is ``fail``
leaves the session green; one that passes, or that errors (at run time or on bad input), fails
the session. Run through the plugin in a pytest of its own, with the fake vLLM under the real
supervisor (tests/experiment/fast_e2e.py), in seconds."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml

from tests.ci.helpers import PLUGIN, ROOT, env
from tests.experiment.fast_e2e import fast_experiment

FAKE = "fake=tests.fakes.stack:FakeStack"


def selftest(tmp: Path, name: str, **config) -> Path:
    """The fast experiment tagged ``selftest``, titled ``name``, ``config`` merged."""
    path = fast_experiment(tmp, name, **config)
    doc = yaml.safe_load(path.read_text())
    doc["title"], doc["tags"] = name, [*doc.get("tags", []), "selftest"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def session(tmp: Path, *experiments: Path) -> tuple[int, dict[str, str], str]:
    """Run ``experiments`` through the plugin in one pytest: (exit code, experiment title →
    outcome from the JUnit XML: passed, failed, error, xfailed, skipped, terminal output)."""
    junit = tmp / "junit.xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", *PLUGIN, "-q", "-rA", "--junitxml", str(junit),
                           "--specchaos-out", str(tmp / "out"), *map(str, experiments)],
                          cwd=ROOT, env=env(SPECCHAOS_STATE_DIR=str(tmp / "state"), SPECCHAOS_LAUNCHERS=FAKE),
                          capture_output=True, text=True, timeout=300, check=False)
    out = proc.stdout[-6000:] + proc.stderr[-2000:]
    outcomes = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        skipped = case.find("skipped")
        if skipped is not None and skipped.get("type") == "pytest.xfail":
            kinds = ["xfailed"]
        outcomes[case.get("name")] = kinds[0] if kinds else "passed"
    return proc.returncode, outcomes, out


def test_a_self_test_that_fails_is_expected_and_one_that_passes_fails_the_session(tmp_path):
    failing = selftest(tmp_path, "selftest-fails", slo={"ttft_p95_s": 0.000001})   # the defect it exists to catch
    passing = selftest(tmp_path, "selftest-passes")                                 # a harness that caught nothing
    code, outcomes, out = session(tmp_path, failing, passing)
    assert outcomes == {"selftest-fails": "xfailed", "selftest-passes": "failure"}, out
    assert "XPASS(strict)" in out and code == 1, out
    # the control alone: a self-test that fails as it must leaves the session green
    code, outcomes, out = session(tmp_path / "alone", failing)
    assert code == 0 and outcomes == {"selftest-fails": "xfailed"}, out


def test_a_self_test_that_errors_fails_the_session(tmp_path):
    # a run-time error (the server exits at start-up: verdict error) and bad input (nothing starts)
    broken = selftest(tmp_path, "selftest-errors", stack={"extra_args": ["--crash", "selftest start-up defect"]})
    bad = selftest(tmp_path, "selftest-bad-input", load={"users": -1})
    code, outcomes, out = session(tmp_path, broken, bad)
    assert code == 1, out
    assert outcomes == {"selftest-errors": "error", "selftest-bad-input": "error"}, out
    assert "selftest start-up defect" in out and "users: Input should be greater than or equal to 1" in out

"""The pytest plugin's pure parts (verdict → outcome, tags → markers, the failure message,
the gate's exit code, the table) and its collection (in a subprocess, nothing started)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest
import yaml

from harness.pytest_plugin import (MARKERS, failure_message, gate_exit_code, markers_of, outcome_of,
                                   verdict_table)
from tests.ci.helpers import PLUGIN, ROOT, SHORT, collect_many, env, pytest_plugin
from tests.experiment.fast_e2e import fast_experiment
from tests.experiment.files import experiment_files
from tests.procs import wait_for


@pytest.mark.parametrize("verdict, outcome", [
    ("pass", "passed"), ("fail", "failed"), ("aborted", "failed"), ("error", "error"),
    (None, "error"), ("weird", "error"),
])
def test_verdict_to_outcome(verdict, outcome):
    assert outcome_of(verdict) == outcome


@pytest.mark.parametrize("verdicts, code", [
    (["pass"], 0), (["pass", "pass"], 0), (["pass", "fail"], 1), (["aborted"], 1),
    (["fail", "error"], 2), (["pass", None], 2), ([], 2),
])
def test_gate_exit_code(verdicts, code):
    assert gate_exit_code(verdicts) == code


def test_tags_to_markers():
    assert markers_of(["specchaos", "slow", "process-kill", "gate", "chaos"]) == ["chaos", "gate", "slow"]
    assert markers_of(["specchaos", "network"]) == []
    assert markers_of(None) == [] and markers_of("gate") == []   # not a list: no marker
    assert set(MARKERS) == {"chaos", "gate", "slow"}


REPORT = {"experiment": "x", "verdict": "fail", "errors": [], "checks": [
    {"name": "slo.baseline.ttft_p95_s", "passed": False, "observed": 0.0312, "limit": 1e-06,
     "detail": "baseline p95 TTFT (s) 0.0312 > 1e-06"},
    {"name": "integrity.mismatched", "passed": True, "observed": 0, "limit": 0},
    {"name": "recovery.time_to_slo_s", "passed": None, "observed": None, "limit": 30},   # not judged
]}


def test_failure_message_lists_each_failing_check_with_observed_and_limit(tmp_path):
    text = failure_message(REPORT, tmp_path)
    assert text.splitlines()[0] == "verdict: fail (x)"
    assert "  slo.baseline.ttft_p95_s: observed 0.0312, limit 1e-06 (baseline p95 TTFT (s) 0.0312 > 1e-06)" in text
    assert "integrity.mismatched" not in text and "recovery.time_to_slo_s" not in text
    assert str(tmp_path / "report.json") in text
    err = failure_message({"verdict": "error", "errors": ["start failed: port 8000 in use"], "checks": []})
    assert "  error: start failed: port 8000 in use" in err


def test_verdict_table_is_compact():
    rows = [{"experiment": "Kill the drafting worker", "verdict": "pass", "failing": [], "duration_s": 171.4},
            {"experiment": "Short", "verdict": "fail", "failing": ["a", "b", "c", "d"], "duration_s": 9.6}]
    lines = verdict_table(rows).splitlines()
    assert re.split(r"\s{2,}", lines[0]) == ["experiment", "verdict", "failing checks", "duration"]
    assert re.split(r"\s{2,}", lines[1]) == ["Kill the drafting worker", "pass", "-", "171 s"]
    assert re.split(r"\s{2,}", lines[2]) == ["Short", "fail", "a, b +2 more", "10 s"]
    assert len({line.index(" pass") if " pass" in line else line.index(" fail") for line in lines[1:]}) == 1


def _items(text: str) -> list[str]:
    return [line for line in text.splitlines() if "::" in line]


def _collected(proc) -> list[str]:
    return _items(proc.stdout)


def test_collects_one_item_per_experiment_with_markers_from_tags():
    (rc, out), (_, gate_out), (_, slow_out), (_, chaos_out) = collect_many(
        ["experiments/"], ["-m", "gate", "experiments/"], ["-m", "slow", "experiments/"], ["-m", "chaos", "experiments/"])
    assert rc == 0, out
    items = _items(out)
    files = experiment_files()   # the shipped ones and selftest/, less the sweep files; nothing started
    assert sorted(i.split("::")[0] for i in items) == [str(f.relative_to(ROOT)) for f in files], items
    assert "experiments/kill-draft-worker.yaml::Kill the drafting worker under load" in items
    assert sorted(i.split("::")[0] for i in _items(gate_out)) == [
        "experiments/client-abort.yaml", "experiments/kill-draft-worker.yaml", "experiments/network-jitter.yaml"]
    assert sorted(i.split("::")[0] for i in _items(slow_out)) == [   # and every real-model one (minutes each)
        "experiments/bad-draft-fallback.yaml", "experiments/memory-pressure.yaml",
        *(str(f.relative_to(ROOT)) for f in experiment_files() if "real-model" in f.parts)]
    tagged = [f for f in files if "chaos" in (yaml.safe_load(f.read_text()).get("tags") or [])]
    assert len(_items(chaos_out)) == len(tagged)


def test_glob_option_collects_and_plain_testpaths_never_do():
    (_, out), (_, walked_out), (_, named_out) = collect_many(
        ["--specchaos-experiments", "experiments/kill-*.yaml", "tests/ci/test_plugin.py::test_tags_to_markers"],
        ["tests/ci/"], [str(SHORT.relative_to(SHORT.parents[3]))])
    items = _items(out)
    assert "experiments/kill-draft-worker.yaml::Kill the drafting worker under load" in items, out
    assert len(items) == 2
    # the fixture experiments under tests/ci/experiments are not collected by walking tests/ci
    walked = _items(walked_out)
    assert walked and not any(i.split("::")[0].endswith(".yaml") for i in walked)   # (ids may name a .yaml)
    # named explicitly, a fixture experiment is collected
    assert _items(named_out) == ["tests/ci/experiments/short-freeze.yaml::Short freeze of the engine (test fixture)"]


def test_a_named_yaml_file_that_is_no_experiment_is_one_line():
    bad = pytest_plugin("--collect-only", "-q", ".github/workflows/chaos-nightly.yml")
    assert bad.returncode != 0
    assert "not a specchaos experiment: no configuration.specchaos block" in bad.stdout


def test_sigterm_stops_the_shared_stack_and_leaves_no_run_state(tmp_path):
    """A gate run with the fake launcher (fast path: the harness's supervisor around the fake
    vLLM) gets SIGTERM once its pooled stack is up: the pytest session ends, every process of
    the pooled stack is gone, and no run state file is left for ``specchaos cleanup``."""
    exp = fast_experiment(tmp_path, "fast-gate")
    state = tmp_path / "state"
    proc = subprocess.Popen([sys.executable, "-m", "pytest", *PLUGIN, "-q", "--specchaos-gate",
                             "--specchaos-out", str(tmp_path / "out"), str(exp)], cwd=ROOT,
                            env=env(SPECCHAOS_STATE_DIR=str(state), SPECCHAOS_LAUNCHERS="fake=tests.fakes.stack:FakeStack"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pids: list[int] = []

    def pooled_stack_registered() -> bool:
        for f in (state / "runs").glob("*.json") if (state / "runs").exists() else []:
            try:
                data = json.loads(f.read_text())
            except ValueError:
                continue
            if "/stacks/stack-" in data["out_dir"]:
                pids[:] = [p["pid"] for p in data["processes"]]
        return bool(pids)

    try:
        wait_for(pooled_stack_registered, 90, "the pooled stack to register its processes")
        time.sleep(2)   # into the run
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, out[-3000:]
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not list((state / "runs").glob("*.json")), "a run state file was left behind"
    rows = json.loads((tmp_path / "out" / "verdicts.json").read_text())["experiments"]
    assert rows[0]["verdict"] == "error" and any("SIGTERM" in e for e in rows[0]["errors"]), rows
    assert os.path.exists(tmp_path / "out" / "01-fast-gate" / "report.json")


def test_a_broken_experiment_under_a_named_directory_is_a_collection_error(tmp_path):
    """A gate experiment with a YAML error or a misspelled ``configuration.specchaos`` must not
    drop silently out of the gate; other YAML files, ``.json`` files found by walking and the
    copies in a run directory are not collected."""
    d = tmp_path / "exps"
    (d / "run-01").mkdir(parents=True)
    good = (ROOT / "experiments" / "kill-draft-worker.yaml").read_text()
    (d / "good.yaml").write_text(good)
    (d / "other.yaml").write_text("a: 1\n")                      # not an experiment: ignored
    (d / "found.json").write_text('{"configuration": {"specchaos": {}}}')   # .json only when named
    (d / "run-01" / "copy.yaml").write_text(good)                 # a run directory's copy
    (d / "run-01" / "report.json").write_text("{}")
    ok = pytest_plugin("--collect-only", "-q", str(d))
    assert ok.returncode == 0, ok.stdout
    assert [i.split("::")[0].rsplit("/", 1)[-1] for i in _collected(ok)] == ["good.yaml"], ok.stdout
    (d / "broken.yaml").write_text(good.replace("method:", "method: [", 1))
    (d / "typo.yaml").write_text(good.replace("  specchaos:", "  specchaos_:", 1))
    bad = pytest_plugin("--collect-only", "-q", str(d))
    assert bad.returncode == 2, bad.stdout
    assert "broken.yaml: not a specchaos experiment: not YAML" in bad.stdout
    assert "typo.yaml: not a specchaos experiment: no configuration.specchaos block" in bad.stdout


def test_walking_the_project_root_collects_no_experiment():
    items = _collected(pytest_plugin("--collect-only", "-q", ".", "--ignore=tests", "--ignore=bench"))
    assert not [i for i in items if ".yaml" in i or ".json" in i], items

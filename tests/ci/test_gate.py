"""ci/gate.sh, the pre-release gate: bad input (fast, nothing started) and two real-stack
runs (short phases): one gate experiment passing, one made to fail by an impossible latency
limit and a hand-written test with the plugin's fixtures, run on ONE shared stack, exit 1;
the passing one alone, exit 0."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from faults.ledger import Ledger
from harness.stack.vllm import vllm_distribution
from harness.timeline import read_timeline
from tests.ci.helpers import ROOT, SHORT, env, gate, stderr_lines

#: A hand-written chaos test with the plugin's fixtures, run beside the experiments.
EXAMPLE = Path(__file__).parent / "examples" / "chaos_fixtures.py"


# ---------------------------------------------------------------------- bad input: one line, exit 2
def test_a_path_that_does_not_exist():
    proc = gate("experiments/no-such.yaml", timeout=60)
    assert proc.returncode == 2
    assert stderr_lines(proc) == ["gate: no such experiment file or directory: experiments/no-such.yaml"]


def test_no_gate_tagged_experiment(tmp_path):
    proc = gate("experiments/freeze-engine.yaml", "experiments/selftest", timeout=120,
                SPECCHAOS_GATE_OUT=str(tmp_path / "out"), SPECCHAOS_GATE_ALLURE=str(tmp_path / "allure"))
    assert proc.returncode == 2
    lines = stderr_lines(proc)
    assert len(lines) == 1 and lines[0].startswith("gate: no gate-tagged experiment selected among "), lines
    assert "experiments/freeze-engine.yaml" in lines[0]
    assert not (tmp_path / "out").exists()   # nothing ran


def test_html_without_the_allure_command_line(tmp_path):
    proc = gate("--html", str(SHORT), timeout=60, ALLURE_CLI=str(tmp_path / "no-allure"),
                SPECCHAOS_GATE_OUT=str(tmp_path / "out"))
    assert proc.returncode == 2
    lines = stderr_lines(proc)
    assert len(lines) == 1 and lines[0].startswith("gate: --html needs the Allure command line, not found"), lines
    assert not (tmp_path / "out").exists()


def test_the_gate_removes_only_allure_files_from_its_results_directory(tmp_path):
    results = tmp_path / "allure"
    results.mkdir()
    for name in ("old-result.json", "old-container.json", "old-attachment.png", "environment.properties"):
        (results / name).write_text("{}")
    (results / "notes.txt").write_text("mine")
    gate("experiments/freeze-engine.yaml", timeout=120, SPECCHAOS_GATE_OUT=str(tmp_path / "out"),
         SPECCHAOS_GATE_ALLURE=str(results))   # no gate experiment: exit 2, after the clean-up
    assert sorted(p.name for p in results.iterdir()) == ["notes.txt"]


def test_the_report_script_refuses_to_empty_a_directory_that_is_no_report(tmp_path):
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "x-result.json").write_text("{}")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "keep.txt").write_text("mine")
    proc = subprocess.run([str(ROOT / "ci" / "allure-report.sh"), str(tmp_path / "res"), str(tmp_path / "mine")],
                          cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and len(stderr_lines(proc)) == 1 and "no Allure report" in proc.stderr
    assert (tmp_path / "mine" / "keep.txt").exists()


@pytest.mark.parametrize("body, code", [
    ("@pytest.fixture\ndef stack():\n    raise RuntimeError('no stack')\n\n"
     "@pytest.mark.gate\ndef test_x(stack):\n    pass\n", 2),                     # setup error: an error
    ("@pytest.mark.gate\ndef test_x():\n    pytest.skip('not here')\n", 2),    # all skipped: nothing judged
    ("@pytest.mark.gate\ndef test_x():\n    assert False\n", 1),               # a finding
    ("@pytest.mark.gate\ndef test_x():\n    pass\n", 0),
])
def test_hand_written_gate_tests_map_onto_the_gate_codes(tmp_path, body, code):
    test = tmp_path / "test_handwritten.py"
    test.write_text("import pytest\n\n" + body)
    proc = gate(str(test), timeout=120, SPECCHAOS_GATE_OUT=str(tmp_path / "out"),
                SPECCHAOS_GATE_ALLURE=str(tmp_path / "allure"))
    assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_an_unknown_option():
    usage = "usage: ci/gate.sh [--html] [--set PATH=VALUE]... [--var-file FILE]... [EXPERIMENT_FILES_OR_DIRS...]"
    proc = gate("--fast", timeout=60)
    assert proc.returncode == 2 and stderr_lines(proc) == [f"gate: unknown option --fast ({usage})"]
    proc = gate("--set", timeout=60)
    assert proc.returncode == 2 and stderr_lines(proc) == [f"gate: --set needs a value ({usage})"]


def test_an_override_reaches_every_experiment_and_a_bad_one_is_an_error(tmp_path):
    """``--set`` (and ``--var-file``) go to the plugin, which applies them to each experiment
    before it validates: an invalid value is the item's one-line error naming the override,
    and nothing starts."""
    varfile = tmp_path / "vars.yaml"
    varfile.write_text("phases:\n  baseline_s: 5\n")
    proc = gate("--var-file", str(varfile), "--set", "load.users=0", str(SHORT), timeout=300,
                SPECCHAOS_GATE_OUT=str(tmp_path / "out"), SPECCHAOS_GATE_ALLURE=str(tmp_path / "allure"))
    assert proc.returncode == 2
    assert "--set load.users=0: Input should be greater than or equal to 1" in proc.stdout
    rows = json.loads((tmp_path / "out" / "verdicts.json").read_text())["experiments"]
    assert [r["verdict"] for r in rows] == ["error"] and not (tmp_path / "out" / "stacks").exists()


def test_an_experiment_that_does_not_validate_is_an_error(tmp_path):
    doc = yaml.safe_load(SHORT.read_text())
    doc["configuration"]["specchaos"]["stack"]["draft"] = "no-such-draft"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = gate(str(bad), timeout=300, SPECCHAOS_GATE_OUT=str(tmp_path / "out"),
                SPECCHAOS_GATE_ALLURE=str(tmp_path / "allure"))
    assert proc.returncode == 2
    assert "configuration.specchaos.stack.draft" in proc.stdout   # the item's error names the field
    assert re.search(r"\b1 error\b", proc.stdout) and "failed" not in proc.stdout.splitlines()[-1]   # an error, not a failure
    rows = json.loads((tmp_path / "out" / "verdicts.json").read_text())["experiments"]
    assert [r["verdict"] for r in rows] == ["error"]


# ---------------------------------------------------------------------- real stack
def _impossible(tmp: Path) -> Path:
    """The short experiment with an impossible p95 TTFT limit (1 µs); same stack block."""
    doc = yaml.safe_load(SHORT.read_text())
    doc["title"] = "Short freeze, impossible TTFT limit (test fixture)"
    doc["configuration"]["specchaos"]["slo"]["ttft_p95_s"] = 0.000001
    path = tmp / "short-freeze-impossible.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture
def real_vllm():
    if vllm_distribution() is None:
        pytest.skip("vLLM is not installed")


@pytest.mark.stack
@pytest.mark.nightly     # ci/gate.sh's own pytest starts its own stack (about 2 minutes): nightly; in make
@pytest.mark.own_stack   # test: the gate's exit codes (above, tests/ci/test_plugin.py), the pool's reuse
                         # (tests/ci/test_pool.py), the experiments on the shared stack (tests/experiment)
def test_gate_fails_on_an_impossible_limit_with_both_runs_on_one_stack(real_vllm, tmp_path):
    out = tmp_path / "out"
    proc = gate(str(SHORT), str(_impossible(tmp_path)), str(EXAMPLE), SPECCHAOS_GATE_OUT=str(out),
                SPECCHAOS_GATE_ALLURE=str(tmp_path / "allure"))
    assert proc.returncode == 1, proc.stdout[-3000:]
    verdicts = json.loads((out / "verdicts.json").read_text())
    rows = verdicts["experiments"]
    assert [r["verdict"] for r in rows] == ["pass", "fail"]
    assert "slo.baseline.ttft_p95_s" in rows[1]["failing"]
    # the stack started ONCE: reused by the second experiment and by the hand-written test
    assert verdicts["stacks"] == {"starts": 1, "reuses": 2}
    assert "2 passed, 1 failed" in proc.stdout or "1 failed, 2 passed" in proc.stdout
    # the fixtures' fault was cleared at teardown (the ledger of the hand-written test)
    ledgers = list((out / "tests").glob("*/ledger.jsonl"))
    assert len(ledgers) == 1 and [e["state"] for e in Ledger(ledgers[0]).entries()] == ["cleared"]
    # the same evidence in each run's timeline: started by the first run, reused by the second
    first, second = (Path(r["run_dir"]) for r in rows)
    pooled = [[e for e in read_timeline(d / "timeline.jsonl") if e["event"] == "stack_pooled"] for d in (first, second)]
    assert [p[0]["uses"] for p in pooled] == [1, 2] and pooled[0][0]["key"] == pooled[1][0]["key"]
    assert [e["event"] for e in read_timeline(second / "timeline.jsonl")].count("server_ready") == 0
    assert (second / "logs" / "spec-server.log").stat().st_size > 0   # its slice of the shared server's log
    # the item outcome follows the verdict; the message lists the failing check with observed and limit
    assert "_ experiment: Short freeze, impossible TTFT limit (test fixture) _" in proc.stdout   # the failed item
    assert re.search(r"slo\.baseline\.ttft_p95_s: observed [0-9.e-]+, limit 1e-06", proc.stdout)
    # the verdict table
    table = proc.stdout[proc.stdout.index("experiment  "):]
    assert re.search(r"Short freeze of the engine \(test fixture\)\s+pass\s+-\s+\d+ s", table)
    assert re.search(r"Short freeze, impossible TTFT limit \(test fixture\)\s+fail\s+slo\.baseline\.ttft_p95_s", table)
    assert "stacks started: 1, reused: 2" in proc.stdout


@pytest.mark.stack
@pytest.mark.nightly
@pytest.mark.own_stack
def test_gate_passes_when_every_gate_experiment_passes(real_vllm, tmp_path):
    out = tmp_path / "out"
    proc = gate(str(SHORT), SPECCHAOS_GATE_OUT=str(out), SPECCHAOS_GATE_ALLURE=str(tmp_path / "allure"))
    assert proc.returncode == 0, proc.stdout[-3000:]
    rows = json.loads((out / "verdicts.json").read_text())["experiments"]
    assert [r["verdict"] for r in rows] == ["pass"] and "1 passed" in proc.stdout

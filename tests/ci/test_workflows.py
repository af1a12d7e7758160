"""The workflow files (.github/workflows): valid YAML, the expected triggers, runners and
jobs, shell steps that parse, and every local command they call exists (scripts under ci/,
make targets, specchaos subcommands)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest
import yaml

from harness.experiment.overrides import read_var_file
from harness.experiment.validate import load_experiment
from tests.ci.helpers import ROOT

WORKFLOWS = ROOT / ".github" / "workflows"
NIGHTLY, GPU = WORKFLOWS / "chaos-nightly.yml", WORKFLOWS / "chaos-gpu.yml"
#: The docs page that explains the GPU workflow's repository variables.
GPU_DOCS = ROOT / "docs" / "guides" / "gate-and-allure.md"


def load(path):
    doc = yaml.safe_load(path.read_text())
    doc["on"] = doc.pop(True, doc.get("on"))   # YAML 1.1 reads the key `on` as true
    return doc


def steps(doc):
    return [s for job in doc["jobs"].values() for s in job["steps"]]


def run_blocks(doc) -> list[str]:
    return [s["run"] for s in steps(doc) if "run" in s]


def commands(doc) -> list[list[str]]:
    """Every simple command of every ``run:`` block, as words (``&&``, ``;``, ``|`` split)."""
    out = []
    for block in run_blocks(doc):
        for line in block.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            for part in re.split(r"&&|\|\||;|\|", line):
                words = shlex.split(part.strip(), comments=True)
                if words:
                    out.append(words)
    return out


def make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


def test_nightly_runs_on_a_cron_on_a_cpu_runner_and_keeps_allure_history():
    doc = load(NIGHTLY)
    assert set(doc["on"]) == {"schedule", "workflow_dispatch"}
    assert len(doc["on"]["schedule"][0]["cron"].split()) == 5
    job = doc["jobs"]["gate"]
    assert job["runs-on"] == "ubuntu-latest" and job["env"]["SPECCHAOS_EXTRA"] == "cpu"
    uses = [s.get("uses", "") for s in steps(doc)]
    assert any(u.startswith("actions/cache/restore@") for u in uses)
    assert any(u.startswith("actions/cache/save@") for u in uses)
    assert any(u.startswith("actions/upload-artifact@") for u in uses)
    words = [w for c in commands(doc) for w in c]
    assert "ci/gate.sh" in words and "ci/allure-report.sh" in words and "ci/check_report.py" in words
    assert ["make", "setup-test", "models", "models-real"] in commands(doc)   # the real set: the nightly real-model runs
    # the whole chaos suite runs, not only the gate, and the nightly test tier (the property suite's
    # nightly budget and the verdict-stability runs among it)
    assert "chaos and not gate" in words and ["make", "test-nightly"] in commands(doc)
    assert job["timeout-minutes"] >= 240   # three runs of every shipped experiment fit


def test_gpu_variant_runs_on_a_self_hosted_gpu_runner_with_real_models():
    doc = load(GPU)
    assert "schedule" in doc["on"] and "workflow_dispatch" in doc["on"]
    job = doc["jobs"]["gate-gpu"]
    assert {"self-hosted", "gpu"} <= set(job["runs-on"])
    assert job["env"]["SPECCHAOS_EXTRA"] == "gpu"
    for var in ("SPECCHAOS_GPU_MODELS_DIR", "SPECCHAOS_GPU_TARGET", "SPECCHAOS_GPU_DRAFT"):
        assert job["env"][var] == "${{ vars.%s }}" % var
        assert var in GPU_DOCS.read_text(), f"{var} is not documented in {GPU_DOCS.relative_to(ROOT)}"
    words = [w for c in commands(doc) for w in c]
    assert "ci/gpu-experiments.py" in words and "ci/gate.sh" in words
    assert ["ci/gate.sh", "--var-file", "results/gpu-overrides.json", "experiments/"] in commands(doc)


@pytest.mark.parametrize("path", [NIGHTLY, GPU], ids=lambda p: p.name)
def test_every_shell_step_parses(path):
    for block in run_blocks(load(path)):
        block = re.sub(r"\$\{\{[^}]*\}\}", "X", block)   # GitHub expressions are substituted before bash
        proc = subprocess.run(["bash", "-n"], input=block, capture_output=True, text=True)
        assert proc.returncode == 0, f"{path.name}: {proc.stderr}\n{block}"


def _local_commands() -> list[tuple[str, list[str]]]:
    out = []
    for path in (NIGHTLY, GPU):
        for words in commands(load(path)):
            out.append((path.name, words))
    return out


@pytest.mark.parametrize("workflow, words", _local_commands(), ids=lambda x: " ".join(x) if isinstance(x, list) else x)
def test_every_local_command_exists(workflow, words):
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):   # VAR=value prefixes
        words = words[1:]
    head = words[0]
    if head == ".venv/bin/python":   # a script of this repo, or pytest over paths of this repo
        if words[1:3] == ["-m", "pytest"]:
            paths = [w for w in words[3:] if not w.startswith(("-", "results/")) and "/" in w]   # results/: outputs
            assert paths and all((ROOT / p).exists() for p in paths), f"{workflow}: a missing path in {words}"
        else:
            assert (ROOT / words[1]).is_file(), f"{workflow}: {words[1]} missing"
    elif head.startswith("ci/"):
        assert (ROOT / head).is_file() and os.access(ROOT / head, os.X_OK), f"{workflow}: {head} missing or not executable"
    elif head == "make":
        targets = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        assert targets and set(targets) <= make_targets(), f"{workflow}: unknown make target in {words}"
    elif head.endswith("/specchaos") or head == "specchaos":
        sub = words[1]
        proc = subprocess.run([sys.executable, "-m", "harness.cli", sub, "--help"], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, f"{workflow}: `specchaos {sub}` is no subcommand: {proc.stderr[-500:]}"
    else:   # shell built-ins and tools the runner brings
        assert head in {"set", "echo", "mkdir", "cp", "rm", "if", "then", "fi", "exit", "npm", "sudo", "["}, \
            f"{workflow}: a command this test does not know: {words}"


def test_the_gpu_overrides_point_every_experiment_at_the_real_models(tmp_path):
    """ci/gpu-experiments.py writes a var file; applied to a shipped experiment it gives the
    GPU stack, and the experiment file is left as it is."""
    env = dict(os.environ, SPECCHAOS_GPU_MODELS_DIR=str(ROOT / "models"), SPECCHAOS_GPU_TARGET="target",
               SPECCHAOS_GPU_DRAFT="draft-acc80")
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, "ci/gpu-experiments.py", str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    exp_file = ROOT / "experiments" / "kill-draft-worker.yaml"
    before = exp_file.read_text()
    stack = load_experiment(exp_file, overrides=read_var_file(out)).cfg.stack
    assert stack.models_dir == str(ROOT / "models") and stack.target == "target" and stack.draft == "draft-acc80"
    assert stack.method == "draft_model" and stack.enforce_eager is False and stack.dtype == "bfloat16"
    assert stack.extra_args == ["--gpu-memory-utilization", "0.4"] and stack.num_speculative_tokens == 4
    assert exp_file.read_text() == before
    # no draft: ngram, and the draft the experiment names is unset
    env.pop("SPECCHAOS_GPU_DRAFT")
    subprocess.run([sys.executable, "ci/gpu-experiments.py", str(out)], cwd=ROOT, env=env, check=True,
                   capture_output=True, timeout=60)
    stack = load_experiment(exp_file, overrides=read_var_file(out)).cfg.stack
    assert stack.method == "ngram" and stack.draft is None
    missing = subprocess.run([sys.executable, "ci/gpu-experiments.py", str(out)], cwd=ROOT,
                             env={k: v for k, v in env.items() if k != "SPECCHAOS_GPU_TARGET"},
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1
    assert "SPECCHAOS_GPU_TARGET is not set" in missing.stderr


@pytest.mark.parametrize("extra, needle", [
    ({"SPECCHAOS_GPU_K": "abc"}, "$SPECCHAOS_GPU_K must be a whole number"),
    ({"SPECCHAOS_GPU_MEMORY_UTILIZATION": "x"}, "$SPECCHAOS_GPU_MEMORY_UTILIZATION must be a fraction"),
    ({"SPECCHAOS_GPU_MEMORY_UTILIZATION": "1.5"}, "$SPECCHAOS_GPU_MEMORY_UTILIZATION must be a fraction"),
    ({"OUT_IS_DIR": "1"}, "is a directory"),
])
def test_bad_gpu_settings_are_one_line_exit_2(tmp_path, extra, needle):
    env = dict(os.environ, SPECCHAOS_GPU_MODELS_DIR="/models", SPECCHAOS_GPU_TARGET="/models/t", **extra)
    out = tmp_path if "OUT_IS_DIR" in extra else tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, "ci/gpu-experiments.py", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert needle in proc.stderr


def test_the_cpu_and_gpu_workflows_keep_separate_allure_histories():
    def keys(doc):
        return {str(v) for s in steps(doc) for k, v in (s.get("with") or {}).items() if k in ("key", "restore-keys")}
    cpu, gpu = keys(load(NIGHTLY)), keys(load(GPU))
    assert cpu and gpu
    assert all(k.startswith("allure-history-cpu-") for k in cpu) and all(k.startswith("allure-history-gpu-") for k in gpu)

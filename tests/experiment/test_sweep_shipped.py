"""The shipped sweeps: ``experiments/sweep-speculation.yaml`` and the known answers of
``experiments/sweep-known-answers.yaml`` (its traffic file of repetitive and random
prompts beside it). Their plans validate in make test (seconds); the whole sweeps run on the
real stack in the nightly tier."""

from __future__ import annotations

import json

import pytest

from harness.experiment.sweep import plan_sweep
from tests.experiment.files import EXPERIMENTS, ROOT
from tests.experiment.test_bad_input import cli

SWEEP = EXPERIMENTS / "sweep-speculation.yaml"
KNOWN = EXPERIMENTS / "sweep-known-answers.yaml"


def test_the_shipped_sweep_plans(models_built):
    plan = plan_sweep(SWEEP)
    assert len(plan.runs) == 16 and plan.stacks == 4
    assert sum(len(r.buckets) * len(r.sampling) for r in plan.runs) == 48
    assert plan.cfg.pairing == "blocks" and all(len(r.blocks) == 2 * plan.cfg.blocks for r in plan.runs)
    # runs of one stack follow each other, so each stack starts once
    keys = [r.stack_key for r in plan.runs]
    assert keys == sorted(keys, key=keys.index) and len(set(keys)) == 4


def test_the_known_answer_sweep_plans(models_built, monkeypatch):
    """Two speculators (draft-acc20, ngram) x concurrency 1 and 2, the traffic file's two
    kinds as the buckets ``random`` and ``repetitive`` of one run."""
    monkeypatch.chdir(ROOT)   # load.source.path is relative to the working directory
    plan = plan_sweep(KNOWN)
    assert [r.id for r in plan.runs] == ["acc20-k4-c1-greedy", "acc20-k4-c2-greedy", "ngram-k4-c1-greedy",
                                         "ngram-k4-c2-greedy"]
    assert all(r.buckets == ["random", "repetitive"] for r in plan.runs) and plan.stacks == 2
    lines = [json.loads(ln) for ln in (EXPERIMENTS / "sources" / "repetitive-vs-random.jsonl").read_text().splitlines()]
    assert len(lines) == 24 and sum("JSON list" in x["prompt"] for x in lines) == 12


def swept(sweep, out) -> dict:
    """Run a sweep file with the CLI; its policy.json, every cell measured."""
    res = cli("sweep", str(sweep), "--out", str(out), "--no-progress", cwd=ROOT)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    pol = json.loads((out / "policy.json").read_text())
    assert pol["missing"] == []
    return pol


@pytest.mark.stack
@pytest.mark.nightly
@pytest.mark.own_stack
@pytest.mark.timeout(3600)
def test_the_shipped_sweep_on_the_real_stack(tmp_path, models_built):
    pol = swept(SWEEP, tmp_path / "sweep")
    assert len(pol["cells"]) == 48
    assert pol["sweep"]["stack_starts"] == 4 and pol["sweep"]["stack_reuses"] == 16 * 4 - 4
    p = pol["policy"]
    assert p is not None and {"enabled", "enable", "k_by_bucket", "breaker", "vllm", "notes"} <= set(p)
    assert all(r["rests_on"] for r in p["k_by_bucket"])
    # the policy never rests on an implausible cell
    bad = {c["id"] for c in pol["cells"] if c["plausibility"]["state"] == "implausible"}
    assert not bad & set(p["enable"]["rests_on"])


@pytest.mark.stack
@pytest.mark.nightly
@pytest.mark.own_stack
@pytest.mark.timeout(3600)
def test_the_known_answers_on_the_real_stack(tmp_path, models_built):
    """A ~20 % draft is off in every bucket; ngram is never enabled on random prompts."""
    pol = swept(KNOWN, tmp_path / "sweep")
    cells = {c["id"]: c for c in pol["cells"]}
    for c in cells.values():
        if c["speculator"] == "acc20" or c["bucket"] == "random":
            assert c["verdict"] != "gain", (c["id"], c["reason"])
    p = pol["policy"]
    enabled = {r["bucket"] for r in p["k_by_bucket"] if r["enabled"]} if p["enabled"] else set()
    assert "random" not in enabled and (not p["enabled"] or p["speculator"] == "ngram")

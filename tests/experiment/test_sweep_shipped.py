"""The shipped sweep, ``experiments/sweep-speculation.yaml``: its plan validates in make
test (seconds); the whole sweep runs on the real stack in the nightly tier (~15 min)."""

from __future__ import annotations

import json

import pytest

from harness.experiment.sweep import plan_sweep
from tests.experiment.files import EXPERIMENTS, ROOT
from tests.experiment.test_bad_input import cli

SWEEP = EXPERIMENTS / "sweep-speculation.yaml"


def test_the_shipped_sweep_plans(models_built):
    plan = plan_sweep(SWEEP)
    assert len(plan.runs) == 16 and plan.stacks == 4
    assert sum(len(r.buckets) * len(r.sampling) for r in plan.runs) == 48
    # runs of one stack follow each other, so each stack starts once
    keys = [r.stack_key for r in plan.runs]
    assert keys == sorted(keys, key=keys.index) and len(set(keys)) == 4


@pytest.mark.stack
@pytest.mark.nightly
@pytest.mark.own_stack
@pytest.mark.timeout(1800)
def test_the_shipped_sweep_on_the_real_stack(tmp_path, models_built):
    res = cli("sweep", str(SWEEP), "--out", str(tmp_path / "sweep"), "--no-progress", cwd=ROOT)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    pol = json.loads((tmp_path / "sweep" / "policy.json").read_text())
    assert pol["missing"] == [] and len(pol["cells"]) == 48
    assert pol["sweep"]["stack_starts"] == 4 and pol["sweep"]["stack_reuses"] == 12
    p = pol["policy"]
    assert p is not None and {"enabled", "enable", "k_by_bucket", "breaker", "vllm", "notes"} <= set(p)
    assert all(r["rests_on"] for r in p["k_by_bucket"])

"""The experiments of ``experiments/real-model/`` on the real model set (SmolLM2-135M-Instruct,
``make models-real``) through the real CLI, their own processes: the kill in its CI form in
the real-stack tier, every one of them at full length in the nightly tier. Skipped, with the
reason, when ``models-real/`` is not built (it is not part of ``make test``: minutes, ~1.2 GB)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.experiment.files import EXPERIMENTS, REAL_MODELS, ci_form, needs_real_models, run_cli, write
from tests.procs import leaked_since, sut_pids

REAL = EXPERIMENTS / "real-model"
FILES = sorted(REAL.glob("*.yaml"))

@pytest.fixture
def real_models_built():
    why = needs_real_models(REAL / "kill-draft-worker.yaml")
    if why is not None:
        pytest.skip(why)


#: The CI form's phases on the real model: a 32-token request takes ~8 s at 4 users on 2 cores,
#: so the tiny set's 8 s baseline would hold 3 requests; these hold 10-20.
REAL_CI_PHASES = {"warmup_s": 2, "baseline_s": 30, "after_s": 20}
REAL_CI_MIN_COMPARED = 5


def _doc(path: Path) -> dict:
    d = yaml.safe_load(path.read_text())
    d["configuration"]["specchaos"]["stack"]["models_dir"] = str(REAL_MODELS)
    return d


def _ci_form(d: dict) -> dict:
    ci_form(d)
    spec = d["configuration"]["specchaos"]
    spec["phases"].update(REAL_CI_PHASES)
    spec["integrity"]["min_compared"] = REAL_CI_MIN_COMPARED
    return d


def test_the_real_model_experiments_are_the_four_families():
    assert [p.name for p in FILES] == ["bad-draft-fallback.yaml", "freeze-engine.yaml", "kill-draft-worker.yaml",
                                       "network-jitter.yaml"]


@pytest.mark.stack
@pytest.mark.own_stack
@pytest.mark.timeout(900)
def test_a_kill_on_the_real_model_restarts_and_stays_exact(tmp_path, real_models_built):
    """The kill in its CI form on the real set: the Worker (SmolLM2 + draft-l25) is killed, the
    supervisor restarts it, and every response the server called complete equals the float32
    reference's. The SLO verdict is not asserted: it depends on how loaded the host is."""
    exp = write(tmp_path, _ci_form(_doc(REAL / "kill-draft-worker.yaml")))
    before = sut_pids()
    proc, rep = run_cli(exp, tmp_path / "out")
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    (fault,) = rep["faults"]
    assert fault["acted"] and "worker" in fault["target"], fault
    assert rep["restarts"] >= 1
    integ = rep["integrity"]
    assert integ["compared"] >= 1 and integ["mismatched"] == 0 and integ["malformed"] == 0, integ
    assert leaked_since(before) == []


@pytest.mark.nightly
@pytest.mark.stack
@pytest.mark.own_stack
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_every_real_model_experiment_runs_at_full_length(tmp_path, real_models_built, path):
    """Each experiment as shipped (its own phases) on the real set: judged (pass or fail, never
    an error), its fault acted, and no response the server called complete differs from the
    reference's."""
    before = sut_pids()
    proc, rep = run_cli(write(tmp_path, _doc(path)), tmp_path / "out")
    assert proc.returncode in (0, 1) and rep["verdict"] in ("pass", "fail"), (rep.get("errors"), proc.stderr[-3000:])
    assert rep["faults"] and all(f["acted"] for f in rep["faults"]), rep["faults"]
    assert rep["integrity"]["mismatched"] == 0, rep["integrity"]
    assert leaked_since(before) == []

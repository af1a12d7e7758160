"""``experiments/minimal.yaml``: about 30 lines, every other setting a default, and it
validates and runs."""

from __future__ import annotations

from pathlib import Path

import yaml

from harness.experiment.config import PhasesConfig, SpecchaosConfig, parse_config
from harness.experiment.runner import run
from tests.experiment.fast_e2e import MODELS
from tests.experiment.test_bad_input import cli
from tests.fakes.stack import register_fake_launchers

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = ROOT / "experiments" / "minimal.yaml"


def test_the_minimal_experiment_validates(models_built):
    res = cli("validate", str(MINIMAL))
    assert res.returncode == 0, res.stderr
    assert "valid" in res.stdout


def test_defaults_fill_everything_but_the_phase_lengths():
    doc = yaml.safe_load(MINIMAL.read_text())
    cfg = parse_config(doc["configuration"]["specchaos"])
    defaults = SpecchaosConfig()
    assert cfg.model_dump(exclude={"phases"}) == defaults.model_dump(exclude={"phases"})
    assert cfg.phases == PhasesConfig(baseline_s=20, after_s=20)
    assert len(MINIMAL.read_text().splitlines()) <= 35


def test_the_minimal_experiment_runs_and_passes_on_the_fake_vllm(tmp_path, models_built):
    """The shipped file as it is, on the fake vLLM under the real supervisor, with shorter
    phases: the defaults judge a healthy worker kill as a pass."""
    register_fake_launchers()
    doc = yaml.safe_load(MINIMAL.read_text())
    doc["configuration"]["specchaos"] = {
        "stack": {"launcher": "fake", "models_dir": str(MODELS), "startup_timeout_s": 60,
                  "restart": {"backoff_s": 0.2, "backoff_max_s": 0.5}},
        "phases": {"warmup_s": 1, "baseline_s": 4, "after_s": 4},
    }
    path = tmp_path / "minimal.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    code, report = run(path, tmp_path / "out")
    failed = [c["name"] for c in report["checks"] if c["passed"] is False]
    assert (code, report["verdict"], failed) == (0, "pass", []), report.get("errors")

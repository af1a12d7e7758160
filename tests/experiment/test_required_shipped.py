"""Every shipped experiment's required checks, as ``specchaos validate`` prints them, follow
the defaults table of :mod:`harness.checks.required` for the faults it declares (the
shipped files declare no ``judge`` block)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harness.checks.required import DEFAULTS, SOAK_DEFAULT
from harness.cli import app
from harness.experiment.validate import fault_activities, parse_file

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p for p in [*ROOT.glob("experiments/*.yaml"), *ROOT.glob("experiments/selftest/*.yaml")]
                 if "matrix" not in yaml.safe_load(p.read_text()))
#: What validate needs on a host without the hardware a file asks for.
SETS = {"gpu-health.yaml": ["--set", "gpu.require=false"]}
#: The refusal of a GPU fault on a host without a GPU (validate cannot list it there).
NO_GPU = "no NVIDIA GPU on this host"


def expected(path: Path) -> list[str]:
    """The defaults table applied by hand: each declared fault kind's row, in document
    order without repeats, ``soak`` for a soak run, integrity left out without a reference."""
    doc = parse_file(path)
    conf = doc["configuration"]["specchaos"]
    assert "judge" not in conf, f"{path.name}: a shipped experiment relies on the defaults"
    out: list[str] = []
    for _loc, kind, _fault in fault_activities(doc, where=str(path)):
        out += [n for n in DEFAULTS.get(kind, ()) if n not in out]
    if (conf.get("soak") or {}).get("enabled"):
        out += [n for n in SOAK_DEFAULT if n not in out]
    stack = conf.get("stack") or {}
    if stack.get("reference") is False or (stack.get("launcher") == "external" and not stack.get("reference_url")):
        out.remove("integrity")
    return out


@pytest.mark.usefixtures("models_built")
@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT / "experiments")))
def test_validate_lists_the_default_requirements(path, monkeypatch):
    monkeypatch.chdir(ROOT)
    res = CliRunner().invoke(app, ["validate", str(path.relative_to(ROOT)), *SETS.get(path.name, [])])
    if res.exit_code == 2 and NO_GPU in res.output:   # a host without a GPU: the GPU experiment's refusal is the answer
        assert path.name == "gpu-health.yaml", res.output
        return
    assert res.exit_code == 0, res.output
    (line,) = [ln for ln in res.output.splitlines() if ln.startswith("requires: ")]
    listed = [n.strip() for group in line.removeprefix("requires: ").split(";")
              for n in group.split("(")[0].split(",") if n.strip()]
    assert listed == expected(path), line
    assert listed, f"{path.name} requires nothing"


def test_the_default_experiment_requires_recovery_fail_fast_and_integrity(monkeypatch):
    monkeypatch.chdir(ROOT)
    res = CliRunner().invoke(app, ["validate", "experiments/kill-draft-worker.yaml"])
    assert "requires: recovery, fail_fast, integrity (default for process-kill)" in res.output

"""The experiment files under test, as editable documents: load one with the built tiny
models, change it, write it to a temporary directory; run it through the CLI (its own
process) or in this process on the session's shared stack (:func:`run_pooled`), in the CI
form (:func:`ci_form`) that ``make test`` uses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from harness import gpu

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ROOT / "experiments"
MODELS = ROOT / "models"
#: The real model set the experiments under ``experiments/real-model/`` name (``make models-real``).
REAL_MODELS = ROOT / "models-real"
#: ``.ci/run`` installs the ``real`` extra, builds ``models-real/`` and sets
#: ``SPECCHAOS_REQUIRE_REAL_MODELS=1``: there a test that needs the set fails instead of skipping.
REQUIRE_REAL_MODELS = os.environ.get("SPECCHAOS_REQUIRE_REAL_MODELS") == "1"


def is_sweep(path: Path) -> bool:
    """A sweep file of ``specchaos sweep`` (a top-level ``matrix``), shipped beside the
    experiments but not one (tests/experiment/test_sweep_shipped.py checks them)."""
    doc = yaml.safe_load(path.read_text())
    return isinstance(doc, dict) and "matrix" in doc


def experiment_files() -> list[Path]:
    """Every shipped experiment file (``experiments/**/*.yaml`` less the sweep files), sorted."""
    return [p for p in sorted(EXPERIMENTS.rglob("*.yaml")) if not is_sweep(p)]


def needs_real_models(path: Path) -> str | None:
    """Why the experiment at ``path`` cannot be loaded here: it is one of
    ``experiments/real-model/`` and the real model set is not built in ``models-real/``
    (``make models-real``: minutes, ~1.2 GB; ``.ci/run`` builds it before make test); or None."""
    if "real-model" not in path.parts:
        return None
    from harness.stack.real_models import verify_real_models

    problems = verify_real_models(REAL_MODELS)
    return f"the real model set is not built in models-real/ (make models-real): {problems[0]}" if problems else None


def skip_without_real_models(why: str | None) -> None:
    """Skip the calling test for ``why`` (a reason the real model set or its packages are
    missing; None: nothing missing, return); under :data:`REQUIRE_REAL_MODELS` fail instead.

    Raises:
        pytest.skip.Exception, pytest.fail.Exception: as said.
    """
    if why is None:
        return
    if REQUIRE_REAL_MODELS:
        pytest.fail(f"{why} (SPECCHAOS_REQUIRE_REAL_MODELS=1: .ci/run installs the `real` extra and builds the set "
                    f"before make test)", pytrace=False)
    pytest.skip(why)


def gpu_only(path: Path) -> str | None:
    """Why the experiment at ``path`` is refused on this host (it declares ``gpu.require``
    and this host has no NVIDIA GPU: :func:`harness.gpu.unavailable`'s line), or None."""
    spec = ((yaml.safe_load(path.read_text()) or {}).get("configuration") or {}).get("specchaos") or {}
    return gpu.unavailable() if (spec.get("gpu") or {}).get("require") else None


def experiment_doc(name: str) -> dict:
    """``experiments/<name>`` as a dict, its ``stack.models_dir`` pointed at the built models."""
    d = yaml.safe_load((EXPERIMENTS / name).read_text())
    d["configuration"]["specchaos"]["stack"]["models_dir"] = str(MODELS)
    return d


#: The CI form of a shipped experiment's phases (seconds), used by every real-stack experiment
#: test of ``make test``: the full-length experiments run in the nightly tier. Long enough for
#: each phase's checks to judge (30 to 60 requests per phase at 4 users here) and so to fail.
CI_PHASES = {"warmup_s": 2, "baseline_s": 8, "after_s": 6}
#: Responses compared with the reference that the CI form asks for (``integrity.min_compared``).
CI_MIN_COMPARED = 10


def ci_form(d: dict, **fault_arguments) -> dict:
    """``d`` (an experiment document) in its CI form: :data:`CI_PHASES`,
    :data:`CI_MIN_COMPARED`, and ``fault_arguments`` (e.g. ``duration_s=8``) set on the
    method's first action. Changes ``d`` in place and returns it."""
    spec = d["configuration"]["specchaos"]
    spec["phases"].update(CI_PHASES)
    spec.setdefault("integrity", {})["min_compared"] = CI_MIN_COMPARED
    if fault_arguments:
        d["method"][0]["provider"].setdefault("arguments", {}).update(fault_arguments)
    return d


def run_pooled(exp: Path, out: Path) -> tuple[int, dict]:
    """Run ``exp`` in this process through the runner (:func:`harness.experiment.runner.run`)
    on a stack from the session's pool: the test must ask for the ``specchaos_pool`` fixture
    (it makes the pool the stack provider). Prints the wall time. Returns (exit code 0/1/2,
    report.json). A run the runner reports interrupted (Ctrl-C, or SIGTERM, which the plugin
    turns into one) raises KeyboardInterrupt, so the pytest session ends and the pool stops
    its stacks, as for the plugin's experiment items."""
    from harness.experiment.runner import run

    t0 = time.monotonic()
    code, report = run(exp, out)
    print(f"{exp.name} wall time (in-process, pooled stack): {time.monotonic() - t0:.0f} s")
    report = report if report is not None else json.loads((out / "report.json").read_text())
    if any(str(e).startswith("interrupted by") for e in report.get("errors") or []):
        raise KeyboardInterrupt   # the runner caught Ctrl-C or SIGTERM: end the pytest session too
    return code, report


def run_cli(exp: Path, out: Path) -> tuple[subprocess.CompletedProcess, dict]:
    """``specchaos run exp --out out`` in its own process (real signals, real exit code);
    prints the tail of its output and the wall time. Returns (process, report.json)."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(exp), "--out", str(out)], cwd=ROOT,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"), capture_output=True, text=True, timeout=840)
    print(proc.stdout[-6000:], f"\n{exp.name} wall time: {time.monotonic() - t0:.0f} s")
    return proc, json.loads((out / "report.json").read_text())


def write(tmp: Path, d: dict | str, name: str = "exp.yaml") -> Path:
    """Write ``d`` (a document, or raw text) to ``tmp/name``; returns the path."""
    p = tmp / name
    p.write_text(d if isinstance(d, str) else yaml.safe_dump(d, sort_keys=False))
    return p

"""The experiment files under test, as editable documents: load one with the built tiny
models, change it, write it to a temporary directory for the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ROOT / "experiments"
MODELS = ROOT / "models"


def experiment_doc(name: str) -> dict:
    """``experiments/<name>`` as a dict, its ``stack.models_dir`` pointed at the built models."""
    d = yaml.safe_load((EXPERIMENTS / name).read_text())
    d["configuration"]["specchaos"]["stack"]["models_dir"] = str(MODELS)
    return d


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

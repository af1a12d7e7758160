"""Benchmark: the sweep's own overhead, and the stack starts that reuse saves.

Runs one small sweep (:mod:`harness.experiment.sweep`) twice in this process on the fake
vLLM (the real supervisor, real locust, mirror mode; ``--launcher local`` for the real
stack): once with started stacks shared between the cells of one speculator and k (a
:class:`harness.stack.pool.StackPool`, what ``specchaos sweep`` does) and once with a
stack started and stopped per run. The matrix: ``--k`` values × ``--concurrency`` levels
of one speculator (draft-exact), one bucket, one sampling class; each run's phases
``--phase-s`` seconds (baseline and after) after a 1 s warm-up. Printed side by side:

* runs, stack starts (reuse: one per k; without: one per run) and the starts saved;
* wall time of the whole sweep (s) and per run, and their ratio;
* the harness's CPU per run (s: user + system of this process over the run, the
  runner, scraper, judge and report; the servers and locust are other processes) and
  the sweep's own analysis per cell (s: reading a run's records and bootstrapping its
  speedups, ``resamples`` 1000), as a share of the run's wall time.

The last line is a JSON object with those figures (``reuse``, ``fresh``, ``ratios``).
Exit 0; 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.experiment.sweep import plan_sweep, run_sweep  # noqa: E402
from harness.stack.models import build_models  # noqa: E402
from tests.experiment.fast_e2e import FAST, _merge  # noqa: E402
from tests.fakes.stack import register_fake_launchers  # noqa: E402


def write_sweep(tmp: Path, launcher: str, ks: list[int], levels: list[int], phase_s: float) -> Path:
    """The soak experiment with the fast path's settings as the base, and the sweep file."""
    doc = yaml.safe_load((ROOT / "experiments" / "soak.yaml").read_text())
    spec = _merge(doc["configuration"]["specchaos"], FAST)
    spec["stack"]["launcher"] = launcher
    spec["stack"]["models_dir"] = str(ROOT / "models")
    spec["phases"] = {"warmup_s": 1, "baseline_s": phase_s, "after_s": phase_s}
    doc["configuration"]["specchaos"] = spec
    (tmp / "base.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    sweep = {"title": "sweep overhead", "base": "base.yaml",
             "matrix": {"speculators": [{"name": "exact", "draft": "draft-exact"}], "k": ks, "concurrency": levels,
                        "buckets": ["short"], "sampling": ["greedy"]}}
    sweep["policy"] = {"min_values": 3}   # short phases: few requests per cell
    sweep["pairing"] = "mirror"   # one experiment run per cell: the overhead figures of docs/guides/sweep.md
    (tmp / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    return tmp / "sweep.yaml"


def measure(sweep: Path, out: Path, reuse: bool) -> dict:
    plan = plan_sweep(sweep)
    t0 = time.monotonic()
    s = run_sweep(plan, out, reuse=reuse)
    wall = time.monotonic() - t0
    results = [json.loads((out / "runs" / r.id / "sweep-run.json").read_text()) for r in plan.runs]
    cells = sum(len(r["cells"]) for r in results)
    return {"runs": len(plan.runs), "cells": cells, "stack_starts": s["sweep"]["stack_starts"],
            "wall_s": round(wall, 2), "wall_per_run_s": round(wall / len(plan.runs), 2),
            "harness_cpu_per_run_s": round(statistics.mean(r["harness_cpu_s"] for r in results), 3),
            "analysis_cpu_per_cell_s": round(sum(r["analysis_cpu_s"] for r in results) / max(cells, 1), 4),
            "harness_cpu_share": round(sum(r["harness_cpu_s"] for r in results) / sum(r["wall_s"] for r in results), 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--phase-s", type=float, default=2.5)
    ap.add_argument("--launcher", default="fake", help="fake (default) or local (the real stack: use flock)")
    ap.add_argument("--quick", action="store_true",
                    help="k 4 x concurrency 1 and 2 with 1 s phases on the fake with 10 ms steps (the test's form)")
    a = ap.parse_args()
    if a.phase_s <= 0 or any(k < 1 for k in a.k) or any(c < 1 for c in a.concurrency):
        print(f"sweep_overhead: error: --phase-s={a.phase_s:g}, --k and --concurrency must be positive",
              file=sys.stderr)
        return 2
    if a.quick:
        a.k, a.concurrency, a.phase_s, a.launcher = [4], [1, 2], 1.0, "fake-quick"
    build_models(ROOT / "models")
    register_fake_launchers()
    with tempfile.TemporaryDirectory(prefix="sweep-overhead-") as d:
        tmp = Path(d)
        sweep = write_sweep(tmp, a.launcher, a.k, a.concurrency, a.phase_s)
        reuse = measure(sweep, tmp / "reuse", True)
        fresh = measure(sweep, tmp / "fresh", False)
    ratios = {"stack_starts_saved": fresh["stack_starts"] - reuse["stack_starts"],
              "wall_fresh_over_reuse": round(fresh["wall_s"] / reuse["wall_s"], 3),
              "harness_cpu_fresh_over_reuse": round(fresh["harness_cpu_per_run_s"] / reuse["harness_cpu_per_run_s"], 3)}
    print(f"{'':28}{'reuse':>12}{'start per run':>16}")
    for key in ("runs", "cells", "stack_starts", "wall_s", "wall_per_run_s", "harness_cpu_per_run_s",
                "analysis_cpu_per_cell_s", "harness_cpu_share"):
        print(f"{key:28}{reuse[key]:>12}{fresh[key]:>16}")
    print(f"stack starts saved by reuse: {ratios['stack_starts_saved']} of {fresh['stack_starts']}; wall time "
          f"x{ratios['wall_fresh_over_reuse']} without reuse; harness CPU per run x"
          f"{ratios['harness_cpu_fresh_over_reuse']} ({a.launcher} launcher)")
    print(json.dumps({"launcher": a.launcher, "reuse": reuse, "fresh": fresh, "ratios": ratios}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

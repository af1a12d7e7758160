"""Benchmark: what the GPU paths cost on the host they run on, without a GPU.

* **sampler**: :func:`harness.gpu.sample` over ``--gpus`` GPUs, ``--samples`` times, with the
  fake NVML of ``tests/fakes/fake_nvml.py`` in NVML's place: the Python side of one GPU
  reading (its ``sample_wall_ms`` / ``sample_cpu_ms``, mean and p95) and of a whole sample
  round. On a GPU host each NVML call adds the driver's time; the report's ``gpu`` section
  gives the real figures of every run.
* **shim**: ``--launches`` ``cuLaunchKernel`` calls through the stub CUDA library of
  ``tests/fakes/native``, without the CUDA fault shim, through it unarmed (no arm file: every
  launch counted, none selected) and through it with an arm file: ns per launch.

    .venv/bin/python bench/gpu_costs.py [--gpus 8] [--samples 200] [--launches 1000000]

Prints one JSON object. Needs a C compiler for the shim part (skipped without one).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from faults.cuda_error import compiler, shim_env  # noqa: E402
from harness import gpu  # noqa: E402
from tests.fakes.cuda import build_native  # noqa: E402
from tests.fakes.fake_nvml import FakeNvml  # noqa: E402


def sampler_cost(gpus: int, samples: int) -> dict:
    gpu.pynvml = FakeNvml({"gpus": [{}] * gpus})
    rows = []
    with gpu.session():
        watch = gpu.EventWatch()
        t0 = time.perf_counter()
        for _ in range(samples):
            rows += gpu.sample(watch)
        elapsed = time.perf_counter() - t0
        watch.close()
    wall = sorted(r["sample_wall_ms"] for r in rows)
    return {"gpus": gpus, "samples": samples, "per_gpu_wall_ms_mean": round(statistics.mean(wall), 4),
            "per_gpu_wall_ms_p95": wall[int(0.95 * (len(wall) - 1))],
            "per_gpu_cpu_ms_mean": round(statistics.mean(r["sample_cpu_ms"] for r in rows), 4),
            "per_round_ms": round(elapsed / samples * 1000, 3)}


def shim_cost(launches: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        native = build_native(Path(d))
        arm = Path(d) / "armed"
        arm.touch()
        base = {"nth_launch": 2**62, "error": 700}

        def ns(env: dict | None) -> float:
            return native.drive(env, f"bench={launches}")[0]["ns_per_launch"]

        return {"launches": launches, "stub_only_ns": ns(None), "shim_ns": ns(shim_env(native.shim, **base)),
                "shim_with_arm_file_ns": ns(shim_env(native.shim, arm_file=arm, **base))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--launches", type=int, default=1_000_000)
    args = ap.parse_args()
    out = {"sampler": sampler_cost(args.gpus, args.samples)}
    out["shim"] = shim_cost(args.launches) if compiler() else "skipped: no C compiler"
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

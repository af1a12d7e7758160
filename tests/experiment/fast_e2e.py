"""The fast end-to-end path: a whole experiment (Chaos Toolkit control, steady-state
probes, typed fault action, await_recovery, hold_phase, rollbacks, real locust load,
judge, report) run in this process by :func:`harness.experiment.runner.run` against the
fake vLLM under the harness's real supervisor (:mod:`tests.fakes.stack`), in seconds."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import yaml

from harness.experiment.runner import run
from harness.stack.models import build_models
from tests.fakes.stack import register_fake_launchers

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENT = ROOT / "experiments" / "kill-draft-worker.yaml"
MODELS = ROOT / "models"

#: Short phases and generous limits for the fake on a shared 2-core machine.
FAST = {
    "stack": {"launcher": "fake", "startup_timeout_s": 60,
              "restart": {"max_restarts": 2, "backoff_s": 0.2, "backoff_max_s": 0.5}},
    "load": {"users": 4, "spawn_rate": 4, "short_prompts": 6, "medium_prompts": 4, "long_prompts": 2,
             "max_tokens": 16, "request_timeout_s": 10, "error_backoff_s": 0.1},
    "phases": {"warmup_s": 1, "baseline_s": 4, "fault_timeout_s": 30, "recovery_timeout_s": 20, "after_s": 4},
    "slo": {"ttft_p95_s": 1.5, "tpot_p95_s": 0.3, "itl_p95_s": 0.8, "e2e_p95_s": 5.0, "error_rate": 0.0,
            "goodput": {"ttft_s": 1.5, "tpot_s": 0.3, "e2e_s": 5.0}},
    "degradation": {"after_vs_baseline_max_ratio": 10.0, "min_requests_per_phase": 3},
    "recovery": {"time_to_healthy_s": 25, "time_to_first_success_s": 25, "time_to_slo_s": 30,
                 "slo_window_s": 2, "baseline_p95_factor": 10.0, "health_interval_s": 0.2},
    "fail_fast": {"max_error_latency_s": 5},
    # the fake's token text (" w<id>") is not the tiny tokenizer's: its text is not judged
    # against the token ids (the real stack's request-mix run judges it)
    "integrity": {"min_compared": 10, "text_from_ids": False},
}


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out.get(k) or {}, v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def fast_experiment(tmp: Path, name: str = "fast", method: list[dict] | None = None, **config: Any) -> Path:
    """The default experiment with :data:`FAST` settings, ``config`` merged into
    ``configuration.specchaos`` and, if given, ``method`` replacing the fault action
    (``await-recovery`` and ``hold-after-phase`` stay)."""
    build_models(MODELS)   # seconds; skipped when models/manifest.json verifies (the prompt set needs the tokenizer)
    register_fake_launchers()
    doc = yaml.safe_load(EXPERIMENT.read_text())
    spec = _merge(doc["configuration"]["specchaos"], FAST)
    spec["stack"]["models_dir"] = str(MODELS)
    doc["configuration"]["specchaos"] = _merge(spec, config)
    if method is not None:
        doc["method"] = method + doc["method"][1:]
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def run_fast(tmp: Path, name: str = "fast", **kw: Any) -> tuple[int, dict, float, Path]:
    """Run :func:`fast_experiment` in this process: ``(exit code, report, seconds, out dir)``."""
    path = fast_experiment(tmp, name, **kw)
    out = tmp / f"{name}-out"
    t0 = time.monotonic()
    code, report = run(path, out)
    return code, report, time.monotonic() - t0, out

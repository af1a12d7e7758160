"""One real stack (spec + ref on the tiny models, CPU) shared by every stack test of the session."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.stack.config import RestartPolicy, StackConfig
from harness.stack.local import LocalStack
from harness.stack.vllm import vllm_distribution
from harness.stack.models import build_models
from harness.timeline import Timeline

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def real_stack(tmp_path_factory):
    """``SimpleNamespace(stack, timeline, run_dir, startup_s)`` of a started LocalStack.

    Started once per session (both servers), always stopped at the end.
    """
    if vllm_distribution() is None:
        pytest.skip("vLLM is not installed")
    models = ROOT / "models"
    build_models(models)   # seconds; skipped when models/manifest.json verifies
    run_dir = tmp_path_factory.mktemp("stack-run")
    timeline = Timeline(run_dir / "timeline.jsonl")
    cfg = StackConfig(models_dir=str(models), startup_timeout_s=600,
                      restart=RestartPolicy(max_restarts=2, backoff_s=0.5, backoff_max_s=2.0))
    stack = LocalStack(cfg, run_dir, timeline=timeline)
    t0 = time.monotonic()
    stack.start()
    ns = SimpleNamespace(stack=stack, timeline=timeline, run_dir=run_dir, startup_s=time.monotonic() - t0)
    try:
        yield ns
    finally:
        stack.stop()

"""Fixtures shared by every test directory: the fake vLLM (see :mod:`tests.fakes`), and the
one real stack (spec + ref on the tiny models, CPU) that every real-stack test shares."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness.stack.config import RestartPolicy, StackConfig
from harness.stack.local import LocalStack
from harness.stack.models import build_models
from harness.stack.ports import free_ports
from harness.stack.vllm import vllm_distribution
from harness.timeline import Timeline
from tests import procs
from tests.property import profiles as property_profiles
from tests.fakes import FakeProcess, FakeServer

ROOT = Path(__file__).resolve().parents[1]
assert procs.TAG   # tags this session's child processes before any starts (see tests/procs.py)
property_profiles.register()   # `--hypothesis-profile nightly` works for any selection of tests


@pytest.fixture
def fake_vllm():
    """Factory ``fake_vllm(*flags, wait=True, **kw) -> FakeProcess``: a fake vLLM as a plain
    subprocess on a free loopback port, started (and ready unless ``wait=False``); ``kw``
    as :class:`~tests.fakes.launch.FakeProcess` (``served_model_name``,
    ``num_speculative_tokens``, ``log_path``). At teardown every one is stopped, whole
    tree, and none may survive."""
    made: list[FakeProcess] = []

    def make(*flags: str, wait: bool = True, **kw: Any) -> FakeProcess:
        fake = FakeProcess(*flags, **kw)
        made.append(fake)
        return fake.start(wait=wait)

    yield make
    left = [p.pid for fake in made for p in fake.stop()]
    assert not left, f"fake vLLM processes survived their test: {left}"


@pytest.fixture
def fake_server(tmp_path):
    """Factory ``fake_server(name="spec", fake_args=(), *, ready=False, restart=None,
    timeline=None, startup_timeout_s=30.0, **kw) -> FakeServer``: the harness's supervised
    LocalServer running the fake vLLM, on a free loopback port, model directory
    ``tmp_path/"target"`` (served as ``"target"``), log ``tmp_path/"<name>-server.log"``.
    ``restart`` defaults to 2 restarts with 0.2 s back-off (doubling, at most 0.3 s);
    ``kw`` goes to LocalServer (``speculative_config``, ``stop_grace_not_ready_s``...).
    ``ready=True`` starts it and waits until it is ready. Every one is stopped at teardown."""
    made: list[FakeServer] = []

    def make(name: str = "spec", fake_args: Sequence[str] = (), *, ready: bool = False,
             restart: RestartPolicy | None = None, timeline: Timeline | None = None,
             startup_timeout_s: float = 30.0, **kw: Any) -> FakeServer:
        server = FakeServer(
            name, kw.pop("model_dir", tmp_path / "target"), port=free_ports("127.0.0.1", 1)[0],
            log_path=tmp_path / f"{name}-server.log", timeline=timeline or Timeline(),
            restart=restart or RestartPolicy(max_restarts=2, backoff_s=0.2, backoff_max_s=0.3),
            startup_timeout_s=startup_timeout_s, fake_args=fake_args, **kw)
        made.append(server)
        if ready:
            server.start()
            server.wait_ready(startup_timeout_s)
        return server

    yield make
    for server in made:
        server.stop(5)


@pytest.fixture
def models(tmp_path):
    """A models directory of stand-ins (``target``, ``draft-exact``, ``draft-acc20``, each a
    directory with an empty ``config.json``): enough for the fake vLLM and the draft rules."""
    for name in ("target", "draft-exact", "draft-acc20"):
        (tmp_path / "models" / name).mkdir(parents=True)
        (tmp_path / "models" / name / "config.json").write_text("{}")
    return tmp_path / "models"


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

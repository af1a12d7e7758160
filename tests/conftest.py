"""Fixtures shared by every test directory: the fake vLLM (see :mod:`tests.fakes`), and the
one real stack (spec + ref on the tiny models, CPU) that every real-stack test shares."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness.errors import StackError
from harness.stack.config import RestartPolicy, StackConfig
from harness.stack.docker_engine import engine_client
from harness.stack.models import build_models
from harness.ports import free_ports
from harness.stack.vllm import vllm_distribution
from harness.stack.vllm_server import VllmSpec
from harness.timeline import Timeline
from tests import procs
from tests.property import profiles as property_profiles
from tests.fakes import FakeProcess, FakeServer
from tests.fakes.cuda import build_native

ROOT = Path(__file__).resolve().parents[1]
#: pytester: the tests of this conftest's own session hooks (tests/test_coverage.py)
pytest_plugins = ["pytester"]
assert procs.TAG   # tags this session's child processes before any starts (see tests/procs.py)
property_profiles.register()   # `--hypothesis-profile nightly` works for any selection of tests


#: The order of the real-stack tests, by marker: those that start their own servers first
#: (before the session's pool has started one), then those on the shared stack, then those
#: that leave it unfit for reuse, the one that stops it last. Tests without ``stack`` run first.
STACK_ORDER = ("own_stack", None, "respeculates", "stops_stack")


def stack_rank(item: pytest.Item) -> int:
    """0 for a test without the ``stack`` marker, else 1 + its place in :data:`STACK_ORDER`."""
    if item.get_closest_marker("stack") is None:
        return 0
    for rank, marker in enumerate(STACK_ORDER):
        if marker is not None and item.get_closest_marker(marker) is not None:
            return 1 + rank
    return 1 + STACK_ORDER.index(None)


def pytest_collection_modifyitems(config, items):
    """Real-stack tests in :data:`STACK_ORDER` (a stable sort: file order within a rank), so
    the shared stack starts once and is replaced only where a test must leave it unfit."""
    items.sort(key=stack_rank)


def pytest_addoption(parser):
    parser.addoption("--real-stack-coverage", action="store_true", default=False,
                     help="end with the line `real-stack coverage: FAMILY ...` (the fault families that acted "
                          "against a real vLLM server, from the ledgers this run wrote) and fail the run when a "
                          "family of `specchaos faults` is missing (make test's real-stack group)")


_COVERAGE = pytest.StashKey[tuple]()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    """With ``--real-stack-coverage``: judge the families that acted (:mod:`tests.coverage`)
    over the ledgers under the session's temporary directory and the plugin's output."""
    config = session.config
    if not config.getoption("real_stack_coverage") or exitstatus == pytest.ExitCode.INTERRUPTED:
        return
    from faults.registry import REGISTRY
    from harness.pytest_plugin import run_root
    from tests.coverage import coverage_line, families_acted, gpu_only_families, ledgers_under

    acted = families_acted(ledgers_under(config._tmp_path_factory.getbasetemp(), run_root(config)))
    gpu_only = gpu_only_families(REGISTRY)
    line, missing = coverage_line(acted, [k for k in REGISTRY if k not in gpu_only])
    if gpu_only:
        line += f" (GPU hosts only, not here: {' '.join(sorted(gpu_only))}: {next(iter(gpu_only.values()))})"
    config.stash[_COVERAGE] = (line, missing)
    if missing and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    result = config.stash.get(_COVERAGE, None)
    if result is not None:
        line, missing = result
        terminalreporter.write_line(line)
        if missing:
            terminalreporter.write_line(f"real-stack coverage: FAILED: no fault of {' '.join(missing)} acted "
                                        f"against a real vLLM server in this run", red=True)


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


@pytest.fixture(scope="session")
def docker_engine() -> str:
    """``$DOCKER_HOST`` of a Docker engine that answers: the one the environment names, else
    the private engine of ``ci/docker-engine.sh`` started now (when ``dockerd`` is installed;
    left running for the next session, ``ci/docker-engine.sh stop`` ends it). Without one
    the tests that need it are skipped, except where ``SPECCHAOS_REQUIRE_DOCKER=1``
    (``.ci/run`` sets it after starting the engine): there they fail."""
    def answers() -> str | None:
        try:
            engine_client(timeout_s=10).close()
            return None
        except StackError as exc:
            return exc.one_line()

    why = answers()
    if why is not None and shutil.which("dockerd"):
        started = subprocess.run([str(ROOT / "ci" / "docker-engine.sh"), "start"], capture_output=True, text=True,
                                 timeout=120)
        line = started.stdout.strip().splitlines()[-1] if started.stdout.strip() else ""
        if started.returncode == 0 and line.startswith("DOCKER_HOST="):
            os.environ["DOCKER_HOST"] = line.split("=", 1)[1]
            why = answers()
        else:
            why = f"ci/docker-engine.sh start failed: {started.stderr.strip()[-300:]}"
    if why is not None:
        if os.environ.get("SPECCHAOS_REQUIRE_DOCKER") == "1":
            pytest.fail(f"no Docker engine (SPECCHAOS_REQUIRE_DOCKER=1): {why}")
        pytest.skip(f"no Docker engine: {why}")
    return os.environ.get("DOCKER_HOST", "")


@pytest.fixture(scope="session")
def cuda_native(tmp_path_factory):
    """The CUDA fault shim, the stub CUDA library and the driver program
    (:mod:`tests.fakes.cuda`), compiled once per session into a temporary directory. Without
    a C compiler the tests that need them are skipped, except in CI (``CI=true`` or
    ``SPECCHAOS_REQUIRE_CC=1``, which ``.ci/run`` sets after installing one), where they fail."""
    try:
        return build_native(tmp_path_factory.mktemp("cuda-native"))
    except RuntimeError as exc:
        if os.environ.get("CI", "").lower() == "true" or os.environ.get("SPECCHAOS_REQUIRE_CC") == "1":
            pytest.fail(str(exc))
        pytest.skip(str(exc))


@pytest.fixture
def fake_server(tmp_path):
    """Factory ``fake_server(name="spec", fake_args=(), *, ready=False, restart=None,
    timeline=None, startup_timeout_s=30.0, **kw) -> FakeServer``: the harness's supervised
    LocalServer running the fake vLLM, on a free loopback port, model directory
    ``tmp_path/"target"`` (served as ``"target"``), log ``tmp_path/"<name>-server.log"``.
    ``restart`` defaults to 2 restarts with 0.2 s back-off (doubling, at most 0.3 s);
    ``kw``: :class:`~harness.stack.vllm_server.VllmSpec` fields (``model_dir``,
    ``speculative_config``...) and the supervisor's settings (``stop_grace_not_ready_s``...).
    ``ready=True`` starts it and waits until it is ready. Every one is stopped at teardown."""
    made: list[FakeServer] = []

    def make(name: str = "spec", fake_args: Sequence[str] = (), *, ready: bool = False,
             restart: RestartPolicy | None = None, timeline: Timeline | None = None,
             startup_timeout_s: float = 30.0, **kw: Any) -> FakeServer:
        spec_fields = {k: kw.pop(k) for k in list(kw) if k in VllmSpec.__dataclass_fields__ and k != "model_dir"}
        server = FakeServer(
            name, VllmSpec(Path(kw.pop("model_dir", tmp_path / "target")), **spec_fields),
            port=free_ports("127.0.0.1", 1)[0],
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


#: The stack of every real-stack test: the shipped experiments' ``stack`` block (spec with
#: ``draft-exact``, k=4, and the ``ref`` server; the pool key leaves the run-level fields out),
#: so the tests and the experiments run in-process share one started stack.
REAL_STACK = StackConfig(models_dir=str(ROOT / "models"), startup_timeout_s=600)


@pytest.fixture(scope="session")
def stack_home(tmp_path_factory):
    """``(run_dir, timeline)`` where the real-stack tests' borrowed stacks write: one
    timeline for the session, so a test reads every ``stack`` event of its module."""
    run_dir = tmp_path_factory.mktemp("stack-run")
    return run_dir, Timeline(run_dir / "timeline.jsonl")


@pytest.fixture(scope="module")
def real_stack(request, stack_home):
    """``SimpleNamespace(stack, timeline, run_dir, startup_s)``: the session's started stack
    (:data:`REAL_STACK`), borrowed from the plugin's pool (``specchaos_pool``) for one test
    module and given back at its end, so experiments run in-process between modules reuse it.
    ``startup_s``: how long the pool took to start it (0.0 when this module reused it).

    A module that leaves the stack unfit (stopped, respeculated, a server down) makes the pool
    start a fresh one for the next borrower.
    """
    if vllm_distribution() is None:
        pytest.skip("vLLM is not installed")
    build_models(ROOT / "models")   # seconds; skipped when models/manifest.json verifies
    pool = request.getfixturevalue("specchaos_pool")
    run_dir, timeline = stack_home
    starts, t0 = pool.starts, time.monotonic()
    stack = pool.acquire(REAL_STACK, run_dir, timeline)
    startup_s = time.monotonic() - t0 if pool.starts > starts else 0.0
    try:
        yield SimpleNamespace(stack=stack, timeline=timeline, run_dir=run_dir, startup_s=startup_s)
    finally:
        pool.release(stack, run_dir, clean=True)

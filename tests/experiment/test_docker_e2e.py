"""The Docker launcher on real parts: a real Docker engine (``docker_engine``: the private
one of ci/docker-engine.sh), real containers running the real vLLM (tiny models, CPU) from
the host-root image, real ``docker kill``, ``docker pause`` and ``container.update``.

One docker stack for the container mechanisms (the default experiment's stack with
``stack.launcher: docker`` and no reference server: one container, one vLLM start inside
make test's budget), started by the session's pool, borrowed by the tests and stopped at the
module's end, so the shared local stack never runs beside it; then cleanup after a SIGKILL
of a harness that runs the Docker launcher (the containers it started, and no other). The default
experiment itself on the Docker launcher (as ``--launcher docker`` runs it: both containers,
integrity against the reference container) is in the nightly tier (about 200 s here with its
stack start).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import docker
import httpx
import psutil
import pytest
import yaml

from faults.mechanisms import container as container_ops
from faults.inject import FaultInjector, InjectionContext
from faults.ledger import Ledger
from harness.experiment.validate import load_experiment
from harness.errors import FaultError
from harness.stack.container_cleanup import LABEL_PREFIX
from harness.stack.docker_engine import engine_client, ensure_image
from harness.timeline import Timeline
from tests.experiment.files import ci_form, run_pooled

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENT = ROOT / "experiments" / "kill-draft-worker.yaml"

pytestmark = [pytest.mark.stack, pytest.mark.own_stack]


def docker_variant(tmp: Path, name: str = "kill-docker", **spec_changes) -> Path:
    """The default experiment in its CI form with ``stack.launcher: docker`` (and absolute models)."""
    doc = ci_form(yaml.safe_load(EXPERIMENT.read_text()))
    stack = doc["configuration"]["specchaos"]["stack"]
    stack.update(launcher="docker", models_dir=str(ROOT / "models"), **spec_changes)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(scope="module", autouse=True)
def _the_external_modules_server_boots_meanwhile(request):
    """When the external launcher's tests run in this session (right after this module), their
    plain vLLM server boots now, beside this module's one container: two servers at once, and
    one boot less on make test's clock."""
    if any(item.nodeid.startswith("tests/experiment/test_external_e2e.py") for item in request.session.items):
        request.getfixturevalue("plain_vllm_server")


@pytest.fixture(scope="module")
def docker_config(docker_engine, tmp_path_factory):
    """The default experiment's ``stack`` block with ``launcher: docker`` and the speculative
    server only (as validated): what the container mechanisms act on."""
    path = docker_variant(tmp_path_factory.mktemp("docker-cfg"), reference=False)
    doc = yaml.safe_load(path.read_text())
    doc["configuration"]["specchaos"]["integrity"]["min_compared"] = 0
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_experiment(path).cfg.stack


@pytest.fixture(scope="module")
def docker_run(docker_engine, tmp_path_factory, specchaos_pool):
    """The default experiment (CI form) on the Docker launcher, in this process through the
    runner, its stack started (and kept) by the session's pool."""
    tmp = tmp_path_factory.mktemp("docker")
    exp = docker_variant(tmp)
    t0 = time.monotonic()
    code, report = run_pooled(exp, tmp / "out")
    return {"rc": code, "report": report, "out": tmp / "out", "exp": exp, "wall_s": time.monotonic() - t0}


@pytest.fixture(scope="module")
def docker_stack(docker_config, specchaos_pool, tmp_path_factory):
    """A pooled docker stack (:func:`docker_config`), borrowed for direct fault tests, then
    taken out of the pool and stopped (its container removed) at the module's end."""
    cfg = docker_config
    run_dir = tmp_path_factory.mktemp("docker-faults")
    timeline = Timeline(run_dir / "timeline.jsonl")
    stack = specchaos_pool.acquire(cfg, run_dir, timeline)
    try:
        yield stack
    finally:
        specchaos_pool.release(stack, run_dir, clean=True)
        owned = specchaos_pool.detach(cfg)
        if owned is not None:
            owned.stop()
        client = docker.from_env()
        left = client.containers.list(all=True, filters={"label": f"{LABEL_PREFIX}.launcher=docker",
                                                          "name": "specchaos-"})
        mine = [c.name for c in left if c.labels.get(f"{LABEL_PREFIX}.owner_pid") == str(os.getpid())]
        assert not mine, f"containers left after the docker stack stopped: {mine}"


@pytest.fixture
def injector(docker_stack, tmp_path):
    inj = FaultInjector(InjectionContext(docker_stack, Timeline(tmp_path / "timeline.jsonl"),
                                         Ledger(tmp_path / "ledger.jsonl")))
    yield inj
    inj.clear_all()


def generate(url: str, model: str, n: int = 1, max_tokens: int = 24, timeout_s: float = 30.0) -> int:
    """``n`` greedy completions one after another; how many succeeded."""
    ok = 0
    with httpx.Client(timeout=timeout_s) as c:
        for _ in range(n):
            try:
                r = c.post(f"{url}/v1/completions", json={"model": model, "prompt": "The quick brown fox",
                                                          "max_tokens": max_tokens, "temperature": 0})
                ok += r.status_code == 200
            except httpx.HTTPError:
                pass
    return ok


class Load:
    """Completions in a loop on a thread (the CPU limit is only seen on a busy container)."""

    def __init__(self, server) -> None:
        self.server, self.stop_ = server, threading.Event()
        self.t = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        deadline = time.monotonic() + 60
        while not self.stop_.is_set() and time.monotonic() < deadline:
            generate(self.server.base_url, self.server.model, max_tokens=32)

    def __enter__(self) -> "Load":
        self.t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_.set()
        self.t.join(40)


# ------------------------------------------------------------------ the experiment, unchanged but the launcher

@pytest.mark.nightly
def test_the_default_experiment_passes_on_the_docker_launcher(docker_run):
    rep = docker_run["report"]
    failed = [c for c in rep["checks"] if c["passed"] is False]
    assert rep["verdict"] == "pass" and docker_run["rc"] == 0, f"failed: {failed}; errors: {rep.get('errors')}"
    assert rep["stack"]["launcher"] == "docker"
    assert rep["restarts"] >= 1                      # the killed worker's container was replaced by the supervisor
    f = rep["faults"][0]
    assert f["kind"] == "process-kill" and "worker" in f["target"]
    rec = rep["recovery"]
    assert rec["time_to_first_success_s"] and rec["time_to_first_success_s"] > 0
    assert rep["integrity"]["compared"] >= 20 and rep["integrity"]["mismatched"] == 0
    print(f"docker launcher: kill-draft-worker (CI form) wall {docker_run['wall_s']:.0f} s, recovery {rec}")


@pytest.mark.nightly
def test_the_server_log_and_the_allure_environment_name_the_container_launcher(docker_run):
    log = (docker_run["out"] / "logs" / "spec-server.log").read_text(errors="replace")
    assert "# specchaos: spec incarnation 1 starting" in log and "vllm" in log.lower()   # both containers' output
    events = [json.loads(line) for line in (docker_run["out"] / "timeline.jsonl").read_text().splitlines()]
    exited = [e for e in events if e.get("event") == "server_exited" and e.get("expected") is False]
    assert exited and exited[0].get("container", "").startswith("specchaos-spec-"), exited[:1]
    env_files = list((docker_run["out"]).rglob("environment.properties"))
    assert env_files and any("launcher = docker" in p.read_text() or "launcher=docker" in p.read_text()
                             for p in env_files), [p.read_text() for p in env_files]


# ------------------------------------------------------------------ container mechanisms of the families

def test_a_role_is_found_by_host_pid_and_frozen_inside_its_container(docker_stack, injector):
    spec = docker_stack.servers["spec"]
    assert docker_stack.launcher == "docker" and spec.container_name().startswith("specchaos-spec-")
    log = spec.log_file().read_text(errors="replace")
    assert "# specchaos: spec incarnation 0 starting" in log and "vllm" in log.lower()   # the container's output
    roles = spec.roles()
    assert all(roles[r] for r in ("api", "engine", "worker")), roles
    init = spec.container().attrs["State"]["Pid"]
    assert roles["api"][0].ppid() == init            # the container's init runs the API server
    h = injector.inject("process-freeze", {"server": "spec", "role": "engine"})
    ev = injector.collect_evidence(h, timeout_s=20)
    assert ev.acted and ev.observations["tokens_while_frozen"] == 0, ev.detail
    injector.clear(h)
    assert generate(spec.base_url, spec.model) == 1


def test_docker_pause_freezes_every_role_and_unpause_resumes(docker_stack, injector):
    spec = docker_stack.servers["spec"]
    c = spec.container()
    h = injector.inject("process-freeze", {"server": "spec", "role": "container"})
    assert h.facts["mechanism"] == "docker_pause" and h.facts["container_name"] == c.name
    ev = injector.collect_evidence(h, timeout_s=10)
    assert ev.acted, ev.detail
    assert ev.observations["paused"] is True and ev.observations["metrics_answered"] is False
    states = {p.pid: p.status() for r in spec.roles().values() for p in r}
    injector.clear(h)
    c.reload()
    assert c.attrs["State"]["Paused"] is False
    assert generate(spec.base_url, spec.model) == 1, f"no generation after unpause (states while paused: {states})"


def test_a_pause_that_did_not_happen_is_no_evidence(docker_stack, injector, monkeypatch):
    """The defect: the engine accepted the pause but the container runs on (an engine or
    freezer that lies): the evidence must say the fault did not act."""
    monkeypatch.setattr(container_ops, "pause", lambda c: None)
    h = injector.inject("process-freeze", {"server": "spec", "role": "container"})
    ev = injector.collect_evidence(h, timeout_s=3)
    assert not ev.acted and "does not report it paused" in ev.detail


def test_a_live_cpu_limit_through_the_engine_and_its_lifting(docker_stack, injector):
    spec = docker_stack.servers["spec"]
    c = spec.container()
    with Load(spec):
        time.sleep(1.0)
        h = injector.inject("cpu-throttle", {"server": "spec", "cpu_fraction": 0.3})
        assert h.facts["mechanism"] == "container"          # auto: a container gets its own quota
        ev = injector.collect_evidence(h, timeout_s=15)
        injector.clear(h)
    o = ev.observations
    assert ev.acted, ev.detail
    assert o["quota_read_back_cpus"] == 0.3 and o["throttled_periods"] > 0 and o["cpu_used_cpus"] <= 0.35, o
    c.reload()
    assert c.attrs["HostConfig"]["CpuQuota"] in (0, -1)
    cgroup_of_api = Path(f"/proc/{spec.roles()['api'][0].pid}/cgroup").read_text()
    assert c.id in cgroup_of_api                          # still in Docker's cgroups: nothing moved out


def test_a_live_memory_limit_through_the_engine_and_its_lifting(docker_stack, injector):
    spec = docker_stack.servers["spec"]
    c = spec.container()
    h = injector.inject("memory-limit", {"server": "spec", "usage_factor": 1.5})
    assert h.facts["mechanism"] == "container"
    ev = injector.collect_evidence(h, timeout_s=10)
    assert ev.acted, ev.detail
    assert ev.observations["limit_read_back"] == h.facts["limit_bytes"]
    injector.clear(h)
    c.reload()
    assert c.attrs["HostConfig"]["Memory"] in (0, container_ops.MEMORY_LIFTED_BYTES)
    assert generate(spec.base_url, spec.model) == 1


def test_per_role_cgroups_are_refused_on_a_container(docker_stack, injector):
    with pytest.raises(FaultError, match="out of Docker's cgroups"):
        injector.inject("memory-limit", {"server": "spec", "roles": ["worker"], "usage_factor": 2})
    with pytest.raises(FaultError, match="out of Docker's cgroups"):
        injector.inject("cpu-throttle", {"server": "spec", "roles": ["worker"], "cpu_fraction": 0.5,
                                         "mechanism": "cgroup"})
    api = docker_stack.servers["spec"].roles()["api"][0]
    assert docker_stack.servers["spec"].container().id in Path(f"/proc/{api.pid}/cgroup").read_text()


def test_a_killed_container_is_replaced_by_the_supervisor(docker_stack, injector):
    spec = docker_stack.servers["spec"]
    before, n = spec.container_name(), spec.incarnation
    h = injector.inject("process-kill", {"server": "spec", "role": "container"})
    assert h.facts["mechanism"] == "container" and h.facts["container_name"] == before
    ev = injector.collect_evidence(h, timeout_s=240)
    o = ev.observations
    assert ev.acted and o["gone"] and o["restart_seen_after_s"] is not None, ev.detail
    assert spec.incarnation == n + 1 and spec.container_name() != before and spec.restarts[-1]["returncode"] == -9
    assert generate(spec.base_url, spec.model) == 1
    print(f"docker: container kill -> server ready again {o['restart_seen_after_s']:.1f} s later")
    assert not docker.from_env().containers.list(all=True, filters={"name": before})   # the old one removed


# ------------------------------------------------------------------ cleanup after SIGKILL of the harness

def test_cleanup_after_a_sigkill_removes_the_harness_containers_and_no_other(docker_engine, tmp_path):
    client = engine_client()
    foreign = client.containers.run(ensure_image(client), ["/usr/bin/sleep", "300"], detach=True, init=True,
                                    name=f"specchaos-spec-foreign-{os.getpid()}",
                                    mounts=[docker.types.Mount("/usr", "/usr", type="bind", read_only=True)])
    state = tmp_path / "state"
    env = dict(os.environ, SPECCHAOS_STATE_DIR=str(state), PYTHONUNBUFFERED="1")
    exp = docker_variant(tmp_path)
    harness = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", str(exp), "--out", str(tmp_path / "out")],
                               cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    label = [f"{LABEL_PREFIX}.state_dir={state.resolve()}"]
    try:
        deadline = time.monotonic() + 120
        while not client.containers.list(filters={"label": label}) and time.monotonic() < deadline:
            assert harness.poll() is None, "the harness ended before starting a container"
            time.sleep(0.5)
        mine = client.containers.list(filters={"label": label})
        assert mine, "no container of the harness appeared"
        init = mine[0].attrs["State"]["Pid"]
        time.sleep(2)
        harness.send_signal(signal.SIGKILL)
        harness.wait(10)
        assert client.containers.list(filters={"label": label}), "the containers died with the harness: no test"
        res = subprocess.run([sys.executable, "-m", "harness.cli", "cleanup"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "removed container(s)" in res.stdout and "specchaos-spec-" in res.stdout, res.stdout
        assert not client.containers.list(all=True, filters={"label": label})
        assert not psutil.pid_exists(init) or psutil.Process(init).status() == psutil.STATUS_ZOMBIE
        foreign.reload()
        assert foreign.status == "running", "cleanup touched a container it did not start"
    finally:
        if harness.poll() is None:
            harness.kill()
        foreign.remove(force=True)
        for c in client.containers.list(all=True, filters={"label": label}):
            c.remove(force=True)

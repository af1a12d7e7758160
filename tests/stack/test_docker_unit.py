"""The Docker launcher without an engine: every shipped experiment validates with
``--launcher docker``, the one-line refusals of a container mechanism on another launcher
and of a cgroup mechanism on containers, the exit-code mapping, the mounts, the image
recipe, the engine's absence, ci/docker-engine.sh's arguments. The real containers are
tests/experiment/test_docker_e2e.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from harness.errors import SpecchaosError, StackError
from harness.experiment.overrides import Override
from harness.experiment.validate import load_experiment
from harness.stack.config import DockerConfig
from harness.stack.container import as_returncode
from harness.stack.docker_engine import engine_client, host_mounts, host_root_tar, outermost
from tests.experiment.files import EXPERIMENTS, MODELS, experiment_files, needs_real_models
from tests.experiment.test_bad_input import assert_one_line_error, cli

ROOT = Path(__file__).resolve().parents[2]
KILL = EXPERIMENTS / "kill-draft-worker.yaml"
DOCKER = Override("stack.launcher", "docker", "--launcher")


@pytest.mark.skipif(not (MODELS / "manifest.json").exists(), reason="models not built (make test builds them)")
@pytest.mark.parametrize("path", [p for p in experiment_files() if p.name not in ("external-endpoint.yaml",
                                                                                 "gpu-health.yaml")],  # needs a GPU anyway
                         ids=lambda p: str(p.relative_to(EXPERIMENTS)))
def test_every_shipped_experiment_validates_with_the_docker_launcher(path, docker_engine):
    if needs_real_models(path):
        pytest.skip("needs models-real/")
    exp = load_experiment(path, overrides=[DOCKER])
    assert exp.cfg.stack.launcher == "docker"


def variant(tmp: Path, **arguments) -> Path:
    doc = yaml.safe_load(KILL.read_text())
    doc["configuration"]["specchaos"]["stack"]["models_dir"] = str(MODELS)
    doc["method"][0]["provider"]["arguments"].update(arguments)
    path = tmp / "x.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.skipif(not (MODELS / "manifest.json").exists(), reason="models not built (make test builds them)")
def test_a_container_kill_is_refused_on_the_local_launcher(tmp_path, docker_engine):
    res = cli("validate", str(variant(tmp_path, role="container")))
    assert_one_line_error(res, "method[0].provider", "process-kill", "capability `containers`",
                          "launcher `local` starts vLLM as local processes", "use launcher docker")
    assert cli("validate", str(variant(tmp_path, role="container")), "--launcher", "docker").returncode == 0


@pytest.mark.skipif(not (MODELS / "manifest.json").exists(), reason="models not built (make test builds them)")
def test_a_cgroup_mechanism_is_refused_on_the_docker_launcher(tmp_path):
    doc = yaml.safe_load(KILL.read_text())
    doc["configuration"]["specchaos"]["stack"]["models_dir"] = str(MODELS)
    doc["method"][0]["provider"] = {"type": "python", "module": "harness.experiment.actions", "func": "throttle_cpu",
                                    "arguments": {"server": "spec", "cpu_fraction": 0.5, "mechanism": "cgroup",
                                                  "roles": ["worker"], "duration_s": 5}}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert_one_line_error(cli("validate", str(path), "--launcher", "docker"), "cpu-throttle",
                          "out of Docker's cgroups", "launcher `docker`")
    assert cli("validate", str(path)).returncode == 0


@pytest.mark.parametrize("arguments, words", [
    ({"func": "freeze_process", "arguments": {"role": "container", "duty_cycle": 0.5, "duration_s": 5}},
     "docker pause, which has no duty cycle"),
    ({"func": "throttle_cpu", "arguments": {"mechanism": "container", "roles": ["worker"], "duration_s": 5}},
     "caps the whole container"),
    ({"func": "limit_memory", "arguments": {"mechanism": "container", "roles": ["worker"], "usage_factor": 2,
                                            "duration_s": 5}}, "limits the whole container"),
])
def test_container_mechanisms_refuse_what_they_cannot_do(tmp_path, arguments, words):
    doc = yaml.safe_load(KILL.read_text())
    doc["configuration"]["specchaos"]["stack"]["models_dir"] = str(MODELS)
    doc["method"][0]["provider"].update(module="harness.experiment.actions", **arguments)
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert_one_line_error(cli("validate", str(path), "--launcher", "docker"), words)


def test_a_container_exit_code_reads_as_a_local_return_code():
    assert as_returncode(137) == -9 and as_returncode(143) == -15     # init: 128 + the child's signal
    assert as_returncode(0) == 0 and as_returncode(1) == 1 and as_returncode(128) == 128


def test_each_path_is_mounted_once_and_read_only(tmp_path):
    a, b = tmp_path / "a", tmp_path / "a" / "b"
    b.mkdir(parents=True)
    assert outermost([b, a, a]) == [a.resolve()]
    mounts = host_mounts(tmp_path, [b])
    targets = [m["Target"] for m in mounts]
    assert "/usr" in targets and str(tmp_path.resolve()) in targets and str(b) not in targets
    assert all(m["ReadOnly"] and m["Source"] == m["Target"] for m in mounts)
    assert [m["Target"] for m in host_mounts(None, [b], interpreter=False)] == [str(b.resolve())]
    with pytest.raises(StackError, match="does not exist"):
        host_mounts(None, [tmp_path / "nowhere"])


def test_the_image_recipe_is_deterministic():
    (data1, tag1), (data2, tag2) = host_root_tar(), host_root_tar()
    assert tag1 == tag2 and data1 == data2 and len(tag1) == 12


def test_no_engine_is_one_line_naming_where_and_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/none.sock")
    with pytest.raises(SpecchaosError) as ei:
        engine_client(timeout_s=2)
    assert "no Docker engine answers at unix://" in ei.value.message
    assert "ci/docker-engine.sh start" in (ei.value.hint or "") and "\n" not in ei.value.one_line()


def test_the_engine_script_refuses_an_unknown_command():
    res = subprocess.run([str(ROOT / "ci" / "docker-engine.sh"), "restart"], capture_output=True, text=True)
    assert res.returncode == 2 and "unknown command 'restart' (start, stop, status)" in res.stderr


@pytest.mark.skipif(not (MODELS / "manifest.json").exists(), reason="models not built (make test builds them)")
def test_validate_refuses_a_missing_engine_before_anything_starts(tmp_path, monkeypatch):
    """``validate`` (and so ``run``) contacts the engine: none answering is one line naming
    ``$DOCKER_HOST``, exit 2, and no run directory, container or process."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/none.sock")
    res = cli("validate", str(variant(tmp_path)), "--launcher", "docker")
    assert_one_line_error(res, "$DOCKER_HOST", "no Docker engine answers", "ci/docker-engine.sh start")
    res = cli("run", str(variant(tmp_path)), "--launcher", "docker", "--out", str(tmp_path / "out"))
    assert_one_line_error(res, "$DOCKER_HOST", "no Docker engine answers")
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not (MODELS / "manifest.json").exists(), reason="models not built (make test builds them)")
@pytest.mark.parametrize("setting, needles", [
    ("stack.docker.image=specchaos/nosuch:tag", ["stack.docker.image", "is not on the Docker engine"]),
    ("stack.docker.cpuset_cpus=4096", ["stack.docker.cpuset_cpus", "CPU(s) [4096]", "the engine does not have"]),
])
def test_validate_refuses_an_image_or_cpus_the_engine_lacks(tmp_path, docker_engine, setting, needles):
    res = cli("validate", str(variant(tmp_path)), "--launcher", "docker", "--set", setting)
    assert_one_line_error(res, *needles)


def test_cpuset_cpus_takes_a_number_and_names_its_cpus():
    assert DockerConfig(cpuset_cpus=1).cpuset_cpus == "1"
    assert DockerConfig(cpuset_cpus="0-2,5").cpus() == {0, 1, 2, 5} and DockerConfig().cpus() == set()


class _StubServer:
    """What LocalStack.stop asks of a server."""

    def __init__(self, name: str):
        import threading

        self.name, self._stop_requested = name, threading.Event()

    def request_stop(self) -> None:
        self._stop_requested.set()

    def finish_stop(self, timeout_s: float) -> None:
        pass


@pytest.mark.parametrize("launcher, logger", [("local", "harness.stack.local"), ("docker", "harness.stack.container")])
def test_each_launcher_logs_under_its_own_module(tmp_path, caplog, launcher, logger):
    """The Docker launcher inherits LocalStack's start and stop; its lines name it, not the local one."""
    import logging

    from harness.stack.config import StackConfig
    from harness.stack.launchers import launcher_class

    stack = launcher_class(launcher)(StackConfig(models_dir=str(tmp_path)), tmp_path / "run")
    stack.servers = {"spec": _StubServer("spec")}
    caplog.set_level(logging.INFO)
    stack.stop()
    assert [(r.name, r.getMessage()) for r in caplog.records] == [(logger, "stopping the stack: spec")]

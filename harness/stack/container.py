"""The Docker launcher: each vLLM server in its own container, on a real Docker engine,
supervised by the harness exactly as a local process is (:mod:`harness.stack.supervisor`).

``stack: {launcher: docker}`` (or ``specchaos run FILE --launcher docker``) with the
optional ``stack.docker`` block (:class:`harness.stack.config.DockerConfig`). The engine is
the one ``$DOCKER_HOST`` names (``export "$(ci/docker-engine.sh start)"`` starts a private
one); :func:`harness.stack.docker_engine.engine_client` says what to do when none answers.

One container per incarnation of a server (``spec`` and ``ref``):

* **image**: ``stack.docker.image``; not given, the tiny host-root image built locally
  (:func:`harness.stack.docker_engine.ensure_image`) run with read-only mounts of ``/usr``,
  the Python installation, the venv, the checkout and the models
  (:func:`harness.stack.docker_engine.host_mounts`), so the container runs the very vLLM
  installed here. On GPU hosts: the official ``vllm/vllm-openai`` image and
  ``stack.docker.gpus`` (device requests), the models mounted.
* **network**: ``host`` (the default here: the private engine runs without a bridge) with
  vLLM bound to ``stack.host`` (loopback), or ``bridge`` with the port published on
  ``stack.host`` only (vLLM binds 0.0.0.0 inside the container's own namespace).
* ``--init`` (Python as PID 1 ignores SIGTERM), ``stack.docker.shm_size``, CPU pinning
  (``stack.docker.cpuset_cpus``), the engine's restart policy **off**: the harness
  restarts a container that exited as it restarts a process (back-off, ``max_restarts``,
  ``server_restarting`` events), so restarts are counted the same way.
* **labels** (:data:`LABEL_PREFIX`): the launcher, the server, the owning harness process
  (pid and create time) and its state directory: ``specchaos cleanup`` removes the
  containers of crashed runs by label and by the ids the run registered, never another
  container (:func:`faults.cleanup.cleanup`).
* **logs**: the container's output is appended to ``run_dir/logs/{spec,ref}-server.log``.
* **roles**: the container's init has the host pid ``State.Pid``; its child is the API
  server, and the EngineCore and Worker are found below it by title as locally
  (:func:`harness.stack.procs.tree_roles`), so per-role kill and freeze work unchanged.

Exit codes: a container's is its init's (128 + signal for a killed API server); the
``server_exited`` event reports it as a local process would (negative: killed by that
signal), with ``container_exit_code`` and ``oom_killed`` beside it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import docker
import docker.errors
import psutil
from docker.models.containers import Container
from docker.types import DeviceRequest, Mount

from harness import state
from harness.errors import StackError
from harness.stack import procs, vllm
from harness.stack.config import DockerConfig, StackConfig
from harness.stack.container_cleanup import LABEL_PREFIX, engine_address
from harness.stack.docker_engine import engine_client, ensure_image, host_mounts
from harness.stack.local import LocalStack
from harness.stack.preflight import check_stack
from harness.stack.supervisor import ExitWatch, Incarnation
from harness.stack.vllm_server import VllmServer, VllmSpec
from harness.timeline import Timeline

__all__ = ["ContainerIncarnation", "DockerServer", "DockerStack", "LABEL_PREFIX", "owner_labels"]

log = logging.getLogger(__name__)

#: Environment variables of the harness passed into a container (the rest of the host's
#: environment stays out: HOME, PATH and the like are the container's own).
PASSED_ENV_PREFIXES = ("VLLM_", "HF_", "HUGGING_FACE", "TRANSFORMERS_", "OMP_", "TORCH", "CUDA_", "NCCL_")
_CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_DOCKER_ERRORS = (docker.errors.APIError, docker.errors.NotFound, OSError)


def owner_labels(server: str) -> dict[str, str]:
    """The labels of a container started now by this process for ``server``:
    ``io.specchaos.launcher``, ``.server``, ``.owner_pid``, ``.owner_create_time`` (epoch
    s, the pid-reuse guard) and ``.state_dir`` (:func:`harness.state.state_dir`)."""
    me = psutil.Process()
    return {f"{LABEL_PREFIX}.launcher": "docker", f"{LABEL_PREFIX}.server": server,
            f"{LABEL_PREFIX}.owner_pid": str(me.pid), f"{LABEL_PREFIX}.owner_create_time": f"{me.create_time():.3f}",
            f"{LABEL_PREFIX}.state_dir": str(state.state_dir().resolve())}


class ContainerIncarnation(Incarnation):
    """One incarnation as a container (see module doc): created, registered in the run
    state (``specchaos cleanup``), started; its output followed into ``log_path``.

    Args:
        client: the engine.
        name: the container's name.
        image: image id or tag.
        cmd: the argv (entrypoint ``cmd[0]``, command the rest).
        env: the container's whole environment.
        log_path: the output is appended here.
        mounts: bind mounts.
        labels: the container's labels.
        options: ``stack.docker``.
        port, host: the server's port, and the host address a ``bridge`` network publishes it on.

    Raises:
        StackError: the engine refused to create or start the container (message names it).
    """

    def __init__(self, client: docker.DockerClient, *, name: str, image: str, cmd: list[str], env: dict[str, str],
                 log_path: Path, mounts: list[Mount], labels: dict[str, str], options: DockerConfig, port: int,
                 host: str):
        kw: dict[str, Any] = dict(image=image, entrypoint=cmd[:1], command=cmd[1:], name=name, environment=env,
                                  detach=True, init=True, labels=labels, mounts=mounts, shm_size=options.shm_size,
                                  working_dir=os.getcwd(), restart_policy={"Name": "no"})
        if options.network == "host":
            kw["network_mode"] = "host"
        else:
            kw["ports"] = {f"{port}/tcp": (host, port)}
        if options.cpuset_cpus:
            kw["cpuset_cpus"] = options.cpuset_cpus
        if options.gpus:
            kw["device_requests"] = [DeviceRequest(count=-1 if options.gpus == "all" else int(options.gpus),
                                                   capabilities=[["gpu"]])]
        self.name = name
        self.log_path = log_path
        self._rc: int | None = None
        self._exit: dict[str, Any] = {}
        self._closed = False
        try:
            self.container: Container = client.containers.create(**kw)
        except docker.errors.APIError as exc:
            raise StackError(f"the Docker engine refused to create container {name}: {exc.explanation or exc}",
                             where=f"image {image}", hint="check stack.docker and `docker info`") from None
        state.register_container(self.container.id, name, engine_address())
        try:
            self.container.start()
            self.container.reload()
        except docker.errors.APIError as exc:
            self.close()
            raise StackError(f"container {name} did not start: {exc.explanation or exc}", where=f"image {image}",
                             hint="check stack.docker and `docker info`") from None
        self.pid = int(self.container.attrs["State"]["Pid"])
        try:
            self._init: psutil.Process | None = psutil.Process(self.pid)
        except psutil.Error:
            self._init = None
        self._follower = threading.Thread(target=self._follow_logs, name=f"specchaos-logs-{name}", daemon=True)
        self._follower.start()

    # ------------------------------------------------------------------ Incarnation
    @property
    def returncode(self) -> int | None:
        return self._rc

    def poll(self) -> int | None:
        if self._rc is not None:
            return self._rc
        if self._init is not None and procs.alive(self._init):
            return None
        try:
            status = self.container.wait(timeout=10)
            self.container.reload()
            st = self.container.attrs.get("State") or {}
        except _DOCKER_ERRORS + (Exception,):  # noqa: BLE001 - the engine lost it: the container is gone
            status, st = {"StatusCode": None}, {}
        code = status.get("StatusCode")
        if code is None:
            code = st.get("ExitCode", -1)
        self._exit = {"container": self.name, "container_exit_code": code, "oom_killed": bool(st.get("OOMKilled"))}
        self._rc = as_returncode(int(code))
        return self._rc

    def wait(self, timeout_s: float | None = None) -> int:
        with self.exit_watch() as w:
            if not w.wait(1e9 if timeout_s is None else timeout_s):
                raise subprocess.TimeoutExpired(self.name, timeout_s or 0.0)
        rc = self.poll()
        assert rc is not None
        return rc

    def exit_watch(self) -> ExitWatch:
        return ExitWatch(self.pid, lambda: self._init is None or not procs.alive(self._init))

    def terminate(self) -> None:
        self._signal("SIGTERM")

    def kill(self) -> None:
        self._signal("SIGKILL")

    def api_process(self) -> psutil.Process | None:
        """The init's child (the API server), or None while init has not started it yet."""
        if self._init is None:
            return None
        try:
            children = self._init.children()
        except psutil.Error:
            return None
        for child in children:
            if "vllm" in " ".join(_cmdline(child)):
                return child
        return children[0] if children else None

    def kill_leftovers(self, victims: Sequence[psutil.Process]) -> list[psutil.Process]:
        """SIGKILL the container (every process in it dies with its init), wait up to 10 s,
        then SIGKILL whatever of ``victims`` is still alive (none normally)."""
        self.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.wait(10)
        return procs.kill_tree([p for p in victims if p.pid != self.pid])

    def exit_details(self) -> dict[str, Any]:
        return dict(self._exit)

    def close(self) -> None:
        """Remove the container (forced) and forget it in the run state. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(*_DOCKER_ERRORS):
            self.container.remove(force=True)
        state.unregister_container(self.container.id)

    # ------------------------------------------------------------------ helpers
    def _signal(self, name: str) -> None:
        if self.poll() is not None:
            return
        with contextlib.suppress(*_DOCKER_ERRORS):
            self.container.kill(signal=name)

    def _follow_logs(self) -> None:
        """Append the container's stdout and stderr to the log file until it stops."""
        try:
            with open(self.log_path, "ab") as fh:
                for chunk in self.container.logs(stream=True, follow=True, stdout=True, stderr=True):
                    fh.write(chunk)
                    fh.flush()
        except Exception as exc:  # noqa: BLE001 - the container went away: its log ends here
            log.debug("container %s: log stream ended: %s", self.name, exc)


def as_returncode(container_code: int) -> int:
    """A container's exit code as a local process's return code: ``128 + N`` (an init
    reporting its child killed by signal N, e.g. 137 for SIGKILL) → ``-N``; others as they are."""
    if 128 < container_code < 128 + signal.NSIG:
        return -(container_code - 128)
    return container_code


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


class DockerServer(VllmServer):
    """One supervised vLLM server, each incarnation a container (module doc). Arguments as
    :class:`~harness.stack.vllm_server.VllmServer`, plus:

    Args:
        client: the Docker engine.
        image: the image (id or tag).
        mounts: bind mounts of every container.
        options: ``stack.docker``.
    """

    def __init__(self, name: str, vllm_spec: VllmSpec, *, client: docker.DockerClient, image: str,
                 mounts: list[Mount], options: DockerConfig, **kw: Any):
        super().__init__(name, vllm_spec, **kw)
        self.client = client
        self.image = image
        self.mounts = list(mounts)
        self.options = options
        self._uid = uuid.uuid4().hex[:6]

    def listen_host(self) -> str:
        """``stack.host`` on the host network; 0.0.0.0 inside a bridge network's own
        namespace (the port is published on ``stack.host`` only)."""
        return self.host if self.options.network == "host" else "0.0.0.0"

    def command(self) -> list[str]:
        """As :meth:`VllmServer.command`, with the container's Python first
        (``stack.docker.python``; default: this venv's interpreter, mounted, with the
        host-root image; ``python3`` with an image of one's own)."""
        cmd = super().command()
        python = self.options.python or (cmd[0] if self.options.image is None else "python3")
        return [python, *cmd[1:]]

    def environment(self) -> dict[str, str]:
        """The container's whole environment: its own PATH and HOME, the harness's
        :data:`PASSED_ENV_PREFIXES` variables, vLLM's settings (:func:`harness.stack.vllm.api_server_env`)
        and :attr:`incarnation_env`."""
        base = {k: v for k, v in os.environ.items() if k.startswith(PASSED_ENV_PREFIXES)}
        base.update(PATH=_CONTAINER_PATH, HOME="/root")
        return {**vllm.api_server_env(self.kv_cache_gib, base=base), **self.incarnation_env}

    def container(self) -> Container | None:
        """The container of the current incarnation while it runs, else None (capability ``containers``)."""
        inc = self._inc
        if isinstance(inc, ContainerIncarnation) and inc.poll() is None:
            return inc.container
        return None

    def container_name(self) -> str | None:
        """The current container's name, or None before the first start."""
        inc = self._inc
        return inc.name if isinstance(inc, ContainerIncarnation) else None

    def _launch(self, cmd: list[str], env: dict[str, str]) -> Incarnation:
        name = f"specchaos-{self.name}-{self.port}-{self._uid}-{self.incarnation}"
        labels = {**owner_labels(self.name), f"{LABEL_PREFIX}.incarnation": str(self.incarnation)}
        return ContainerIncarnation(self.client, name=name, image=self.image, cmd=cmd, env=env,
                                    log_path=self.log_path, mounts=self.mounts, labels=labels, options=self.options,
                                    port=self.port, host=self.host)


class DockerStack(LocalStack):
    """The speculative server and the optional reference, each in containers (module doc).
    Implements ``harness.stack.base.Stack``; everything but where a server runs is
    :class:`~harness.stack.local.LocalStack`'s (ports, pre-flight, warm-up, stop)."""

    launcher = "docker"
    summary = "starts vLLM in Docker containers"
    server_class = DockerServer

    def __init__(self, cfg: StackConfig, run_dir: str | os.PathLike, timeline: Timeline | None = None):
        super().__init__(cfg, run_dir, timeline=timeline)
        self.client: docker.DockerClient | None = None
        self.image: str | None = None
        self.mounts: list[Mount] = []

    @classmethod
    def preflight(cls, cfg: StackConfig, where: str) -> None:
        """Validate-time checks, before anything starts: the models and ports as locally; an
        engine answers at ``$DOCKER_HOST``; the configured image is on it; the configured
        CPUs (``stack.docker.cpuset_cpus``) are the engine's.

        Raises:
            ModelError, StackError: as :func:`harness.stack.preflight.check_stack`.
            StackError: no engine answers (``where`` ``$DOCKER_HOST``), the image is missing
                (``stack.docker.image``), or a CPU the engine does not have
                (``stack.docker.cpuset_cpus``).
        """
        check_stack(cfg, where=where)
        opts = cfg.docker
        client = engine_client(timeout_s=10)
        try:
            if opts.image:
                try:
                    client.images.get(opts.image)
                except docker.errors.ImageNotFound:
                    raise StackError(f"image {opts.image!r} is not on the Docker engine", where="stack.docker.image",
                                     hint=f"`docker pull {opts.image}` where a registry is reachable, or leave "
                                          f"stack.docker.image out for the host-root image") from None
            if opts.cpuset_cpus:
                ncpu = int(client.info().get("NCPU") or 0)
                if ncpu and (missing := sorted(c for c in opts.cpus() if c >= ncpu)):
                    raise StackError(f"cpuset_cpus {opts.cpuset_cpus!r} names CPU(s) {missing} the engine does not "
                                     f"have (it has {ncpu}: 0-{ncpu - 1})", where="stack.docker.cpuset_cpus",
                                     hint=f"pick CPUs in 0-{ncpu - 1}, or leave it out for all")
        finally:
            client.close()

    def start(self) -> None:
        """Contact the engine, find or build the image, then start as
        :meth:`LocalStack.start` does, each server in its containers.

        Raises:
            StackError: no engine answers, the image is missing (no registry is asked), or
                a server failed to start (everything started is stopped first).
            ModelError: as :func:`harness.stack.preflight.check_stack`.
        """
        opts = self.cfg.docker
        self.client = engine_client()
        if opts.image:
            try:
                self.image = self.client.images.get(opts.image).id
            except docker.errors.ImageNotFound:
                raise StackError(f"image {opts.image!r} is not on the Docker engine", where="stack.docker.image",
                                 hint=f"`docker pull {opts.image}` where a registry is reachable, or leave "
                                      f"stack.docker.image out for the host-root image") from None
            self.mounts = host_mounts(None, self._model_paths(), interpreter=False)
        else:
            self.image = ensure_image(self.client)
            self.mounts = host_mounts(Path(__file__).resolve().parents[2], self._model_paths())
        super().start()

    def _model_paths(self) -> list[Path]:
        """The directories the servers read: the models directory, the target and the draft (resolved)."""
        cfg = self.cfg
        paths = [Path(cfg.models_dir).resolve()]
        draft = self._configured.get("draft")
        for p in (Path(cfg.models_dir) / cfg.target, Path(draft) if draft else None):
            if p is not None and p.exists():
                paths.append(p.resolve())
        return paths

    def new_server(self, name: str, vllm_spec: VllmSpec, **kw: Any) -> DockerServer:
        assert self.client is not None and self.image is not None, "start() first"
        return self.server_class(name, vllm_spec, client=self.client, image=self.image, mounts=self.mounts,
                                 options=self.cfg.docker, **kw)

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop every server (their containers are removed) as :meth:`LocalStack.stop`."""
        super().stop(timeout_s)

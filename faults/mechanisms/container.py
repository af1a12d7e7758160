"""The Docker launcher's mechanisms (capability ``containers``,
:class:`harness.stack.capabilities.Containerised`), through the engine:

* :class:`ContainerCpu` (cpu-throttle): the CFS quota through ``container.update``, the
  whole container (Docker's own cgroup, no process moved);
* :class:`ContainerMemory` (memory-limit): memory and memory+swap through ``container.update``;
* :class:`ContainerPause` (process-freeze ``role: container``): ``docker pause``, the
  cgroup freezer, every role at once;
* :class:`ContainerKill` (process-kill ``role: container``): ``docker kill``, every role
  at once (the supervisor then starts a new container).

Facts written to the ledger carry ``container`` (id), ``container_name`` and ``engine``
(the engine's URL), so ``specchaos cleanup`` reverts a crashed run's change on the right
engine (:func:`client_for`).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import time
from collections.abc import Callable
from typing import Any, ClassVar

import docker
import docker.errors
import psutil

from faults.base import Evidence
from faults.engine_metrics import read_metrics
from faults.mechanisms.base import Mechanism, Target, generating
from faults.mechanisms.cgroup_memory import CgroupMemory
from harness.errors import FaultError
from harness.stack.capabilities import Containerised, Supervised
from harness.stack.container_cleanup import engine_address
from harness.stack.procs import Recorded, cmdline_of

log = logging.getLogger(__name__)

#: The CFS period a container CPU limit uses, microseconds (Docker's default).
CPU_PERIOD_US = 100_000
#: The memory limit that lifts one (cgroup v1 keeps a limit once set: a large value lifts
#: it, with swap unlimited; the kernel refuses 1 PiB), bytes: 1 TiB.
MEMORY_LIFTED_BYTES = 1 << 40
_ERRORS = (docker.errors.DockerException, OSError)


def identity(c: Any) -> dict[str, Any]:
    """``{"container": id, "container_name": str, "engine": URL}`` of container ``c`` (ledger facts)."""
    return {"container": c.id, "container_name": c.name, "engine": engine_address()}


def client_for(facts: dict[str, Any]) -> docker.DockerClient:
    """A client of the engine the facts name (:func:`identity`).

    Raises:
        FaultError: that engine does not answer.
    """
    engine = facts.get("engine")
    try:
        client = docker.DockerClient(base_url=engine, timeout=30) if engine else docker.from_env(timeout=30)
        client.ping()
        return client
    except _ERRORS as exc:
        raise FaultError(f"Docker engine {engine or '$DOCKER_HOST'} does not answer ({exc})",
                         where=str(facts.get("container_name")), hint='start it: export "$(ci/docker-engine.sh start)"')


def _call(what: str, c: Any, fn: Any, *args: Any, **kw: Any) -> Any:
    try:
        return fn(*args, **kw)
    except docker.errors.NotFound:
        raise FaultError(f"container {c.name} is gone: cannot {what}", where=c.name,
                         hint="the server may be restarting; inject once it is ready") from None
    except _ERRORS as exc:
        raise FaultError(f"the Docker engine refused to {what} container {c.name}: {exc}", where=c.name) from None


def pause(c: Any) -> None:
    """``docker pause`` (cgroup freezer: every process of the container stops).

    Raises:
        FaultError: the container is gone or the engine refused.
    """
    _call("pause", c, c.pause)


def unpause(c: Any) -> None:
    """``docker unpause``; nothing when it is not paused or gone (idempotent)."""
    with contextlib.suppress(*_ERRORS):
        c.reload()
        if (c.attrs.get("State") or {}).get("Paused"):
            c.unpause()


def paused(c: Any) -> bool | None:
    """Whether the engine reports the container paused (None: gone)."""
    try:
        c.reload()
        return bool((c.attrs.get("State") or {}).get("Paused"))
    except _ERRORS:
        return None


def host_config(c: Any) -> dict[str, Any]:
    """The container's ``HostConfig`` as the engine reports it now (``{}`` when gone)."""
    try:
        c.reload()
        return dict(c.attrs.get("HostConfig") or {})
    except _ERRORS:
        return {}


def lift_cpu(c: Any) -> None:
    """Lift a CPU limit (quota -1: ``--cpus 0`` does not lift one). Nothing when gone."""
    with contextlib.suppress(*_ERRORS):
        c.update(cpu_quota=-1)


def lift_memory(c: Any) -> None:
    """Lift a memory limit: memory and memory+swap to :data:`MEMORY_LIFTED_BYTES` first (the
    kernel refuses a memory limit above the memory+swap one), then swap unlimited. Nothing
    when gone."""
    with contextlib.suppress(*_ERRORS):
        c.update(mem_limit=MEMORY_LIFTED_BYTES, memswap_limit=MEMORY_LIFTED_BYTES)
        c.update(mem_limit=MEMORY_LIFTED_BYTES, memswap_limit=-1)


def _stats(c: Any) -> dict[str, Any]:
    try:
        return dict(c.stats(stream=False) or {})
    except _ERRORS:
        return {}


def cpu_stats(c: Any) -> tuple[float, dict[str, int]] | None:
    """``(monotonic s, {"usage_ns", "throttled_periods", "periods"})`` of the container from
    the engine's stats (cumulative counters); None when unreadable."""
    s = _stats(c)
    cpu = s.get("cpu_stats") or {}
    if not cpu:
        return None
    thr = cpu.get("throttling_data") or {}
    return time.monotonic(), {"usage_ns": int((cpu.get("cpu_usage") or {}).get("total_usage") or 0),
                              "throttled_periods": int(thr.get("throttled_periods") or 0),
                              "periods": int(thr.get("periods") or 0)}


def memory_usage(c: Any) -> dict[str, int | None]:
    """``{"usage_bytes", "limit_bytes", "max_usage_bytes"}`` from the engine's stats (None: unreadable)."""
    m = _stats(c).get("memory_stats") or {}
    return {"usage_bytes": m.get("usage"), "limit_bytes": m.get("limit"), "max_usage_bytes": m.get("max_usage")}


class _Container(Mechanism):
    """The container of the target's server, found at :meth:`apply`."""

    needs: ClassVar[tuple[str, ...]] = ("containers",)

    def __init__(self, t: Target):
        super().__init__(t)
        self.c: Any = None

    @classmethod
    def unfit(cls, t: Target) -> FaultError | None:
        return None if isinstance(t.srv, Containerised) else FaultError(
            f"server {t.server} does not run in a container", where=t.where,
            hint="the container mechanisms need launcher docker; use a process role or mechanism")

    def _find(self) -> dict[str, Any]:
        """The server's running container (FaultError: it is down); its ledger identity."""
        self.c = self.t.srv.container()
        if self.c is None:
            raise FaultError(f"server {self.t.server} has no running container (is it up?)", where=self.t.where,
                             hint="inject once the server is ready")
        return identity(self.c)

    @classmethod
    def _on_engine(cls, facts: dict[str, Any], fn: Callable[[Any], None]) -> None:
        """After a crash: ``fn(container)`` on the engine the facts name; nothing when it is gone."""
        if facts.get("container"):
            with contextlib.suppress(docker.errors.NotFound):   # removed meanwhile: nothing of it is left
                fn(client_for(facts).containers.get(facts["container"]))


class ContainerCpu(_Container):
    """A CFS quota on the whole container (``container.update``); for ``mechanism: cgroup``
    too, a container's cgroup being Docker's. Evidence: the quota read back from the
    engine's ``HostConfig``, the engine's CPU counters over the window (throttled periods
    grew, CPU used within the limit)."""

    name: ClassVar[str] = "container"
    action: ClassVar[str] = "cpu"
    answers: ClassVar[tuple[str, ...]] = ("container", "cgroup", "auto")
    stands_in: ClassVar[str | None] = "a container's cgroup is Docker's: its quota set through the engine"

    @classmethod
    def unfit(cls, t: Target) -> FaultError | None:
        if t.roles and isinstance(t.srv, Containerised):
            return FaultError("per-role limits in a container: its cgroups are Docker's")
        return super().unfit(t)

    def apply(self, cpu_fraction: float, period_s: float) -> dict[str, Any]:
        facts = self._find()
        self.measured_by = f"the engine's HostConfig and CPU stats of container {self.c.name}; "
        self.targets = list(self.t.recorded)
        quota = max(1000, int(round(cpu_fraction * CPU_PERIOD_US)))
        _call("limit the CPU of", self.c, self.c.update, cpu_period=CPU_PERIOD_US, cpu_quota=quota)
        self.asked = {"cpu_quota_us": quota, "cpu_period_us": CPU_PERIOD_US}
        return {**facts, "read_back": self.asked}

    def observe(self, window_s: float, limit_cpus: float, obs: dict[str, Any]) -> tuple[bool, str]:
        c, where = self.c, self.t.where
        hc = host_config(c)
        back = obs["read_back"] = {"cpu_quota_us": hc.get("CpuQuota"), "cpu_period_us": hc.get("CpuPeriod")}
        s0 = cpu_stats(c)
        time.sleep(window_s)
        s1 = cpu_stats(c)
        if back != self.asked:
            return False, f"{where}: the engine reports {back}, not the limit asked {self.asked}"
        obs["quota_read_back_cpus"] = round((back["cpu_quota_us"] or 0) / (back["cpu_period_us"] or 1), 4)
        if s0 is None or s1 is None:
            return False, f"{where}: the engine's CPU stats of {c.name} are unreadable"
        span = s1[0] - s0[0]
        obs["window_s"] = round(span, 3)
        obs["cpu_seconds"] = round((s1[1]["usage_ns"] - s0[1]["usage_ns"]) / 1e9, 4)
        obs["cpu_used_cpus"] = round(obs["cpu_seconds"] / span, 4) if span > 0 else None
        obs["throttled_periods"] = s1[1]["throttled_periods"] - s0[1]["throttled_periods"]
        head = (f"{where}: container {c.name} quota read back {obs['quota_read_back_cpus']} CPU "
                f"(asked {obs['cpu_fraction']:g})")
        if obs["throttled_periods"] <= 0:
            return False, (f"{head}, but the kernel never throttled it in {obs['window_s']:.1f} s (it used "
                           f"{obs['cpu_used_cpus']} CPU: idle?)")
        if obs["cpu_used_cpus"] is None or obs["cpu_used_cpus"] > limit_cpus:
            return False, f"{head}, yet it used {obs['cpu_used_cpus']} CPU"
        return True, (f"{head}; it used {obs['cpu_used_cpus']:.3f} CPU over {obs['window_s']:.1f} s, "
                      f"throttled in {obs['throttled_periods']} periods")

    def restore(self) -> None:
        if self.c is not None:
            lift_cpu(self.c)
            quota = host_config(self.c).get("CpuQuota")
            if quota not in (None, 0, -1):
                raise FaultError(f"container {self.c.name} still has a CPU quota of {quota} us")
            log.info("unthrottled %s (container %s)", self.t.where, self.c.name)
            self.c = None

    @classmethod
    def recover(cls, facts: dict[str, Any], fault_id: str) -> None:
        cls._on_engine(facts, lift_cpu)


class ContainerMemory(_Container):
    """The whole container's memory and memory+swap limit (``container.update``); for
    ``mechanism: cgroup`` too. Evidence: the limit read back (``HostConfig.Memory``) and
    the container's use within it (the engine's stats); after an OOM kill, the restart."""

    name: ClassVar[str] = "container"
    action: ClassVar[str] = "memory"
    answers: ClassVar[tuple[str, ...]] = ("container", "cgroup", "auto")

    @classmethod
    def unfit(cls, t: Target) -> FaultError | None:
        if t.roles and isinstance(t.srv, Containerised):
            return CgroupMemory.unfit(t)   # the same refusal: Docker's cgroups
        return super().unfit(t)

    def apply(self, size: Callable[[int], int]) -> dict[str, Any]:
        facts = self._find()
        used = memory_usage(self.c)["usage_bytes"] or 0
        self.limit = max(mmap.PAGESIZE, size(used))
        self.incarnation = int(getattr(self.t.srv, "incarnation", 0))
        facts = {"mechanism": self.name, "limit_bytes": self.limit, "read_back": None, "container_usage_bytes": used,
                 "tree_rss_bytes": None, "pids": [], "create_times": [], "incarnation": self.incarnation,
                 "limited_at": None, "cgroup": None, **facts}
        # cgroup v1 refuses a limit below current use: set it above, growth then meets the OOM killer
        _call("limit the memory of", self.c, self.c.update, mem_limit=self.limit, memswap_limit=self.limit)
        facts["read_back"] = {"memory_bytes": host_config(self.c).get("Memory")}
        log.info("limited %s (container %s) to %d bytes (using %d)", self.t.where, self.c.name, self.limit, used)
        return facts

    def observe(self, obs: dict[str, Any], restart: Callable[[], None]) -> tuple[bool, str]:
        c, where, limit = self.c, self.t.where, self.limit
        mem = memory_usage(c)
        back = host_config(c).get("Memory")
        obs.update(mechanism=self.name, container=c.name, limit_read_back=back, usage_bytes=mem["usage_bytes"],
                   peak_bytes=mem["max_usage_bytes"], stats_limit_bytes=mem["limit_bytes"],
                   measured_by=f"the engine's HostConfig.Memory and memory stats of {c.name}; ")
        restarted = int(getattr(self.t.srv, "incarnation", 0)) != self.incarnation
        if restarted and isinstance(self.t.srv, Supervised):   # OOM-killed: the supervisor's new container
            restart()
            return True, (f"{where}: container {c.name} limited to {limit} bytes exited (OOM) and the server restarted"
                          + (f" {obs['restart_ready_after_s']:.1f} s after the limit"
                             if obs["restart_ready_after_s"] is not None else ""))
        head = f"{where}: container {c.name} limit {limit / (1 << 20):.1f} MiB"
        if back != limit:
            return False, f"{where}: the engine reports a memory limit of {back}, not {limit}"
        if not obs["usage_bytes"]:
            return False, f"{head} read back, but the engine reports no memory use of it"
        if obs["usage_bytes"] > limit:
            return False, f"{head} read back, yet it uses {obs['usage_bytes']} bytes"
        return True, f"{head} read back; usage {obs['usage_bytes']} bytes within it{generating(obs)}"

    def restore(self) -> None:
        if self.c is not None:
            lift_memory(self.c)
            back = host_config(self.c).get("Memory")
            if back not in (None, 0, MEMORY_LIFTED_BYTES):
                raise FaultError(f"container {self.c.name} still limited to {back} bytes")
            log.info("unlimited %s (container %s)", self.t.where, self.c.name)
            self.c = None

    @classmethod
    def recover(cls, facts: dict[str, Any], fault_id: str) -> None:
        cls._on_engine(facts, lift_memory)


class ContainerPause(_Container):
    """``docker pause`` (no duty cycle). Evidence: the engine reports the container paused
    at both ends of a window, and ``/metrics`` never answers within it."""

    name: ClassVar[str] = "docker_pause"
    action: ClassVar[str] = "freeze"
    answers: ClassVar[tuple[str, ...]] = ("container",)

    def apply(self, duty_cycle: float | None, period_s: float) -> dict[str, Any]:
        facts = self._find()
        pause(self.c)
        log.info("paused %s (container %s: every role)", self.t.where, self.c.name)
        return {"pids": [], "create_times": [], "cmdlines": [], "mechanism": self.name, **facts}

    def evidence(self, base_url: str, timeout_s: float, window_s: float) -> Evidence:
        c, window = self.c, max(0.5, min(window_s, timeout_s))
        obs: dict[str, Any] = {"role": "container", "mechanism": self.name, "container": c.name, "paused": False,
               "metrics_answered": None, "window_s": 0.0,
               "measured_by": f"the engine's State.Paused and {base_url}/metrics over the window"}
        w0 = time.monotonic()
        first = paused(c)
        answered = False
        while time.monotonic() - w0 < window:
            answered |= read_metrics(base_url, timeout_s=min(1.0, max(0.05, window - (time.monotonic() - w0)))) \
                is not None
        last = paused(c)
        obs.update(paused=bool(first and last), metrics_answered=answered, window_s=round(time.monotonic() - w0, 3))
        head = f"docker pause of {self.t.where} ({c.name}, every role)"
        if not obs["paused"]:
            return Evidence(False, obs, f"{head}: the engine does not report it paused (start {first}, end {last})")
        if answered:
            return Evidence(False, obs, f"{head}: paused, yet {base_url}/metrics answered within the "
                                        f"{obs['window_s']:.2f} s window")
        return Evidence(True, obs, f"{head}: paused throughout, /metrics unanswered for {obs['window_s']:.2f} s")

    def restore(self) -> None:
        if self.c is not None:
            unpause(self.c)
            if paused(self.c):
                raise FaultError(f"container {self.c.name} still paused after docker unpause",
                                 hint="run `specchaos cleanup`, or docker unpause it")
            log.info("unpaused %s (container %s)", self.t.where, self.c.name)
            self.c = None

    @classmethod
    def recover(cls, facts: dict[str, Any], fault_id: str) -> None:
        cls._on_engine(facts, unpause)


class ContainerKill(_Container):
    """``docker kill --signal``: its init forwards the signal; the processes whose end is
    the kill's are the container's init (host pid)."""

    name: ClassVar[str] = "container"
    action: ClassVar[str] = "kill"
    answers: ClassVar[tuple[str, ...]] = ("container",)

    def apply(self, signal: str) -> tuple[int, list[Recorded], dict[str, Any]]:
        facts = self._find()
        incarnation = int(getattr(self.t.srv, "incarnation", 0))
        pid = int((self.c.attrs.get("State") or {}).get("Pid") or 0)
        try:
            init = psutil.Process(pid)
            recorded: list[Recorded] = [(pid, init.create_time(), cmdline_of(init))]
        except psutil.Error as exc:
            raise FaultError(f"the init of container {self.c.name} (pid {pid}) is gone", where=self.t.where,
                             hint="the server may be restarting; inject once it is ready") from exc
        _call("kill", self.c, self.c.kill, signal=signal)   # the init forwards it; SIGKILL ends every process
        return incarnation, recorded, {"mechanism": self.name, **facts}

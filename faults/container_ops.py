"""Container operations the fault families use on a server of the Docker launcher
(capability ``containers``, :class:`harness.stack.capabilities.Containerised`): below the
families, like their shared process helpers, so no family imports another.

Each family keeps its own meaning and evidence; these are its *container mechanisms*:

* process-kill ``role: container``: :func:`kill` (``docker kill``: every role at once, the
  harness's supervisor then starts a new container);
* process-freeze ``role: container``: :func:`pause` / :func:`unpause` (``docker pause``:
  the cgroup freezer, every role at once);
* cpu-throttle ``mechanism: container``: :func:`limit_cpu` / :func:`lift_cpu` (the CFS
  quota through ``container.update``: Docker's own cgroup, no process moved);
* memory-limit ``mechanism: container``: :func:`limit_memory` / :func:`lift_memory`.

Facts written to the ledger carry ``container`` (id), ``container_name`` and ``engine``
(the engine's URL), so ``specchaos cleanup`` reverts a crashed run's change on the right
engine (:func:`client_for`).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import docker
import docker.errors

from harness.errors import FaultError
from harness.stack.capabilities import Containerised
from harness.stack.container_cleanup import engine_address

__all__ = ["container_of", "identity", "client_for", "kill", "pause", "unpause", "paused", "limit_cpu", "lift_cpu",
           "limit_memory", "lift_memory", "host_config", "cpu_stats", "memory_usage", "CPU_PERIOD_US",
           "MEMORY_LIFTED_BYTES"]

#: The CFS period a container CPU limit uses, microseconds (Docker's default).
CPU_PERIOD_US = 100_000
#: The memory limit that lifts one (cgroup v1 keeps a limit once set: a large value lifts
#: it, with swap unlimited; the kernel refuses 1 PiB), bytes: 1 TiB.
MEMORY_LIFTED_BYTES = 1 << 40
_ERRORS = (docker.errors.DockerException, OSError)


def container_of(srv: Any, server: str, target: str) -> Any:
    """The running container of server ``srv`` (named ``server``).

    Raises:
        FaultError: the server is not in a container (another launcher: use a process
            role or mechanism), or it is down (no running container).
    """
    if not isinstance(srv, Containerised):
        raise FaultError(f"server {server} does not run in a container", where=target,
                         hint="the container mechanisms need launcher docker; use a process role or mechanism")
    c = srv.container()
    if c is None:
        raise FaultError(f"server {server} has no running container (is it up?)", where=target,
                         hint="inject once the server is ready")
    return c


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


def kill(c: Any, signal: str = "SIGKILL") -> None:
    """``docker kill --signal`` (the init forwards it; SIGKILL ends every process at once).

    Raises:
        FaultError: the container is gone or the engine refused.
    """
    _call("kill", c, c.kill, signal=signal)


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


def limit_cpu(c: Any, cpu_fraction: float) -> dict[str, int]:
    """Cap the container at ``cpu_fraction`` of one CPU: CFS quota = fraction × :data:`CPU_PERIOD_US`.

    Returns:
        ``{"cpu_quota_us", "cpu_period_us"}`` as asked.

    Raises:
        FaultError: the container is gone or the engine refused.
    """
    quota = max(1000, int(round(cpu_fraction * CPU_PERIOD_US)))
    _call("limit the CPU of", c, c.update, cpu_period=CPU_PERIOD_US, cpu_quota=quota)
    return {"cpu_quota_us": quota, "cpu_period_us": CPU_PERIOD_US}


def lift_cpu(c: Any) -> None:
    """Lift a CPU limit (quota -1: ``--cpus 0`` does not lift one). Nothing when gone."""
    with contextlib.suppress(*_ERRORS):
        c.update(cpu_quota=-1)


def limit_memory(c: Any, limit_bytes: int) -> None:
    """Limit the container's memory (and memory + swap) to ``limit_bytes``.

    Raises:
        FaultError: the container is gone or the engine refused (cgroup v1 refuses a limit
            below current use: set it above, growth then meets the OOM killer).
    """
    _call("limit the memory of", c, c.update, mem_limit=int(limit_bytes), memswap_limit=int(limit_bytes))


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

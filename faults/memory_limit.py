"""Fault family ``memory-limit``: a memory limit on a server's process tree — a cgroup of
the harness's own (:mod:`faults.mechanisms.cgroup_memory`; v1 ``memory.limit_in_bytes``,
v2 ``memory.max``), or a container's own limit through its engine
(:mod:`faults.mechanisms.container`); :func:`faults.mechanisms.select` picks.

Size, exactly one of: ``limit_gib`` (GiB), ``limit_bytes`` (bytes), or ``usage_factor``
(× the targeted tree's resident memory, psutil RSS, at injection). A size of zero or
less, or larger than the machine's memory, is refused at validation (the field named).

What the limit bounds (measured on this host's kernel, 6.18, cgroup v1): memory is
charged to the cgroup a page was allocated in, and charges do not move with a process
(``memory.move_charge_at_immigrate`` is gone; cgroup v2 never moved them). So the limit
caps what the tree charges **after** it was moved in — new allocations, page cache,
buffers grown under load — not the memory it already held. A tree that grows past it is
reclaimed and then OOM-killed by the kernel (``oom_kill`` in ``memory.oom_control`` /
``memory.events``); vLLM then exits and the harness's supervisor restarts it, outside this
cgroup (a restarted server is not limited).

Targets: ``server`` and ``roles`` (None: the whole tree), as in ``cpu-throttle``.

Evidence (measured over a window of :data:`EVIDENCE_WINDOW_S` s): the limit read back;
the tree's pids in the cgroup's ``cgroup.procs``; the cgroup's usage, peak
(``memory.max_usage_in_bytes`` / ``memory.peak``), ``failcnt`` (v1; times the limit was
hit), OOM kills; the tree's RSS; what the server did: output tokens on ``/metrics``
(``vllm:generation_tokens_total``) across the window (still generating?), and, after an
OOM kill that took its API process down, the supervisor's restart
(``restart_ready_after_s``). ``acted`` needs the limit read back as written (page-aligned),
every live targeted pid inside, and the kernel accounting the tree's memory there (usage or
peak above zero, or an OOM kill) with the peak within the limit.

Revert: limit lifted, pids moved back, cgroup removed (:meth:`MemoryLimit.clear`;
:meth:`MemoryLimit.recover` from the ledger, or by the cgroup's name
``specchaos-<fault id>`` when the crash came before the facts).

Example::

    - type: action
      name: limit-spec-memory
      provider:
        type: python
        module: harness.experiment.actions
        func: limit_memory
        arguments: {server: spec, roles: [worker], limit_gib: 0.05, duration_s: 15}
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any, ClassVar, Literal

import psutil
from pydantic import Field, field_validator, model_validator

from faults import mechanisms
from faults.base import Evidence, Fault, FaultContext, FaultParams
from faults.engine_metrics import TOKENS_METRIC, read_metrics
from faults.mechanisms import MemoryCap, Target
from faults.targets import server_of
from harness.clock import now
from harness.errors import FaultError
from harness.stack.capabilities import Supervised

log = logging.getLogger(__name__)

GIB = 1 << 30
#: Seconds the evidence watches the limited tree.
EVIDENCE_WINDOW_S = 3.0


def machine_bytes() -> int:
    """The machine's memory, bytes (psutil ``virtual_memory().total``)."""
    return int(psutil.virtual_memory().total)


class MemoryLimitParams(FaultParams):
    """Arguments of ``memory-limit`` (how long: the action's ``duration_s``).

    Fields:
        server: key of ``stack.servers`` (``"spec"`` or ``"ref"``).
        roles: ``["api", "engine", "worker"]`` or a subset; None (default): the whole tree.
        limit_gib: the limit in GiB (> 0, at most the machine's memory).
        limit_bytes: the limit in bytes (> 0, at most the machine's memory).
        usage_factor: the limit as this factor × the tree's RSS at injection (> 0; with
            the container mechanism: × the container's memory use).
        Exactly one of ``limit_gib``, ``limit_bytes``, ``usage_factor``.
        mechanism: ``"auto"`` (``container`` for a server in a container, else ``cgroup``),
            ``"cgroup"`` (a cgroup of the harness's own; on a server in a container, the
            container's own cgroup through the engine, as ``container``; ``roles`` refused
            there: they would move the container's processes out of Docker's cgroups) or
            ``"container"`` (launcher docker: ``container.update`` of the whole container's
            memory and memory+swap limit; no ``roles``).
    """

    server: str = "spec"
    roles: list[Literal["api", "engine", "worker"]] | None = Field(None, min_length=1)
    limit_gib: float | None = Field(None, gt=0)
    limit_bytes: int | None = Field(None, gt=0)
    usage_factor: float | None = Field(None, gt=0)
    mechanism: Literal["auto", "cgroup", "container"] = "auto"

    @field_validator("limit_gib", "limit_bytes")
    @classmethod
    def _fits_the_machine(cls, v: float | None, info: Any) -> float | None:
        if v is None:
            return v
        size = v * GIB if info.field_name == "limit_gib" else v
        total = machine_bytes()
        if size > total:
            raise ValueError(f"{v:g} {'GiB' if info.field_name == 'limit_gib' else 'bytes'} is more than this "
                             f"machine's memory ({total / GIB:.1f} GiB)")
        return v

    @model_validator(mode="after")
    def _exactly_one(self) -> "MemoryLimitParams":
        given = [n for n in ("limit_gib", "limit_bytes", "usage_factor") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of limit_gib, limit_bytes, usage_factor (got "
                             f"{', '.join(given) or 'none'})")
        if self.mechanism == "container" and self.roles:
            raise ValueError("mechanism container limits the whole container: remove roles")
        return self


class MemoryLimit(Fault):
    """Limit the memory a server's process tree may charge (cgroup memory controller)."""

    kind: ClassVar[str] = "memory-limit"
    activity: ClassVar[str] = "limit_memory"
    needs: ClassVar[tuple[str, ...]] = ("processes",)
    Params: ClassVar[type[FaultParams]] = MemoryLimitParams
    params: MemoryLimitParams

    def __init__(self, params: MemoryLimitParams):
        super().__init__(params)
        self.facts: dict[str, Any] | None = None
        self._mech: MemoryCap | None = None

    def required(self) -> tuple[str, ...]:
        """Process ids; ``mechanism: container`` needs a container."""
        return ("containers",) if self.params.mechanism == "container" else type(self).needs

    def excluded(self) -> dict[str, str]:
        """Single ``roles`` never on a container (see :class:`MemoryLimitParams`)."""
        return {"containers": mechanisms.MEMORY_ROLES_IN_CONTAINER} if self.params.roles else {}

    def describe_target(self, ctx: FaultContext) -> str:
        """``"<server>/<roles joined by +>"`` or ``"<server>/tree"``."""
        return f"{self.params.server}/{'+'.join(self.params.roles) if self.params.roles else 'tree'}"

    def check_host(self) -> None:
        """A writable memory cgroup (there is no fallback), unless ``mechanism: container``.

        Raises:
            FaultError: ``"cgroup <path> not writable (...)"`` (no ``where``: the whole fault).
        """
        mechanisms.check_host("memory", self.params.mechanism)

    def _size(self, used: int) -> int:
        """The limit in bytes, from the tree's (or container's) use ``used`` in bytes."""
        p = self.params
        if p.limit_bytes is not None:
            return int(p.limit_bytes)
        if p.limit_gib is not None:
            return int(p.limit_gib * GIB)
        return int((p.usage_factor or 0) * used)

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        """Limit the tree by the mechanism :func:`faults.mechanisms.select` picks (a cgroup:
        created, the tree moved in, the limit set and read back).

        Returns:
            ``{"mechanism": "cgroup"|"container", "limit_bytes": int (asked), "read_back":
            {file: value}, "tree_rss_bytes": int|None, "pids", "create_times", "incarnation",
            "limited_at": epoch s, "cgroup": cgroup facts|None}``; a container's also
            ``container_usage_bytes``, ``container``, ``container_name``, ``engine``.

        Raises:
            FaultError: unknown server, server down, cgroup not writable, the kernel refused
                the limit.
        """
        p = self.params
        target = self.describe_target(ctx)
        t = Target(server_of(ctx, p.server, target), p.server, target,
                   self.fault_id or f"{self.kind}-{uuid.uuid4().hex[:8]}", p.roles)
        self._mech, _ = mechanisms.select("memory", t, p.mechanism)
        self.facts = self._mech.apply(self._size)
        self.facts["limited_at"] = now()
        return dict(self.facts)

    def evidence(self, ctx: FaultContext, timeout_s: float) -> Evidence:
        """Watch the limited tree for :data:`EVIDENCE_WINDOW_S` s (see module doc).

        Observations: ``limit_bytes`` (asked), ``limit_read_back``, ``usage_bytes``,
        ``peak_bytes``, ``tokens_before``, ``tokens_after`` and ``still_generating`` (the
        counter grew across the window), ``restart_ready_after_s`` (after an OOM kill that
        took the server down: the supervisor's restart, from the injection), ``window_s``,
        ``measured_by``; a cgroup's also ``failcnt`` (v1; None in v2), ``oom_kills`` (in the
        window and before it, since injection), ``tree_rss_bytes`` (now),
        ``pids_in_cgroup``, ``missing_pids``, ``killed_pids`` (targeted and gone),
        ``api_alive``; a container's ``mechanism``, ``container``, ``stats_limit_bytes``.

        Raises:
            FaultError: called before :meth:`inject`.
        """
        target = self.describe_target(ctx)
        if self.facts is None or self._mech is None:
            raise FaultError("memory-limit evidence asked before injection", where=target)
        f = self.facts
        srv = server_of(ctx, self.params.server, target)
        window = max(0.5, min(EVIDENCE_WINDOW_S, timeout_s / 2))
        start = time.monotonic()
        before = read_metrics(srv.base_url)
        time.sleep(window)
        after = read_metrics(srv.base_url)
        obs: dict[str, Any] = {
            "limit_bytes": f["limit_bytes"], "tokens_metric": TOKENS_METRIC,
            "tokens_before": before and before[TOKENS_METRIC], "tokens_after": after and after[TOKENS_METRIC],
            "still_generating": None, "restart_ready_after_s": None, "window_s": round(time.monotonic() - start, 3)}
        if obs["tokens_before"] is not None and obs["tokens_after"] is not None:
            obs["still_generating"] = obs["tokens_after"] > obs["tokens_before"]

        def restart() -> None:   # the supervisor's restart after an OOM kill, from the limit
            if isinstance(srv, Supervised):
                ready = srv.wait_for_incarnation(f["incarnation"] + 1, max(0.0, timeout_s - (time.monotonic() - start)))
                if ready is not None:
                    obs["restart_ready_after_s"] = round(ready - f["limited_at"], 3)

        acted, detail = self._mech.observe(obs, restart)
        obs["measured_by"] += f"{TOKENS_METRIC} on /metrics"
        return Evidence(acted, obs, detail)

    def clear(self, ctx: FaultContext) -> None:
        """Lift the limit (the mechanism's restore: pids moved back, cgroup removed). Idempotent.

        Raises:
            FaultError: the limit could not be lifted, or the cgroup removed.
        """
        if self._mech is not None:
            try:
                self._mech.restore()
            except FaultError as exc:
                raise FaultError(exc.message, where=self.describe_target(ctx),
                                 hint=exc.hint or "run `specchaos cleanup`") from None

    @classmethod
    def recover(cls, entry: dict[str, Any]) -> None:
        """After a crash: the mechanism's recover (:func:`faults.mechanisms.recover`): the
        cgroup reverted from the ledger's facts, or found by its name ``specchaos-<fault id>``
        when the facts were never written; a container's limit lifted.

        Raises:
            RuntimeError: something could not be reverted.
        """
        if errors := mechanisms.recover("memory", entry):
            raise RuntimeError("; ".join(errors))


__all__ = ["MemoryLimit", "MemoryLimitParams", "machine_bytes"]

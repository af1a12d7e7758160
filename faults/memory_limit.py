"""Fault family ``memory-limit``: a cgroup memory limit on a server's process tree
(:mod:`faults.cgroup`; v1 ``memory.limit_in_bytes``, v2 ``memory.max``).

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
import mmap
import time
import uuid
from typing import Any, ClassVar, Literal

import psutil
from docker import errors as docker_errors
from pydantic import Field, field_validator, model_validator

from faults import cgroup, container_ops
from faults.base import Evidence, Fault, FaultContext, FaultParams
from faults.engine_metrics import TOKENS_METRIC, read_metrics
from faults.targets import server_of
from harness.clock import now
from harness.errors import FaultError
from harness.stack.capabilities import Containerised, ProcessRoles, Supervised
from harness.stack.procs import Recorded, same_process

log = logging.getLogger(__name__)

GIB = 1 << 30
#: Seconds the evidence watches the limited tree.
EVIDENCE_WINDOW_S = 3.0
#: v1 and v2 file names: (limit, usage, peak, lift value).
FILES = {1: ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.max_usage_in_bytes", "-1"),
         2: ("memory.max", "memory.current", "memory.peak", "max")}


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


def _tree_rss(targets: list[Recorded]) -> int:
    total = 0
    for pid, ct, cmd in targets:
        try:
            if same_process(pid, ct, cmd):
                total += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            continue
    return total


def _events(text: str | None) -> dict[str, int]:
    out = {}
    for line in (text or "").splitlines():
        k, _, v = line.partition(" ")
        if v.strip().isdigit():
            out[k] = int(v)
    return out


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
        self._cg: cgroup.TreeCgroup | None = None
        self._targets: list[Recorded] = []
        self._oom_before = 0
        self._container: Any = None   # mechanism container: the limited container

    def required(self) -> tuple[str, ...]:
        """Process ids; ``mechanism: container`` needs a container."""
        return ("containers",) if self.params.mechanism == "container" else type(self).needs

    def excluded(self) -> dict[str, str]:
        """Single ``roles`` never on a container (see :class:`MemoryLimitParams`)."""
        if self.params.roles:
            return {"containers": "a memory limit on single roles needs a cgroup of the harness's own, which would "
                                  "move the container's processes out of Docker's cgroups: limit the whole container "
                                  "(no roles)"}
        return {}

    def _mechanism(self, srv: Any, target: str) -> str:
        """The mechanism for server ``srv`` (``auto`` resolved).

        Raises:
            FaultError: ``cgroup``, or ``roles``, on a server in a container.
        """
        p = self.params
        if not isinstance(srv, Containerised):
            return "cgroup" if p.mechanism == "auto" else p.mechanism
        if p.roles:
            raise FaultError(self.excluded()["containers"], where=target)
        return "container"   # cgroup too: a container's cgroup is Docker's, set through the engine

    def _inject_container(self, srv: Any, target: str) -> dict[str, Any]:
        p = self.params
        c = container_ops.container_of(srv, p.server, target)
        used = container_ops.memory_usage(c)["usage_bytes"] or 0
        if p.limit_bytes is not None:
            limit = int(p.limit_bytes)
        elif p.limit_gib is not None:
            limit = int(p.limit_gib * GIB)
        else:
            limit = int((p.usage_factor or 0) * used)
        limit = max(mmap.PAGESIZE, limit)
        self.facts = {"mechanism": "container", "limit_bytes": limit, "read_back": None, "container_usage_bytes": used,
                      "tree_rss_bytes": None, "pids": [], "create_times": [],
                      "incarnation": int(getattr(srv, "incarnation", 0)), "limited_at": None, "cgroup": None,
                      **container_ops.identity(c)}
        container_ops.limit_memory(c, limit)
        self._container = c
        self.facts["read_back"] = {"memory_bytes": container_ops.host_config(c).get("Memory")}
        self.facts["limited_at"] = now()
        log.info("limited %s (container %s) to %d bytes (%.3f GiB; using %.3f GiB)", target, c.name, limit,
                 limit / GIB, used / GIB)
        return dict(self.facts)

    def _container_evidence(self, srv: Any, target: str, timeout_s: float) -> Evidence:
        """``mechanism: container``: the limit read back from the engine (``HostConfig.Memory``)
        and the container's memory use within it (the engine's stats); tokens on
        ``/metrics`` across the window; after an OOM kill, the supervisor's restart."""
        f, c = self.facts or {}, self._container
        window = max(0.5, min(EVIDENCE_WINDOW_S, timeout_s / 2))
        start = time.monotonic()
        before = read_metrics(srv.base_url)
        time.sleep(window)
        after = read_metrics(srv.base_url)
        mem = container_ops.memory_usage(c)
        back = container_ops.host_config(c).get("Memory")
        obs: dict[str, Any] = {
            "mechanism": "container", "container": f.get("container_name"), "limit_bytes": f["limit_bytes"],
            "limit_read_back": back, "usage_bytes": mem["usage_bytes"], "peak_bytes": mem["max_usage_bytes"],
            "stats_limit_bytes": mem["limit_bytes"], "tokens_metric": TOKENS_METRIC,
            "tokens_before": before and before[TOKENS_METRIC], "tokens_after": after and after[TOKENS_METRIC],
            "still_generating": None, "restart_ready_after_s": None, "window_s": round(time.monotonic() - start, 3),
            "measured_by": f"the engine's HostConfig.Memory and memory stats of {f.get('container_name')}; "
                           f"{TOKENS_METRIC} on /metrics"}
        if obs["tokens_before"] is not None and obs["tokens_after"] is not None:
            obs["still_generating"] = obs["tokens_after"] > obs["tokens_before"]
        restarted = int(getattr(srv, "incarnation", 0)) != f["incarnation"]
        if restarted and isinstance(srv, Supervised):   # OOM-killed: the supervisor's new container
            ready = srv.wait_for_incarnation(f["incarnation"] + 1, max(0.0, timeout_s - (time.monotonic() - start)))
            if ready is not None:
                obs["restart_ready_after_s"] = round(ready - f["limited_at"], 3)
            return Evidence(True, obs, f"{target}: container {obs['container']} limited to {f['limit_bytes']} bytes "
                                       f"exited (OOM) and the server restarted"
                                       + (f" {obs['restart_ready_after_s']:.1f} s after the limit"
                                          if obs["restart_ready_after_s"] is not None else ""))
        head = f"{target}: container {obs['container']} limit {f['limit_bytes'] / (1 << 20):.1f} MiB"
        if back != f["limit_bytes"]:
            return Evidence(False, obs, f"{target}: the engine reports a memory limit of {back}, not {f['limit_bytes']}")
        if not obs["usage_bytes"]:
            return Evidence(False, obs, f"{head} read back, but the engine reports no memory use of it")
        if obs["usage_bytes"] > f["limit_bytes"]:
            return Evidence(False, obs, f"{head} read back, yet it uses {obs['usage_bytes']} bytes")
        gen = ("; still generating" if obs["still_generating"] else
               "; no token produced in the window" if obs["still_generating"] is False else "")
        return Evidence(True, obs, f"{head} read back; usage {obs['usage_bytes']} bytes within it{gen}")

    def describe_target(self, ctx: FaultContext) -> str:
        """``"<server>/<roles joined by +>"`` or ``"<server>/tree"``."""
        return f"{self.params.server}/{'+'.join(self.params.roles) if self.params.roles else 'tree'}"

    def check_host(self) -> None:
        """A writable memory cgroup (there is no fallback), unless ``mechanism: container``.

        Raises:
            FaultError: ``"cgroup <path> not writable (...)"`` (no ``where``: the whole fault).
        """
        if self.params.mechanism != "container":
            cgroup.check_writable("memory")

    def _oom_kills(self, version: int) -> int:
        assert self._cg is not None
        name = "memory.oom_control" if version == 1 else "memory.events"
        return _events(self._cg.read([name])[name]).get("oom_kill", 0)

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        """Create the cgroup, move the tree in, set the limit, read it back.

        Returns:
            ``{"limit_bytes": int (asked), "read_back": {file: value}, "tree_rss_bytes": int,
            "pids", "create_times", "incarnation", "limited_at": epoch s, "cgroup": cgroup facts}``.

        Raises:
            FaultError: unknown server, server down, cgroup not writable, the kernel refused
                the limit.
        """
        p = self.params
        target = self.describe_target(ctx)
        srv = server_of(ctx, p.server, target)
        if self._mechanism(srv, target) == "container":
            return self._inject_container(srv, target)
        incarnation, recorded = cgroup.record_tree(srv, p.server, p.roles, target)
        rss = _tree_rss(recorded)
        if p.limit_bytes is not None:
            limit = int(p.limit_bytes)
        elif p.limit_gib is not None:
            limit = int(p.limit_gib * GIB)
        else:
            limit = int((p.usage_factor or 0) * rss)
        limit = max(mmap.PAGESIZE, limit)
        self._cg = cgroup.TreeCgroup("memory", self.fault_id or f"{self.kind}-{uuid.uuid4().hex[:8]}")
        limit_file, _, _, lift = FILES[self._cg.h.version]
        self._cg.lift = {limit_file: lift}
        self.facts = {"limit_bytes": limit, "read_back": None, "tree_rss_bytes": rss,
                      "pids": [r[0] for r in recorded], "create_times": [r[1] for r in recorded],
                      "incarnation": incarnation, "limited_at": None, "cgroup": None}
        self._cg.create()
        self.facts["read_back"] = self._cg.write({limit_file: str(limit)})
        moved = self._cg.move_in(recorded)
        self.facts["cgroup"] = self._cg.facts()
        if not moved:
            raise FaultError(f"every process of {target} went away before it could be limited", where=target,
                             hint="the server may be restarting; inject once it is ready")
        self._targets = [r for r in recorded if r[0] in moved]
        self._oom_before = self._oom_kills(self._cg.h.version)
        self.facts["limited_at"] = now()
        log.info("limited %s to %d bytes (%.3f GiB; tree RSS %.3f GiB) in %s", target, limit, limit / GIB,
                 rss / GIB, self._cg.path)
        return dict(self.facts)

    def evidence(self, ctx: FaultContext, timeout_s: float) -> Evidence:
        """Watch the limited tree for :data:`EVIDENCE_WINDOW_S` s (see module doc).

        Observations: ``limit_bytes`` (asked), ``limit_read_back``, ``usage_bytes``,
        ``peak_bytes``, ``failcnt`` (v1; None in v2), ``oom_kills`` (in the window and
        before it, since injection), ``tree_rss_bytes`` (now), ``pids_in_cgroup``,
        ``missing_pids``, ``killed_pids`` (targeted and gone), ``tokens_before``,
        ``tokens_after`` and ``still_generating`` (the counter grew across the window),
        ``api_alive``, ``restart_ready_after_s`` (after an OOM kill that took the API process
        down: the supervisor's restart, from the injection), ``window_s``.

        Raises:
            FaultError: called before :meth:`inject`.
        """
        if self.facts is not None and self._container is not None:
            return self._container_evidence(server_of(ctx, self.params.server, self.describe_target(ctx)),
                                            self.describe_target(ctx), timeout_s)
        if self.facts is None or self._cg is None:
            raise FaultError("memory-limit evidence asked before injection", where=self.describe_target(ctx))
        p, f, cg = self.params, self.facts, self._cg
        target = self.describe_target(ctx)
        limit_file, usage_file, peak_file, _ = FILES[cg.h.version]
        srv = server_of(ctx, p.server, target)
        window = max(0.5, min(EVIDENCE_WINDOW_S, timeout_s / 2))
        start = time.monotonic()
        before = read_metrics(srv.base_url)
        time.sleep(window)
        after = read_metrics(srv.base_url)
        vals = cg.read([limit_file, usage_file, peak_file, "memory.failcnt"])
        inside = set(cg.procs())
        oom = self._oom_kills(cg.h.version)
        alive = [(pid, ct, cmd) for pid, ct, cmd in self._targets if same_process(pid, ct, cmd)]

        def num(v: str | None) -> int | None:
            return int(v) if v is not None and v.lstrip("-").isdigit() else None

        expected = f["limit_bytes"] // mmap.PAGESIZE * mmap.PAGESIZE
        obs: dict[str, Any] = {
            "limit_bytes": f["limit_bytes"], "limit_read_back": num(vals[limit_file]),
            "usage_bytes": num(vals[usage_file]), "peak_bytes": num(vals[peak_file]),
            "failcnt": num(vals["memory.failcnt"]), "oom_kills": oom - self._oom_before,
            "tree_rss_bytes": _tree_rss(alive), "pids_in_cgroup": sorted(inside),
            "missing_pids": [pid for pid, _, _ in alive if pid not in inside],
            "killed_pids": [pid for pid, ct, cmd in self._targets if not same_process(pid, ct, cmd)],
            "tokens_metric": TOKENS_METRIC, "tokens_before": before and before[TOKENS_METRIC],
            "tokens_after": after and after[TOKENS_METRIC], "still_generating": None,
            "api_alive": None, "restart_ready_after_s": None, "window_s": round(time.monotonic() - start, 3),
            "measured_by": f"{cg.path}: {limit_file}, {usage_file}, {peak_file}, failcnt, OOM kills; "
                           f"{TOKENS_METRIC} on /metrics",
        }
        if obs["tokens_before"] is not None and obs["tokens_after"] is not None:
            obs["still_generating"] = obs["tokens_after"] > obs["tokens_before"]
        api = srv.api_process() if isinstance(srv, ProcessRoles) else None
        api_pids = set(f["pids"])
        obs["api_alive"] = api is not None and api.pid in api_pids and int(getattr(srv, "incarnation", 0)) == \
            f["incarnation"]
        if obs["oom_kills"] > 0 and not obs["api_alive"] and isinstance(srv, Supervised):
            left = max(0.0, timeout_s - (time.monotonic() - start))
            ready = srv.wait_for_incarnation(f["incarnation"] + 1, left)
            if ready is not None:
                obs["restart_ready_after_s"] = round(ready - f["limited_at"], 3)
        limit_ok = obs["limit_read_back"] == expected
        charged = (obs["usage_bytes"] or 0) > 0 or (obs["peak_bytes"] or 0) > 0 or obs["oom_kills"] > 0
        gib = f"{f['limit_bytes'] / (1 << 20):.1f} MiB"
        server_did = (f"; {obs['oom_kills']} OOM kill(s)" if obs["oom_kills"] else "") + (
            f", server restarted {obs['restart_ready_after_s']:.1f} s after the limit"
            if obs["restart_ready_after_s"] is not None else "") + (
            "; still generating" if obs["still_generating"] else
            "; no token produced in the window" if obs["still_generating"] is False else "")
        if not limit_ok:
            return Evidence(False, obs, f"{target}: limit read back {obs['limit_read_back']}, written {expected}")
        if obs["missing_pids"]:
            return Evidence(False, obs, f"{target}: pids {obs['missing_pids']} are not in {cg.path}")
        if not charged:
            return Evidence(False, obs, f"{target}: limit {gib} in place, but the kernel accounted no memory of the "
                                        f"tree to it in {obs['window_s']:.1f} s (idle?)")
        if (obs["peak_bytes"] or 0) > expected:
            return Evidence(False, obs, f"{target}: peak {obs['peak_bytes']} bytes above the limit {expected}")
        return Evidence(True, obs, f"{target}: limit {gib} read back; usage {obs['usage_bytes']} bytes, peak "
                                   f"{obs['peak_bytes']}, failcnt {obs['failcnt']}{server_did}")

    def clear(self, ctx: FaultContext) -> None:
        """Lift the limit, move the pids back, remove the cgroup. Idempotent.

        Raises:
            FaultError: the cgroup could not be removed.
        """
        if self._container is not None:
            container_ops.lift_memory(self._container)
            back = container_ops.host_config(self._container).get("Memory")
            if back not in (None, 0, container_ops.MEMORY_LIFTED_BYTES):
                raise FaultError(f"container {self._container.name} still limited to {back} bytes",
                                 where=self.describe_target(ctx), hint="run `specchaos cleanup`")
            log.info("unlimited %s (container %s)", self.describe_target(ctx), self._container.name)
            self._container = None
            return
        if self._cg is None:
            return
        res = self._cg.revert()
        log.info("unlimited %s: moved back %s, removed %s", self.describe_target(ctx),
                 res["moved_back"] + res["to_parent"], res["path"])
        self._cg = None

    @classmethod
    def recover(cls, entry: dict[str, Any]) -> None:
        """After a crash: revert the cgroup from the ledger's facts, or find it by its
        name ``specchaos-<fault id>`` when the facts were never written.

        Raises:
            RuntimeError: a cgroup could not be removed.
        """
        facts = entry.get("facts") or {}
        if facts.get("mechanism") == "container":
            try:
                container_ops.lift_memory(container_ops.client_for(facts).containers.get(facts["container"]))
            except docker_errors.NotFound:
                pass   # removed meanwhile: no limit is left
            except FaultError as exc:
                raise RuntimeError(exc.one_line()) from None
            return
        if facts.get("cgroup"):
            found = [facts["cgroup"]]
        else:
            found = []
            for pth in cgroup.find_cgroups(str(entry.get("fault_id")), "memory"):
                lift = FILES[1][0] if (pth / FILES[1][0]).exists() else FILES[2][0]
                found.append({"path": str(pth), "parent": str(pth.parent),
                              "lift": {lift: FILES[1][3] if lift == FILES[1][0] else FILES[2][3]}})
        errors = []
        for cg_facts in found:
            try:
                cgroup.revert(cg_facts)
            except FaultError as exc:
                errors.append(exc.one_line())
        if errors:
            raise RuntimeError("; ".join(errors))


__all__ = ["MemoryLimit", "MemoryLimitParams", "machine_bytes"]

"""``memory-limit`` by a cgroup of the harness's own (:mod:`faults.cgroup`); evidence and
revert as :mod:`faults.memory_limit` describes."""

from __future__ import annotations

import logging
import mmap
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import psutil

from faults import cgroup
from faults.mechanisms.base import Mechanism, Target, generating, gone
from faults.targets import record_tree
from harness.errors import FaultError
from harness.stack.capabilities import ProcessRoles, provides
from harness.stack.procs import Recorded, same_process

log = logging.getLogger(__name__)

#: v1 and v2 file names: (limit, usage, peak, lift value).
FILES = {1: ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.max_usage_in_bytes", "-1"),
         2: ("memory.max", "memory.current", "memory.peak", "max")}
#: Why a per-role cgroup is refused on a server in a container.
IN_CONTAINER = ("a memory limit on single roles needs a cgroup of the harness's own, which would move the "
                "container's processes out of Docker's cgroups: limit the whole container (no roles)")


def tree_rss(targets: list[Recorded]) -> int:
    """Resident bytes of the recorded processes that still are themselves (psutil)."""
    total = 0
    for pid, ct, cmd in targets:
        try:
            if same_process(pid, ct, cmd):
                total += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            continue
    return total


def _num(v: str | None) -> int | None:
    return int(v) if v is not None and v.lstrip("-").isdigit() else None


class CgroupMemory(Mechanism):
    """A memory limit on a cgroup of the harness's own."""

    name: ClassVar[str] = "cgroup"
    action: ClassVar[str] = "memory"
    answers: ClassVar[tuple[str, ...]] = ("cgroup", "auto")
    needs: ClassVar[tuple[str, ...]] = ("processes",)

    def __init__(self, t: Target):
        super().__init__(t)
        self.cg: cgroup.TreeCgroup | None = None
        self.facts: dict[str, Any] = {}
        self._oom_before = 0

    @classmethod
    def unfit(cls, t: Target) -> FaultError | None:
        return FaultError(IN_CONTAINER, where=t.where) if provides(t.srv, "containers") else None

    @classmethod
    def check_host(cls) -> None:
        cgroup.check_writable("memory")

    def _oom_kills(self) -> int:
        assert self.cg is not None
        name = "memory.oom_control" if self.cg.h.version == 1 else "memory.events"
        return cgroup.counters(self.cg.read([name])[name]).get("oom_kill", 0)

    def apply(self, size: Callable[[int], int]) -> dict[str, Any]:
        t = self.t
        incarnation, recorded = record_tree(t.srv, t.server, t.roles, t.where)
        rss = tree_rss(recorded)
        limit = max(mmap.PAGESIZE, size(rss))
        self.cg = cgroup.TreeCgroup("memory", t.fault_id)
        limit_file, _, _, lift = FILES[self.cg.h.version]
        self.cg.lift = {limit_file: lift}
        self.facts = {"mechanism": self.name, "limit_bytes": limit, "read_back": None, "tree_rss_bytes": rss,
                      "pids": [r[0] for r in recorded], "create_times": [r[1] for r in recorded],
                      "incarnation": incarnation, "limited_at": None, "cgroup": None}
        self.cg.create()
        self.facts["read_back"] = self.cg.write({limit_file: str(limit)})
        moved = self.cg.move_in(recorded)
        self.facts["cgroup"] = self.cg.facts()
        if not moved:
            raise gone(t.where, "limited")
        self.targets = [r for r in recorded if r[0] in moved]
        self._oom_before = self._oom_kills()
        log.info("limited %s to %d bytes (tree RSS %d) in %s", t.where, limit, rss, self.cg.path)
        return dict(self.facts)

    def observe(self, obs: dict[str, Any], restart: Callable[[], None]) -> tuple[bool, str]:
        cg, f, where, srv = self.cg, self.facts, self.t.where, self.t.srv
        assert cg is not None
        limit_file, usage_file, peak_file, _ = FILES[cg.h.version]
        vals = cg.read([limit_file, usage_file, peak_file, "memory.failcnt"])
        inside = set(cg.procs())
        alive = [(pid, ct, cmd) for pid, ct, cmd in self.targets if same_process(pid, ct, cmd)]
        expected = f["limit_bytes"] // mmap.PAGESIZE * mmap.PAGESIZE
        obs.update({
            "limit_read_back": _num(vals[limit_file]), "usage_bytes": _num(vals[usage_file]),
            "peak_bytes": _num(vals[peak_file]), "failcnt": _num(vals["memory.failcnt"]),
            "oom_kills": self._oom_kills() - self._oom_before, "tree_rss_bytes": tree_rss(alive),
            "pids_in_cgroup": sorted(inside), "missing_pids": [pid for pid, _, _ in alive if pid not in inside],
            "killed_pids": [pid for pid, ct, cmd in self.targets if not same_process(pid, ct, cmd)], "api_alive": None,
            "measured_by": f"{cg.path}: {limit_file}, {usage_file}, {peak_file}, failcnt, OOM kills; "})
        api = srv.api_process() if isinstance(srv, ProcessRoles) else None
        obs["api_alive"] = api is not None and api.pid in set(f["pids"]) and \
            int(getattr(srv, "incarnation", 0)) == f["incarnation"]
        if obs["oom_kills"] > 0 and not obs["api_alive"]:
            restart()
        charged = (obs["usage_bytes"] or 0) > 0 or (obs["peak_bytes"] or 0) > 0 or obs["oom_kills"] > 0
        server_did = (f"; {obs['oom_kills']} OOM kill(s)" if obs["oom_kills"] else "") + (
            f", server restarted {obs['restart_ready_after_s']:.1f} s after the limit"
            if obs["restart_ready_after_s"] is not None else "")
        if obs["limit_read_back"] != expected:
            return False, f"{where}: limit read back {obs['limit_read_back']}, written {expected}"
        if obs["missing_pids"]:
            return False, f"{where}: pids {obs['missing_pids']} are not in {cg.path}"
        if not charged:
            return False, (f"{where}: limit {f['limit_bytes'] / (1 << 20):.1f} MiB in place, but the kernel accounted "
                           f"no memory of the tree to it in {obs['window_s']:.1f} s (idle?)")
        if (obs["peak_bytes"] or 0) > expected:
            return False, f"{where}: peak {obs['peak_bytes']} bytes above the limit {expected}"
        return True, (f"{where}: limit {f['limit_bytes'] / (1 << 20):.1f} MiB read back; usage {obs['usage_bytes']} "
                      f"bytes, peak {obs['peak_bytes']}, failcnt {obs['failcnt']}{server_did}{generating(obs)}")

    def restore(self) -> None:
        if self.cg is not None:
            res = self.cg.revert()
            log.info("unlimited %s: moved back %s, removed %s", self.t.where, res["moved_back"] + res["to_parent"],
                     res["path"])
            self.cg = None

    @classmethod
    def recover(cls, facts: dict[str, Any], fault_id: str) -> None:
        """Revert the cgroup of the facts, or every one named ``specchaos-<fault id>``."""
        cgroup.recover(facts.get("cgroup"), fault_id, "memory", _lift_for)


def _lift_for(path: Path) -> dict[str, str]:
    """The value that lifts a limit on a cgroup found by name (no facts)."""
    v = 1 if (path / FILES[1][0]).exists() else 2
    return {FILES[v][0]: FILES[v][3]}

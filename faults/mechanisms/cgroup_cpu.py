"""``cpu-throttle`` by a CFS quota on a cgroup of the harness's own (:mod:`faults.cgroup`);
evidence and revert as :mod:`faults.cpu_throttle` describes."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, ClassVar

from faults import cgroup
from faults.mechanisms.base import Mechanism, Target, cpu_seconds, gone
from harness.errors import FaultError
from harness.stack.capabilities import provides
from harness.stack.procs import same_process

log = logging.getLogger(__name__)

#: Why a per-role cgroup is refused on a server in a container.
IN_CONTAINER = ("mechanism cgroup for single roles would move the container's processes out of Docker's cgroups: "
                "limit the whole container (no roles), or use mechanism duty_cycle")


def quota(version: int, cpu_fraction: float, period_s: float) -> tuple[dict[str, str], dict[str, str]]:
    """(files to write, files that lift the limit) for cgroup ``version``."""
    period_us = int(round(period_s * 1e6))
    quota_us = max(1000, int(round(cpu_fraction * period_us)))
    if version == 1:
        return ({"cpu.cfs_period_us": str(period_us), "cpu.cfs_quota_us": str(quota_us)}, {"cpu.cfs_quota_us": "-1"})
    return {"cpu.max": f"{quota_us} {period_us}"}, {"cpu.max": f"max {period_us}"}


class CgroupCpu(Mechanism):
    """A CFS quota on a cgroup of the harness's own."""

    name: ClassVar[str] = "cgroup"
    action: ClassVar[str] = "cpu"
    answers: ClassVar[tuple[str, ...]] = ("cgroup", "auto")
    needs: ClassVar[tuple[str, ...]] = ("processes",)

    def __init__(self, t: Target):
        super().__init__(t)
        self.cg: cgroup.TreeCgroup | None = None
        self.values: dict[str, str] = {}
        self.measured_by = "psutil CPU times of the tree over the window; the cgroup's cpu.stat; "

    @classmethod
    def unfit(cls, t: Target) -> FaultError | None:
        if provides(t.srv, "containers"):
            return FaultError(IN_CONTAINER, where=t.where)
        try:
            cgroup.check_writable("cpu")
        except FaultError as exc:
            return exc
        return None

    @classmethod
    def check_host(cls) -> None:
        cgroup.check_writable("cpu")

    def apply(self, cpu_fraction: float, period_s: float) -> dict[str, Any]:
        t = self.t
        self.cg = cgroup.TreeCgroup("cpu", t.fault_id)
        self.values, self.cg.lift = quota(self.cg.h.version, cpu_fraction, period_s)
        self.cg.create()
        facts: dict[str, Any] = {"read_back": self.cg.write(self.values)}
        moved = self.cg.move_in(t.recorded)
        if not moved:
            raise gone(t.where, "throttled")
        self.targets = [r for r in t.recorded if r[0] in moved]
        return {**facts, "cgroup": self.cg.facts()}

    def observe(self, window_s: float, limit_cpus: float, obs: dict[str, Any]) -> tuple[bool, str]:
        cg, where = self.cg, self.t.where
        assert cg is not None
        s0 = cgroup.counters(cg.read(["cpu.stat"])["cpu.stat"])
        procs: list[tuple[int, float | None]] = [(pid, None) for pid in cg.procs()]
        c0, w0 = cpu_seconds(procs), time.monotonic()
        time.sleep(window_s)
        w1 = time.monotonic()
        c1 = cpu_seconds(procs)
        obs.update(window_s=round(w1 - w0, 3), cpu_seconds=round(c1 - c0, 4), cpu_used_cpus=round((c1 - c0) / (w1 - w0), 4))
        s1 = cgroup.counters(cg.read(["cpu.stat"])["cpu.stat"])
        back = obs["read_back"] = cg.read(list(self.values))
        values = self.values
        if cg.h.version == 1:
            q, per = back.get("cpu.cfs_quota_us"), back.get("cpu.cfs_period_us")
            ok_limit = q == values["cpu.cfs_quota_us"] and per == values["cpu.cfs_period_us"]
            if ok_limit:
                obs["quota_read_back_cpus"] = round(int(q or 0) / int(per or 1), 4)
            obs["throttled_s"] = round((s1.get("throttled_time", 0) - s0.get("throttled_time", 0)) / 1e9, 4)
        else:
            raw = back.get("cpu.max") or ""
            ok_limit = raw.split() == values["cpu.max"].split()
            if ok_limit:
                q, per = raw.split()
                obs["quota_read_back_cpus"] = round(int(q) / int(per), 4)
            obs["throttled_s"] = round((s1.get("throttled_usec", 0) - s0.get("throttled_usec", 0)) / 1e6, 4)
        obs["throttled_periods"] = s1.get("nr_throttled", 0) - s0.get("nr_throttled", 0)
        inside = set(cg.procs())
        obs["pids_in_cgroup"] = sorted(inside)
        obs["missing_pids"] = [pid for pid, ct, cmd in self.targets if pid not in inside and same_process(pid, ct, cmd)]
        head = f"{where}: quota read back {obs['quota_read_back_cpus']} CPU (asked {obs['cpu_fraction']:g})"
        if not ok_limit:
            return False, f"{where}: the quota read back {back} is not the one written {values}"
        if obs["missing_pids"]:
            return False, f"{head}, but pids {obs['missing_pids']} are not in {cg.path}"
        if obs["throttled_periods"] <= 0:
            return False, (f"{head}, but the kernel never throttled the tree in {obs['window_s']:.1f} s (it used "
                           f"{obs['cpu_used_cpus']:.3f} CPU: idle?)")
        if obs["cpu_used_cpus"] > limit_cpus:
            return False, f"{head}, yet the tree used {obs['cpu_used_cpus']:.3f} CPU"
        return True, (f"{head}; the tree used {obs['cpu_used_cpus']:.3f} CPU over {obs['window_s']:.1f} s, throttled "
                      f"in {obs['throttled_periods']} periods ({obs['throttled_s']:.2f} s)")

    def restore(self) -> None:
        if self.cg is not None:
            res = self.cg.revert()
            log.info("unthrottled %s: moved back %s, removed %s", self.t.where, res["moved_back"] + res["to_parent"],
                     res["path"])
            self.cg = None

    @classmethod
    def recover(cls, facts: dict[str, Any], fault_id: str) -> None:
        """Revert the cgroup of the facts, or every one named ``specchaos-<fault id>``."""
        cgroup.recover(facts.get("cgroup"), fault_id, "cpu", _lift_for)


def _lift_for(path: Path) -> dict[str, str]:
    """The values that lift a quota on a cgroup found by name (no facts)."""
    return {"cpu.cfs_quota_us": "-1"} if (path / "cpu.cfs_quota_us").exists() else {"cpu.max": "max"}

"""cpu-throttle through the real injector on plain process trees (a parent with busy
children, as a server's tree): the cgroup quota measured (CPU of the tree, the kernel's
throttling counters, the quota read back), the duty-cycle fallback (asked, and where the
cgroup is not writable), evidence that fails on an idle tree, clear and recover (from the
facts, and from the fault id alone), the GPU options refused here, bad arguments."""

from __future__ import annotations

import uuid

import psutil
import pytest
from pydantic import ValidationError

from faults import cgroup
from faults.cpu_throttle import CpuThrottle, CpuThrottleParams
from faults.ledger import Ledger
from faults.registry import make_fault
from harness import gpu
from harness.errors import FaultError
from harness.timeline import read_timeline

from .cgroups import BUSY, TREE, PlainServer, cpu_rates, cpu_rates_during, needs_cgroup, not_writable_root, python, specchaos_cgroups
from .cgroups import no_cgroup_left  # noqa: F401 - autouse fixture
from .conftest import ServersStack, wait_until

pytestmark = pytest.mark.timeout(90)


def tree(started, n: int = 2) -> PlainServer:
    p = started.popen(python(TREE.format(n=n)))
    proc = psutil.Process(p.pid)
    assert wait_until(lambda: len(proc.children()) == n, 10)
    for c in proc.children():
        started.seen[c.pid] = c.create_time()
    return PlainServer(proc)


def pids(server: PlainServer) -> list[int]:
    return [server.proc.pid] + [c.pid for c in server.proc.children()]


@needs_cgroup("cpu")
def test_quota_throttles_the_tree_and_clear_lifts_it(started, make_injector, tmp_path):
    srv = tree(started)
    h = cgroup.hierarchy("cpu")
    origins = {pid: cgroup.cgroup_of(pid, h) for pid in pids(srv)}
    inj = make_injector(ServersStack(spec=srv))
    handle = inj.inject("cpu-throttle", {"cpu_fraction": 0.2})
    f = handle.facts
    assert f["mechanism"] == "cgroup" and sorted(f["pids"]) == sorted(pids(srv))
    assert f["read_back"] == {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "20000"}
    path = cgroup.TreeCgroup("cpu", handle.fault_id).path
    assert f["cgroup"]["path"] == str(path) and path.name == f"specchaos-{handle.fault_id}"

    control = started.popen(python(BUSY))                     # unthrottled: a busy host slows it alike
    (free,), ev = cpu_rates_during([control.pid], lambda: inj.collect_evidence(handle, timeout_s=20))
    o = ev.observations
    assert ev.acted, ev.detail
    assert o["quota_read_back_cpus"] == 0.2 and sorted(o["pids_in_cgroup"]) == sorted(pids(srv))
    assert o["throttled_periods"] > 0   # the kernel's count (few, and little throttled time, on a saturated host)
    # two busy loops held to 0.2 CPU together (the quota caps them however idle the host), and
    # running: a share of what the control got in the same window, up to the quota
    assert o["cpu_used_cpus"] <= 0.24 and o["cpu_used_cpus"] > 0.3 * min(0.2, free), (o, free)
    assert o["tokens_per_s_during"] is None                   # no /metrics on a plain tree

    inj.clear(handle)
    assert not path.exists()
    assert {pid: cgroup.cgroup_of(pid, h) for pid in pids(srv)} == origins
    # unthrottled again: its two busy loops get more than one unthrottled control loop measured
    # in the same window (a busy host slows all three alike; held to 0.2 CPU they would not)
    *loops, free = cpu_rates([*pids(srv), control.pid], 2.0)
    assert sum(loops) > 1.2 * free, (loops, free, o["cpu_used_cpus"])   # same window only: the load varies
    inj.clear(handle)                                         # idempotent
    (entry,) = Ledger(tmp_path / "ledger.jsonl").entries()
    assert entry["state"] == "cleared" and entry["evidence"]["acted"]
    assert [e["event"] for e in read_timeline(tmp_path / "timeline.jsonl")] == [
        "fault_injected", "fault_evidence", "fault_cleared"]


@needs_cgroup("cpu")
def test_an_idle_tree_is_no_evidence(started, make_injector):
    """The known defect the evidence must catch: a quota that never bit."""
    p = started.popen(["sleep", "60"])
    srv = PlainServer(psutil.Process(p.pid))
    inj = make_injector(ServersStack(spec=srv))
    handle = inj.inject("cpu-throttle", {"cpu_fraction": 0.5})
    ev = inj.collect_evidence(handle, timeout_s=8)
    assert not ev.acted and "never throttled" in ev.detail and ev.observations["throttled_periods"] == 0
    inj.clear(handle)


def test_duty_cycle_stops_and_resumes_the_tree(started, make_injector):
    srv = tree(started, n=1)
    inj = make_injector(ServersStack(spec=srv))
    handle = inj.inject("cpu-throttle", {"cpu_fraction": 0.3, "mechanism": "duty_cycle", "period_s": 0.5})
    f = handle.facts
    assert f["mechanism"] == "duty_cycle" and f["cgroup"] is None
    assert [ff["role"] for ff in f["freezes"]] == ["api", "worker"]
    ev = inj.collect_evidence(handle, timeout_s=20)
    o = ev.observations
    assert ev.acted, ev.detail
    assert 0.5 < o["stopped_share"] < 0.9 and o["cpu_used_cpus"] < 0.6, o
    inj.clear(handle)
    procs = [srv.proc] + srv.proc.children()
    for _ in range(20):
        assert all(p.status() != psutil.STATUS_STOPPED for p in procs)


@needs_cgroup("cpu")
def test_auto_falls_back_to_the_duty_cycle_where_cgroups_are_not_writable(started, make_injector, tmp_path,
                                                                          monkeypatch):
    monkeypatch.setenv(cgroup.ROOT_ENV, str(not_writable_root(tmp_path, "cpu")))
    srv = tree(started, n=1)
    inj = make_injector(ServersStack(spec=srv))
    handle = inj.inject("cpu-throttle", {"cpu_fraction": 0.5})
    assert handle.facts["mechanism"] == "duty_cycle"
    assert "not writable (Operation not permitted)" in handle.facts["fallback_reason"]
    inj.clear(handle)
    fault = make_fault("cpu-throttle", {"mechanism": "cgroup"})
    with pytest.raises(FaultError) as ei:
        fault.check_host()
    assert ei.value.where == "mechanism" and "not writable" in ei.value.message
    make_fault("cpu-throttle", {}).check_host()          # auto: the fallback needs nothing


@needs_cgroup("cpu")
@pytest.mark.parametrize("facts", [True, False])
def test_recover_after_a_crash(started, make_injector, tmp_path, facts):
    """The harness "crashed" with the quota on: recover() from the ledger entry — with its
    facts, or with only the intent (crashed before the facts): found by the fault id."""
    srv = tree(started, n=1)
    h = cgroup.hierarchy("cpu")
    origins = {pid: cgroup.cgroup_of(pid, h) for pid in pids(srv)}
    inj = make_injector(ServersStack(spec=srv))
    handle = inj.inject("cpu-throttle", {"cpu_fraction": 0.1})
    (entry,) = Ledger(tmp_path / "ledger.jsonl").open_faults()
    if not facts:
        entry = {k: v for k, v in entry.items() if k != "facts"} | {"state": "intended"}
    CpuThrottle.recover(entry)
    assert not [d for d in specchaos_cgroups("cpu") if handle.fault_id in d.name]
    assert {pid: cgroup.cgroup_of(pid, h) for pid in pids(srv)} == origins
    CpuThrottle.recover(entry)                                 # idempotent
    inj.clear(handle)                                          # and the live clear is a no-op now


def test_gpu_limits_are_refused_without_a_gpu():
    if gpu.unavailable() is None:
        pytest.skip("this host has an NVIDIA GPU")
    for name, value in (("gpu_clocks_mhz", 900), ("power_limit_w", 200)):
        with pytest.raises(FaultError) as ei:
            make_fault("cpu-throttle", {name: value, "mechanism": "duty_cycle"}).check_host()
        assert ei.value.where == name and ei.value.message.startswith(gpu.NO_GPU)


@pytest.mark.parametrize("args, field", [
    ({"cpu_fraction": 0}, "cpu_fraction"), ({"cpu_fraction": 1.5}, "cpu_fraction"),
    ({"cpu_fraction": -0.2}, "cpu_fraction"), ({"period_s": 0}, "period_s"), ({"period_s": 2}, "period_s"),
    ({"roles": ["drafter"]}, "roles"), ({"roles": []}, "roles"), ({"mechanism": "magic"}, "mechanism"),
    ({"gpu_clocks_mhz": -1}, "gpu_clocks_mhz"), ({"power_limit_w": 0}, "power_limit_w"),
])
def test_bad_parameters_name_the_field(args, field):
    with pytest.raises(ValidationError) as ei:
        CpuThrottleParams(**args)
    assert ei.value.errors()[0]["loc"][0] == field


@pytest.mark.parametrize("args", [{"cpu_fraction": 1.0, "mechanism": "duty_cycle"},
                                  {"cpu_fraction": 0.1, "period_s": 0.1, "mechanism": "duty_cycle"}])
def test_duty_cycle_arguments_that_stop_nothing_or_slice_too_thin(args):
    with pytest.raises(ValidationError, match="stop nothing|lengthen period_s"):
        CpuThrottleParams(**args)


def test_ids_name_the_cgroup():
    assert cgroup.PREFIX == "specchaos-" and uuid.UUID(int=0)

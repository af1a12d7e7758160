"""memory-limit through the real injector on plain processes and on the fake vLLM under
the harness's supervisor: an allocator over the limit OOM-killed by the kernel (evidence: limit read back, failcnt, peak within the limit, the
OOM kill, the killed pid), a limit with headroom leaves it running, an idle process is no
evidence, sizes relative to usage, an OOM-killed server and its supervised restart recorded, clear
and recover, bad sizes."""

from __future__ import annotations

import subprocess

import psutil
import pytest
from pydantic import ValidationError

from faults import cgroup
from faults.ledger import Ledger
from faults.memory_limit import GIB, MemoryLimit, MemoryLimitParams, machine_bytes
from faults.registry import make_fault
from harness.errors import ExperimentError, FaultError
from harness.stack.config import RestartPolicy

from .cgroups import ALLOC, PlainServer, needs_cgroup, not_writable_root, python, specchaos_cgroups
from .cgroups import no_cgroup_left  # noqa: F401 - autouse fixture
from .conftest import ServersStack, wait_until
from .test_process_freeze import Stream

pytestmark = [pytest.mark.timeout(90), needs_cgroup("memory")]


def allocator(started, total_mib: int, step_mib: int = 16) -> PlainServer:
    p = subprocess.Popen(python(ALLOC.format(total=total_mib, step=step_mib)), stdout=subprocess.PIPE, text=True)
    started.popens.append(p)
    proc = psutil.Process(p.pid)
    started.seen[p.pid] = proc.create_time()
    assert wait_until(lambda: proc.cmdline()[:1] == [p.args[0]], 5)
    return PlainServer(proc)


def test_an_allocator_over_the_limit_is_oom_killed_and_clear_removes_the_cgroup(started, make_injector, tmp_path):
    srv = allocator(started, total_mib=1024)
    inj = make_injector(ServersStack(spec=srv))
    handle = inj.inject("memory-limit", {"limit_bytes": 64 << 20})
    assert handle.facts["read_back"] == {"memory.limit_in_bytes": str(64 << 20)}
    ev = inj.collect_evidence(handle, timeout_s=10)
    o = ev.observations
    assert ev.acted, ev.detail
    assert o["limit_read_back"] == 64 << 20 and o["oom_kills"] == 1 and o["killed_pids"] == [srv.proc.pid]
    assert o["failcnt"] > 0 and 0 < o["peak_bytes"] <= 64 << 20
    assert "1 OOM kill(s)" in ev.detail
    inj.clear(handle)
    assert not cgroup.TreeCgroup("memory", handle.fault_id).path.exists()
    assert Ledger(tmp_path / "ledger.jsonl").open_faults() == []


def test_a_limit_with_headroom_leaves_the_allocator_running(started, make_injector):
    srv = allocator(started, total_mib=96)
    h = cgroup.hierarchy("memory")
    origin = cgroup.cgroup_of(srv.proc.pid, h)
    inj = make_injector(ServersStack(spec=srv))
    handle = inj.inject("memory-limit", {"limit_gib": 0.5})
    ev = inj.collect_evidence(handle, timeout_s=10)
    o = ev.observations
    assert ev.acted, ev.detail
    assert o["oom_kills"] == 0 and o["killed_pids"] == [] and o["failcnt"] == 0
    assert 64 << 20 < o["peak_bytes"] <= GIB // 2          # the allocations after the move are accounted
    inj.clear(handle)
    assert srv.proc.is_running() and cgroup.cgroup_of(srv.proc.pid, h) == origin


def test_an_idle_process_is_no_evidence(started, make_injector):
    """The known defect the evidence must catch: a limit under which nothing was charged."""
    p = started.popen(["sleep", "60"])
    inj = make_injector(ServersStack(spec=PlainServer(psutil.Process(p.pid))))
    handle = inj.inject("memory-limit", {"limit_gib": 0.1})
    ev = inj.collect_evidence(handle, timeout_s=4)
    assert not ev.acted and "accounted no memory" in ev.detail
    inj.clear(handle)


def test_usage_factor_sizes_the_limit_from_the_trees_rss(started, make_injector):
    srv = allocator(started, total_mib=32)
    assert wait_until(lambda: srv.proc.memory_info().rss > 40 << 20, 10)
    inj = make_injector(ServersStack(spec=srv))
    handle = inj.inject("memory-limit", {"usage_factor": 2.0})
    f = handle.facts
    assert f["limit_bytes"] == int(2.0 * f["tree_rss_bytes"]) and f["tree_rss_bytes"] > 40 << 20
    inj.clear(handle)


@pytest.mark.parametrize("facts", [True, False])
def test_recover_after_a_crash(started, make_injector, tmp_path, facts):
    srv = allocator(started, total_mib=32)
    h = cgroup.hierarchy("memory")
    origin = cgroup.cgroup_of(srv.proc.pid, h)
    inj = make_injector(ServersStack(spec=srv))
    handle = inj.inject("memory-limit", {"limit_gib": 0.25})
    (entry,) = Ledger(tmp_path / "ledger.jsonl").open_faults()
    if not facts:
        entry = {k: v for k, v in entry.items() if k != "facts"} | {"state": "intended"}
    MemoryLimit.recover(entry)
    assert not [d for d in specchaos_cgroups("memory") if handle.fault_id in d.name]
    assert cgroup.cgroup_of(srv.proc.pid, h) == origin
    MemoryLimit.recover(entry)
    inj.clear(handle)


def test_not_writable_is_refused_at_check_host(tmp_path, monkeypatch):
    monkeypatch.setenv(cgroup.ROOT_ENV, str(not_writable_root(tmp_path, "memory")))
    with pytest.raises(FaultError, match="not writable"):
        make_fault("memory-limit", {"limit_gib": 1}).check_host()


@pytest.mark.parametrize("args, field, needle", [
    ({"limit_gib": 0}, "limit_gib", "greater than 0"),
    ({"limit_gib": -1}, "limit_gib", "greater than 0"),
    ({"limit_bytes": 0}, "limit_bytes", "greater than 0"),
    ({"usage_factor": -0.5}, "usage_factor", "greater than 0"),
    ({"limit_gib": 100000}, "limit_gib", "more than this machine's memory"),
    ({"limit_bytes": 1 << 62}, "limit_bytes", "more than this machine's memory"),
    ({"roles": ["drafter"], "limit_gib": 1}, "roles", ""),
])
def test_bad_sizes_name_the_field(args, field, needle):
    with pytest.raises(ValidationError) as ei:
        MemoryLimitParams(**args)
    err = ei.value.errors()[0]
    assert err["loc"][0] == field and needle in err["msg"]


@pytest.mark.parametrize("args", [{}, {"limit_gib": 1, "limit_bytes": 1 << 20}])
def test_exactly_one_size(args):
    with pytest.raises(ExperimentError, match="exactly one of limit_gib, limit_bytes, usage_factor"):
        make_fault("memory-limit", args)


def test_machine_bytes_is_the_machines():
    assert machine_bytes() == psutil.virtual_memory().total


def test_an_oom_killed_server_is_recorded_with_its_supervised_restart(fake_server, make_injector):
    """The fake vLLM under the harness's supervisor, streaming, its API process limited far
    below what serving charges: the kernel OOM-kills it, the evidence records the kill and
    the supervisor's restart (outside the cgroup), and clear leaves nothing."""
    spec = fake_server("spec", ["--step-delay-s", "0.005"],
                       restart=RestartPolicy(max_restarts=1, backoff_s=0.2, backoff_max_s=0.2))
    spec.start()
    spec.wait_ready(30)
    streams = [Stream(spec) for _ in range(3)]
    for s in streams:
        s.start()
    streams[0].wait_chunks(5)
    inj = make_injector(ServersStack(spec=spec))
    handle = inj.inject("memory-limit", {"roles": ["api"], "limit_bytes": 64 << 10})
    ev = inj.collect_evidence(handle, timeout_s=40)
    o = ev.observations
    inj.clear(handle)
    assert ev.acted, ev.detail
    assert o["oom_kills"] >= 1 and o["api_alive"] is False and o["restart_ready_after_s"] is not None, o
    assert spec.incarnation == 1 and "1 OOM kill(s), server restarted" in ev.detail
    assert not cgroup.TreeCgroup("memory", handle.fault_id).path.exists()


# ------------------------------------------------------------------ the real stack
@pytest.mark.stack
@pytest.mark.timeout(300)
def test_a_memory_limit_on_the_real_workers_tree_is_charged_and_lifted(real_stack, tmp_path):
    """memory-limit on the shared stack's speculative worker (the target, the draft and the
    KV cache live there) with headroom, 1.5 x its RSS, under streaming load: the limit read
    back, the worker inside the cgroup and charged there, no OOM kill, generation goes on;
    after the clear the worker is back in its cgroup and no cgroup is left (autouse
    ``no_cgroup_left``)."""
    from faults.inject import FaultInjector, InjectionContext
    from harness.timeline import Timeline
    from tests.experiment.test_thermal import Streams

    spec = real_stack.stack.servers["spec"]
    worker = spec.roles()["worker"][0]
    h = cgroup.hierarchy("memory")
    origin = cgroup.cgroup_of(worker.pid, h)
    inj = FaultInjector(InjectionContext(real_stack.stack, Timeline(tmp_path / "timeline.jsonl"),
                                         Ledger(tmp_path / "ledger.jsonl")))
    with Streams(spec.base_url, spec.model) as load:
        try:
            handle = inj.inject("memory-limit", {"server": "spec", "roles": ["worker"], "usage_factor": 1.5})
            ev = inj.collect_evidence(handle, timeout_s=30)
        finally:
            inj.clear_all()
    o = ev.observations
    print(f"\n[measure] memory-limit 1.5 x RSS on the real spec worker: {ev.detail}")
    assert ev.acted, ev.detail
    assert worker.pid in o["pids_in_cgroup"] and o["oom_kills"] == 0, o
    assert 0 < o["peak_bytes"] <= o["limit_read_back"], o
    assert o["still_generating"] is True, o
    assert not load.errors, load.errors[:3]
    assert cgroup.cgroup_of(worker.pid, h) == origin and spec.is_up()
    assert Ledger(tmp_path / "ledger.jsonl").open_faults() == []

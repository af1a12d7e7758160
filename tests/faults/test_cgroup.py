"""faults/cgroup.py on the host's real cgroups (v1 here, as root) with plain child
processes: limits written and read back, a busy loop really throttled (measured CPU),
an allocator really OOM-killed, revert from facts alone (pids back where they came from,
children forked inside moved out, the directory gone), pid-reuse safety, and the
"not writable" error."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from faults import cgroup
from faults.ledger import Ledger
from harness.errors import FaultError

from .cgroups import ALLOC, BUSY, TREE, cpu_rates, needs_cgroup, not_writable_root, python, specchaos_cgroups
from .cgroups import TEST_ID_PREFIX, no_cgroup_left  # noqa: F401 - autouse fixture
from .cgroups import writable as writable_cgroup
from .conftest import wait_until

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]


def fid() -> str:
    """A cgroup id of this test process (``no_cgroup_left`` counts ``test-<pid>-*`` as its own)."""
    return f"{TEST_ID_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"


def recorded(p: subprocess.Popen) -> tuple[int, float, list[str]]:
    proc = psutil.Process(p.pid)
    assert wait_until(lambda: proc.cmdline()[:1] == [p.args[0]], 5)
    return p.pid, proc.create_time(), proc.cmdline()


def test_hierarchies_are_detected():
    for controller in ("cpu", "memory"):
        h = cgroup.hierarchy(controller)
        assert h.version in (1, 2) and h.mount.is_dir()
        assert cgroup.cgroup_of("self", h).is_dir()
    with pytest.raises(FaultError, match="no cgroup hierarchy with the nosuch controller"):
        cgroup.hierarchy("nosuch")


@needs_cgroup("cpu")
def test_a_busy_loop_is_throttled_to_its_quota_and_revert_restores_it(started):
    p = started.popen(python(BUSY))
    control = started.popen(python(BUSY))                   # an unthrottled busy loop: a busy host slows both alike
    pid, ct, cmd = recorded(p)
    h = cgroup.hierarchy("cpu")
    origin = cgroup.cgroup_of(pid, h)
    time.sleep(0.5)                                         # past the interpreters' start
    cg = cgroup.TreeCgroup("cpu", fid(), lift={"cpu.cfs_quota_us": "-1"})
    cg.create()
    back = cg.write({"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "10000"})
    assert back == {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "10000"}
    assert cg.move_in([(pid, ct, cmd)]) == [pid]
    assert cg.procs() == [pid] and cgroup.cgroup_of(pid, h) == cg.path
    throttled, free = cpu_rates([pid, control.pid], 2.0)
    # the quota caps it at 0.1 CPU however idle the host (the kernel counts the throttling,
    # below); the control in the same window gets more, and the throttled loop still runs (a
    # share of what it may use: a busy host slows both alike)
    assert throttled < 0.13 and free > throttled, (free, throttled)
    assert throttled > 0.3 * min(0.1, free), (free, throttled)
    assert "nr_throttled 0" not in cg.read(["cpu.stat"])["cpu.stat"]
    facts = cg.facts()
    assert facts["moved"] == [{"pid": pid, "create_time": ct, "cmdline": cmd, "origin": str(origin)}]

    res = cgroup.revert(facts)                              # from the facts alone
    assert res["moved_back"] == [pid] and res["removed"] and res["lifted"] == {"cpu.cfs_quota_us": "-1"}
    assert not cg.path.exists() and cgroup.cgroup_of(pid, h) == origin
    # no longer held to 0.1 CPU: it gets what the unthrottled control gets in the same window
    after, free_control = cpu_rates([pid, control.pid], 2.0)
    assert after > 0.6 * free_control, (throttled, after, free_control)
    assert cgroup.revert(facts)["removed"]                  # idempotent


@needs_cgroup("memory")
def test_an_allocator_over_the_limit_is_oom_killed(started):
    p = subprocess.Popen(python(ALLOC.format(total=512, step=16)), stdout=subprocess.PIPE, text=True)
    started.popens.append(p)
    pid, ct, cmd = recorded(p)
    cg = cgroup.TreeCgroup("memory", fid(), lift={"memory.limit_in_bytes": "-1"})
    cg.create()
    assert cg.write({"memory.limit_in_bytes": str(64 << 20)}) == {"memory.limit_in_bytes": str(64 << 20)}
    assert cg.move_in([(pid, ct, cmd)]) == [pid]
    try:
        assert p.wait(20) == -9                             # SIGKILLed by the kernel's OOM killer
        steps = len(p.stdout.read().split())
        assert steps < 6, steps                             # 16 MiB steps: killed around 64 MiB
        vals = cg.read(["memory.failcnt", "memory.max_usage_in_bytes", "memory.oom_control"])
        assert int(vals["memory.failcnt"]) > 0
        assert 0 < int(vals["memory.max_usage_in_bytes"]) <= 64 << 20
        assert "oom_kill 1" in vals["memory.oom_control"]
    finally:
        res = cg.revert()
    assert res["removed"] and not cg.path.exists()


@needs_cgroup("cpu")
def test_children_forked_inside_are_moved_out_and_the_cgroup_removed(started):
    p = started.popen(python("import subprocess, sys, time\ntime.sleep(1.0)\n"
                             "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
                             "time.sleep(600)\n"))
    pid, ct, cmd = recorded(p)
    cg = cgroup.TreeCgroup("cpu", fid())
    cg.create()
    cg.move_in([(pid, ct, cmd)])
    parent = psutil.Process(pid)
    assert wait_until(lambda: len(parent.children()) == 1, 10)
    child = parent.children()[0].pid
    started.seen[child] = psutil.Process(child).create_time()
    assert sorted(cg.procs()) == sorted([pid, child])     # forked inside, not recorded
    res = cgroup.revert(cg.facts())
    assert res["moved_back"] == [pid] and res["to_parent"] == [child] and res["removed"]


@needs_cgroup("cpu")
def test_a_reused_pid_is_never_moved(started):
    p = started.popen(python(BUSY))
    pid, ct, cmd = recorded(p)
    h = cgroup.hierarchy("cpu")
    origin = cgroup.cgroup_of(pid, h)
    cg = cgroup.TreeCgroup("cpu", fid())
    cg.create()
    try:
        assert cg.move_in([(pid, ct - 50, cmd)]) == []      # another process, as far as the record knows
        assert cg.move_in([(pid, ct, ["not", "it"])]) == []
        assert cgroup.cgroup_of(pid, h) == origin and cg.facts()["moved"] == []
    finally:
        cg.revert()
    # facts naming a process that is not inside ours: revert leaves it where it is
    other = cgroup.TreeCgroup("cpu", fid())
    other.create()
    facts = other.facts() | {"moved": [{"pid": pid, "create_time": ct, "cmdline": cmd,
                                        "origin": str(other.path)}]}
    assert cgroup.revert(facts)["moved_back"] == []
    assert cgroup.cgroup_of(pid, h) == origin


@needs_cgroup("cpu")
def test_a_cgroup_left_without_facts_is_found_by_name_and_reverted(started):
    p = started.popen(python(TREE.format(n=1)))
    pid, ct, cmd = recorded(p)
    name = fid()
    cg = cgroup.TreeCgroup("cpu", name)
    cg.create()
    cg.write({"cpu.cfs_quota_us": "10000"})
    cg.move_in([(pid, ct, cmd)])
    (found,) = cgroup.find_cgroups(name, "cpu")
    assert found == cg.path
    res = cgroup.revert({"path": str(found), "parent": str(found.parent), "lift": {"cpu.cfs_quota_us": "-1"}})
    assert res["removed"] and pid in res["to_parent"]
    assert cgroup.find_cgroups(name, "cpu") == []
    assert not [d for d in specchaos_cgroups("cpu") if name in d.name]


def test_revert_refuses_a_cgroup_it_did_not_create(tmp_path):
    with pytest.raises(FaultError, match="not a cgroup specchaos created"):
        cgroup.revert({"path": str(tmp_path), "parent": str(tmp_path.parent)})


@needs_cgroup("cpu")
def test_not_writable_is_one_clear_error(tmp_path, monkeypatch):
    root = not_writable_root(tmp_path, "cpu")
    monkeypatch.setenv(cgroup.ROOT_ENV, str(root))
    with pytest.raises(FaultError) as ei:
        cgroup.check_writable("cpu")
    assert ei.value.message.startswith(f"cgroup {root / 'cpu'}") and "not writable (Operation not permitted)" in \
        ei.value.message


@needs_cgroup("cpu")
def test_check_writable_leaves_nothing_behind():
    parent = cgroup.check_writable("cpu")
    assert not [d for d in parent.iterdir() if d.name.startswith(f"{cgroup.PREFIX}probe-")]
    time.sleep(0)


# ------------------------------------------------------------------ SIGKILL of the harness, then cleanup

@pytest.mark.parametrize("kind, params, controller, limit_file", [
    ("cpu-throttle", {"cpu_fraction": 0.2, "mechanism": "cgroup"}, "cpu", "cpu.cfs_quota_us"),
    ("memory-limit", {"limit_gib": 0.5}, "memory", "memory.limit_in_bytes"),
])
def test_sigkill_of_the_harness_then_cleanup_leaves_no_cgroup_and_no_limit(tmp_path, started, kind, params,
                                                                          controller, limit_file):
    """A harness (the real injector, a ledger and a run state file) SIGKILLed with the fault
    on; ``specchaos cleanup`` reverts it from the ledger: no specchaos-* cgroup left, every
    pid back in its original cgroup, whose limit is what it was."""
    if not writable_cgroup(controller):
        pytest.skip(f"needs a writable {controller} cgroup")
    p = started.popen(python(TREE.format(n=1)))
    root = psutil.Process(p.pid)
    assert wait_until(lambda: len(root.children()) == 1, 10)
    started.seen[root.children()[0].pid] = root.children()[0].create_time()
    tree = [p.pid, root.children()[0].pid]
    h = cgroup.hierarchy(controller)
    origins = {pid: cgroup.cgroup_of(pid, h) for pid in tree}
    limits_before = {str(o): (o / limit_file).read_text() for o in origins.values()}
    env = dict(os.environ, SPECCHAOS_STATE_DIR=str(tmp_path / "state"), PYTHONUNBUFFERED="1")
    out = tmp_path / "out"
    driver = subprocess.Popen([sys.executable, "-m", "tests.faults.cgroup_driver", str(out), str(p.pid), kind,
                               json.dumps(params)], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        line = driver.stdout.readline()
        assert line.startswith("injected "), line
        fault_id = line.split()[1]
        ours = cgroup.TreeCgroup(controller, fault_id).path
        assert all(cgroup.cgroup_of(pid, h) == ours for pid in tree)
        assert (ours / limit_file).read_text().strip() != "-1"
        driver.send_signal(signal.SIGKILL)
        driver.wait(10)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert ours.exists(), "the killed harness cannot have cleaned up"
    res = subprocess.run([sys.executable, "-m", "harness.cli", "cleanup"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "reverted 1 fault(s)" in res.stdout
    assert not ours.exists() and not [d for d in specchaos_cgroups(controller) if fault_id in d.name]
    assert {pid: cgroup.cgroup_of(pid, h) for pid in tree} == origins
    assert {str(o): (o / limit_file).read_text() for o in origins.values()} == limits_before
    assert Ledger(out / "ledger.jsonl").open_faults() == []
    assert not list((tmp_path / "state" / "runs").glob("*.json"))

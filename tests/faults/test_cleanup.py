"""``specchaos cleanup`` against real orphaned process trees (fake vLLM servers) and state files."""

import json
import os
from typing import Any, ClassVar

import psutil
import pytest
from typer.testing import CliRunner

from faults.base import Fault, FaultParams
from faults.cleanup import cleanup
from faults.ledger import Ledger
from faults.registry import REGISTRY
from harness.cli import app

from .conftest import alive, dead_owner

pytestmark = pytest.mark.timeout(90)


def write_state(state_dir, run_id, owner, processes, ledger=None):
    runs = state_dir / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    path = runs / f"{run_id}.json"
    path.write_text(json.dumps({
        "run_id": run_id, "owner_pid": owner[0], "owner_create_time": owner[1], "out_dir": str(state_dir),
        "ledger": str(ledger) if ledger else None,
        "processes": [{"pid": p, "create_time": ct, "role": "server"} for p, ct in processes],
    }))
    return path


def tree_of(fake):
    """(pid, create_time) of a fake vLLM's api, engine and worker."""
    tree = fake.tree()
    assert len(tree) == 3
    return [(p.pid, p.create_time()) for p in tree]


class Recorder(Fault):
    kind: ClassVar[str] = "test-recorder"
    Params: ClassVar[type[FaultParams]] = FaultParams
    RECOVERED: ClassVar[list[dict[str, Any]]] = []

    def describe_target(self, ctx):
        return "x"

    def inject(self, ctx):
        return {}

    def evidence(self, ctx, timeout_s):
        raise NotImplementedError

    def clear(self, ctx):
        pass

    @classmethod
    def recover(cls, entry):
        cls.RECOVERED.append(entry)


@pytest.mark.parametrize("owner_kind", ["exited", "pid-reused"])
def test_orphan_tree_of_a_dead_run_is_torn_down(started, fake_vllm, tmp_path, monkeypatch, owner_kind):
    monkeypatch.setitem(REGISTRY, Recorder.kind, Recorder)
    Recorder.RECOVERED.clear()
    # An orphaned tree whose processes do not die with their parent and ignore SIGTERM.
    tree = fake_vllm("--orphans", "--ignore-sigterm", "api,engine,worker")
    procs = tree_of(tree)
    assert len(procs) == 3
    # The run's ledger: one fault still injected, one already cleared.
    led = Ledger(tmp_path / "out" / "ledger.jsonl")
    open_id = led.intend("test-recorder", "x", {})
    led.injected(open_id, {"pids": [123]})
    done = led.intend("test-recorder", "x", {})
    led.cleared(done)
    if owner_kind == "exited":
        owner = dead_owner(started)
    else:  # a live pid that is not the owner any more
        owner = (os.getpid(), psutil.Process().create_time() - 1000)
    state = write_state(tmp_path, "dead1", owner, [procs[0]], ledger=led.path)

    r = cleanup(tmp_path, grace_s=0.5)

    assert r["runs"] == 1 and r["skipped_live_runs"] == [] and r["errors"] == []
    assert sorted(r["killed"]) == sorted(p for p, _ in procs)
    assert not any(alive(*p) for p in procs)
    assert r["faults_reverted"] == [open_id]
    assert [e["fault_id"] for e in Recorder.RECOVERED] == [open_id]
    assert Recorder.RECOVERED[0]["facts"] == {"pids": [123]}
    assert led.open_faults() == []
    assert not state.exists()
    assert cleanup(tmp_path)["runs"] == 0  # nothing left


def test_live_run_is_left_alone_unless_forced(fake_vllm, tmp_path):
    tree = fake_vllm()
    procs = tree_of(tree)
    me = psutil.Process()
    state = write_state(tmp_path, "live1", (me.pid, me.create_time()), [procs[0]])

    r = cleanup(tmp_path)
    whose = {"run_id": "live1", "owner_pid": me.pid, "owner_cwd": os.getcwd(), "out_dir": str(tmp_path)}
    assert r == {"runs": 0, "killed": [], "faults_reverted": [], "containers_removed": [], "skipped_live_runs": [whose],
                 "errors": []}
    assert all(alive(*p) for p in procs) and state.exists()
    # the command's line says whose run it left alone (the state file's owner_cwd when it has one)
    data = json.loads(state.read_text())
    state.write_text(json.dumps({**data, "owner_cwd": "/work/wt/other-checkout"}))
    res = CliRunner().invoke(app, ["cleanup", "--state-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    # (the CLI's own line; a log record another test's logging set-up lets through may come before it)
    assert " ".join(res.output.split()).endswith(f"cleanup: 0 crashed run(s) cleaned; killed 0 process(es); reverted 0 fault(s); "
                                  f"skipped live run(s): live1 (pid {me.pid} in /work/wt/other-checkout, output "
                                  f"{tmp_path}) (their owners still run; --force tears them down too)")

    r = cleanup(tmp_path, force=True, grace_s=2)
    assert r["runs"] == 1 and sorted(r["killed"]) == sorted(p for p, _ in procs)
    assert not any(alive(*p) for p in procs) and not state.exists()


def test_unregistered_and_reused_pids_are_never_touched(started, fake_vllm, tmp_path):
    bystander = started.popen(["sleep", "60"])  # never registered
    reused = fake_vllm()  # registered with another create_time: a reused pid (with children)
    reused_tree = tree_of(reused)
    rct = reused_tree[0][1]
    registered = started.popen(["sleep", "60"])
    gct = psutil.Process(registered.pid).create_time()
    state = write_state(tmp_path, "dead2", dead_owner(started),
                        [(reused.pid, rct - 5.0), (registered.pid, gct), (999_999_999, 1.0)])

    r = cleanup(tmp_path, grace_s=2)

    assert r["killed"] == [registered.pid] and r["errors"] == []
    assert registered.wait(5) is not None
    assert bystander.poll() is None and reused.popen.poll() is None
    assert all(alive(*p) for p in reused_tree)
    assert not state.exists()


def test_unknown_fault_kind_keeps_the_state_file(started, tmp_path):
    led = Ledger(tmp_path / "ledger.jsonl")
    fid = led.intend("from-the-future", "x", {})
    state = write_state(tmp_path, "dead3", dead_owner(started), [], ledger=led.path)
    r = cleanup(tmp_path)
    assert r["runs"] == 1 and r["faults_reverted"] == []
    assert "unknown kind 'from-the-future'" in r["errors"][0]
    assert state.exists() and [e["fault_id"] for e in led.open_faults()] == [fid]


def test_default_state_dir_and_unreadable_files(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAOS_STATE_DIR", str(tmp_path))
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "torn.json").write_text("{")
    r = cleanup()
    assert r["runs"] == 0 and "unreadable state file" in r["errors"][0]

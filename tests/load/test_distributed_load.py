"""Distributed load (``load.workers``): locust's own master/worker mode on loopback.

Against the fake vLLM (no vLLM needed): two workers' records merge without loss or double
counting (the merged count equals the completion requests the server received, the
complete ones equal its ``vllm:request_success_total``), user ids are unique across
workers, the request bound holds across workers, and no locust process is left after a
normal end, an exception, the harness's death (SIGKILL or SIGTERM) or ``specchaos cleanup``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from faults.cleanup import cleanup
from harness import state
from harness.experiment.config import LoadConfig
from harness.load.locust_process import LocustProcess, exit_reason
from harness.load.prompts import Prompt, save_prompt_set
from harness.load.records import read_records, worker_record_files, worker_records_path

from tests.fakes import run_fake

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [Prompt(i, ("short", "medium", "long")[i % 3], f"prompt number {i}", 4, 6) for i in range(5)]


@pytest.fixture(scope="module")
def server():
    with run_fake() as srv:
        yield srv


@pytest.fixture()
def run_dir(tmp_path):
    save_prompt_set(tmp_path / "prompts.json", PROMPTS)
    (tmp_path / "logs").mkdir()
    return tmp_path


def make(base_url: str, run_dir: Path, model: str = "fake", run_time_s: float = 60, **cfg) -> LocustProcess:
    cfg = LoadConfig(**{"users": 4, "workers": 2, "spawn_rate": 50, "request_timeout_s": 10, **cfg})
    return LocustProcess(base_url, prompts_path=run_dir / "prompts.json", records_path=run_dir / "records.jsonl",
                         model=model, cfg=cfg, run_time_s=run_time_s, log_path=run_dir / "logs" / "locust.log",
                         stop_timeout_s=3)


def wait_for(pred, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def server_counts(base_url: str) -> tuple[int, int]:
    """(completion requests the fake received, ``vllm:request_success_total`` summed)."""
    with httpx.Client(timeout=5) as c:
        received = len(c.get(f"{base_url}/fake/requests").json()["bodies"])
        text = c.get(f"{base_url}/metrics").text
    success = sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                  if ln.startswith("vllm:request_success_total"))
    return received, int(success)


# ---------------------------------------------------------------- no process started
def test_master_and_worker_commands_and_shares(tmp_path):
    lp = make("http://127.0.0.1:9", tmp_path, users=5, workers=3, max_requests=10)
    cmd = lp.command()
    for flag, value in (("--master-bind-host", "127.0.0.1"), ("--expect-workers", "3"), ("-u", "5")):
        assert cmd[cmd.index(flag) + 1] == value
    assert "--master" in cmd and "--headless" in cmd
    port = cmd[cmd.index("--master-bind-port") + 1]
    wcmd = lp.worker_command(0)
    assert "--worker" in wcmd and wcmd[wcmd.index("--master-host") + 1] == "127.0.0.1"
    assert wcmd[wcmd.index("--master-port") + 1] == port
    envs = [lp.worker_environment(i) for i in range(3)]
    assert [e["SPECCHAOS_MAX_REQUESTS"] for e in envs] == ["4", "3", "3"]   # shares sum to the bound
    assert [e["SPECCHAOS_WORKER_INDEX"] for e in envs] == ["0", "1", "2"]
    assert {e["SPECCHAOS_WORKER_COUNT"] for e in envs} == {"3"}
    assert [e["SPECCHAOS_RECORDS"] for e in envs] == [str(worker_records_path(lp.records_path, i)) for i in range(3)]
    assert lp.worker_log_path(2).name == "locust.worker2.log"
    single = make("http://127.0.0.1:9", tmp_path, workers=0)
    assert "--master" not in single.command() and single.environment()["SPECCHAOS_RECORDS"].endswith("records.jsonl")


def test_workers_need_users():
    with pytest.raises(ValueError, match=r"workers \(3\) exceeds users \(2\)"):
        LoadConfig(users=2, workers=3)


# ---------------------------------------------------------------- against the fake vLLM
def test_two_workers_merge_without_loss_or_duplicates(server, run_dir):
    received0, success0 = server_counts(server.base_url)
    lp = make(server.base_url, run_dir, max_requests=60)
    lp.start()
    try:
        assert wait_for(lambda: not lp.is_running(), 60), "the master should quit once a worker used up its share"
    finally:
        lp.stop()
    assert lp.returncode == 0 and all(gone(p) for p in lp.pids)
    received, success = server_counts(server.base_url)
    recs = read_records(lp.records_path)
    print(f"2 workers, max_requests 60: {len(recs)} records ({sum(r.ok for r in recs)} ok); the fake received "
          f"{received - received0}, counted {success - success0} successes")
    assert not lp.records_path.exists()   # the master writes nothing; each worker its own file
    assert [f.name for f in worker_record_files(lp.records_path)] == ["records.worker0.jsonl", "records.worker1.jsonl"]
    assert len(recs) == received - received0 and 30 <= len(recs) <= 60     # the bound holds across workers
    assert sum(r.ok for r in recs) == success - success0
    assert len({r.request_id for r in recs}) == len(recs)                   # nothing counted twice
    assert {r.user_id for r in recs} == {0, 1, 2, 3}                        # unique across workers
    for i, f in enumerate(worker_record_files(lp.records_path)):
        with open(f) as fh:
            assert {json.loads(line)["user_id"] % 2 for line in fh} == {i}
    log = (run_dir / "logs" / "locust.log").read_text()
    assert "SPECCHAOS_MAX_REQUESTS=60 reached" in log
    assert "load.max_requests was reached" in exit_reason(run_dir / "logs" / "locust.log")


def test_stop_registers_and_leaves_nothing(server, run_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECCHAOS_STATE_DIR", str(tmp_path / "state"))
    rs = state.RunState(run_dir)
    state.set_current(rs)
    try:
        received0, _ = server_counts(server.base_url)
        lp = make(server.base_url, run_dir)
        lp.start()
        listed = json.loads(rs.path.read_text())["processes"]
        assert sorted(p["role"] for p in listed) == ["locust-master", "locust-worker0", "locust-worker1"]
        assert wait_for(lambda: len(read_records(lp.records_path)) >= 20, 30)
        assert lp.stop(timeout_s=15) == 0
        assert all(gone(p) for p in lp.pids)
        assert json.loads(rs.path.read_text())["processes"] == []
        recs = read_records(lp.records_path)
        received, _ = server_counts(server.base_url)
        assert len(recs) == received - received0 and len({r.request_id for r in recs}) == len(recs)
    finally:
        state.set_current(None)
        rs.close()


def test_exception_in_the_owner_stops_every_process(server, run_dir):
    with pytest.raises(RuntimeError):
        with make(server.base_url, run_dir) as lp:
            pids = lp.pids
            assert len(pids) == 3
            raise RuntimeError("the experiment failed")
    assert all(gone(p) for p in pids)


def test_cleanup_ends_master_and_workers(server, run_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECCHAOS_STATE_DIR", str(tmp_path / "state"))
    rs = state.RunState(run_dir)
    state.set_current(rs)
    lp = make(server.base_url, run_dir)
    try:
        lp.start()
        pids = lp.pids
        result = cleanup(force=True, grace_s=10)
        assert set(pids) <= set(result["killed"]) and not result["errors"]
        assert all(gone(p) for p in pids)
    finally:
        lp.stop(timeout_s=5)
        state.set_current(None)
        rs.close()


ORPHAN_SCRIPT = r"""
import os, signal, sys
from pathlib import Path
from harness.experiment.config import LoadConfig
from harness.load.locust_process import LocustProcess, exit_reason
d = Path(sys.argv[2])
lp = LocustProcess(sys.argv[1], prompts_path=d / "prompts.json", records_path=d / "records.jsonl", model="fake",
                   cfg=LoadConfig(users=2, workers=2), run_time_s=120, log_path=d / "locust.log", stop_timeout_s=1)
lp.start()
(d / "pids").write_text(" ".join(map(str, lp.pids)))
os.kill(os.getpid(), int(sys.argv[3]))  # the harness dies without stopping its load
"""


@pytest.mark.parametrize("sig", [9, 15])
def test_master_and_workers_die_with_the_harness(server, run_dir, sig):
    script = run_dir / "orphan.py"
    script.write_text(ORPHAN_SCRIPT)
    res = subprocess.run([sys.executable, str(script), server.base_url, str(run_dir), str(sig)], cwd=ROOT,
                         timeout=90, capture_output=True)
    assert res.returncode == -sig, res.stderr[-2000:]
    pids = [int(p) for p in (run_dir / "pids").read_text().split()]
    assert len(pids) == 3
    try:
        assert wait_for(lambda: all(gone(p) for p in pids), 20), "a locust process outlived the harness"
    finally:  # never leave an orphan behind, even when the check fails
        for pid in pids:
            try:
                p = psutil.Process(pid)
                if str(run_dir) in " ".join(p.environ().values()):
                    p.kill()
            except psutil.Error:
                pass

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
from harness.load.lag import LagHistogram
from harness.load.profiles import lag_fields, planned_requests, read_load_stats
from harness.load.records import read_records, worker_record_files, worker_records_path


ROOT = Path(__file__).resolve().parents[2]
from tests.load.conftest import PROMPTS


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
    # a shape's peak counts (the master spreads its users), an open loop's max_in_flight
    LoadConfig(users=2, workers=3, profile={"ramp": {"from_users": 1, "duration_s": 5}, "users": 3})
    with pytest.raises(ValueError, match=r"workers \(4\) exceeds the profile's most users \(3\)"):
        LoadConfig(users=2, workers=4, profile={"steps": [{"at_s": 2, "users": 3}]})
    LoadConfig(users=1, workers=4, profile={"kind": "open", "rate": 5, "max_in_flight": 4})
    with pytest.raises(ValueError, match=r"workers \(2\) exceeds max_requests \(1\)"):
        LoadConfig(users=4, workers=2, max_requests=1)
    with pytest.raises(ValueError, match=r"workers \(5\) exceeds profile.max_in_flight \(4\)"):
        LoadConfig(users=1, workers=5, profile={"kind": "open", "rate": 5, "max_in_flight": 4})


def test_an_open_loop_runs_one_scheduler_per_worker(tmp_path):
    lp = make("http://127.0.0.1:9", tmp_path, workers=3, spawn_rate=1,
              profile={"kind": "open", "rate": 5, "max_in_flight": 10})
    assert lp.command()[lp.command().index("-u") + 1] == "3"
    # all three schedulers in locust's first spawn batch, so their clocks start together
    assert lp.command()[lp.command().index("-r") + 1] == "3"
    closed = make("http://127.0.0.1:9", tmp_path, workers=3, spawn_rate=1, users=6)
    assert closed.command()[closed.command().index("-r") + 1] == "1"
    assert make("http://127.0.0.1:9", tmp_path, workers=0, profile={"kind": "open", "rate": 5}).locust_users() == 1


def test_worker_load_stats_are_merged(tmp_path):
    def part(arrivals, dropped, lags, max_in_flight):
        hist = LagHistogram()
        for lag in lags:
            hist.add(lag)
        return {"kind": "open", "rate": 40.0, "burstiness": 1.0, "max_in_flight": max_in_flight,
                "arrivals": arrivals, "dropped": dropped, **lag_fields(hist)}
    path = tmp_path / "load_stats.json"
    assert read_load_stats(path) is None
    worker_records_path(path, 0).write_text(json.dumps(part(30, 1, [0.0005] * 29 + [0.004], 32)))
    worker_records_path(path, 1).write_text(json.dumps(part(10, 0, [0.002] * 9 + [0.010], 32)))
    merged = read_load_stats(path)
    assert merged["arrivals"] == 40 and merged["dropped"] == 1 and merged["max_in_flight"] == 64
    # the histograms add: 40 lags, 11 of them above 1 ms, 0 above 10 ms (0.010 is not above)
    assert merged["lag_histogram"]["n"] == 40 and merged["lag_max_s"] == 0.010
    assert merged["share_late_1ms"] == pytest.approx(11 / 40) and merged["share_late_10ms"] == 0.0
    assert merged["lag_mean_s"] == pytest.approx((29 * 0.0005 + 0.004 + 9 * 0.002 + 0.010) / 40)
    assert merged["lag_p50_s"] == pytest.approx(0.0005, rel=0.13)
    assert merged["workers"] == 2 and merged["rate"] == 40.0
    path.write_text(json.dumps(part(5, 0, [0.0] * 5, 8)))     # a single process's file wins
    assert read_load_stats(path)["arrivals"] == 5


# ---------------------------------------------------------------- against the fake vLLM
def run_until_quit(lp: LocustProcess, base_url: str, timeout_s: float = 60) -> tuple[list, int, int]:
    """Start ``lp``, wait until its master quits on its own (request bound or run time), stop
    it; asserts a clean exit and no process left. Returns (its records, the completion
    requests the fake received meanwhile, the successes it counted meanwhile)."""
    received0, success0 = server_counts(base_url)
    lp.start()
    try:
        assert wait_for(lambda: not lp.is_running(), timeout_s), "the master should quit on its own"
    finally:
        lp.stop()
    assert lp.returncode == 0 and all(gone(p) for p in lp.pids)
    received, success = server_counts(base_url)
    return read_records(lp.records_path), received - received0, success - success0


def test_two_workers_merge_without_loss_or_duplicates(server, run_dir):
    lp = make(server.base_url, run_dir, max_requests=60)
    recs, received, success = run_until_quit(lp, server.base_url)
    print(f"2 workers, max_requests 60: {len(recs)} records ({sum(r.ok for r in recs)} ok); the fake received "
          f"{received}, counted {success} successes")
    assert not lp.records_path.exists()   # the master writes nothing; each worker its own file
    assert [f.name for f in worker_record_files(lp.records_path)] == ["records.worker0.jsonl", "records.worker1.jsonl"]
    assert len(recs) == received and 30 <= len(recs) <= 60     # the bound holds across workers
    assert sum(r.ok for r in recs) == success
    assert len({r.request_id for r in recs}) == len(recs)                   # nothing counted twice
    assert {r.user_id for r in recs} == {0, 1, 2, 3}                        # unique across workers
    for i, f in enumerate(worker_record_files(lp.records_path)):
        with open(f) as fh:
            assert {json.loads(line)["user_id"] % 2 for line in fh} == {i}
    log = (run_dir / "logs" / "locust.log").read_text()
    assert "SPECCHAOS_MAX_REQUESTS=60 reached" in log
    assert "load.max_requests was reached" in exit_reason(run_dir / "logs" / "locust.log")


def test_an_open_loop_over_two_workers_sends_the_single_process_arrivals(server, run_dir):
    """Worker k sends arrivals i with i % 2 == k, in order: together the one seeded sequence,
    nothing lost or sent twice, and the merged account matches the records. max_in_flight
    leaves room for every arrival (40/s of ~0.5 s requests on the fake's 30 ms steps): a
    dropped arrival would be a gap in the sequence, which is not what this test is about."""
    profile = {"kind": "open", "rate": 40.0, "max_in_flight": 64}
    lp = make(server.base_url, run_dir, users=1, seed=7, profile=profile, max_requests=80)
    recs, received, _ = run_until_quit(lp, server.base_url)
    plan = planned_requests(lp.cfg, PROMPTS, count=200)
    stats = read_load_stats(run_dir / "load_stats.json")
    print(f"open loop 40/s over 2 workers, max_requests 80: {len(recs)} records, the fake received "
          f"{received}; merged stats {stats}")
    assert len(recs) == received and 40 <= len(recs) <= 80
    assert len({r.request_id for r in recs}) == len(recs) and all(r.ok for r in recs)
    for k, f in enumerate(worker_record_files(lp.records_path)):
        with open(f) as fh:
            sent = sorted((json.loads(line) for line in fh), key=lambda r: r["send_time"])
        mine = [p["prompt_id"] for i, p in enumerate(plan) if i % 2 == k]
        assert sent and [r["prompt_id"] for r in sent] == mine[:len(sent)], k
    assert stats["workers"] == 2 and stats["max_in_flight"] == 64 and stats["dropped"] == 0
    assert stats["arrivals"] >= len(recs) and stats["lag_max_s"] < 0.5
    # together at the run's rate: the arrivals span what one process's plan needs for them
    span = max(r.send_time for r in recs) - min(r.send_time for r in recs)
    planned_span = plan[len(recs) - 1]["at_s"] - plan[0]["at_s"]
    assert abs(span - planned_span) < 0.5, (span, planned_span)


def test_steps_over_two_workers_change_the_users(server, run_dir):
    """The master runs the shape: 2 users, then 4 from 2 s on, spread over both workers."""
    profile = {"users": 2, "steps": [{"at_s": 2.0, "users": 4}]}
    lp = make(server.base_url, run_dir, users=2, profile=profile, spawn_rate=50, run_time_s=4)
    recs, _, _ = run_until_quit(lp, server.base_url, timeout_s=40)   # the shape ends it at --run-time
    t0 = min(r.send_time for r in recs)
    early = {r.user_id for r in recs if r.send_time - t0 < 1.5}
    late = {r.user_id for r in recs if r.send_time - t0 > 3.0}
    assert early == {0, 1} and late == {0, 1, 2, 3}, (early, late)
    assert len(worker_record_files(lp.records_path)) == 2


def test_a_lost_worker_is_reported_and_not_replaced(server, run_dir):
    """SIGKILL one worker mid-run: the master runs on with the other worker's users only, and
    lost_worker_error says so (the experiment ends the run on it)."""
    lp = make(server.base_url, run_dir, run_time_s=30)
    lp.start()
    try:
        assert wait_for(lambda: len(read_records(lp.records_path)) >= 20, 30)
        assert lp.lost_worker_error() is None
        victim = lp.pids[2]                       # master, worker 0, worker 1
        psutil.Process(victim).kill()
        t_kill = time.time()
        assert wait_for(lambda: lp.lost_worker_error() is not None, 10)
        err = lp.lost_worker_error()
        assert "locust worker 1 exited with code -9" in str(err) and err.where.endswith("locust.worker1.log")
        assert lp.is_running()
        time.sleep(4.0)                           # beyond locust's heartbeat: still not replaced
        later = {r.user_id for r in read_records(lp.records_path) if r.send_time > t_kill + 3.5}
        assert later == {0, 2}, later             # worker 0's users only (worker 1 had 1 and 3)
    finally:
        lp.stop()
    assert lp.lost_worker_error() is None         # stopped: nothing more to report
    assert all(gone(p) for p in lp.pids)


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

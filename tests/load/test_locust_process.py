"""The locust process end to end against the fake vLLM's hand-made SSE scenarios (no vLLM needed):
records, per-user seeded walks, the global request bound, error backoff, graceful stop
with requests in flight, early-exit detection, and no process left behind."""

from __future__ import annotations

import time
from collections import Counter

import psutil
import pytest

from harness.errors import LoadError
from harness.experiment.config import LoadConfig
from harness.load.locust_process import LocustProcess
from harness.load.prompts import save_prompt_set
from harness.load.records import read_records


from tests.load.conftest import PROMPTS


def make(server, run_dir, scenario, run_time_s=30, stop_timeout_s=5.0, **cfg):
    cfg = LoadConfig(**{"users": 2, "spawn_rate": 50, "request_timeout_s": 10, **cfg})
    return LocustProcess(server.base_url, prompts_path=run_dir / "prompts.json",
                         records_path=run_dir / "records.jsonl", model=scenario, cfg=cfg,
                         run_time_s=run_time_s, log_path=run_dir / "logs" / "locust.log",
                         stop_timeout_s=stop_timeout_s)


def wait_for(pred, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


def assert_gone(pid: int) -> None:
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_records_users_and_seeded_walks(server, run_dir):
    lp = make(server, run_dir, "normal", users=3, seed=11)
    lp.start()
    try:
        assert lp.is_running()
        assert wait_for(lambda: len(read_records(lp.records_path)) >= 40, 40)
    finally:
        rc = lp.stop()
    assert rc == 0 and not lp.is_running() and lp.returncode == 0
    assert_gone(lp.pid)
    recs = read_records(lp.records_path)
    assert all(r.ok and r.source == "load" and r.error is None for r in recs)
    assert {r.user_id for r in recs} == {0, 1, 2}
    assert all(r.chunk_tokens == [2, 3, 1] for r in recs)
    # Each user walks its own seeded shuffle: every prompt once per pass of 5 requests.
    by_user: dict[int, list[int]] = {}
    for r in sorted(recs, key=lambda r: r.send_time):
        by_user.setdefault(r.user_id, []).append(r.prompt_id)
    walks = [ids[:5] for ids in by_user.values() if len(ids) >= 5]
    assert walks and all(sorted(w) == [0, 1, 2, 3, 4] for w in walks)
    assert len({tuple(w) for w in walks}) > 1 or len(walks) == 1
    log = (run_dir / "logs" / "locust.log").read_text()
    assert "/v1/completions [short]" in log  # locust's own stats saw the requests
    assert lp.stop() == 0  # idempotent


def test_same_seed_same_walk(server, tmp_path):
    walks = []
    for i in range(2):
        d = tmp_path / str(i)
        d.mkdir()
        save_prompt_set(d / "prompts.json", PROMPTS)
        lp = make(server, d, "normal", users=1, seed=5, max_requests=7)
        lp.start()
        assert wait_for(lambda: not lp.is_running(), 30)
        lp.stop()
        walks.append([r.prompt_id for r in sorted(read_records(lp.records_path), key=lambda r: r.send_time)])
    assert walks[0] == walks[1] and len(walks[0]) == 7


def test_max_requests_quits_the_runner(server, run_dir):
    lp = make(server, run_dir, "normal", users=3, max_requests=9)
    lp.start()
    assert wait_for(lambda: not lp.is_running(), 30), "locust should quit by itself"
    assert lp.returncode == 0
    lp.stop()
    assert len(read_records(lp.records_path)) == 9


def test_error_backoff_bounds_the_request_rate(server, run_dir):
    lp = make(server, run_dir, "http500", users=2, error_backoff_s=0.5)
    lp.start()
    time.sleep(3.0)
    assert lp.stop() == 0
    recs = read_records(lp.records_path)
    assert recs and all(r.error == "http_500" and not r.ok for r in recs), [(r.error, r.error_detail, r.e2e_s) for r in recs if r.error != "http_500"]
    span = max(r.send_time for r in recs) - min(r.send_time for r in recs)
    assert len(recs) <= 2 * (span / 0.5 + 1) + 1  # without backoff it would be hundreds


def test_stop_lets_requests_in_flight_finish(server, run_dir):
    lp = make(server, run_dir, "slow", users=2, stop_timeout_s=5)
    lp.start()
    assert wait_for(lambda: len(read_records(lp.records_path)) >= 2, 20)
    time.sleep(0.4)  # the next requests are in flight now
    t0 = time.monotonic()
    assert lp.stop(timeout_s=15) == 0
    assert time.monotonic() - t0 < 5
    recs = read_records(lp.records_path)
    assert all(r.ok for r in recs)
    assert Counter(r.user_id for r in recs)  # written, finished, counted


def test_requests_cut_by_shutdown_are_errors(server, run_dir):
    lp = make(server, run_dir, "hang_after_chunk", users=2, stop_timeout_s=1, request_timeout_s=30)
    lp.start()
    time.sleep(1.5)  # both users are stuck in a request that would last 10 s
    assert read_records(lp.records_path) == []
    assert lp.stop(timeout_s=15) == 0
    recs = read_records(lp.records_path)
    assert len(recs) == 2
    assert all(not r.ok and r.error == "other:GreenletExit" and r.chunk_tokens == [2] for r in recs)


def test_unusable_prompt_set_fails_at_start_with_log_tail(server, run_dir):
    (run_dir / "prompts.json").write_text('{"format": "nope"}')
    lp = make(server, run_dir, "normal")
    with pytest.raises(LoadError, match="not a prompt set"):
        lp.start()
    assert not lp.is_running()
    lp.stop()


def test_missing_prompt_set_and_non_loopback_host(server, tmp_path):
    lp = make(server, tmp_path, "normal")
    with pytest.raises(LoadError, match="prompt set not found"):
        lp.start()
    with pytest.raises(LoadError, match="non-loopback"):
        LocustProcess("http://192.168.1.5:8000", prompts_path=tmp_path / "p.json", records_path=tmp_path / "r.jsonl",
                      model="m", cfg=LoadConfig(), run_time_s=5, log_path=tmp_path / "l.log")


def test_command_is_argv_with_the_config(server, run_dir):
    lp = make(server, run_dir, "normal", users=7, spawn_rate=2.5, run_time_s=12.9)
    cmd = lp.command()
    assert cmd[1:3] == ["-m", "locust"] and "--headless" in cmd and "--only-summary" in cmd
    for flag, value in (("-u", "7"), ("-r", "2.5"), ("--run-time", "12s"), ("--stop-timeout", "5"),
                        ("--host", server.base_url)):
        assert cmd[cmd.index(flag) + 1] == value
    env = lp.environment()
    assert env["SPECCHAOS_MODEL"] == "normal" and env["SPECCHAOS_MAX_REQUESTS"] == "20000"
    assert not any(k.startswith("LOCUST_") for k in env)
    assert env["GEVENT_RESOLVER"] == "block"   # loopback only: no thread pool per getaddrinfo


def test_run_time_ends_the_run(server, run_dir):
    lp = make(server, run_dir, "normal", run_time_s=2)
    lp.start()
    assert wait_for(lambda: not lp.is_running(), 20)
    assert lp.returncode == 0 and read_records(lp.records_path)
    lp.stop()


def test_registered_in_run_state_while_alive(server, run_dir, monkeypatch, tmp_path):
    import json

    from harness import state

    monkeypatch.setenv("SPECCHAOS_STATE_DIR", str(tmp_path / "state"))
    rs = state.RunState(run_dir)
    state.set_current(rs)
    try:
        lp = make(server, run_dir, "normal")
        lp.start()
        listed = json.loads(rs.path.read_text())["processes"]
        assert [(p["pid"], p["role"]) for p in listed] == [(lp.pid, "locust")]
        lp.stop()
        assert json.loads(rs.path.read_text())["processes"] == []
    finally:
        state.set_current(None)
        rs.close()


ORPHAN_SCRIPT = r"""
import os, sys
from pathlib import Path
from harness.experiment.config import LoadConfig
from harness.load.locust_process import LocustProcess
d = Path(sys.argv[2])
lp = LocustProcess(sys.argv[1], prompts_path=d / "prompts.json", records_path=d / "records.jsonl", model="normal",
                   cfg=LoadConfig(users=1), run_time_s=120, log_path=d / "locust.log", stop_timeout_s=1)
lp.start()
(d / "pid").write_text(str(lp.pid))
os.kill(os.getpid(), 9)  # the harness dies without stopping its load
"""


def test_locust_dies_with_the_harness(server, run_dir):
    import subprocess
    import sys
    from pathlib import Path

    script = run_dir / "orphan.py"
    script.write_text(ORPHAN_SCRIPT)
    res = subprocess.run([sys.executable, str(script), server.base_url, str(run_dir)],
                         cwd=Path(__file__).resolve().parents[2], timeout=60, capture_output=True)
    assert res.returncode == -9, res.stderr[-2000:]
    pid = int((run_dir / "pid").read_text())
    try:
        assert wait_for(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE,
                        15), "locust outlived the process that started it"
    finally:  # never leave the orphan behind, even when the check fails
        try:
            p = psutil.Process(pid)
            if str(run_dir) in " ".join(p.environ().values()):
                p.kill()
        except psutil.Error:
            pass


def test_exit_reason_names_the_request_bound(tmp_path):
    from harness.load.locust_process import exit_reason

    log = tmp_path / "locust.log"
    log.write_text("[2026] INFO: starting\n[2026] INFO: SPECCHAOS_MAX_REQUESTS=20000 reached, quitting\n")
    assert "load.max_requests was reached" in exit_reason(log)
    log.write_text("boom: something else\n")
    assert exit_reason(log) == "boom: something else"

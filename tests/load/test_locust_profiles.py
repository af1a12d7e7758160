"""Workload profiles and the retry policy in the real locust process, against the fake
vLLM's hand-made scenarios (no vLLM needed): an open loop sends at its rate, bounded by
``max_in_flight``; concurrency steps change the users; retries resend the same request
under one ``logical_id``."""

from __future__ import annotations

import json
import time
from collections import defaultdict

import pytest

from harness.load.records import read_records
from harness.load.retry import retryable
from tests.load.conftest import PROMPTS
from tests.load.test_locust_process import make, wait_for

pytestmark = pytest.mark.timeout(120)


def test_an_open_loop_sends_at_its_rate(server, run_dir):
    rate, seconds = 20.0, 6.0
    lp = make(server, run_dir, "normal", profile={"kind": "open", "rate": rate}, seed=3)
    assert lp.locust_users() == 1
    lp.start()
    try:
        assert wait_for(lambda: len(read_records(lp.records_path)) >= 1, 30)
        t0 = time.time()
        time.sleep(seconds)
        n_window = sum(1 for r in read_records(lp.records_path) if t0 <= r.send_time < t0 + seconds)
    finally:
        assert lp.stop() == 0
    recs = read_records(lp.records_path)
    assert all(r.ok and r.user_id == 0 and r.attempt == 1 for r in recs)
    # Poisson count over 6 s at 20/s: mean 120, sd ~11; 4 sd of slack plus scheduler lateness
    assert abs(n_window - rate * seconds) <= 45, n_window
    stats = json.loads((run_dir / "load_stats.json").read_text())
    assert stats["dropped"] == 0 and stats["arrivals"] >= len(recs) and stats["max_in_flight"] == 64
    assert stats["lag_max_s"] < 0.5 and stats["lag_histogram"]["n"] == stats["arrivals"], stats
    assert stats["lag_p50_s"] <= stats["lag_p99_s"] <= stats["lag_max_s"], stats
    # the i-th arrival sends the i-th request of user 0's seeded walk: every prompt once per pass
    ids = [r.prompt_id for r in sorted(recs, key=lambda r: r.send_time)][:5]
    assert sorted(ids) == [0, 1, 2, 3, 4]


def test_an_open_loop_drops_arrivals_beyond_max_in_flight(server, run_dir):
    lp = make(server, run_dir, "slow", profile={"kind": "open", "rate": 20, "max_in_flight": 2})
    lp.start()
    time.sleep(4.0)
    assert lp.stop() == 0
    recs = read_records(lp.records_path)
    stats = json.loads((run_dir / "load_stats.json").read_text())
    assert stats["dropped"] > 0 and stats["arrivals"] >= stats["dropped"] + len(recs)
    # never more than 2 in flight: sweep over (start, end) events
    events = sorted([(r.send_time, 1) for r in recs] + [(r.end_time, -1) for r in recs])
    depth = peak = 0
    for _, d in events:
        depth += d
        peak = max(peak, depth)
    assert peak <= 2


def test_concurrency_steps_change_the_users(server, run_dir):
    lp = make(server, run_dir, "normal", profile={"kind": "closed", "users": 1, "steps": [{"at_s": 3, "users": 3}]})
    lp.start()
    try:
        assert wait_for(lambda: len({r.user_id for r in read_records(lp.records_path)}) >= 3, 30)
    finally:
        assert lp.stop() == 0
    recs = sorted(read_records(lp.records_path), key=lambda r: r.send_time)
    first = recs[0].send_time
    assert {r.user_id for r in recs if r.send_time < first + 2.0} == {0}
    assert {r.user_id for r in recs} == {0, 1, 2}


def test_a_ramp_adds_users_over_its_duration(server, run_dir):
    lp = make(server, run_dir, "normal", profile={"kind": "closed", "users": 3, "ramp": {"from_users": 1, "duration_s": 4}})
    lp.start()
    try:
        assert wait_for(lambda: len({r.user_id for r in read_records(lp.records_path)}) >= 3, 30)
    finally:
        assert lp.stop() == 0
    recs = sorted(read_records(lp.records_path), key=lambda r: r.send_time)
    start = {u: min(r.send_time for r in recs if r.user_id == u) for u in (0, 1, 2)}
    # 1 + 2 t / 4 users, halves up: 1 user until 1 s, 2 from 1 s, 3 from 3 s (locust ticks each second)
    assert start[0] < start[1] < start[2]
    assert start[2] - start[0] >= 1.5


def test_retries_resend_the_same_request_under_one_logical_id(server, run_dir):
    # "flaky": HTTP 503 for the first two requests of each prompt text, then the stream
    lp = make(server, run_dir, "flaky", users=1, seed=4,
              retry={"max_retries": 2, "initial_s": 0.05, "max_s": 0.2, "jitter": "none"})
    lp.start()
    try:
        assert wait_for(lambda: sum(r.ok for r in read_records(lp.records_path)) >= len(PROMPTS) + 2, 30)
    finally:
        assert lp.stop() == 0
    tries: dict[str, list] = defaultdict(list)
    for r in sorted(read_records(lp.records_path), key=lambda r: r.send_time):
        tries[r.logical_id].append(r)
    assert "" not in tries
    first_pass = [t for t in tries.values() if t[0].status == 503]
    assert len(first_pass) == len(PROMPTS)
    for t in first_pass:
        assert [r.attempt for r in t] == [1, 2, 3]
        assert [r.status for r in t] == [503, 503, 200] and t[-1].ok and retryable(t[0])
        assert len({(r.prompt_id, r.sampling, r.max_tokens, r.user_id) for r in t}) == 1
        assert len({r.request_id for r in t}) == 3
        gaps = [b.send_time - (a.send_time + a.e2e_s) for a, b in zip(t, t[1:])]
        assert gaps[0] >= 0.045 and gaps[1] >= 0.095, gaps   # 0.05 s, then 0.1 s (no jitter)
    later = [t for t in tries.values() if t[0].status == 200]
    assert later and all(len(t) == 1 and t[0].attempt == 1 for t in later)


def test_no_retries_when_the_policy_says_none(server, run_dir):
    lp = make(server, run_dir, "http500", users=1, retry={"max_retries": 0}, error_backoff_s=0.1)
    lp.start()
    time.sleep(1.5)
    assert lp.stop() == 0
    recs = read_records(lp.records_path)
    assert recs and all(r.attempt == 1 for r in recs) and len({r.logical_id for r in recs}) == len(recs)


def test_the_locust_command_carries_the_profile_and_the_policy(tmp_path):
    from harness.load.config import LoadConfig
    from harness.load.locust_process import LocustProcess

    def lp(**cfg):
        return LocustProcess("http://127.0.0.1:9", prompts_path=tmp_path / "p.json", records_path=tmp_path / "r.jsonl",
                             model="m", cfg=LoadConfig(**cfg), run_time_s=5, log_path=tmp_path / "l.log")

    closed = lp(users=5)
    assert closed.command()[closed.command().index("-u") + 1] == "5"
    env = closed.environment()
    assert json.loads(env["SPECCHAOS_PROFILE"])["users"] == 5 and json.loads(env["SPECCHAOS_RETRY"])["max_retries"] == 2
    opened = lp(profile={"kind": "open", "rate": 3}, retry={"max_retries": 0})
    assert opened.command()[opened.command().index("-u") + 1] == "1"
    assert json.loads(opened.environment()["SPECCHAOS_PROFILE"])["rate"] == 3
    assert json.loads(opened.environment()["SPECCHAOS_RETRY"])["max_retries"] == 0

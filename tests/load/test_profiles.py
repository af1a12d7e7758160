"""Workload profiles as arithmetic (harness.load.profiles): each arrival process checked
statistically with a fixed seed, the ramp/step schedules by value, the walk and the plan
digest for determinism. Pure: nothing starts."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from harness.load.config import LoadConfig, ProfileConfig, SamplingClass
from harness.load.profiles import (arrival_times, iter_arrivals, load_section, max_users, plan_digest,
                                   planned_requests, rate_at, schedule, users_at, Walk)
from harness.load.prompts import Prompt

PROMPTS = [Prompt(i, "short" if i < 6 else "long", f"prompt {i}", 20 + i, 16 if i < 6 else 32) for i in range(10)]


@pytest.mark.parametrize("rate, burstiness", [(10.0, 1.0), (4.0, 0.25), (25.0, 4.0), (2.0, 1.0)])
def test_gamma_arrivals_have_the_mean_and_spread_of_vllm_bench_serve(rate, burstiness):
    t = arrival_times(rate, burstiness, seed=7, duration_s=4000 / rate)
    gaps = np.diff(np.concatenate([[0.0], t]))
    n = len(gaps)
    assert abs(n - 4000) < 6 * math.sqrt(4000 / burstiness)            # count ~ duration * rate
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.06)             # mean gap 1/rate
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.08)   # CV 1/sqrt(b)
    assert np.all(np.diff(t) >= 0) and t[0] > 0 and t[-1] < 4000 / rate


def test_poisson_counts_per_window_have_poisson_dispersion():
    """burstiness 1: counts in 1 s windows have variance ≈ mean (index of dispersion 1);
    burstiness 0.25 is over-dispersed, 4 under-dispersed."""
    def dispersion(b: float) -> float:
        t = arrival_times(20.0, b, seed=3, duration_s=2000)
        counts = np.bincount(t.astype(int), minlength=2000)
        return counts.var() / counts.mean()

    assert dispersion(1.0) == pytest.approx(1.0, abs=0.12)
    assert dispersion(0.25) > 2.5
    assert dispersion(4.0) < 0.5


def test_same_seed_same_arrivals_other_seed_other_arrivals():
    a, b, c = (arrival_times(10, 1, s, 30) for s in (1, 1, 2))
    assert np.array_equal(a, b)
    assert not np.array_equal(a[:10], c[:10])


@pytest.mark.parametrize("rate, burstiness", [(0, 1), (-1, 1), (1, 0), (1, -2)])
def test_arrival_times_refuse_non_positive_parameters(rate, burstiness):
    with pytest.raises(ValueError, match="must be > 0"):
        arrival_times(rate, burstiness, 1, 10)


def test_open_loop_ramp_and_steps_schedule_and_arrivals():
    p = ProfileConfig(kind="open", rate=10, ramp={"from_rate": 0, "duration_s": 100},
                      steps=[{"at_s": 200, "rate": 2}, {"at_s": 300, "rate": 30}])
    assert schedule(p) == [(0.0, 100.0, 0.0, 10.0), (100.0, 200.0, 10.0, 10.0), (200.0, 300.0, 2.0, 2.0),
                           (300.0, math.inf, 30.0, 30.0)]
    assert [rate_at(p, t) for t in (0, 25, 50, 100, 150, 199.9, 200, 299, 300, 1e6)] == \
        [0.0, 2.5, 5.0, 10.0, 10.0, 10.0, 2.0, 2.0, 30.0, 30.0]
    t = np.fromiter(itertools.takewhile(lambda x: x < 400, iter_arrivals(p, seed=11)), dtype=float)
    expected = {(0, 50): 125, (50, 100): 375, (100, 200): 1000, (200, 300): 200, (300, 400): 3000}
    for (lo, hi), n in expected.items():
        got = int(((t >= lo) & (t < hi)).sum())
        assert abs(got - n) < 5 * math.sqrt(n), ((lo, hi), got, n)


def test_a_falling_ramp_is_inverted_too():
    p = ProfileConfig(kind="open", rate=2, ramp={"from_rate": 20, "duration_s": 100})
    t = np.fromiter(itertools.takewhile(lambda x: x < 100, iter_arrivals(p, seed=5)), dtype=float)
    first, second = int((t < 50).sum()), int((t >= 50).sum())
    assert abs(first - 775) < 5 * math.sqrt(775) and abs(second - 325) < 5 * math.sqrt(325)


def test_closed_loop_users_over_time():
    p = ProfileConfig(kind="closed", users=8, ramp={"from_users": 0, "duration_s": 40},
                      steps=[{"at_s": 60, "users": 2}, {"at_s": 90, "users": 12}])
    assert [users_at(p, t) for t in (0, 10, 20, 40, 59, 60, 89, 90, 500)] == [0, 2, 4, 8, 8, 2, 2, 12, 12]
    assert max_users(p) == 12
    assert users_at(ProfileConfig(), 100, default_users=5) == 5 and max_users(ProfileConfig(), 5) == 5
    ramp = ProfileConfig(users=3, ramp={"from_users": 1, "duration_s": 4})
    assert [users_at(ramp, t) for t in (0, 0.9, 1, 2.9, 3, 4)] == [1, 1, 2, 2, 3, 3]   # halves round up


def test_arrivals_only_for_an_open_loop():
    with pytest.raises(ValueError, match="open-loop"):
        next(iter_arrivals(ProfileConfig(), 1))


def test_walk_is_the_locust_users_walk():
    """A fresh shuffle per pass; the sampling draw from its own generator."""
    w = Walk(PROMPTS, [SamplingClass(name="g"), SamplingClass(name="hot", temperature=1.0, weight=3)], 9, 2)
    ids = [w.next()[0].prompt_id for _ in range(30)]
    assert sorted(ids[:10]) == list(range(10)) and sorted(ids[10:20]) == list(range(10))
    assert ids[:10] != ids[10:20]
    w2 = Walk(PROMPTS, [SamplingClass(name="g")], 9, 2)   # one class: no draw, same prompt order
    assert [w2.next()[0].prompt_id for _ in range(30)] == ids


def test_plan_digest_is_stable_for_a_seed_and_changes_with_it():
    closed = LoadConfig(users=3, seed=5)
    assert plan_digest(closed, PROMPTS) == plan_digest(LoadConfig(users=3, seed=5), PROMPTS)
    assert plan_digest(closed, PROMPTS) != plan_digest(LoadConfig(users=3, seed=6), PROMPTS)
    assert plan_digest(closed, PROMPTS) != plan_digest(LoadConfig(users=4, seed=5), PROMPTS)
    opened = LoadConfig(seed=5, profile={"kind": "open", "rate": 5})
    assert plan_digest(opened, PROMPTS) == plan_digest(LoadConfig(seed=5, profile={"kind": "open", "rate": 5}), PROMPTS)
    assert plan_digest(opened, PROMPTS) != plan_digest(LoadConfig(seed=6, profile={"kind": "open", "rate": 5}), PROMPTS)
    assert plan_digest(opened, PROMPTS) != plan_digest(LoadConfig(seed=5, profile={"kind": "open", "rate": 6}), PROMPTS)
    other_text = [Prompt(p.prompt_id, p.prompt_class, p.text + "!", p.prompt_tokens, p.max_tokens) for p in PROMPTS]
    assert plan_digest(closed, PROMPTS) != plan_digest(closed, other_text)


def test_planned_requests_shape():
    plan = planned_requests(LoadConfig(users=2, seed=1), PROMPTS, count=4)
    assert [r["user"] for r in plan] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(r["max_tokens"] == PROMPTS[r["prompt_id"]].max_tokens for r in plan)
    arrivals = planned_requests(LoadConfig(seed=1, profile={"kind": "open", "rate": 2}), PROMPTS, count=5)
    assert len(arrivals) == 5 and all(a["at_s"] < b["at_s"] for a, b in zip(arrivals, arrivals[1:]))
    walk = Walk(PROMPTS, LoadConfig().sampling, 1, 0)
    assert [a["prompt_id"] for a in arrivals] == [walk.next()[0].prompt_id for _ in range(5)]


def test_load_section_states_profile_retry_and_digest():
    sec = load_section(LoadConfig(users=3, seed=5), PROMPTS)
    assert sec["profile"]["kind"] == "closed" and sec["profile"]["users"] == 3
    assert sec["retry"]["max_retries"] == 2 and sec["retry"]["waits_s"] == [0.5, 1.0]
    assert sec["seed"] == 5 and len(sec["plan_digest"]) == 64
    assert "each of 3 users" in sec["plan_covers"]

"""The retry policy as arithmetic (harness.load.retry): the backoff schedule per jitter
mode with a seeded generator, its bounds, and which failed tries are retried. Pure."""

from __future__ import annotations

import random

import pytest

from harness.load.config import RetryConfig
from harness.load.retry import backoff_s, backoff_schedule, describe, retryable
from tests.factories import make_record


def test_defaults_are_the_openai_sdks():
    p = RetryConfig()
    assert (p.max_retries, p.initial_s, p.max_s, p.multiplier, p.jitter) == (2, 0.5, 8.0, 2.0, "openai")


def test_exponential_without_jitter_doubles_up_to_the_cap():
    p = RetryConfig(max_retries=7, jitter="none")
    assert backoff_schedule(p, random.Random(1)) == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert describe(p)["max_total_wait_s"] == 31.5


def test_openai_jitter_takes_off_at_most_a_quarter():
    p = RetryConfig(max_retries=5)
    rng = random.Random(42)
    waits = [backoff_s(p, n, rng) for n in range(1, 6) for _ in range(400)]
    base = [0.5, 1.0, 2.0, 4.0, 8.0]
    for k, b in enumerate(base):
        chunk = waits[k * 400:(k + 1) * 400]
        assert all(0.75 * b <= w <= b for w in chunk)
        assert sum(chunk) / 400 == pytest.approx(0.875 * b, rel=0.03)   # mean of 1 - 0.25 U


def test_full_jitter_is_uniform_below_the_wait():
    p = RetryConfig(max_retries=3, jitter="full", initial_s=1.0, max_s=2.0)
    rng = random.Random(3)
    draws = [backoff_s(p, 3, rng) for _ in range(2000)]
    assert all(0 <= d <= 2.0 for d in draws)
    assert sum(draws) / len(draws) == pytest.approx(1.0, rel=0.05)


def test_fixed_backoff_and_seeded_schedules():
    p = RetryConfig(backoff="fixed", initial_s=0.25, max_retries=3, jitter="none")
    assert backoff_schedule(p, random.Random(0)) == [0.25, 0.25, 0.25]
    q = RetryConfig(max_retries=4)
    assert backoff_schedule(q, random.Random(9)) == backoff_schedule(q, random.Random(9))
    assert backoff_schedule(q, random.Random(9)) != backoff_schedule(q, random.Random(10))
    with pytest.raises(ValueError):
        backoff_s(q, 0, random.Random(0))


@pytest.mark.parametrize("kw, expected", [
    ({}, False),                                                                 # complete: nothing to retry
    ({"status": None, "error": "connect", "done": False}, True),                 # refused
    ({"status": None, "error": "timeout", "done": False}, True),                 # no head in time
    ({"status": None, "error": "stream_cut", "done": False}, True),              # reset before the head
    ({"status": 503, "error": "http_503", "done": False}, True),
    ({"status": 500, "error": "http_500", "done": False}, True),
    ({"status": 429, "error": "http_429", "done": False}, True),
    ({"status": 408, "error": "http_408", "done": False}, True),
    ({"status": 400, "error": "http_400", "done": False}, False),                # the request is wrong
    ({"status": 404, "error": "http_404", "done": False}, False),
    ({"status": 200, "error": "stream_cut", "done": False}, False),              # the stream had begun
    ({"status": 200, "error": "stream_error"}, False),
    ({"status": None, "error": "other:GreenletExit", "done": False}, False),     # the client stopped it
])
def test_what_is_retried(kw, expected):
    rec = make_record(**kw)
    if kw:
        rec.ok = False
    assert retryable(rec) is expected


@pytest.mark.parametrize("field, value, needle", [
    ("max_retries", -1, "greater than or equal to 0"),
    ("max_retries", 11, "less than or equal to 10"),
    ("jitter", "half", "'openai', 'full' or 'none'"),
    ("backoff", "linear", "'exponential' or 'fixed'"),
    ("multiplier", 0.5, "greater than or equal to 1"),
])
def test_bad_policies(field, value, needle):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=needle):
        RetryConfig(**{field: value})
    with pytest.raises(ValidationError, match="max_s 1 < initial_s 2"):
        RetryConfig(initial_s=2, max_s=1)

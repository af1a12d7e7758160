"""A sweep cell's speedups on synthetic records with a known answer
(:func:`harness.metrics.sweep.cell_figures`)."""

from __future__ import annotations

import pytest

from harness.metrics.config import GoodputConfig
from harness.metrics.sweep import cell_figures, goodput_values
from harness.report.sweep import _speed
from tests.factories import fail, make_record


def plain(i: int):
    """8 one-token chunks 40 ms apart after a TTFT of 100-104 ms: E2E TTFT + 0.28 s."""
    return make_record(send_time=1000 + i, ttft=0.1 + 0.001 * (i % 5), gaps=[0.04] * 7, server="ref")


def spec(i: int):
    """The same 8 tokens in 4 chunks of 2 (k=1, every draft accepted) 40 ms apart: E2E
    TTFT + 0.12 s, TPOT 0.12 / 7 s (plain's 0.28 / 7 s), TTFT as plain's."""
    return make_record(send_time=1000 + i, ttft=0.1 + 0.001 * (i % 5), gaps=[0.04] * 3, chunk_tokens=[2] * 4)


def test_a_cell_with_twice_the_tokens_per_step():
    fig = cell_figures([spec(i) for i in range(40)], [plain(i) for i in range(40)], level=2, k=1, resamples=200)
    s = fig["speedup"]
    assert s["tpot_p50"]["speedup"] == pytest.approx(0.28 / 0.12, rel=1e-6)
    assert s["tpot_p50"]["low"] == pytest.approx(0.28 / 0.12, rel=1e-6) == s["tpot_p50"]["high"]
    assert s["ttft_p50"]["speedup"] == pytest.approx(1.0)
    assert s["ttft_p50"]["low"] <= 1.0 <= s["ttft_p50"]["high"]
    # goodput at 2 in flight: 2 / mean E2E; E2E = TTFT (mean 0.102 s) + 0.28 s plain, + 0.12 s speculative
    assert s["goodput"]["speedup"] == pytest.approx((0.28 + 0.102) / (0.12 + 0.102), rel=1e-6)
    assert s["goodput"]["plain"] == pytest.approx(2 / (0.28 + 0.102), rel=1e-6)
    assert s["goodput"]["low"] <= s["goodput"]["speedup"] <= s["goodput"]["high"]
    assert fig["acceptance_rate"] == pytest.approx(1.0) and fig["mean_acceptance_length"] == pytest.approx(2.0)
    assert fig["complete"] == {"plain": 40, "spec": 40} and fig["error_rate"] == {"plain": 0.0, "spec": 0.0}


def test_goodput_counts_only_good_requests_and_failed_ones_lose():
    limits = GoodputConfig(e2e_s=0.3)   # plain's ~0.38 s E2E misses it, speculative's ~0.22 s meets it
    assert all(v < 0 for v in goodput_values([plain(i) for i in range(5)], limits))
    assert all(v > 0 for v in goodput_values([spec(i) for i in range(5)], limits))
    fig = cell_figures([fail(send_time=1000 + i) for i in range(20)], [plain(i) for i in range(20)], level=1, resamples=100)
    assert fig["speedup"]["goodput"]["speedup"] == pytest.approx(0.0)
    assert "tpot_p50" in fig["speedup"] and fig["speedup"]["tpot_p50"]["speedup"] is None   # no complete spec request


def test_open_loop_goodput_is_the_good_fraction_times_the_rate():
    fig = cell_figures([spec(i) for i in range(20)], [plain(i) for i in range(10)] + [fail(send_time=1000 + i, server="ref") for i in range(10)],
                       level=4, level_kind="rate", resamples=100)
    g = fig["speedup"]["goodput"]
    assert g["plain"] == pytest.approx(2.0) and g["spec"] == pytest.approx(4.0) and g["speedup"] == pytest.approx(2.0)


def test_too_few_values_leave_the_speedup_unestimated():
    fig = cell_figures([spec(i) for i in range(3)], [plain(i) for i in range(3)], level=1, resamples=50)
    assert fig["speedup"]["tpot_p50"]["speedup"] is None and fig["speedup"]["goodput"]["speedup"] is None


def test_bad_level_kind():
    with pytest.raises(ValueError, match="level_kind"):
        cell_figures([], [], level=1, level_kind="users")


def test_the_sweep_table_shows_an_interval_with_one_open_end():
    """Measured on the shipped sweep: a cell whose interval had a low end but no high one
    crashed the table (TypeError); it shows "?" for the open end."""
    assert _speed({"speedup": 1.5, "low": 1.2, "high": None}) == "1.50 [1.20, ?]"
    assert _speed({"speedup": 1.5, "low": None, "high": None}) == "1.50"
    assert _speed({"speedup": 1.5, "low": 1.2, "high": 1.8}) == "1.50 [1.20, 1.80]"
    assert _speed(None) == "—"

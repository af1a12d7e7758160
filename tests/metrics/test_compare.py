"""Run-vs-run statistics (harness.metrics.compare): bootstrap intervals of a change and the
verdict against a tolerance — a real slowdown is a regression, the same data is within,
too little data is inconclusive or not judged, and the spread between repeats widens the
interval (two-level bootstrap)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.metrics.compare import bootstrap_change, bootstrap_changes, judge


def lat(mean: float, n: int, seed: int, sd: float = 0.1) -> list[float]:
    return list(np.random.default_rng(seed).lognormal(np.log(mean), sd, n))


def p95(v):
    return float(np.percentile(v, 95))


def test_a_real_slowdown_is_a_regression_and_a_speedup_an_improvement():
    a = [lat(0.100, 400, 1)]
    slower = bootstrap_change(a, [lat(0.150, 400, 2)], p95, resamples=300)
    assert slower.change == pytest.approx(0.5, abs=0.1) and slower.low > 0.1
    assert judge(slower, 0.10, "up") == "regression"
    faster = bootstrap_change(a, [lat(0.060, 400, 3)], p95, resamples=300)
    assert judge(faster, 0.10, "up") == "improvement"


def test_the_same_data_is_within_any_tolerance():
    a = [lat(0.1, 300, 4)]
    est = bootstrap_change(a, a, np.median, resamples=200)
    assert est.change == 0 and est.low <= 0 <= est.high
    assert judge(est, 0.10, "up") == "within"


def test_little_data_is_inconclusive_and_too_little_not_judged():
    small = bootstrap_change([lat(0.1, 12, 5, sd=0.5)], [lat(0.105, 12, 6, sd=0.5)], np.median, resamples=300)
    assert judge(small, 0.10, "up") == "inconclusive"
    none = bootstrap_change([lat(0.1, 8, 5)], [lat(0.12, 8, 6)], p95, min_values=10)
    assert none.low is None and judge(none, 0.10, "up") == "not_judged"
    assert bootstrap_change([[]], [lat(0.1, 20, 1)], p95).a is None


def test_a_drop_in_acceptance_is_a_regression_when_lower_is_worse():
    a = [[0.80], [0.82], [0.79]]
    b = [[0.60], [0.62], [0.58]]
    est = bootstrap_change(a, b, np.mean, relative=False, per_run=True, resamples=300)
    assert est.change == pytest.approx(-0.203, abs=0.01)
    assert judge(est, 0.05, "down") == "regression" and judge(est, 0.05, "up") == "improvement"


def test_a_per_run_figure_needs_two_runs_a_side():
    est = bootstrap_change([[10.0]], [[20.0]], np.mean, per_run=True)
    assert est.change == pytest.approx(1.0) and est.low is None and judge(est, 0.2, "up") == "not_judged"


def test_spread_between_repeats_widens_the_interval():
    """The same pooled values, once as one run, once as three repeats that disagree: the
    two-level bootstrap gives the repeats a wider interval."""
    runs = [lat(0.08, 100, 7), lat(0.10, 100, 8), lat(0.13, 100, 9)]
    pooled = [sum(runs, [])]
    b = [lat(0.11, 300, 10)]
    one = bootstrap_change(pooled, b, np.median, resamples=400)
    three = bootstrap_change(runs, b, np.median, resamples=400)
    assert one.change == pytest.approx(three.change)
    assert (three.high - three.low) > 1.5 * (one.high - one.low)


def test_seeded_and_several_statistics_at_once():
    a, b = [lat(0.1, 200, 11)], [lat(0.12, 200, 12)]
    x = bootstrap_changes(a, b, lambda v: np.percentile(v, (50, 95, 99)), resamples=200, seed=3)
    y = bootstrap_changes(a, b, lambda v: np.percentile(v, (50, 95, 99)), resamples=200, seed=3)
    assert x == y and len(x) == 3
    assert x[0].change == pytest.approx(bootstrap_change(a, b, np.median, resamples=200, seed=3).change)


@pytest.mark.parametrize("kw", [{"confidence": 1.0}, {"confidence": 0}, {"resamples": 5}])
def test_bad_parameters_raise(kw):
    with pytest.raises(ValueError):
        bootstrap_change([[1.0]], [[1.0]], np.mean, **kw)


def test_no_values_on_either_side_is_not_judged():
    est = bootstrap_change([[]], [[]], np.mean)
    assert est.a is None and est.b is None and judge(est, 0.1, "up") == "not_judged"
    assert bootstrap_changes([], [], lambda v: np.percentile(v, (50, 95))) == []

"""Run-vs-run statistics (harness.metrics.compare): intervals of a change with repeats as
clusters and the verdict against a tolerance — a real slowdown is a regression, the same
data is within, too little data is inconclusive or not judged, one run a side needs
repeats, the spread between repeats widens the interval; Student's t, the one-sided
p-values and the Holm and Benjamini–Hochberg adjustments against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from harness.metrics.compare import (
    Estimate,
    adjust,
    bootstrap_change,
    bootstrap_changes,
    cluster_changes,
    judge,
    p_values,
    t_quantile,
    t_sf,
)


def lat(mean: float, n: int, seed: int, sd: float = 0.1) -> list[float]:
    return list(np.random.default_rng(seed).lognormal(np.log(mean), sd, n))


def p95(v):
    return float(np.percentile(v, 95))


def runs(mean: float, k: int, seed: int, n: int = 150, run_sd: float = 0.03) -> list[list[float]]:
    """``k`` runs of ``n`` latencies, each run's scale drawn around ``mean`` (host noise)."""
    rng = np.random.default_rng([seed, 99])
    return [lat(mean * float(rng.lognormal(0, run_sd)), n, seed * 100 + i) for i in range(k)]


def one(a, b, stat=p95, **kw) -> Estimate:
    (est,) = cluster_changes(a, b, lambda v: np.array([stat(v)]), resamples=kw.pop("resamples", 300), **kw)
    return est


def test_a_real_slowdown_is_a_regression_and_a_speedup_an_improvement():
    a = runs(0.100, 3, 1)
    slower = one(a, runs(0.150, 3, 2))
    assert slower.change == pytest.approx(0.5, abs=0.1) and slower.low > 0.1 and slower.scale == "log"
    assert judge(slower, 0.10, "up") == "regression"
    faster = one(a, runs(0.060, 3, 3))
    assert judge(faster, 0.10, "up") == "improvement"


def test_the_same_data_is_within_any_tolerance():
    a = runs(0.1, 3, 4)
    est = one(a, a, np.median)
    assert est.change == 0 and est.low <= 0 <= est.high
    assert judge(est, 0.10, "up") == "within"


def test_one_run_a_side_needs_repeats_however_large_the_change():
    """A bootstrap over one run's requests cannot see the spread between runs: no
    interval, no p-value, and the verdict says so."""
    est = one([lat(0.1, 400, 1)], [lat(0.3, 400, 2)])
    assert est.change == pytest.approx(2.0, abs=0.3) and est.low is None and est.se is None
    assert p_values(est, 0.1, "up") is None
    assert judge(est, 0.10, "up") == "needs_repeats"
    assert judge(one(runs(0.1, 3, 1), [lat(0.3, 400, 2)]), 0.10, "up") == "needs_repeats"


def test_little_data_is_inconclusive_and_too_little_not_judged():
    small = one(runs(0.1, 2, 5, n=12, run_sd=0.2), runs(0.105, 2, 6, n=12, run_sd=0.2), np.median)
    assert judge(small, 0.10, "up") == "inconclusive"
    none = one(runs(0.1, 3, 5, n=8), runs(0.12, 3, 6, n=8), min_values=30)
    assert none.low is None and judge(none, 0.10, "up") == "not_judged"
    assert one([[]], [lat(0.1, 20, 1)]).a is None


def test_a_drop_in_acceptance_is_a_regression_when_lower_is_worse():
    a = [[0.80], [0.82], [0.79]]
    b = [[0.60], [0.62], [0.58]]
    est = one(a, b, np.mean, relative=False, per_run=True)
    assert est.change == pytest.approx(-0.203, abs=0.01) and est.scale == "absolute"
    assert judge(est, 0.05, "down") == "regression" and judge(est, 0.05, "up") == "improvement"


def test_one_value_per_run_is_welchs_t_test():
    """Per-run figures: the bootstrap's se (with the n/(n-1) correction) is Welch's
    standard error s_a²/n_a + s_b²/n_b, and the degrees of freedom Welch–Satterthwaite's."""
    a, b = [1.0, 1.2, 0.9, 1.1], [1.5, 1.9, 1.6]
    est = one([[x] for x in a], [[x] for x in b], np.mean, relative=False, per_run=True, resamples=4000)
    va, vb = np.var(a, ddof=1) / 4, np.var(b, ddof=1) / 3
    assert est.se == pytest.approx(np.sqrt(va + vb), rel=0.08)
    welch = (va + vb) ** 2 / (va ** 2 / 3 + vb ** 2 / 2)
    assert est.df == pytest.approx(welch, rel=0.2)


def test_student_t_against_its_table():
    """Two-sided 95 % quantiles of Student's t (any statistics table) and P(T > 2) at 7 df."""
    for df, q in [(1, 12.706), (2, 4.303), (3, 3.182), (5, 2.571), (10, 2.228), (30, 2.042)]:
        assert t_quantile(0.975, df) == pytest.approx(q, abs=1e-3)
        assert t_sf(q, df) == pytest.approx(0.025, abs=1e-4)
    assert t_sf(2.0, 7) == pytest.approx(0.04281, abs=1e-5)
    assert t_sf(-2.0, 7) == pytest.approx(1 - 0.04281, abs=1e-5)
    assert t_sf(0.0, 4) == 0.5 and t_sf(float("inf"), 3) == 0.0
    assert t_sf(2.0, 2.5) == pytest.approx((t_sf(2.0, 2) + t_sf(2.0, 3)) / 2)   # between integer df


def test_p_values_of_a_change_beyond_its_tolerance():
    """d = log(1.5), tolerance log(1.1), se 0.1, 5 df: t = (0.4055 - 0.0953) / 0.1 = 3.102,
    P(T5 > 3.102) = 0.0134; the improvement side P(T5 > (log 0.9 - log 1.5) / 0.1 = -5.108) = 0.9981."""
    est = Estimate(1.0, 1.5, 0.5, 0.2, 0.9, 100, 100, 3, 3, se=0.1, df=5.0, scale="log")
    reg, imp = p_values(est, 0.10, "up")
    assert reg == pytest.approx(0.0134, abs=2e-4) and imp == pytest.approx(0.9981, abs=2e-4)
    assert p_values(est, 0.10, "down") == (imp, reg)
    assert judge(est, 0.10, "up", p_regression=0.2) == "inconclusive"   # adjusted away
    flat = Estimate(0.8, 0.2, -0.6, -0.6, -0.6, 3, 3, 3, 3, se=0.0, df=4.0, scale="absolute")
    assert p_values(flat, 0.05, "down") == (0.0, 1.0)


def test_holm_and_benjamini_hochberg_by_hand():
    """p = 0.01, 0.04, 0.03, 0.005 (and one figure outside the family).
    Holm: sorted 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 → monotone 0.06.
    BH: sorted 0.005·4/1 = 0.02, 0.01·4/2 = 0.02, 0.03·4/3 = 0.04, 0.04·4/4 = 0.04."""
    p = [0.01, 0.04, 0.03, 0.005, None]
    assert adjust(p, "holm") == pytest.approx([0.03, 0.06, 0.06, 0.02, None])
    assert adjust(p, "bh") == pytest.approx([0.02, 0.04, 0.04, 0.02, None])
    assert adjust(p, "none") == p
    assert adjust([0.5, 0.9], "holm") == [1.0, 1.0] and adjust([], "bh") == []
    with pytest.raises(ValueError):
        adjust([0.1], "sidak")   # type: ignore[arg-type]


def test_a_per_run_figure_needs_two_runs_a_side():
    est = bootstrap_change([[10.0]], [[20.0]], np.mean, per_run=True)
    assert est.change == pytest.approx(1.0) and est.low is None
    assert judge(one([[10.0]], [[20.0]], np.mean, per_run=True), 0.2, "up") == "needs_repeats"


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
    with pytest.raises(ValueError):
        cluster_changes([[1.0]], [[1.0]], lambda v: np.array([v.mean()]), **kw)


def test_no_values_on_either_side_is_not_judged():
    est = bootstrap_change([[]], [[]], np.mean)
    assert est.a is None and est.b is None and judge(est, 0.1, "up") == "not_judged"
    assert bootstrap_changes([], [], lambda v: np.percentile(v, (50, 95))) == []
    assert cluster_changes([], [], lambda v: np.percentile(v, (50, 95))) == []


def test_repeats_that_disagree_widen_the_cluster_interval():
    """Three repeats whose medians differ by 20-30 % against three that agree, over the
    same number of requests: the spread between runs is in the interval."""
    agree = [lat(0.10, 100, 20 + i) for i in range(3)]
    disagree = [lat(m, 100, 30 + i) for i, m in enumerate((0.08, 0.10, 0.13))]
    b = [lat(0.10, 100, 40 + i) for i in range(3)]
    narrow, wide = one(agree, b, np.median), one(disagree, b, np.median)
    assert (wide.high - wide.low) > 2 * (narrow.high - narrow.low)

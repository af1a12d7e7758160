"""Run-versus-run statistics: how a figure moved from side A (the last release, plain
decoding) to side B (the candidate, speculative decoding), how sure that is, and whether
the move is a regression beyond a stated tolerance.

**Repeats are the unit.** Each side is one or more runs (``specchaos run --repeat N``),
each run a sample of per-request values (a TTFT in seconds, a failed flag, ...). Two runs
of the same experiment on the same host differ by more than their requests' spread says
(an after-phase TTFT p95 moved +19 % between two identical runs), so a verdict needs the
spread *between runs*, and that needs at least :data:`MIN_RUNS` runs a side. With fewer,
:func:`cluster_changes` gives the change and no interval, and :func:`judge` says
``needs_repeats``.

**Interval** (:func:`cluster_changes`): a *two-level* (cluster) bootstrap per side: a
resample draws the side's runs with replacement, then each drawn run's values with
replacement, pools them and computes the statistic (Davison & Hinkley, *Bootstrap Methods
and their Application*, 1997, §3.8, resampling both stages, which errs on the wide side).
Figures with one value per run (a recovery time, a phase's acceptance rate as vLLM counted
it) are resampled over runs only. A side's variance of the statistic is the larger of the
draws' variance and ``S² / n``, ``S²`` the sample variance of the ``n`` runs' own
statistics (the classic estimate for a mean of clusters, which the bootstrap shrinks by
``(n − 1) / n`` where runs differ more than their requests do); the change's standard
error ``se`` is the root of the two sides' sum, and its interval ``d ± t·se`` with Student's ``t`` at
the Welch–Satterthwaite degrees of freedom — a normal-theory bootstrap
interval (Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993, §13.2) with the
few-runs tail. ``d`` is the log ratio ``log(B / A)`` for a relative figure (a ratio's
distribution is close to symmetric on that scale; the interval is shown as ``B / A − 1``),
``B − A`` for an absolute one. For one value per run this is Welch's t-test.

**p-values** (:func:`p_values`): one-sided, of "the change lies beyond the tolerance in
the worse direction" (a regression) and "… in the better direction" (an improvement),
from the same ``d``, ``se`` and ``t``. Several figures are tested at once, so the family's
p-values are adjusted (:func:`adjust`: Benjamini–Hochberg, or Holm) before
:func:`judge` compares them with ``alpha``.

**Verdict of one figure** (:func:`judge`): with ``worse`` the direction that hurts
(``"up"`` for latencies, error rates, recovery times; ``"down"`` for acceptance,
throughput, goodput) and a tolerance in the change's unit (a fraction for a relative
change, the figure's unit for an absolute one): ``regression`` when the adjusted p-value
of a regression is at most ``alpha``; ``improvement`` likewise; ``within`` when the
interval lies inside ``[-tolerance, +tolerance]``; else ``inconclusive`` (more repeats
would tell). ``needs_repeats`` with fewer than :data:`MIN_RUNS` runs on a side;
``not_judged`` when a side has no value or too few samples.

:func:`bootstrap_changes` is the one-level percentile interval the sweep uses for its
speed-ups (one run per cell).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import numpy as np

__all__ = ["Estimate", "MIN_RUNS", "bootstrap_change", "bootstrap_changes", "cluster_changes", "p_values",
           "adjust", "judge", "t_sf", "t_quantile", "Verdict", "Correction"]

Verdict = Literal["regression", "improvement", "within", "inconclusive", "needs_repeats", "not_judged"]
Correction = Literal["bh", "holm", "none"]

#: Runs a side needs before the spread between runs can be estimated (module doc).
MIN_RUNS = 2

#: A statistic of pooled values: ``f(values) -> float`` (NaN when undefined).
Statistic = Callable[[np.ndarray], float]


@dataclass(frozen=True)
class Estimate:
    """A figure on both sides and its change.

    Fields:
        a, b: the statistic over each side's pooled values (None without values).
        change: ``b / a - 1`` (relative) or ``b - a`` (absolute); None when undefined
            (a side without values, or ``a == 0`` for a relative change).
        low, high: the change's confidence interval (None when not bootstrapped).
        n_a, n_b: values pooled on each side; runs_a, runs_b: runs on each side.
        se: the change's standard error on the test scale (None: no interval);
            df: its degrees of freedom; scale: ``"log"`` (``log(b / a)``),
            ``"relative"`` (``b / a − 1``, where a side's statistic is 0) or ``"absolute"``
            (``b − a``) — :func:`cluster_changes` only.
    """

    a: float | None
    b: float | None
    change: float | None
    low: float | None
    high: float | None
    n_a: int
    n_b: int
    runs_a: int
    runs_b: int
    se: float | None = None
    df: float | None = None
    scale: Literal["log", "relative", "absolute"] = "absolute"


def _pooled(runs: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(r, dtype=float) for r in runs]) if runs else np.zeros(0)


def _change(a: float, b: float, relative: bool) -> float:
    if relative:
        return b / a - 1.0 if a != 0 else float("nan")
    return b - a


def _resample(runs: Sequence[np.ndarray], rng: np.random.Generator, within: bool) -> np.ndarray:
    """One two-level resample of a side: runs with replacement, then (``within``) each
    drawn run's values with replacement; pooled."""
    picks = rng.integers(0, len(runs), size=len(runs))
    parts = []
    for i in picks:
        r = runs[i]
        parts.append(r[rng.integers(0, len(r), size=len(r))] if within and len(r) else r)
    return np.concatenate(parts) if parts else np.zeros(0)


def _sides(a_runs: Sequence[Sequence[float]], b_runs: Sequence[Sequence[float]],
           stats: Callable[[np.ndarray], np.ndarray], min_values: int
           ) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray | None, np.ndarray | None, tuple[int, int, int, int],
                      list[Estimate]]:
    """Each side's runs with values, its pooled statistics (None when it has fewer than
    ``min_values`` values), the sizes ``(n_a, n_b, runs_a, runs_b)`` and the estimates
    without a change (what is returned when a side is short)."""
    A = [np.asarray(r, dtype=float) for r in a_runs if len(r)]
    B = [np.asarray(r, dtype=float) for r in b_runs if len(r)]
    pa, pb = _pooled(A), _pooled(B)
    sizes = (len(pa), len(pb), len(A), len(B))
    sa = np.asarray(stats(pa), dtype=float) if len(pa) else None
    sb = np.asarray(stats(pb), dtype=float) if len(pb) else None
    m = len(sa) if sa is not None else len(sb) if sb is not None else 0
    bare = [Estimate(None if sa is None else float(sa[i]), None if sb is None else float(sb[i]), None, None, None,
                     *sizes) for i in range(m)]
    if len(pa) < min_values or len(pb) < min_values:
        return A, B, None, None, sizes, bare
    return A, B, sa, sb, sizes, bare


def _points(sa: np.ndarray, sb: np.ndarray, relative: bool, sizes: tuple[int, int, int, int]) -> list[Estimate]:
    """The estimates with the change and no interval."""
    out = []
    for x, y in zip(sa, sb):
        c = _change(float(x), float(y), relative)
        out.append(Estimate(float(x), float(y), None if math.isnan(c) else c, None, None, *sizes))
    return out


def _draws(A: Sequence[np.ndarray], B: Sequence[np.ndarray], stats: Callable[[np.ndarray], np.ndarray], m: int,
           per_run: bool, resamples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``resamples`` two-level resamples of each side's ``m`` statistics (module doc):
    two arrays of shape ``(resamples, m)``, A's and B's."""
    rng = np.random.default_rng([seed, 7])
    da, db = np.empty((resamples, m)), np.empty((resamples, m))
    with np.errstate(divide="ignore", invalid="ignore"):
        for k in range(resamples):
            da[k] = stats(_resample(A, rng, not per_run))
            db[k] = stats(_resample(B, rng, not per_run))
    return da, db


def _check(confidence: float, resamples: int) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if resamples < 10:
        raise ValueError(f"resamples must be at least 10, got {resamples}")


def bootstrap_change(a_runs: Sequence[Sequence[float]], b_runs: Sequence[Sequence[float]], stat: Statistic, *,
                     relative: bool = True, per_run: bool = False, confidence: float = 0.95,
                     resamples: int = 1000, seed: int = 0, min_values: int = 1) -> Estimate:
    """The change of ``stat`` from A to B with a percentile bootstrap interval (module doc).

    Args:
        a_runs, b_runs: per run, the values (e.g. TTFT in seconds of each complete request;
            1.0/0.0 per logical request for an error rate; one value for a per-run figure).
        stat: computed over a side's pooled values (``np.median``, a quantile, ``np.mean``).
        relative: measure the change as ``b / a - 1`` (else ``b - a``).
        per_run: the values are one figure per run: resample runs only; needs two runs
            per side for an interval.
        confidence: the interval's coverage in (0, 1).
        resamples: bootstrap resamples (more: a steadier interval, slower).
        seed: numpy's PCG64 seed (the same inputs and seed give the same interval).
        min_values: fewer pooled values on a side leaves the change unestimated.

    Returns:
        An :class:`Estimate`; ``low``/``high`` None when a side is short of values (or of
        runs, with ``per_run``) or the change is undefined.

    Raises:
        ValueError: ``confidence`` outside (0, 1) or ``resamples`` < 10.
    """
    ests = bootstrap_changes(a_runs, b_runs, lambda v: np.array([stat(v)]), relative=relative, per_run=per_run,
                             confidence=confidence, resamples=resamples, seed=seed, min_values=min_values)
    return ests[0] if ests else Estimate(None, None, None, None, None, 0, 0, 0, 0)


def bootstrap_changes(a_runs: Sequence[Sequence[float]], b_runs: Sequence[Sequence[float]],
                      stats: Callable[[np.ndarray], np.ndarray], *, relative: bool = True, per_run: bool = False,
                      confidence: float = 0.95, resamples: int = 1000, seed: int = 0,
                      min_values: int = 1) -> list[Estimate]:
    """:func:`bootstrap_change` for several statistics of the same values at once (one
    resample serves them all: p50, p95 and p99 of one latency). ``stats`` maps pooled
    values to a 1-D array of ``m`` statistics; returns ``m`` estimates in that order ([]
    when neither side has a value). Raises as :func:`bootstrap_change`."""
    _check(confidence, resamples)
    A, B, sa, sb, sizes, bare = _sides(a_runs, b_runs, stats, min_values)
    if sa is None or sb is None:
        return bare
    m = len(sa)
    changes = np.array([_change(float(x), float(y), relative) for x, y in zip(sa, sb)])
    if per_run and (len(A) < 2 or len(B) < 2):
        return _points(sa, sb, relative, sizes)
    da, db = _draws(A, B, stats, m, per_run, resamples, seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        draws = db / da - 1.0 if relative else db - da
    tail = (1 - confidence) / 2 * 100
    out = []
    for i in range(m):
        col = draws[:, i]
        col = col[np.isfinite(col)]
        if np.isnan(changes[i]) or len(col) < resamples // 2:
            out.append(Estimate(float(sa[i]), float(sb[i]), None if np.isnan(changes[i]) else float(changes[i]),
                                None, None, *sizes))
            continue
        low, high = np.percentile(col, [tail, 100 - tail])
        out.append(Estimate(float(sa[i]), float(sb[i]), float(changes[i]), float(low), float(high), *sizes))
    return out


def cluster_changes(a_runs: Sequence[Sequence[float]], b_runs: Sequence[Sequence[float]],
                    stats: Callable[[np.ndarray], np.ndarray], *, relative: bool = True, per_run: bool = False,
                    confidence: float = 0.95, resamples: int = 1000, seed: int = 0, min_values: int = 1,
                    min_runs: int = MIN_RUNS) -> list[Estimate]:
    """The change of each of ``m`` statistics from A to B with a cluster-bootstrap standard
    error, degrees of freedom and interval (module doc).

    Args:
        a_runs, b_runs: per run, the values (seconds, 1.0/0.0 flags, or one figure per run).
        stats: pooled values → a 1-D array of ``m`` statistics (NaN where undefined).
        relative: the change is ``b / a − 1`` (tested as ``log(b / a)``), else ``b − a``.
        per_run: one value per run: resample runs only.
        confidence: the interval's coverage in (0, 1).
        resamples: bootstrap resamples per side.
        seed: numpy's PCG64 seed (the same inputs and seed give the same result).
        min_values: fewer pooled values on a side leaves the change unestimated.
        min_runs: fewer runs (with values) on a side leaves the change without ``se``
            and interval (the spread between runs is unknown).

    Returns:
        ``m`` :class:`Estimate` (``[]`` when neither side has a value); ``se``, ``df``,
        ``low``, ``high`` None when a side is short of runs or values, the change is
        undefined (``a == 0`` for a relative change) or most draws are undefined.

    Raises:
        ValueError: ``confidence`` outside (0, 1) or ``resamples`` < 10.
    """
    _check(confidence, resamples)
    A, B, sa, sb, sizes, bare = _sides(a_runs, b_runs, stats, min_values)
    if sa is None or sb is None:
        return bare
    points = _points(sa, sb, relative, sizes)
    if len(A) < min_runs or len(B) < min_runs:
        return points
    da, db = _draws(A, B, stats, len(sa), per_run, resamples, seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        ra = np.array([np.asarray(stats(r), dtype=float) for r in A])
        rb = np.array([np.asarray(stats(r), dtype=float) for r in B])
    return [est if est.change is None else
            _interval(est, (da[:, i], ra[:, i]), (db[:, i], rb[:, i]), relative, confidence, resamples)
            for i, est in enumerate(points)]


def _interval(est: Estimate, a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray], relative: bool,
              confidence: float, resamples: int) -> Estimate:
    """``est`` with ``se``, ``df``, ``scale`` and the interval from each side's
    ``(bootstrap draws, per-run statistics)`` of the statistic (module doc)."""
    assert est.a is not None and est.b is not None and est.change is not None
    da, db = a[0][np.isfinite(a[0])], b[0][np.isfinite(b[0])]
    if len(da) < resamples // 2 or len(db) < resamples // 2:
        return est
    scale: Literal["log", "relative", "absolute"] = "absolute"
    if relative:
        logs = est.a > 0 and est.b > 0 and (da > 0).all() and (db > 0).all() and (a[1] > 0).all() and (b[1] > 0).all()
        scale = "log" if logs else "relative"

    def g(v: np.ndarray) -> np.ndarray:
        return np.log(v) if scale == "log" else v / est.a if scale == "relative" else v   # type: ignore[operator]

    d = math.log(est.b / est.a) if scale == "log" else est.change
    va, vb = _side_variance(g(da), g(a[1])), _side_variance(g(db), g(b[1]))
    se = math.sqrt(va + vb)
    den = va * va / (est.runs_a - 1) + vb * vb / (est.runs_b - 1)
    df = max(1.0, (va + vb) ** 2 / den) if den > 0 else float(est.runs_a + est.runs_b - 2)
    q = t_quantile(1 - (1 - confidence) / 2, df)
    lo, hi = d - q * se, d + q * se
    if scale == "log":
        lo, hi = math.expm1(lo), math.expm1(hi)
    return Estimate(est.a, est.b, est.change, lo, hi, est.n_a, est.n_b, est.runs_a, est.runs_b, se=se, df=df,
                    scale=scale)


def _side_variance(draws: np.ndarray, per_run: np.ndarray) -> float:
    """A side's variance of the statistic: the larger of the two-level bootstrap's and
    ``S² / n`` of the ``n`` runs' own statistics (module doc)."""
    runs = per_run[np.isfinite(per_run)]
    between = float(np.var(runs, ddof=1)) / len(runs) if len(runs) >= 2 else 0.0
    return max(float(np.var(draws, ddof=1)), between)


def t_sf(x: float, df: float) -> float:
    """``P(T > x)`` for Student's t with ``df`` ≥ 1 degrees of freedom: the closed forms
    of Abramowitz & Stegun 26.7.3–26.7.4 at integer ``df`` (the normal tail above 1000),
    linearly interpolated between the two integers around a fractional one. ``x`` may
    be ±inf."""
    if math.isinf(x):
        return 0.0 if x > 0 else 1.0
    df = max(1.0, df)
    low = math.floor(df)
    if df > low:
        w = df - low
        return (1 - w) * _t_sf_int(x, low) + w * _t_sf_int(x, low + 1)
    return _t_sf_int(x, low)


def _t_sf_int(x: float, nu: int) -> float:
    if nu > 1000:
        return 0.5 * math.erfc(x / math.sqrt(2))
    theta = math.atan(abs(x) / math.sqrt(nu))
    c2 = math.cos(theta) ** 2
    if nu % 2:   # A(t|nu) = 2/pi (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...))
        term, total = 1.0, 0.0
        if nu > 1:
            total = term
            for k in range(1, (nu - 3) // 2 + 1):
                term *= c2 * (2 * k) / (2 * k + 1)
                total += term
            total *= math.cos(theta)
        inside = 2 / math.pi * (theta + math.sin(theta) * total)
    else:        # A(t|nu) = sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...)
        term = total = 1.0
        for k in range(1, (nu - 2) // 2 + 1):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        inside = math.sin(theta) * total
    tail = max(0.0, (1 - inside) / 2)
    return tail if x >= 0 else 1 - tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile (``0.5 ≤ p < 1``) of Student's t with ``df`` degrees of freedom
    (as :func:`t_sf`), by bisection to 1e-10."""
    lo, hi = 0.0, 1e7
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_sf(mid, df) > 1 - p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-10:
            break
    return (lo + hi) / 2


def p_values(est: Estimate, tolerance: float, worse: Literal["up", "down"]) -> tuple[float, float] | None:
    """One-sided p-values ``(regression, improvement)`` of the change lying beyond
    ``tolerance`` in the worse and in the better direction (module doc); None without
    an ``se`` (:func:`cluster_changes`)."""
    if est.se is None or est.df is None or est.change is None:
        return None
    if est.scale == "log":
        d, upper = math.log1p(est.change), math.log1p(tolerance)
        lower = math.log1p(-tolerance) if tolerance < 1 else -math.inf
    else:
        d, upper, lower = est.change, tolerance, -tolerance

    def sf(excess: float) -> float:
        if est.se:
            return t_sf(excess / est.se, est.df)   # type: ignore[arg-type]
        return 0.0 if excess > 0 else 1.0

    above, below = sf(d - upper), sf(lower - d)
    return (above, below) if worse == "up" else (below, above)


def adjust(p: Sequence[float | None], method: Correction) -> list[float | None]:
    """Adjusted p-values of a family (None entries are not in it and stay None).

    ``bh``: Benjamini–Hochberg (1995): sorted ascending, ``p_(i) · m / i``, made monotone
    from the largest down, capped at 1; rejecting where the adjusted value ≤ alpha
    controls the false discovery rate at alpha (positively dependent tests included,
    Benjamini & Yekutieli 2001), and the family-wise error rate when no hypothesis is
    false. ``holm``: Holm (1979): ``p_(i) · (m − i + 1)``, made monotone from the
    smallest up, capped at 1; controls the family-wise error rate. ``none``: as given.
    """
    idx = [i for i, v in enumerate(p) if v is not None]
    out: list[float | None] = list(p)
    if method == "none" or not idx:
        return out
    order = sorted(idx, key=lambda i: p[i])   # type: ignore[arg-type, return-value]
    m = len(order)
    if method == "holm":
        run = 0.0
        for rank, i in enumerate(order):
            run = max(run, min(1.0, (m - rank) * p[i]))   # type: ignore[operator]
            out[i] = run
    elif method == "bh":
        run = 1.0
        for rank in range(m - 1, -1, -1):
            i = order[rank]
            run = min(run, p[i] * m / (rank + 1))   # type: ignore[operator]
            out[i] = run
    else:
        raise ValueError(f"unknown correction {method!r} (bh, holm, none)")
    return out


def judge(est: Estimate, tolerance: float, worse: Literal["up", "down"], *, p_regression: float | None = None,
          p_improvement: float | None = None, alpha: float = 0.05) -> Verdict:
    """The verdict of one figure (module doc). ``tolerance`` ≥ 0 in the change's unit;
    ``p_regression``/``p_improvement``: the family-adjusted p-values (:func:`adjust`;
    default: this figure's own, :func:`p_values`); ``alpha``: the level they are held to."""
    if est.change is None:
        return "not_judged"
    if min(est.runs_a, est.runs_b) < MIN_RUNS:
        return "needs_repeats"
    raw = p_values(est, tolerance, worse)
    if raw is None or est.low is None or est.high is None:
        return "not_judged"
    p_reg = raw[0] if p_regression is None else p_regression
    p_imp = raw[1] if p_improvement is None else p_improvement
    if p_reg <= alpha:
        return "regression"
    if p_imp <= alpha:
        return "improvement"
    if -tolerance <= est.low and est.high <= tolerance:
        return "within"
    return "inconclusive"

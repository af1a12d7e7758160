"""Run-versus-run statistics: how a figure moved from side A (the last release, plain
decoding) to side B (the candidate, speculative decoding), with a bootstrap confidence
interval, and whether the move is a regression beyond a stated tolerance.

**Bootstrap.** Each side is one or more runs (``specchaos run --repeat N``), each run a
sample of per-request values (a TTFT in seconds, a failed flag, ...). The interval of a
statistic's change is a *two-level* (cluster) percentile bootstrap: a resample draws the
side's runs with replacement, then each drawn run's values with replacement, pools them
and computes the statistic (Davison & Hinkley, *Bootstrap Methods and their Application*,
1997, §3.8, resampling both stages). With one run per side it is the ordinary bootstrap
over requests; with several, the spread between runs (a noisy host) widens the interval
as it should. Figures with one value per run (a recovery time, a phase's acceptance rate
as vLLM counted it) are bootstrapped over runs only, and need two runs per side.

**Verdict of one figure** (:func:`judge`): with ``worse`` the direction that hurts
(``"up"`` for latencies, error rates, recovery times; ``"down"`` for acceptance,
throughput, goodput) and the change measured relative (``B / A - 1``) or absolute
(``B - A``), the figure is a ``regression`` when the whole interval lies beyond the
tolerance in the worse direction, an ``improvement`` when it lies beyond it in the other,
``within`` when it lies inside ``[-tolerance, +tolerance]``, else ``inconclusive`` (more
repeats would tell). ``not_judged`` when a side has no value or too few samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import numpy as np

__all__ = ["Estimate", "bootstrap_change", "bootstrap_changes", "judge", "Verdict"]

Verdict = Literal["regression", "improvement", "within", "inconclusive", "not_judged"]

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
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if resamples < 10:
        raise ValueError(f"resamples must be at least 10, got {resamples}")
    A = [np.asarray(r, dtype=float) for r in a_runs if len(r)]
    B = [np.asarray(r, dtype=float) for r in b_runs if len(r)]
    pa, pb = _pooled(A), _pooled(B)
    sizes = (len(pa), len(pb), len(A), len(B))
    sa = np.asarray(stats(pa), dtype=float) if len(pa) else None
    sb = np.asarray(stats(pb), dtype=float) if len(pb) else None
    m = len(sa) if sa is not None else len(sb) if sb is not None else 0
    if sa is None or sb is None or len(pa) < min_values or len(pb) < min_values:
        return [Estimate(None if sa is None else float(sa[i]), None if sb is None else float(sb[i]), None, None, None,
                         *sizes) for i in range(m)]
    changes = np.array([_change(float(x), float(y), relative) for x, y in zip(sa, sb)])
    if per_run and (len(A) < 2 or len(B) < 2):
        return [Estimate(float(sa[i]), float(sb[i]), None if np.isnan(changes[i]) else float(changes[i]), None, None,
                         *sizes) for i in range(m)]
    rng = np.random.default_rng([seed, 7])
    draws = np.empty((resamples, m))
    with np.errstate(divide="ignore", invalid="ignore"):
        for k in range(resamples):
            ra, rb = np.asarray(stats(_resample(A, rng, not per_run))), np.asarray(stats(_resample(B, rng, not per_run)))
            draws[k] = rb / ra - 1.0 if relative else rb - ra
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


def judge(est: Estimate, tolerance: float, worse: Literal["up", "down"]) -> Verdict:
    """The verdict of one figure (module doc). ``tolerance`` ≥ 0 in the change's unit
    (a fraction for a relative change, the figure's unit for an absolute one)."""
    if est.change is None or est.low is None or est.high is None:
        return "not_judged"
    lo, hi = (est.low, est.high) if worse == "up" else (-est.high, -est.low)
    if lo > tolerance:
        return "regression"
    if hi < -tolerance:
        return "improvement"
    if -tolerance <= lo and hi <= tolerance:
        return "within"
    return "inconclusive"

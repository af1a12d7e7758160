"""Trend of a series over a long run: the Theil–Sen line (the median of the pairwise
slopes, Theil 1950, Sen 1968; ``scipy.stats.theilslopes`` computes the same slope).
Robust: up to ~29 % of the points may be outliers (a window hit by a GC pause, a noisy
neighbour) without moving the line much, where a least-squares fit would follow them.

Whether the series trends at all, given its own scatter: the Mann–Kendall test
(:func:`mann_kendall`; Mann 1945, Kendall 1975), the rank test that goes with Theil–Sen —
S = Σ sign(y_j − y_i) over pairs with t_j > t_i, its variance under "no trend" with the
correction for ties, z with a continuity correction, one-sided p-values from the normal
distribution (for n = 4 a strictly monotone series gives p = 0.045; the exact value is
1/24 = 0.042)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

__all__ = ["Trend", "theil_sen", "TrendTest", "mann_kendall"]


@dataclass(frozen=True)
class Trend:
    """A fitted line through ``(t, y)`` points.

    Fields:
        slope: y units per second of ``t``.
        start, end: the line's value at the first and at the last ``t``.
        span_s: last ``t`` − first ``t`` (seconds).
        points: how many points it rests on.
    """

    slope: float
    start: float
    end: float
    span_s: float
    points: int

    @property
    def change(self) -> float:
        """``end − start`` (absolute, in y units)."""
        return self.end - self.start

    def relative_change(self) -> float | None:
        """``end / start − 1``; None when the fitted start is not positive."""
        return self.end / self.start - 1.0 if self.start > 0 else None


def _pairs(t: Sequence[float], y: Sequence[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(t, y, i, j)`` as arrays, with the index pairs ``i < j`` of every two points.

    Raises:
        ValueError: ``t`` and ``y`` differ in length.
    """
    if len(t) != len(y):
        raise ValueError(f"t and y differ in length ({len(t)} vs {len(y)})")
    ta, ya = np.asarray(t, dtype=float), np.asarray(y, dtype=float)
    i, j = np.triu_indices(len(ta), k=1)
    return ta, ya, i, j


def theil_sen(t: Sequence[float], y: Sequence[float]) -> Trend | None:
    """The Theil–Sen line through the points (module doc): slope = median of
    ``(y_j − y_i) / (t_j − t_i)`` over pairs with ``t_j > t_i``, intercept = median of
    ``y − slope · t``. None with fewer than 2 distinct times.

    Args:
        t: times in seconds (any origin; sorted or not).
        y: values, same length.
    Raises:
        ValueError: ``t`` and ``y`` differ in length.
    """
    ta, ya, i, j = _pairs(t, y)
    dt = ta[j] - ta[i]
    ok = dt != 0
    if not ok.any():
        return None
    slopes = (ya[j] - ya[i])[ok] / dt[ok]
    slope = float(np.median(slopes))
    intercept = float(np.median(ya - slope * ta))
    t0, t1 = float(ta.min()), float(ta.max())
    return Trend(slope, intercept + slope * t0, intercept + slope * t1, t1 - t0, len(ta))


@dataclass(frozen=True)
class TrendTest:
    """The Mann–Kendall test of a series (module doc).

    Fields:
        s: Kendall's S (concordant − discordant pairs in time order).
        var_s: its variance under "no trend", ties corrected.
        z: (S − sign(S)) ÷ √var_s (0 when S is 0 or var_s is 0).
        p_increasing, p_decreasing: one-sided p-values of "no trend" against a rising and
            against a falling series.
        points: how many points it rests on.
    """

    s: int
    var_s: float
    z: float
    p_increasing: float
    p_decreasing: float
    points: int


def mann_kendall(t: Sequence[float], y: Sequence[float]) -> TrendTest:
    """The Mann–Kendall trend test of ``y`` ordered by ``t`` (module doc).

    Args:
        t: times (any origin; sorted or not; equal times are pairs without an order).
        y: values, same length.
    Raises:
        ValueError: ``t`` and ``y`` differ in length.
    """
    ta, ya, i, j = _pairs(t, y)
    n = len(ta)
    order = np.sign(ta[j] - ta[i])
    s = int(np.sum(order * np.sign(ya[j] - ya[i])))
    ties = sum(c * (c - 1) * (2 * c + 5) for c in Counter(ya.tolist()).values() if c > 1)
    var_s = (n * (n - 1) * (2 * n + 5) - ties) / 18.0
    z = (s - (1 if s > 0 else -1)) / var_s ** 0.5 if s != 0 and var_s > 0 else 0.0
    phi = NormalDist().cdf
    return TrendTest(s, var_s, z, 1.0 - phi(z), phi(z), n)

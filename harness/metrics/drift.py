"""Trend of a series over a long run: the Theil–Sen line (the median of the pairwise
slopes, Theil 1950, Sen 1968; ``scipy.stats.theilslopes`` computes the same slope).
Robust: up to ~29 % of the points may be outliers (a window hit by a GC pause, a noisy
neighbour) without moving the line much, where a least-squares fit would follow them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["Trend", "theil_sen"]


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
    if len(t) != len(y):
        raise ValueError(f"t and y differ in length ({len(t)} vs {len(y)})")
    ta, ya = np.asarray(t, dtype=float), np.asarray(y, dtype=float)
    i, j = np.triu_indices(len(ta), k=1)
    dt = ta[j] - ta[i]
    ok = dt != 0
    if not ok.any():
        return None
    slopes = (ya[j] - ya[i])[ok] / dt[ok]
    slope = float(np.median(slopes))
    intercept = float(np.median(ya - slope * ta))
    t0, t1 = float(ta.min()), float(ta.max())
    return Trend(slope, intercept + slope * t0, intercept + slope * t1, t1 - t0, len(ta))

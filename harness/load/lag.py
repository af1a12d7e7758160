"""Arrival lag of an open-loop or trace-replay pacer: how late each arrival was sent after
its planned instant, kept as a fixed-size histogram so an hours-long run at any rate costs
the same few hundred integers.

The pacer (the open loop's scheduler in :mod:`harness.load.locustfile`) adds one lag per
arrival with :meth:`LagHistogram.add`; each load process writes its histogram into
``load_stats.json`` (:meth:`LagHistogram.to_dict`), the workers' histograms merge by adding
counts (:meth:`LagHistogram.merge`), and :meth:`LagHistogram.summary` turns one into the
figures the report shows and the pacing check judges: lag p50/p95/p99/max and the share
of arrivals later than 1 ms and 10 ms (the thresholds aiperf and GuideLLM users read a
pacer's accuracy by).

Bins: lag 0 (an arrival sent on time or early) has its own bin; above it, bins are
log-spaced from 1 µs to 1000 s, :data:`BINS_PER_DECADE` per decade (each about 12 %
wide), and a lag beyond the last edge falls in the last bin. A percentile is read by
linear interpolation inside its bin, so it is within one bin's width (about 12 %) of the
exact value; ``max`` and the shares above 1 ms / 10 ms are exact (kept beside the bins).
Units: seconds throughout.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BINS_PER_DECADE", "LagHistogram", "EDGES_S", "LATE_THRESHOLDS_S"]

#: Log-spaced bins per decade of lag.
BINS_PER_DECADE = 20
_LO_EXP, _HI_EXP = -6, 3   # 1 µs .. 1000 s
#: Upper edges (seconds) of the bins above zero: ``EDGES_S[i]`` ends bin ``i + 1``.
EDGES_S: tuple[float, ...] = tuple(10 ** (_LO_EXP + i / BINS_PER_DECADE)
                                   for i in range((_HI_EXP - _LO_EXP) * BINS_PER_DECADE + 1))
#: The lateness thresholds whose shares are counted exactly (seconds): 1 ms and 10 ms.
LATE_THRESHOLDS_S = (0.001, 0.010)


def _label(threshold_s: float) -> str:
    return f"late_{threshold_s * 1000:g}ms"


@dataclass
class LagHistogram:
    """Counts of arrival lags (seconds), bounded in size whatever the number of arrivals.

    Fields:
        counts: ``counts[0]`` arrivals with lag 0 (or below 1 µs); for ``i >= 1``,
            ``counts[i]`` those up to ``EDGES_S[i-1]`` and above ``EDGES_S[i-2]`` (above
            1 µs for ``i == 1``); the last bin also takes anything above the last edge.
        n: arrivals added.
        total_s: sum of their lags (for the mean).
        max_s: the largest lag.
        late: ``{"late_1ms": k, "late_10ms": k}``: arrivals later than each threshold.
    """

    counts: list[int] = field(default_factory=lambda: [0] * (len(EDGES_S) + 1))
    n: int = 0
    total_s: float = 0.0
    max_s: float = 0.0
    late: dict[str, int] = field(default_factory=lambda: {_label(t): 0 for t in LATE_THRESHOLDS_S})

    def add(self, lag_s: float) -> None:
        """Count one arrival's lag in seconds (negative counts as 0: sent early is on time)."""
        lag = max(0.0, float(lag_s))
        self.n += 1
        self.total_s += lag
        if lag > self.max_s:
            self.max_s = lag
        if lag < EDGES_S[0]:
            self.counts[0] += 1
        else:
            self.counts[min(len(EDGES_S), 1 + bisect.bisect_left(EDGES_S, lag))] += 1
        for t in LATE_THRESHOLDS_S:
            if lag > t:
                self.late[_label(t)] += 1

    def merge(self, other: "LagHistogram") -> "LagHistogram":
        """A new histogram holding both (the workers of a distributed load)."""
        return LagHistogram(counts=[a + b for a, b in zip(self.counts, other.counts)], n=self.n + other.n,
                            total_s=self.total_s + other.total_s, max_s=max(self.max_s, other.max_s),
                            late={k: self.late.get(k, 0) + other.late.get(k, 0) for k in self.late})

    def quantile(self, q: float) -> float | None:
        """The ``q``-quantile (0..1) of the lags in seconds, interpolated inside its bin and
        never above ``max_s``; None without arrivals.

        Raises:
            ValueError: ``q`` outside [0, 1].
        """
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile {q} outside [0, 1]")
        if self.n == 0:
            return None
        rank = q * self.n
        seen = 0
        for i, c in enumerate(self.counts):
            if c == 0:
                continue
            if seen + c >= rank:
                if i == 0:
                    return 0.0
                lo = EDGES_S[i - 2] if i >= 2 else 0.0
                hi = EDGES_S[i - 1]
                value = lo + (hi - lo) * max(0.0, rank - seen) / c
                return min(value, self.max_s)
            seen += c
        return self.max_s

    def summary(self) -> dict[str, Any]:
        """The report's figures: ``{"n", "mean_s", "p50_s", "p95_s", "p99_s", "max_s",
        "share_late_1ms", "share_late_10ms"}`` (seconds and fractions of arrivals; None
        without arrivals)."""
        out: dict[str, Any] = {"n": self.n,
                               "mean_s": self.total_s / self.n if self.n else None,
                               "p50_s": self.quantile(0.50), "p95_s": self.quantile(0.95),
                               "p99_s": self.quantile(0.99), "max_s": self.max_s if self.n else None}
        for t in LATE_THRESHOLDS_S:
            key = _label(t)
            out[f"share_{key}"] = self.late[key] / self.n if self.n else None
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON form (sparse: only the non-zero bins, as ``{"index": count}``)."""
        return {"bins_per_decade": BINS_PER_DECADE, "n": self.n, "total_s": self.total_s, "max_s": self.max_s,
                "late": dict(self.late), "counts": {str(i): c for i, c in enumerate(self.counts) if c}}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "LagHistogram":
        """The histogram :meth:`to_dict` wrote (an empty one for None).

        Raises:
            ValueError: the data was written with other bins.
        """
        h = cls()
        if not data:
            return h
        if int(data.get("bins_per_decade", BINS_PER_DECADE)) != BINS_PER_DECADE:
            raise ValueError(f"lag histogram with {data.get('bins_per_decade')} bins per decade, "
                             f"expected {BINS_PER_DECADE}")
        for i, c in (data.get("counts") or {}).items():
            idx = int(i)
            if 0 <= idx < len(h.counts):
                h.counts[idx] += int(c)
        h.n = int(data.get("n", 0))
        h.total_s = float(data.get("total_s", 0.0))
        h.max_s = float(data.get("max_s", 0.0))
        for k, v in (data.get("late") or {}).items():
            h.late[k] = int(v)
        return h

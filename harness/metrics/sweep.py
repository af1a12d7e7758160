"""One sweep cell's figures: speculative against plain decoding on the same workload,
with bootstrap confidence intervals (pure functions of request records).

A cell's records come from one mirror-mode run (``load.mirror``: every request goes to the
speculative server and, interleaved, the same request to the non-speculative reference on
the same target, :mod:`harness.metrics.mirror`), taken over the measured phases and the
cell's prompt-length bucket and sampling class. Per figure, the *speedup* (> 1: speculation
helps):

* ``ttft_p50``, ``ttft_p99``, ``tpot_p50``: plain ÷ speculative percentile (seconds, over
  complete requests; definitions of :mod:`harness.metrics.latency`, as vLLM's benchmark);
* ``goodput``: speculative ÷ plain goodput. Closed loop (a concurrency level): by Little's
  law a server holding ``C`` requests in flight completes ``C ÷ mean E2E`` requests/s, so
  goodput at ``C`` is ``C × good ÷ Σ E2E`` over its tries (good: complete and within every
  per-request limit of ``slo.goodput``, :func:`harness.metrics.phases.is_good`; without
  limits every complete request counts, and goodput is throughput in requests/s). In mirror
  mode both servers answer the same requests one after the other, so requests per second
  of wall time cannot tell them apart; time per request can. Open loop (a rate): both see
  the same arrivals, goodput is ``rate × good ÷ tries``.

The interval of each speedup is :func:`harness.metrics.compare.bootstrap_changes` (the
statistics of ``specchaos compare``), plain as side A and speculative as side B, turned
from the change ``B / A − 1`` into the speedup (``1 / (1 + change)`` for latencies,
``1 + change`` for goodput). Acceptance is measured from the speculative streams
(:func:`harness.metrics.client_acceptance.tally`), per cell, so per sampling class and
bucket.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from harness.load.records import RequestRecord, is_complete
from harness.metrics.client_acceptance import tally
from harness.metrics.compare import Estimate, bootstrap_changes
from harness.metrics.config import GoodputConfig
from harness.metrics.latency import e2e_s, tpot_s, ttft_s
from harness.metrics.phases import is_good

__all__ = ["cell_figures", "goodput_values"]

#: Seconds a try without an end time stands for in the goodput's denominator.
_NO_TIME_S = 1e-9


def goodput_values(records: Sequence[RequestRecord], goodput: GoodputConfig | None) -> list[float]:
    """Per try: its E2E in seconds, positive when good, negative when not (so one array
    carries both what goodput counts and the time it divides by, and a bootstrap resample
    keeps each try whole). A try without E2E (failed before any output) counts
    :data:`_NO_TIME_S`."""
    out = []
    for r in records:
        e = e2e_s(r) or _NO_TIME_S
        good = is_complete(r)[0] and (is_good(r, goodput) if goodput is not None and goodput.enabled else True)
        out.append(e if good else -e)
    return out


def _closed_goodput(v: np.ndarray) -> float:
    """Goodput per request in flight: good ÷ Σ E2E (requests/s), NaN without time."""
    total = float(np.sum(np.abs(v)))
    return float(np.sum(v > 0)) / total if total > 0 else float("nan")


def _open_goodput(v: np.ndarray) -> float:
    return float(np.mean(v > 0)) if len(v) else float("nan")


def _latency(est: Estimate) -> dict[str, Any]:
    """A latency's speedup (plain ÷ speculative) from the change of speculative over plain."""
    def inv(x: float | None) -> float | None:
        return None if x is None or 1 + x <= 0 else 1.0 / (1.0 + x)
    return {"plain": est.a, "spec": est.b, "speedup": inv(est.change), "low": inv(est.high), "high": inv(est.low),
            "n_plain": est.n_a, "n_spec": est.n_b}


def cell_figures(spec: Sequence[RequestRecord], plain: Sequence[RequestRecord], *, level: float,
                 level_kind: str = "concurrency", k: int | None = None, goodput: GoodputConfig | None = None,
                 confidence: float = 0.95, resamples: int = 1000, seed: int = 0,
                 min_values: int = 10) -> dict[str, Any]:
    """A cell's figures (module doc).

    Args:
        spec, plain: the cell's load tries on the speculative and the reference server.
        level: requests in flight per server (``concurrency``) or requests/s (``rate``).
        level_kind: ``concurrency`` or ``rate``.
        k: the speculative server's ``num_speculative_tokens`` (acceptance; None: not measured).
        goodput: per-request limits (seconds); None or none set: every complete request is good.
        confidence, resamples, seed: of the bootstrap.
        min_values: fewer values on a side leaves a figure's speedup None.

    Returns:
        ``{"requests": {"spec", "plain"}, "complete": {...}, "error_rate": {...},
        "speedup": {"goodput"|"tpot_p50"|"ttft_p50"|"ttft_p99": {"plain", "spec",
        "speedup", "low", "high", "n_plain", "n_spec"}}, "acceptance_rate",
        "mean_acceptance_length"}``: latencies in seconds, goodput in requests/s.

    Raises:
        ValueError: ``level_kind`` unknown, or the bootstrap's (confidence, resamples).
    """
    if level_kind not in ("concurrency", "rate"):
        raise ValueError(f"level_kind must be concurrency or rate, got {level_kind!r}")
    kw = {"confidence": confidence, "resamples": resamples, "seed": seed, "min_values": min_values}
    sides = {"plain": list(plain), "spec": list(spec)}
    done = {n: [r for r in rs if is_complete(r)[0]] for n, rs in sides.items()}

    def vals(fn: Any, side: str) -> list[list[float]]:
        return [[v for v in (fn(r) for r in done[side]) if v is not None]]

    out: dict[str, Any] = {"requests": {n: len(rs) for n, rs in sides.items()},
                           "complete": {n: len(rs) for n, rs in done.items()},
                           "error_rate": {n: (1 - len(done[n]) / len(rs)) if rs else None for n, rs in sides.items()}}
    ttft = bootstrap_changes(vals(ttft_s, "plain"), vals(ttft_s, "spec"), lambda v: np.percentile(v, [50, 99]), **kw)
    tpot = bootstrap_changes(vals(tpot_s, "plain"), vals(tpot_s, "spec"), lambda v: np.percentile(v, [50]), **kw)
    stat = _closed_goodput if level_kind == "concurrency" else _open_goodput
    gp = bootstrap_changes([goodput_values(sides["plain"], goodput)], [goodput_values(sides["spec"], goodput)],
                           lambda v: np.array([stat(v)]), **kw)
    speed: dict[str, Any] = {}
    if gp:
        e = gp[0]
        scale = float(level)
        speed["goodput"] = {"plain": None if e.a is None else e.a * scale, "spec": None if e.b is None else e.b * scale,
                            "speedup": None if e.change is None else 1 + e.change,
                            "low": None if e.low is None else 1 + e.low, "high": None if e.high is None else 1 + e.high,
                            "n_plain": e.n_a, "n_spec": e.n_b}
    for name, ests, i in (("tpot_p50", tpot, 0), ("ttft_p50", ttft, 0), ("ttft_p99", ttft, 1)):
        if ests:
            speed[name] = _latency(ests[i])
    out["speedup"] = speed
    acc = tally(spec, k).to_dict() if k else None
    out["acceptance_rate"] = acc["acceptance_rate"] if acc else None
    out["mean_acceptance_length"] = acc["mean_acceptance_length"] if acc else None
    return out

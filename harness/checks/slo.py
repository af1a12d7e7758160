"""SLO and degradation checks over per-phase metrics (:func:`harness.metrics.phases.phase_metrics`).

* ``slo.<baseline|after>.<metric>_p95_s`` — p95 TTFT, TPOT, ITL (per token) and E2E
  within the declared SLO, and ``slo.<phase>.error_rate`` within ``slo.error_rate``;
* ``degradation.fault.error_rate`` — errors while the fault acts within
  ``fault_max_error_rate``;
* ``degradation.after_vs_baseline.<metric>_p95_ratio`` — after ÷ baseline p95 for TTFT,
  TPOT and E2E within ``after_vs_baseline_max_ratio``;
* ``coverage.<phase>.requests`` — every phase has at least ``min_requests_per_phase``.

A missing phase or a metric without data fails with ``observed=None``: nothing is ever
passed vacuously.
"""

from __future__ import annotations

from typing import Any

from harness.checks.base import CheckResult
from harness.experiment.config import DegradationConfig, SloConfig
from harness.metrics.phases import PHASES

__all__ = ["slo_checks"]

_SLO_METRICS = (("ttft", "ttft_s", "ttft_p95_s"), ("tpot", "tpot_s", "tpot_p95_s"), ("itl", "itl_s", "itl_p95_s"), ("e2e", "e2e_s", "e2e_p95_s"))
_RATIO_METRICS = (("ttft", "ttft_s"), ("tpot", "tpot_s"), ("e2e", "e2e_s"))


def _p95(phase: dict[str, Any] | None, key: str) -> float | None:
    if not phase:
        return None
    return (phase.get(key) or {}).get("p95")


def _le(name: str, category: str, observed: float | None, limit: float, what: str, missing: str) -> CheckResult:
    if observed is None:
        return CheckResult(name, category, False, None, limit, f"{what}: {missing}")
    ok = observed <= limit
    return CheckResult(name, category, ok, observed, limit, f"{what} {observed:.4g} {'≤' if ok else '>'} {limit:g}")


def slo_checks(phases: dict[str, dict], slo: SloConfig, deg: DegradationConfig) -> list[CheckResult]:
    """SLO, degradation and coverage checks.

    Args:
        phases: ``{phase: phase_metrics(...)}``; phases that never started are absent.
        slo: per-request SLOs (p95, seconds) and the allowed error rate.
        deg: degradation limits.

    Returns:
        Checks in a stable order: SLO for baseline then after, fault error rate,
        after-vs-baseline ratios, then coverage for every phase of
        :data:`~harness.metrics.phases.PHASES`.
    """
    out: list[CheckResult] = []
    for ph in ("baseline", "after"):
        m = phases.get(ph)
        missing = f"phase {ph!r} never ran" if m is None else "no complete request to measure"
        for short, key, limit_key in _SLO_METRICS:
            out.append(
                _le(f"slo.{ph}.{short}_p95_s", "slo", _p95(m, key), getattr(slo, limit_key), f"{ph} p95 {short.upper()} (s)", missing)
            )
        er = None if m is None else m.get("error_rate")
        out.append(
            _le(f"slo.{ph}.error_rate", "slo", er, slo.error_rate, f"{ph} error rate",
                missing if m is None else "no request sent")
        )

    if deg.fault_max_error_rate is not None:
        m = phases.get("fault")
        er = None if m is None else m.get("error_rate")
        out.append(
            _le("degradation.fault.error_rate", "degradation", er, deg.fault_max_error_rate, "fault-phase error rate",
                "phase 'fault' never ran" if m is None else "no request sent")
        )

    base, after = phases.get("baseline"), phases.get("after")
    for short, key in _RATIO_METRICS:
        name = f"degradation.after_vs_baseline.{short}_p95_ratio"
        b, a = _p95(base, key), _p95(after, key)
        limit = deg.after_vs_baseline_max_ratio
        what = f"after/baseline p95 {short.upper()}"
        if b is None or a is None:
            gone = [p for p, v in (("baseline", b), ("after", a)) if v is None]
            out.append(CheckResult(name, "degradation", False, None, limit, f"{what}: no data in {' and '.join(gone)}"))
            continue
        if b <= 0:
            ratio = 1.0 if a <= 0 else None
        else:
            ratio = a / b
        if ratio is None:
            out.append(CheckResult(name, "degradation", False, None, limit, f"{what}: baseline p95 is 0 and after is {a:.4g}"))
            continue
        out.append(_le(name, "degradation", ratio, limit, f"{what} ({a:.4g}/{b:.4g})", ""))

    for ph in PHASES:
        m = phases.get(ph)
        n = None if m is None else int(m.get("requests", 0))
        need = deg.min_requests_per_phase
        if n is None:
            out.append(CheckResult(f"coverage.{ph}.requests", "coverage", False, None, need, f"phase {ph!r} never ran"))
        else:
            ok = n >= need
            out.append(
                CheckResult(f"coverage.{ph}.requests", "coverage", ok, n, need,
                            f"{n} requests sent in phase {ph!r} ({'≥' if ok else '<'} {need} needed)")
            )
    return out

"""SLO, degradation and coverage checks over per-phase metrics
(:func:`harness.metrics.phases.phase_metrics`).

* ``slo.<baseline|after>.<metric>_p95_s`` — p95 TTFT, TPOT, ITL (per chunk, vLLM's
  definition), E2E and, when ``slo.itl_per_token_p95_s`` is set, ITL per token, within
  the declared SLO; ``slo.<phase>.error_rate`` within ``slo.error_rate``;
* ``degradation.fault.error_rate`` — errors while the fault acts within
  ``fault_max_error_rate`` (only when that limit is set);
* ``degradation.after_vs_baseline.<metric>_p95_ratio`` — after ÷ baseline p95 for TTFT,
  TPOT and E2E within ``after_vs_baseline_max_ratio``;
* ``degradation.fault_vs_baseline.<metric>_p95_ratio`` — the same for the fault phase
  within ``fault_vs_baseline_max_ratio`` (only when that limit is set: graceful
  degradation under a fault such as network jitter). A fault that adds a declared delay to
  every request by design (a ``latency`` toxic on the speculative server's load path:
  evidence ``declared_added_latency_s``, :func:`faults.toxics.max_chunk_delay_s`) has that
  delay taken off the fault phase's p95 TTFT and E2E before the ratio: what is judged is
  the stack's degradation beyond what the fault injects. A bare ratio would judge an
  absolute delay against the baseline's size (50 ms of jitter over an 80 ms baseline p95
  TTFT is a ratio near 3 on its own, and the verdict then flips with the host's noise);
* ``coverage.<phase>.requests`` — every phase has at least ``min_requests_per_phase``.

A missing phase or a metric without data fails with ``observed=None``: nothing is ever
passed vacuously. A latency check whose phase has complete requests, but fewer than
``metrics.min_samples`` (``min_samples`` here), is **not judged** (``passed`` None, the
reason in the detail): a p95 over one or two requests says nothing about the p95; the
same for a ratio when either phase is that thin. Error rates and coverage are always
judged (on logical requests, :mod:`harness.metrics.availability`). The steady-state probe
``within_slo`` judges the current phase with :func:`phase_slo_checks`, the same rules.
"""

from __future__ import annotations

from typing import Any

from harness.checks.base import CheckResult, RecordedRun
from harness.checks.config import DegradationConfig, SloConfig
from harness.metrics.phases import PHASES

__all__ = ["phase_slo_checks", "coverage_check", "slo_checks", "declared_added_latency", "check"]

#: (short name, phase metric key, SloConfig limit field) of every p95 latency SLO.
_SLO_METRICS = (("ttft", "ttft_s", "ttft_p95_s"), ("tpot", "tpot_s", "tpot_p95_s"), ("itl", "itl_s", "itl_p95_s"),
                ("itl_per_token", "itl_per_token_s", "itl_per_token_p95_s"), ("e2e", "e2e_s", "e2e_p95_s"))
_RATIO_METRICS = (("ttft", "ttft_s"), ("tpot", "tpot_s"), ("e2e", "e2e_s"))


def _p95(phase: dict[str, Any] | None, key: str) -> float | None:
    if not phase:
        return None
    return (phase.get(key) or {}).get("p95")


def _thin(m: dict[str, Any] | None, min_samples: int) -> int | None:
    """The complete requests a phase's latency figures rest on when that is fewer than
    ``min_samples`` but not none; None otherwise (enough, none at all, or no phase)."""
    if not m or m.get("complete") is None:
        return None
    k = int(m["complete"])
    return k if 0 < k < min_samples else None


def _not_judged(name: str, category: str, observed: float | None, limit: float, what: str, phase: str, k: int,
                min_samples: int) -> CheckResult:
    return CheckResult.not_judged(name, category, observed, limit,
                                  f"{what} rests on {k} complete request{'s' if k != 1 else ''} in phase {phase!r} "
                                  f"(< metrics.min_samples {min_samples})")


def _le(name: str, category: str, observed: float | None, limit: float, what: str, missing: str) -> CheckResult:
    if observed is None:
        return CheckResult(name, category, False, None, limit, f"{what}: {missing}")
    ok = observed <= limit
    return CheckResult(name, category, ok, observed, limit, f"{what} {observed:.4g} {'≤' if ok else '>'} {limit:g}")


def phase_slo_checks(phase: str, m: dict[str, Any] | None, slo: SloConfig, min_samples: int = 1) -> list[CheckResult]:
    """The SLO checks of one phase: p95 of each latency metric whose limit is set, and
    the error rate.

    Args:
        phase: the phase's name (used in check names, e.g. ``slo.after.ttft_p95_s``).
        m: the phase's metrics, None if the phase never ran.
        slo: the limits (seconds, p95; error rate as a fraction).
        min_samples: latency checks of a phase with fewer complete requests (but at least
            one) are not judged (``metrics.min_samples``; default 1: always judged).
    """
    out = []
    missing = f"phase {phase!r} never ran" if m is None else "no complete request to measure"
    thin = _thin(m, min_samples)
    for short, key, limit_key in _SLO_METRICS:
        limit = getattr(slo, limit_key)
        if limit is None:
            continue
        label = "ITL per token" if short == "itl_per_token" else short.upper()
        name, what = f"slo.{phase}.{short}_p95_s", f"{phase} p95 {label} (s)"
        if thin is not None:
            out.append(_not_judged(name, "slo", _p95(m, key), limit, what, phase, thin, min_samples))
            continue
        out.append(_le(name, "slo", _p95(m, key), limit, what, missing))
    er = None if m is None else m.get("error_rate")
    out.append(_le(f"slo.{phase}.error_rate", "slo", er, slo.error_rate, f"{phase} error rate",
                   missing if m is None else "no request sent"))
    return out


def coverage_check(phase: str, m: dict[str, Any] | None, need: int) -> CheckResult:
    """``coverage.<phase>.requests``: the phase sent at least ``need`` requests."""
    if m is None:
        return CheckResult(f"coverage.{phase}.requests", "coverage", False, None, need, f"phase {phase!r} never ran")
    n = int(m.get("requests", 0))
    ok = n >= need
    return CheckResult(f"coverage.{phase}.requests", "coverage", ok, n, need,
                       f"{n} requests sent in phase {phase!r} ({'≥' if ok else '<'} {need} needed)")


def slo_checks(phases: dict[str, dict], slo: SloConfig, deg: DegradationConfig,
               min_samples: int = 1, expected: tuple[str, ...] = PHASES,
               fault_added_s: dict[str, float] | None = None) -> list[CheckResult]:
    """SLO, degradation and coverage checks.

    Args:
        phases: ``{phase: phase_metrics(...)}``; phases that never started are absent.
        slo: per-request SLOs (p95, seconds) and the allowed error rate.
        deg: degradation limits.
        min_samples: ``metrics.min_samples``: latency checks (and ratios) of a phase with
            fewer complete requests, but at least one, are not judged.
        expected: the phases the run must have (coverage); without ``fault`` (a soak with no
            fault) the fault phase's checks are left out.
        fault_added_s: ``{phase metric key: seconds}`` the faults add to every request by
            declaration (:func:`declared_added_latency`), taken off the fault phase's p95
            before its ratio to the baseline (never below 0); None or absent keys: nothing.

    Returns:
        Checks in a stable order: SLO for baseline then after, fault error rate,
        after-vs-baseline ratios, then coverage for every phase of
        :data:`~harness.metrics.phases.PHASES`.
    """
    out: list[CheckResult] = []
    for ph in ("baseline", "after"):
        out += phase_slo_checks(ph, phases.get(ph), slo, min_samples)

    if deg.fault_max_error_rate is not None and "fault" in expected:
        m = phases.get("fault")
        er = None if m is None else m.get("error_rate")
        out.append(
            _le("degradation.fault.error_rate", "degradation", er, deg.fault_max_error_rate, "fault-phase error rate",
                "phase 'fault' never ran" if m is None else "no request sent")
        )

    base = phases.get("baseline")
    out += _ratio_checks("after", base, phases.get("after"), deg.after_vs_baseline_max_ratio, min_samples)
    if deg.fault_vs_baseline_max_ratio is not None and "fault" in expected:
        out += _ratio_checks("fault", base, phases.get("fault"), deg.fault_vs_baseline_max_ratio, min_samples,
                             fault_added_s or {})

    out += [coverage_check(ph, phases.get(ph), deg.min_requests_per_phase) for ph in PHASES if ph in expected]
    return out


def _ratio_checks(phase: str, base: dict | None, other: dict | None, limit: float,
                  min_samples: int = 1, added_s: dict[str, float] | None = None) -> list[CheckResult]:
    """``degradation.<phase>_vs_baseline.<metric>_p95_ratio`` for TTFT, TPOT and E2E: the
    phase's p95 (less ``added_s[key]`` seconds a fault declares it adds, never below 0) ÷ the
    baseline's, at most ``limit``; not judged when either phase's figures rest on fewer than
    ``min_samples`` complete requests (but at least one)."""
    out = []
    thin = [(p, k) for p, k in (("baseline", _thin(base, min_samples)), (phase, _thin(other, min_samples)))
            if k is not None]
    for short, key in _RATIO_METRICS:
        name = f"degradation.{phase}_vs_baseline.{short}_p95_ratio"
        b, a = _p95(base, key), _p95(other, key)
        what = f"{phase}/baseline p95 {short.upper()}"
        added = (added_s or {}).get(key, 0.0)
        if a is not None and added > 0:
            what += f" less the {added * 1000:.4g} ms the fault declares it adds (measured {a:.4g})"
            a = max(0.0, a - added)
        if thin:
            ratio = a / b if a is not None and b else None
            out.append(_not_judged(name, "degradation", ratio, limit, what, thin[0][0], thin[0][1], min_samples))
            continue
        if b is None or a is None:
            gone = [p for p, v in (("baseline", b), (phase, a)) if v is None]
            out.append(CheckResult(name, "degradation", False, None, limit, f"{what}: no data in {' and '.join(gone)}"))
            continue
        if b <= 0:
            ratio = 1.0 if a <= 0 else None
        else:
            ratio = a / b
        if ratio is None:
            out.append(CheckResult(name, "degradation", False, None, limit,
                                   f"{what}: baseline p95 is 0 and {phase} is {a:.4g}"))
            continue
        out.append(_le(name, "degradation", ratio, limit, f"{what} ({a:.4g}/{b:.4g})", ""))
    return out


def check(run: RecordedRun) -> list[CheckResult]:
    """The SLO, degradation and coverage checks of a recorded run (``metrics.min_samples``
    of its configuration decides which latency checks are judged). A soak run without a
    fault (``soak.enabled``) is expected to have a baseline and an after phase only."""
    expected = ("baseline", "after") if run.soak and not run.faults else PHASES
    return slo_checks(run.phases, run.limits.slo, run.limits.degradation, run.limits.metrics.min_samples, expected,
                      declared_added_latency(run.faults))


def declared_added_latency(faults: list[dict[str, Any]], server: str = "spec") -> dict[str, float]:
    """``{"ttft_s": s, "e2e_s": s}``: the delay, in seconds, that the run's faults declare they
    add to every request of ``server`` (the load records the checks judge), summed over the
    faults that acted and recorded ``declared_added_latency_s`` in their evidence (a
    ``latency`` toxic on that server's load path); ``{}`` when none did. TPOT is not
    included: a delay per chunk, counted from each chunk's arrival, moves a stream's first
    and last token alike.

    Args:
        faults: :attr:`RecordedRun.faults` (:func:`harness.timeline.fault_summary` entries).
        server: whose load path counts (``"spec"``).
    """
    total = 0.0
    for f in faults:
        obs = ((f.get("evidence") or {}).get("observations") or {})
        declared = obs.get("declared_added_latency_s")
        if f.get("acted") and declared and obs.get("server", server) == server:
            total += float(declared)
    return {"ttft_s": total, "e2e_s": total} if total > 0 else {}

"""The report's ``steps`` section: figures per load step (:mod:`harness.metrics.steps`).
No check of its own: the SLO and degradation checks judge phases; this section is the
latency-vs-load curve a reader (or ``specchaos compare``) looks at."""

from __future__ import annotations

from typing import Any

from harness.checks.base import CheckResult, RecordedRun
from harness.checks.view import Table, View, enough, lat
from harness.checks.speculation import server_series
from harness.metrics.steps import step_metrics, step_windows

__all__ = ["summarize", "check", "section"]


def check(run: RecordedRun) -> list[CheckResult]:
    """None: steps are reported, not judged."""
    return []


def section(run: RecordedRun) -> dict[str, Any]:
    """``{"unit": "users"|"rate"|None, "note": str|None, "steps": [step_metrics ...]}``:
    every step's figures (:func:`harness.metrics.steps.step_metrics`) for the speculative
    server's load; ``steps`` empty, with a note, when the profile has one constant level."""
    steps = step_windows(run.events, min((r.send_time for r in run.records), default=None))
    if not steps:
        return {"unit": None, "note": "one load level (no ramp or steps): the phases' figures are the run's",
                "steps": []}
    spec = server_series(run, "spec")
    slo = getattr(run.limits, "slo", None)
    return {"unit": steps[0]["unit"], "note": None,
            "steps": step_metrics(steps, run.records, run.windows, spec, goodput=getattr(slo, "goodput", None),
                                  metrics=getattr(run.limits, "metrics", None))}


def summarize(sec: dict[str, Any] | None) -> list[View]:
    """The terminal/Allure view of :func:`section`: per load step the level (users or
    requests/s), when it ran, the phases it overlaps, requests, failed, p50/p95 ms of TTFT,
    TPOT and E2E, output tokens/s, goodput/s and the acceptance rate; nothing for a
    constant profile."""
    steps = (sec or {}).get("steps") or []
    if not steps:
        return []
    unit = "users" if sec.get("unit") == "users" else "req/s"
    tab = Table(f"per load step ({unit}): latency in ms (p50/p95)",
                ["step", unit, "from s", "phases", "requests", "failed", "TTFT", "TPOT", "E2E", "tokens/s",
                 "goodput/s", "acceptance"], labels=1)
    for st in steps:
        level = st.get("level")
        label = f"{level:g}" if st.get("kind") == "level" else f"{st.get('from', 0):.3g}→{st.get('to', 0):.3g}"
        acc = (st.get("acceptance") or {}).get("acceptance_rate")
        tps, gp = st.get("output_tokens_per_s"), st.get("goodput_rps")
        tab.add(f"{st.get('index')} {st.get('kind')}", label, f"{st.get('offset_s', 0):.0f}",
                ",".join(st.get("phases") or []), str(st.get("requests", 0)), str(st.get("errors", 0)),
                *(lat(st, k) for k in ("ttft_s", "tpot_s", "e2e_s")),
                "—" if tps is None else f"{tps:.1f}", "—" if gp is None else f"{gp:.2f}",
                "—" if acc is None else f"{acc:.2f}", dim=not enough(st))
    return [tab]

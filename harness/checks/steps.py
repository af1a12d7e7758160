"""The report's ``steps`` section: figures per load step (:mod:`harness.metrics.steps`).
No check of its own: the SLO and degradation checks judge phases; this section is the
latency-vs-load curve a reader (or ``specchaos compare``) looks at."""

from __future__ import annotations

from typing import Any

from harness.checks.base import CheckResult, RecordedRun
from harness.checks.speculation import server_series
from harness.metrics.steps import step_metrics, step_windows

__all__ = ["check", "section"]


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

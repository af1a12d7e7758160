"""The steady-state hypothesis, judged strictly from the Chaos Toolkit journal.

Every probe of the hypothesis, before and after the method, is a check: a tolerance
miss at either point fails the run (Chaos Toolkit alone exits 0 when the hypothesis is
missed before the method — it just skips the method). A hypothesis that never ran is
not a check here: the interruption or error that stopped it already makes the run an
error. Names: ``steady_state.<before|after>.<probe name>``, plus
``steady_state.deviated`` when Chaos Toolkit reports a deviation.
"""

from __future__ import annotations

import json
from typing import Any

from harness.checks.base import CheckResult, RecordedRun

__all__ = ["steady_state_checks", "check"]


def _scalar(v: Any) -> Any:
    if v is None or isinstance(v, (int, float, str, bool)):
        return v
    return json.dumps(v, default=str)[:200]


def steady_state_checks(journal: dict | None) -> list[CheckResult]:
    """One check per steady-state probe run before and after the method (see module doc).

    Args:
        journal: a Chaos Toolkit journal (``steady_states.before/after.probes``,
            ``deviated``); None gives no check.
    """
    out = []
    ss = (journal or {}).get("steady_states") or {}
    for when in ("before", "after"):
        st = ss.get(when)
        if not st:
            continue
        for p in st.get("probes", []):
            name = (p.get("activity") or {}).get("name", "probe")
            met = bool(p.get("tolerance_met")) and p.get("status") == "succeeded"
            tol = (p.get("activity") or {}).get("tolerance")
            if p.get("status") != "succeeded":
                detail = f"probe {name} {p.get('status') or 'did not run'} {when} the method"
            else:
                detail = (f"probe {name} {when} the method returned {_scalar(p.get('output'))!r}: "
                          f"{'within' if met else 'OUT OF'} tolerance {_scalar(tol)!r}")
            out.append(CheckResult(f"steady_state.{when}.{name}", "steady_state", met, _scalar(p.get("output")),
                                   _scalar(tol), detail))
    if journal and journal.get("deviated"):
        out.append(CheckResult("steady_state.deviated", "steady_state", False, True, False,
                               "Chaos Toolkit reports a deviation"))
    return out


def check(run: RecordedRun) -> list[CheckResult]:
    """The steady-state checks of a recorded run (from its journal)."""
    return steady_state_checks(run.journal)

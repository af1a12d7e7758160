"""Reading the Chaos Toolkit journal: which activities failed, and what the steady-state
hypothesis said before and after the method (for ``run.json`` and the report). The
strict judgement of the hypothesis itself is a check (:mod:`harness.checks.steady_state`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["journal_errors", "steady_state_summary"]


def journal_errors(journal: dict | None) -> list[str]:
    """Activities that failed (raised) in a Chaos Toolkit journal, as one line each: the
    method's and rollbacks' actions, and steady-state probes that raised (a probe that
    raised did not measure the system under test, so it is a run error, not a failed
    hypothesis)."""
    if not journal:
        return []
    out = []
    runs = [("activity", r) for r in list(journal.get("run") or []) + list(journal.get("rollbacks") or [])]
    ss = journal.get("steady_states") or {}
    for when in ("before", "after"):
        runs += [(f"steady-state probe ({when} the method)", p) for p in ((ss.get(when) or {}).get("probes") or [])]
    for what, r in runs:
        if r.get("status") == "failed":
            name = (r.get("activity") or {}).get("name", "?")
            exc = r.get("exception") or []
            last = exc[-1].strip() if exc else "failed"
            out.append(f"{what} '{name}': {last}")
    return out


def steady_state_summary(journal: dict | None) -> dict[str, Any]:
    """Steady-state hypothesis outcome before/after the method (None where it did not run)."""
    ss = (journal or {}).get("steady_states") or {}
    out: dict[str, Any] = {}
    for when in ("before", "after"):
        st = ss.get(when)
        if st is None:
            out[when] = None
            continue
        out[when] = {
            "met": bool(st.get("steady_state_met")),
            "probes": [{"name": p.get("activity", {}).get("name"), "status": p.get("status"),
                        "output": p.get("output"), "tolerance_met": p.get("tolerance_met")}
                       for p in st.get("probes", [])],
        }
    return out

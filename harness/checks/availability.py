"""Unavailability as time and failures per logical request, per server
(:mod:`harness.metrics.availability` defines both).

* section ``availability`` in ``report.json``: per server (the speculative server's load,
  and the reference server's in mirror mode) the unavailability intervals, their total,
  the seconds in each phase, and per phase the logical requests, their failures and the
  tries (``harness.metrics.availability.request_counts``);
* check ``degradation.unavailable_s`` (only when ``degradation.max_unavailable_s`` is
  set): the speculative server's unavailable seconds from the fault phase's start to the
  end of the load, at most that limit. A run without a fault phase fails it with
  ``observed=None`` (nothing is passed vacuously).

The load's end (the last phase's end) closes an interval that no success ended.
"""

from __future__ import annotations

import math
from typing import Any

from harness.checks.base import CheckResult, RecordedRun
from harness.load.records import RequestRecord
from harness.metrics.availability import overlap_s, request_counts, unavailable_intervals
from harness.metrics.phases import PHASES, assign_phases

__all__ = ["DEFINITION", "server_availability", "section", "check"]

#: One sentence for the report: what the figures mean.
DEFINITION = ("unavailable: from a failed try's end (after a success, or first) to the next complete try's first "
              "output chunk; seconds per phase are the overlap with the phase window. requests: logical requests "
              "(every try of one logical_id) counted once, in the phase of their first try, failed when their last "
              "try failed; tries: every HTTP request.")


def _end_of_load(run: RecordedRun) -> float:
    return max((t1 for _t0, t1 in run.windows.values()), default=math.inf)


def server_availability(records: list[RequestRecord], windows: dict[str, tuple[float, float]],
                        until: float = math.inf) -> dict[str, Any]:
    """One server's unavailability and request counts.

    Args:
        records: that server's load tries.
        windows: ``{phase: (start, end)}``, epoch seconds.
        until: end of the observation (an interval no success ended stops there).

    Returns:
        ``{"unavailable_s": total seconds inside the phases, "intervals": [[start, end]]
        (epoch seconds), "phases": {phase: {"unavailable_s", "requests", "failed",
        "retried", "tries", "failed_tries"}}}``.
    """
    intervals = unavailable_intervals(records, until)
    members = assign_phases(records, windows)
    phases = {ph: {"unavailable_s": overlap_s(intervals, t0, t1), **request_counts(members[ph], records)}
              for ph, (t0, t1) in windows.items()}
    return {"unavailable_s": float(sum(p["unavailable_s"] for p in phases.values())),
            "intervals": [[a, b] for a, b in intervals], "phases": phases}


def section(run: RecordedRun) -> dict[str, Any]:
    """``report.json["availability"]``: ``{"definition", "servers": {server: ...}}`` (see
    :func:`server_availability`; ``ref`` only in mirror mode)."""
    until = _end_of_load(run)
    servers = {"spec": server_availability(run.records, run.windows, until)}
    if run.ref_records:
        servers["ref"] = server_availability(run.ref_records, run.windows, until)
    return {"definition": DEFINITION, "servers": servers}


def check(run: RecordedRun) -> list[CheckResult]:
    """``degradation.unavailable_s`` when ``degradation.max_unavailable_s`` is set (module doc)."""
    limit = run.limits.degradation.max_unavailable_s
    if limit is None:
        return []
    name = "degradation.unavailable_s"
    if "fault" not in run.windows:
        return [CheckResult(name, "degradation", False, None, limit, "no fault phase: nothing to measure")]
    start = run.windows["fault"][0]
    intervals = unavailable_intervals(run.records, _end_of_load(run))
    per = {ph: overlap_s(intervals, *run.windows[ph]) for ph in PHASES
           if ph in run.windows and run.windows[ph][0] >= start}
    total = float(sum(per.values()))
    ok = total <= limit
    parts = ", ".join(f"{ph} {s:.2f} s" for ph, s in per.items())
    return [CheckResult(name, "degradation", ok, total, limit,
                        f"unavailable {total:.2f} s from the fault on ({parts}) {'≤' if ok else '>'} {limit:g} s")]

"""Fail fast (one name for one concept: config ``fail_fast``, checks ``fail_fast.*``,
report ``fail_fast``): requests caught in flight by a fault must end, and end in error quickly.

A server that loses its engine must not leave clients hanging: every request in flight
at the fault (sent before it, not ended before it) must end — complete, or with an error
within ``ff.max_error_latency_s`` of the fault. A request that never ended is hung.

When no request was in flight at that instant the fault caught nobody: both checks are
**not judged** (N/J, the reason in the detail), neither passed nor failed. Whether a
request happened to be in flight at a kill is a matter of timing (a user between two
requests, a kill a few milliseconds after the last response ended); failing on it would
make the same experiment's verdict vary from run to run. Nothing is lost by it:
the fault's own evidence (``fault.*.acted``), the hang, recovery and SLO checks still
judge the run, and a run where nothing at all was judged is an error
(:func:`harness.checks.verdict.verdict`). An experiment that must exercise fail-fast
should make it likely (more users, shorter think time) rather than rely on a failing
N/J; the report's ``fail_fast.in_flight`` says how many requests it rested on.
"""

from __future__ import annotations

from typing import Iterable

from harness.checks.base import CheckResult, RecordedRun
from harness.checks.config import FailFastConfig
from harness.load.records import RequestRecord, is_complete

__all__ = ["in_flight", "fail_fast_checks", "judged_at", "check", "section"]


def in_flight(records: Iterable[RequestRecord], t: float) -> list[RequestRecord]:
    """Records in flight at epoch second ``t``: sent before ``t`` and not ended before ``t``
    (never ended included)."""
    return [r for r in records if r.send_time < t and (r.end_time is None or r.end_time >= t)]


def fail_fast_checks(records: Iterable[RequestRecord], fault_time: float, ff: FailFastConfig) -> list[CheckResult]:
    """Judge how requests in flight at ``fault_time`` ended.

    Returns two checks (category ``"fail_fast"``):

    * ``fail_fast.hung`` — in-flight requests that never ended; observed = their count,
      limit 0;
    * ``fail_fast.error_latency_s`` — observed = the worst ``end − fault_time`` (seconds)
      among in-flight requests that ended in error (not complete), limit
      ``ff.max_error_latency_s``; passes with observed None when every in-flight request
      ended complete.

    With no request in flight at the fault both are not judged (``passed`` None, see the
    module doc): the fault caught no request, so there is nothing to judge.
    """
    flying = in_flight(records, fault_time)
    limit = ff.max_error_latency_s
    if not flying:
        why = ("no request was in flight at the fault: nothing to judge (timing: more users or a shorter think "
               "time make it likely)")
        return [
            CheckResult.not_judged("fail_fast.hung", "fail_fast", None, 0, why),
            CheckResult.not_judged("fail_fast.error_latency_s", "fail_fast", None, limit, why),
        ]
    hung = [r for r in flying if r.end_time is None]
    errored = [r for r in flying if r.end_time is not None and not is_complete(r)[0]]
    n = len(flying)
    out = [
        CheckResult(
            "fail_fast.hung",
            "fail_fast",
            not hung,
            len(hung),
            0,
            f"{len(hung)} of {n} in-flight requests never ended"
            + (f" (first: {hung[0].request_id})" if hung else ""),
        )
    ]
    if errored:
        worst = max(errored, key=lambda r: r.end_time)
        lat = worst.end_time - fault_time
        ok = lat <= limit
        out.append(
            CheckResult(
                "fail_fast.error_latency_s",
                "fail_fast",
                ok,
                lat,
                limit,
                f"{len(errored)} of {n} in-flight requests ended in error; slowest {worst.request_id} "
                f"({worst.error or 'incomplete'}) after {lat:.3g} s ({'≤' if ok else '>'} {limit:g} s)",
            )
        )
    else:
        out.append(
            CheckResult(
                "fail_fast.error_latency_s",
                "fail_fast",
                not hung,
                None,
                limit,
                f"none of the {n} in-flight requests ended in error"
                + (f"; {len(hung)} never ended" if hung else "; all completed"),
            )
        )
    return out


def judged_at(run: RecordedRun) -> float | None:
    """The instant (epoch s) fail-fast is judged at: when the first fault whose damage is
    done when it acts (``recovery_from == "injected"``: a killed process) began to act
    (``acting_at``: just before the signal; a fast server fails the requests it held within
    milliseconds, before the injection is even recorded) — with several faults, e.g. a
    worker killed during a memory hog, the requests that matter are those in flight at the
    kill — else the first fault's injection; None without a fault."""
    return next((f.get("acting_at") or f["injected_at"] for f in run.faults if f.get("recovery_from") == "injected"),
                run.fault_time)


def check(run: RecordedRun) -> list[CheckResult]:
    """The fail-fast checks of a recorded run, at :func:`judged_at` (none without a fault)."""
    t = judged_at(run)
    return [] if t is None else fail_fast_checks(run.records, t, run.limits.fail_fast)


def section(run: RecordedRun) -> dict:
    """``report.json``'s ``fail_fast``: ``judged_at`` (epoch s, see :func:`judged_at`),
    ``in_flight`` (requests in flight then), ``worst_error_latency_s`` (measured: the
    slowest of them to end in error, seconds after that instant; None if none did) and
    ``max_error_latency_s`` (the configured limit)."""
    t = judged_at(run)
    n = 0 if t is None else len(in_flight(run.records, t))
    worst = None
    if t is not None:
        worst = next((c.observed for c in fail_fast_checks(run.records, t, run.limits.fail_fast)
                      if c.name == "fail_fast.error_latency_s"), None)
    return {"judged_at": t, "in_flight": n, "worst_error_latency_s": worst,
            "max_error_latency_s": run.limits.fail_fast.max_error_latency_s}

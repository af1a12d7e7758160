"""Continuous safeguards: hard limits over a sliding window of the load, checked during the
method (the live monitor is :mod:`harness.experiment.safeguards`; it aborts the run on a
breach) and re-derived here from the recorded data for the report.

The idea is Chaos Toolkit's: its safeguards control (``chaosaddons.controls.safeguards``)
runs probes during the experiment and, when one leaves its tolerance, ends the experiment
gracefully (SIGUSR1 to its own process: the current activity stops, rollbacks still run).
Here the "probe" is a pure function of the request records, so the same code decides live
and after the fact:

* :func:`window_value` — a metric over the requests that *ended* in a window ``(lo, hi]``;
* :func:`scan` — walk a time span, return the first breach: the metric stayed over the
  limit (with at least ``min_requests`` requests in the window) for ``for_s`` seconds
  without a break, inside the armed phases. The windowed metric only changes when a
  request ends (enters the window) or leaves it ``window_s`` later, so evaluating at those
  instants is exact, whatever the tick of a live caller;
* :func:`find_breach` — :func:`scan` over a whole run.

Definitions (see :class:`~harness.checks.config.SafeguardConfig`): ``error_rate`` = failed ÷
ended requests (failed: not complete as :func:`harness.load.records.is_complete`; each
try of a retried request counts); ``ttft_p95_s`` / ``e2e_p95_s`` as in vLLM's serving
benchmark (:mod:`harness.metrics.latency`), p95 with linear interpolation.

Timeline events written by the live monitor and read here (source ``safeguards``):
``safeguards_armed`` / ``safeguards_disarmed`` (the span the monitor watched),
``safeguard_breached`` (``safeguard``, ``metric``, ``limit``, ``window_s``, ``for_s``,
``observed``, ``n``, ``breach_start``, ``due_at``: epoch s) and ``safeguard_abort``
(``safeguard``, ``reason``, ``signal``).
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from harness.checks.base import CheckResult, RecordedRun, instant
from harness.checks.view import Line, View
from harness.checks.config import SafeguardConfig
from harness.load.records import RequestRecord, is_complete
from harness.metrics.latency import e2e_s, ttft_s

__all__ = ["summarize",
           "SOURCE", "ABORT_PREFIX", "Obs", "Breach", "observations", "window_value", "scan", "find_breach",
           "armed_windows", "fullest_window", "abort_event", "abort_summary", "check", "section"]

#: Timeline source of the live monitor's events.
SOURCE = "safeguards"
#: How every abort reason begins; an activity that ended because of the abort says so,
#: and the judge does not count that as a run error.
ABORT_PREFIX = "aborted by safeguard"


@dataclass(frozen=True)
class Obs:
    """What a safeguard needs of one request: its end (epoch s), whether it failed, its
    TTFT (s, None without output) and, when complete, its E2E (s)."""

    end: float
    failed: bool
    ttft_s: float | None
    e2e_s: float | None


def observations(records: Iterable[RequestRecord]) -> list[Obs]:
    """One :class:`Obs` per *ended* record, sorted by end time."""
    out = []
    for r in records:
        end = r.end_time
        if end is None:
            continue
        ok = is_complete(r)[0]
        out.append(Obs(end, not ok, ttft_s(r), e2e_s(r) if ok else None))
    return sorted(out, key=lambda o: o.end)


def window_value(obs: Sequence[Obs], metric: str, lo: float, hi: float,
                 ends: Sequence[float] | None = None) -> tuple[float | None, int]:
    """``(value, n)`` of ``metric`` over the requests that ended in ``(lo, hi]``.

    Args:
        obs: observations sorted by end (:func:`observations`).
        metric: ``error_rate`` (fraction), ``ttft_p95_s`` or ``e2e_p95_s`` (seconds).
        lo, hi: the window, epoch seconds.
        ends: ``[o.end for o in obs]`` when the caller has it (saves a pass).

    Returns:
        The value (None when no request carries one) and how many requests it rests on
        (for ``error_rate`` every ended request; for a latency the ones with a value).
    """
    ends = ends if ends is not None else [o.end for o in obs]
    i, j = bisect.bisect_right(ends, lo), bisect.bisect_right(ends, hi)
    window = obs[i:j]
    if metric == "error_rate":
        n = len(window)
        return (None if n == 0 else sum(o.failed for o in window) / n), n
    field = {"ttft_p95_s": "ttft_s", "e2e_p95_s": "e2e_s"}[metric]
    vals = [getattr(o, field) for o in window if getattr(o, field) is not None]
    if not vals:
        return None, 0
    return float(np.percentile(np.asarray(vals, dtype=float), 95, method="linear")), len(vals)


@dataclass
class Breach:
    """A safeguard's breach: ``metric`` was over ``limit`` from ``breach_start`` (epoch s)
    without a break until ``due_at`` = ``breach_start + for_s`` (when it counts as
    breached); ``observed`` (over ``n`` requests) is the window's value at ``due_at``."""

    safeguard: str
    metric: str
    limit: float
    window_s: float
    for_s: float
    breach_start: float
    due_at: float
    observed: float
    n: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _over(value: float | None, n: int, sg: SafeguardConfig) -> bool:
    return value is not None and n >= sg.min_requests and value > sg.limit


def scan(obs: Sequence[Obs], sg: SafeguardConfig, armed: Sequence[tuple[float, float]], since: float, until: float,
         over_since: float | None = None) -> tuple[Breach | None, float | None]:
    """Walk ``(since, until]`` and return the first breach of ``sg``.

    Args:
        obs: observations sorted by end (:func:`observations`); those ending before
            ``since − window_s`` are not needed.
        sg: the safeguard.
        armed: ``[(start, end)]`` epoch s, in time order: where ``sg`` is judged (its
            phases, inside the span the monitor watched). A window never reaches before the
            start of its armed interval, and leaving an interval breaks a stretch.
        since, until: the span to walk (epoch s); a live caller passes its previous
            ``until`` as ``since``.
        over_since: the start of an over-limit stretch still open at ``since`` (the second
            value a previous call returned), None if none.

    Returns:
        ``(breach or None, start of the over-limit stretch open at until or None)``.
    """
    ends = [o.end for o in obs]
    w = sg.window_s
    state = over_since
    value: tuple[float | None, int] = (None, 0)
    for a, b in armed:
        lo_t, hi_t = max(a, since), min(b, until)
        if a > until or b <= since:
            continue              # outside the span (an interval that ended was closed by an earlier call)
        points = set()
        if a > since:
            state = None          # a new armed interval: nothing carries over
            points.add(a)
        # the windowed value can only change where a request ends or leaves the window
        for e in ends:
            for c in (e, e + w):
                if lo_t < c <= hi_t:
                    points.add(c)
        for c in sorted(points):
            if state is not None and state + sg.for_s <= c:
                return _breach(obs, ends, sg, a, state, value), state
            value = window_value(obs, sg.metric, max(a, c - w), c, ends)
            if _over(*value, sg):
                state = c if state is None else state
                if state + sg.for_s <= c:
                    return _breach(obs, ends, sg, a, state, value), state
            else:
                state = None
        if state is not None and state + sg.for_s <= hi_t:
            return _breach(obs, ends, sg, a, state, value), state
        if b <= until:
            state = None          # the interval ended: the stretch is broken
    return None, state


def _breach(obs: Sequence[Obs], ends: Sequence[float], sg: SafeguardConfig, a: float, start: float,
            last: tuple[float | None, int]) -> Breach:
    due = start + sg.for_s
    value, n = window_value(obs, sg.metric, max(a, due - sg.window_s), due, ends)
    if not _over(value, n, sg):   # due falls between change points: the last evaluated value holds
        value, n = last
    return Breach(sg.label, sg.metric, sg.limit, sg.window_s, sg.for_s, start, due, float(value or 0.0), n)


def find_breach(records: Iterable[RequestRecord] | Sequence[Obs], sg: SafeguardConfig,
                armed: Sequence[tuple[float, float]]) -> Breach | None:
    """The first breach of ``sg`` in a whole run (None when it stayed quiet).

    Args:
        records: request records (or observations from :func:`observations`).
        sg: the safeguard.
        armed: ``[(start, end)]`` epoch s where it is judged (:func:`armed_windows`).
    """
    items = list(records)
    obs = items if (not items or isinstance(items[0], Obs)) else observations(items)
    if not armed:
        return None
    return scan(obs, sg, armed, since=armed[0][0] - 1e-9, until=armed[-1][1])[0]


def armed_windows(events: Iterable[dict[str, Any]], phases: Sequence[str],
                  until: float | None = None) -> list[tuple[float, float]]:
    """Where a safeguard of ``phases`` is judged: the windows of those phases
    (``phase_start`` events; each phase ends where the next starts, the last at ``until``
    or the last event), intersected with the span the monitor watched
    (``safeguards_armed`` → ``safeguards_disarmed``, or ``until``); consecutive armed
    phases merge into one interval. Time order; empty when the monitor never ran."""
    evs = sorted(events, key=lambda e: e["t"])
    end = until if until is not None else (evs[-1]["t"] if evs else 0.0)
    starts = [(e["t"], e.get("phase")) for e in evs
              if e.get("event") == "phase_start" and e.get("source", "runner") == "runner"]
    arm = [e["t"] for e in evs if e.get("source") == SOURCE and e.get("event") == "safeguards_armed"]
    disarm = [e["t"] for e in evs if e.get("source") == SOURCE and e.get("event") == "safeguards_disarmed"]
    if not arm:
        return []
    w0 = arm[0]
    w1 = min([t for t in disarm if t >= w0] + [end])
    out: list[tuple[float, float]] = []
    for i, (t0, ph) in enumerate(starts):
        t1 = starts[i + 1][0] if i + 1 < len(starts) else end
        if ph in phases:
            lo, hi = max(t0, w0), min(t1, w1)
            if hi <= lo:
                continue
            if out and out[-1][1] >= lo:      # consecutive armed phases make one interval
                out[-1] = (out[-1][0], max(out[-1][1], hi))
            else:
                out.append((lo, hi))
    return out


def abort_event(events: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """The run's ``safeguard_abort`` event (the first), None when no safeguard aborted it."""
    for e in sorted(events, key=lambda e: e["t"]):
        if e.get("source") == SOURCE and e.get("event") == "safeguard_abort":
            return e
    return None


def abort_summary(events: Sequence[dict[str, Any]], fault_time: float | None) -> dict[str, Any] | None:
    """``report.json``'s ``safeguards.abort``: the breach as the monitor recorded it and the
    abort's timing, None when the run was not aborted.

    Fields: ``safeguard``, ``metric``, ``observed``, ``n``, ``limit``, ``window_s``,
    ``for_s``, ``breach_start`` and ``due_at`` (epoch s: the metric went over the limit, and
    stayed over for ``for_s``), ``detected_at`` (the monitor recorded the breach),
    ``aborted_at`` (it signalled the abort), ``detection_latency_s`` = ``aborted_at −
    due_at`` (what the harness added beyond the configured ``for_s``; target ≤ 1 s),
    ``breach_to_abort_s`` = ``aborted_at − breach_start`` and ``fault_to_abort_s`` =
    ``aborted_at −`` the first fault's injection (None without a fault), ``reason``.
    """
    ab = abort_event(events)
    if ab is None:
        return None
    br = next((e for e in events if e.get("source") == SOURCE and e.get("event") == "safeguard_breached"
               and e.get("safeguard") == ab.get("safeguard")), {})
    out = {k: br.get(k) for k in ("safeguard", "metric", "observed", "n", "limit", "window_s", "for_s",
                                   "breach_start", "due_at")}
    out["safeguard"] = ab.get("safeguard")
    out["detected_at"] = br.get("t")
    out["aborted_at"] = ab["t"]
    out["detection_latency_s"] = None if br.get("due_at") is None else ab["t"] - br["due_at"]
    out["breach_to_abort_s"] = None if br.get("breach_start") is None else ab["t"] - br["breach_start"]
    out["fault_to_abort_s"] = None if fault_time is None else ab["t"] - fault_time
    out["reason"] = ab.get("reason")
    return out


def fullest_window(obs: Sequence[Obs], sg: SafeguardConfig, armed: Sequence[tuple[float, float]]) -> int:
    """The most requests any judged window of ``sg`` rested on: the largest ``n`` of
    :func:`window_value` over windows ending at a request's end inside ``armed`` (a
    window's count only grows when a request ends in it); 0 when nothing ended there."""
    ends = [o.end for o in obs]
    most = 0
    for a, b in armed:
        for e in ends[bisect.bisect_right(ends, a):bisect.bisect_right(ends, b)]:
            most = max(most, window_value(obs, sg.metric, max(a, e - sg.window_s), e, ends)[1])
    return most


def _breaches(run: RecordedRun) -> dict[str, tuple[Breach | None, list[tuple[float, float]], list[Obs]]]:
    if "safeguards.breaches" not in run.memo:
        sgs = list(getattr(run.limits, "safeguards", []) or [])
        obs = observations(run.records)
        end = max([e["t"] for e in run.events] or [0.0])
        armed = {sg.label: armed_windows(run.events, sg.phases, end) for sg in sgs}
        run.memo["safeguards.breaches"] = {sg.label: (find_breach(obs, sg, armed[sg.label]), armed[sg.label], obs)
                                           for sg in sgs}
    return run.memo["safeguards.breaches"]


def check(run: RecordedRun) -> list[CheckResult]:
    """One check per configured safeguard, ``safeguards.<name>``: passes when the
    recorded load never breached it while the monitor watched (re-derived with
    :func:`find_breach`); none without safeguards. Without a breach it is **not judged**
    (``passed`` None, never a vacuous pass) when the monitor never watched its phases, or
    when no window there held ``min_requests`` requests (a window that thin can never
    breach, :class:`~harness.checks.config.SafeguardConfig`)."""
    out = []
    sgs = {sg.label: sg for sg in (getattr(run.limits, "safeguards", []) or [])}
    aborted = abort_event(run.events)
    for name, (br, armed, obs) in _breaches(run).items():
        sg = sgs[name]
        limit = f"{sg.metric} <= {sg.limit:g} (window {sg.window_s:g} s, for {sg.for_s:g} s)"
        if br is None:
            most = fullest_window(obs, sg, armed)
            if not armed:
                out.append(CheckResult.not_judged(f"safeguards.{name}", "safeguards", None, limit,
                                                  f"the safeguards monitor never watched {sg.phases}"))
            elif most < sg.min_requests:
                out.append(CheckResult.not_judged(
                    f"safeguards.{name}", "safeguards", None, limit,
                    f"no {sg.window_s:g} s window in {sg.phases} held min_requests {sg.min_requests} requests "
                    f"with a {sg.metric} (at most {most}): too few to judge"))
            else:
                out.append(CheckResult(f"safeguards.{name}", "safeguards", True, None, limit,
                                       f"{sg.metric} never stayed over {sg.limit:g} for {sg.for_s:g} s in "
                                       f"{sg.phases} (windows of up to {most} requests)"))
            continue
        acted = aborted is not None and aborted.get("safeguard") == name
        out.append(CheckResult(f"safeguards.{name}", "safeguards", False, br.observed, limit,
                               f"{sg.metric} {br.observed:.3g} over {br.n} requests > {sg.limit:g} from "
                               f"{instant(br.breach_start, run.fault_time, run.windows)} for {sg.for_s:g} s" + ("; the run was aborted" if acted else "")))
    return out


def section(run: RecordedRun) -> dict[str, Any]:
    """``report.json``'s ``safeguards``: ``configured`` (each safeguard as declared),
    ``breaches`` (``{name: breach or None}``, re-derived from the records) and ``abort``
    (:func:`abort_summary`; None when the run was not aborted)."""
    sgs = list(getattr(run.limits, "safeguards", []) or [])
    return {"configured": [sg.model_dump() | {"name": sg.label} for sg in sgs],
            "breaches": {k: (None if br is None else br.to_dict()) for k, (br, _, _) in _breaches(run).items()},
            "abort": abort_summary(run.events, run.fault_time)}


def summarize(sec: dict[str, Any] | None) -> list[View]:
    """The terminal/Allure view of :func:`section`: why the method was aborted, and how fast
    (nothing when no safeguard fired)."""
    ab = (sec or {}).get("abort")
    if not ab:
        return []
    det = ab.get("detection_latency_s")
    fault = ab.get("fault_to_abort_s")
    return [Line(f"{ab.get('reason')} (detection latency {'—' if det is None else f'{det:.2f} s'} beyond for_s"
                 + (f", {fault:.2f} s after the fault" if fault is not None else "") + "; rollbacks ran)", "alert")]

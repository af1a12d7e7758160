"""Figures per load step: a latency-vs-load curve from one run.

A load profile with a ``ramp`` or ``steps`` (:class:`harness.load.config.ProfileConfig`)
changes its concurrency (closed loop, users) or arrival rate (open loop, requests/s) during
the run. The per-phase figures mix those levels; here the same figures are computed per
level instead, as ``vllm bench serve`` does with one run per ``--request-rate`` and
GuideLLM with its sweep of rates, but from a single run.

Where the steps come from: the runner records the profile's schedule on the timeline's
``load_started`` event (:func:`schedule_fields`: ``unit``, ``schedule`` as
``[[start_s, end_s|None, from, to], ...]`` in seconds since the load started,
:func:`harness.load.profiles.schedule`). :func:`step_windows` turns it into windows in
epoch seconds, cut at the load's stop: a constant piece is one step; a ramp (a linear
piece) is cut into up to :data:`RAMP_WINDOWS` equal windows, each labelled with the level
at its middle. A profile of one constant level has no steps (its figures are the phases').

Each step's figures (:func:`step_metrics`) are :func:`harness.metrics.phases.phase_metrics`
over the load requests *sent* in its window (TTFT, TPOT, ITL, E2E distributions in
seconds, error rate, throughput, goodput) plus the speculative server's acceptance as vLLM
counted it in the window (:func:`harness.metrics.speculation.acceptance`).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

from harness.load.config import ProfileConfig
from harness.load.profiles import schedule
from harness.load.records import RequestRecord
from harness.metrics.config import GoodputConfig, MetricsConfig
from harness.metrics.phases import phase_metrics, records_in
from harness.metrics.speculation import SpeculationSeries

__all__ = ["RAMP_WINDOWS", "schedule_fields", "step_windows", "step_metrics"]

#: Windows a ramp (a linear piece of the schedule) is cut into.
RAMP_WINDOWS = 5


def schedule_fields(profile: ProfileConfig, default_users: int) -> dict[str, Any]:
    """The ``load_started`` event's fields that describe the schedule (JSON-able):
    ``{"unit": "users"|"rate", "schedule": [[start_s, end_s|None, from, to], ...]}``
    (seconds since the load started; the last piece's end None: it lasts until the stop).
    An open loop without a rate (a timed trace's own arrivals, ``load.source``) has no
    schedule: ``[]``."""
    if profile.kind == "open" and profile.rate is None:
        return {"unit": "rate", "schedule": []}
    return {"unit": "users" if profile.kind == "closed" else "rate",
            "schedule": [[a, None if math.isinf(b) else b, v0, v1] for a, b, v0, v1 in schedule(profile, default_users)]}


def step_windows(events: Iterable[dict[str, Any]], first_send: float | None = None) -> list[dict[str, Any]]:
    """The load's steps from the timeline (module doc).

    Args:
        events: timeline events (any order); uses the first ``runner``/``load_started``
            (its ``unit`` and ``schedule``) and the last ``load_stopped`` (else the last event).
        first_send: epoch s of the load's first request. The runner records
            ``load_started`` once locust has started (after its first request), so the
            schedule's 0 is the earlier of the two.

    Returns:
        ``[{"index", "kind": "level"|"ramp", "unit", "level", "from", "to", "start", "end",
        "offset_s"}]`` in time order (``level``: users or requests/s at the window's middle;
        ``from``/``to``: at its ends; ``start``/``end`` epoch s; ``offset_s``: ``start``
        in seconds since the load started). Empty when the load never started, the event
        has no schedule (a run recorded before it did) or the schedule is one constant level.
    """
    evs = sorted(events, key=lambda e: e["t"])
    started = next((e for e in evs if e.get("event") == "load_started" and e.get("source", "runner") == "runner"), None)
    if started is None or not started.get("schedule"):
        return []
    pieces = started["schedule"]
    if len(pieces) < 2 and pieces[0][2] == pieces[0][3]:
        return []
    t0 = float(started["t"]) if first_send is None else min(float(started["t"]), first_send)
    stops = [e["t"] for e in evs if e.get("event") == "load_stopped" and e.get("source", "runner") == "runner"]
    stop = float(stops[-1] if stops else evs[-1]["t"])
    out: list[dict[str, Any]] = []
    for a, b, v0, v1 in pieces:
        start, end = t0 + a, min(stop, t0 + b if b is not None else math.inf)
        if start >= stop:
            break
        n = 1 if v0 == v1 or end <= start else RAMP_WINDOWS
        for i in range(n):
            lo, hi = start + (end - start) * i / n, start + (end - start) * (i + 1) / n
            out.append({"index": len(out), "kind": "level" if v0 == v1 else "ramp", "unit": started.get("unit"),
                        "level": _value((a, b, v0, v1), (lo + hi) / 2 - t0),
                        "from": _value((a, b, v0, v1), lo - t0), "to": _value((a, b, v0, v1), hi - t0),
                        "start": lo, "end": hi, "offset_s": lo - t0})
    return out


def _value(piece: Sequence[Any], x: float) -> float:
    """A schedule piece's value ``x`` seconds after the load started (linear in between)."""
    a, b, v0, v1 = piece
    return float(v0) if b is None or b == a else float(v0 + (v1 - v0) * (x - a) / (b - a))


def _phases_of(start: float, end: float, windows: dict[str, tuple[float, float]]) -> list[str]:
    """The phases a step overlaps (``warmup`` for time before the first phase)."""
    names = [ph for ph, (a, b) in windows.items() if a < end and b > start]
    first = min((a for a, _ in windows.values()), default=None)
    return (["warmup"] if first is None or start < first else []) + names


def step_metrics(steps: Sequence[dict[str, Any]], records: Sequence[RequestRecord],
                 windows: dict[str, tuple[float, float]], speculation: SpeculationSeries | None = None,
                 goodput: GoodputConfig | None = None, metrics: MetricsConfig | None = None) -> list[dict[str, Any]]:
    """Each step of :func:`step_windows` with its figures.

    Args:
        steps: from :func:`step_windows`.
        records: the speculative server's load records (any order).
        windows: the run's phase windows (:func:`harness.metrics.phases.phase_windows`),
            to name the phases each step overlaps.
        speculation: the speculative server's counters, None when none were scraped.
        goodput, metrics: as :func:`harness.metrics.phases.phase_metrics`.

    Returns:
        One dict per step: the step's fields, ``"phases"`` (overlapped, ``warmup`` first
        when it started before the baseline), every field of
        :func:`~harness.metrics.phases.phase_metrics` over the requests sent in the window
        (seconds, requests/s, tokens/s; ``buckets`` and ``request_classes`` included), and
        ``"acceptance"``: ``{"acceptance_rate", "mean_acceptance_length", "draft_tokens",
        "accepted_tokens", "resets"}`` (rates None without draft tokens; the whole block
        None without scraped counters).
    """
    records = list(records)
    out = []
    for st in steps:
        a, b = st["start"], st["end"]
        m = phase_metrics(records, a, b, goodput, members=records_in(records, a, b), metrics=metrics)
        m.pop("start", None)
        m.pop("end", None)
        acc = None
        if speculation is not None and speculation.speculative:
            s = speculation.stats(a, b)
            acc = {k: s[k] for k in ("acceptance_rate", "mean_acceptance_length", "draft_tokens", "accepted_tokens",
                                     "resets")}
        out.append({**st, "phases": _phases_of(a, b, windows), **m, "acceptance": acc})
    return out

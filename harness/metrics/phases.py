"""Phases of a run and the metrics of each.

A run's load window is split by the runner into consecutive phases
``baseline → fault → recovery → after``, recorded as ``phase_start`` events (field
``phase``) on the timeline and closed by ``load_stopped``. Each phase ends where the next
one starts; a phase that never started is absent.

Metric definitions follow vLLM's serving benchmark (see :mod:`harness.metrics.latency`).
Latency statistics use only *complete* requests
(:func:`harness.load.records.is_complete`); a cut stream is an error, never a
success, whatever the client's ``ok`` says. Requests and failures are counted once per
logical request, unavailability as time (:mod:`harness.metrics.availability`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

from harness.load.records import RequestRecord, is_complete
from harness.metrics.availability import overlap_s, request_counts, unavailable_intervals
from harness.metrics.config import GoodputConfig, MetricsConfig
from harness.metrics.latency import distribution, e2e_s, itl_per_token_s, itl_s, tpot_s, ttft_s

__all__ = ["PHASES", "phase_windows", "records_in", "assign_phases", "is_good", "latency_metrics", "phase_metrics"]

PHASES = ("baseline", "fault", "recovery", "after")


def phase_windows(events: Iterable[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """Time window of every phase that started, from timeline events.

    Args:
        events: timeline events (any order); uses ``runner``/``phase_start`` (field
            ``phase``) and the last ``runner``/``load_stopped``.

    Returns:
        ``{phase: (start, end)}`` in epoch seconds, ``start`` inclusive, ``end`` exclusive,
        in phase order. Each phase ends where the next started one begins; the last one
        at ``load_stopped`` (or, if the load never stopped — an interrupted run — at the
        last event on the timeline). A phase started twice keeps its first start; phase
        starts after ``load_stopped`` and unknown phase names are ignored.
    """
    evs = sorted(events, key=lambda e: e["t"])
    stops = [e["t"] for e in evs if e.get("source", "runner") == "runner" and e.get("event") == "load_stopped"]
    stop = stops[-1] if stops else (evs[-1]["t"] if evs else None)
    starts: dict[str, float] = {}
    for e in evs:
        if e.get("event") != "phase_start" or e.get("source", "runner") != "runner":
            continue
        ph = e.get("phase")
        if ph in PHASES and ph not in starts and (stop is None or e["t"] <= stop):
            starts[ph] = e["t"]
    ordered = sorted(starts.items(), key=lambda kv: (kv[1], PHASES.index(kv[0])))
    out: dict[str, tuple[float, float]] = {}
    for i, (ph, t0) in enumerate(ordered):
        t1 = ordered[i + 1][1] if i + 1 < len(ordered) else stop
        out[ph] = (float(t0), float(t1 if t1 is not None else t0))
    return out


def records_in(records: Iterable[RequestRecord], start: float, end: float) -> list[RequestRecord]:
    """Records sent inside ``[start, end)`` (epoch seconds, by ``send_time``)."""
    return [r for r in records if start <= r.send_time < end]


def assign_phases(
    records: Iterable[RequestRecord], windows: dict[str, tuple[float, float]]
) -> dict[str, list[RequestRecord]]:
    """The requests each phase answers for.

    A request belongs to the phase whose window holds its ``send_time``, with one
    exception: a request sent before the ``fault`` phase began and still in flight at
    that instant (not ended before it; never ended included) belongs to ``fault``: the
    fault acted on it, so its outcome (typically an error from the kill) is the fault's,
    not the baseline's. Requests sent outside every window belong to none.

    Args:
        records: load records (any order).
        windows: ``{phase: (start, end)}`` from :func:`phase_windows`.

    Returns:
        ``{phase: [records]}`` for every phase in ``windows`` (possibly empty lists).
    """
    out: dict[str, list[RequestRecord]] = {ph: [] for ph in windows}
    fault_t = windows["fault"][0] if "fault" in windows else None
    for r in records:
        if fault_t is not None and r.send_time < fault_t and (r.end_time is None or r.end_time >= fault_t):
            out["fault"].append(r)
            continue
        for ph, (t0, t1) in windows.items():
            if t0 <= r.send_time < t1:
                out[ph].append(r)
                break
    return out


def is_good(r: RequestRecord, goodput: GoodputConfig) -> bool:
    """Whether a complete request met every per-request goodput limit that is set, as
    ``vllm bench serve --goodput``: TTFT ≤ ``goodput.ttft_s``, TPOT ≤ ``goodput.tpot_s``,
    E2E ≤ ``goodput.e2e_s`` (seconds).

    As in vLLM, a request with ≤ 1 output token has TPOT 0 for this test; one that carried
    no output chunk at all has its TTFT taken as its E2E. Not-complete requests are never good.
    """
    if not is_complete(r)[0]:
        return False
    e = e2e_s(r)
    if e is None:
        return False
    t = ttft_s(r)
    t = e if t is None else t
    p = tpot_s(r) or 0.0
    return ((goodput.ttft_s is None or t <= goodput.ttft_s) and (goodput.tpot_s is None or p <= goodput.tpot_s)
            and (goodput.e2e_s is None or e <= goodput.e2e_s))


def _rate(n: float, duration: float) -> float | None:
    return n / duration if duration > 0 else None


def latency_metrics(complete: Iterable[RequestRecord], metrics: MetricsConfig | None = None) -> dict[str, Any]:
    """The latency distributions of some complete requests, as vLLM's serving benchmark
    defines them (:mod:`harness.metrics.latency`), seconds.

    Returns:
        ``{"complete": K, "enough_samples": K ≥ metrics.min_samples, "ttft_s", "tpot_s",
        "itl_s" (per chunk, vLLM's ITL), "itl_per_token_s", "e2e_s"}``, each metric a
        :func:`~harness.metrics.latency.distribution` (``n``, ``mean``, ``p50`` …
        ``p99.9``). ``n`` counts values: requests for TTFT and E2E, requests with more
        than one output token for TPOT, gaps for ITL, tokens after the first arrival for
        ITL per token; ``complete`` is the number of requests they rest on.
    """
    cfg = metrics or MetricsConfig()
    complete = list(complete)
    return {
        "complete": len(complete),
        "enough_samples": len(complete) >= cfg.min_samples,
        "ttft_s": distribution(ttft_s(r) for r in complete),
        "tpot_s": distribution(tpot_s(r) for r in complete),
        "itl_s": distribution(v for r in complete for v in itl_s(r)),
        "itl_per_token_s": distribution(v for r in complete for v in itl_per_token_s(r, cfg.itl_group_gap_s)),
        "e2e_s": distribution(e2e_s(r) for r in complete),
    }


def phase_metrics(
    records: Iterable[RequestRecord], start: float, end: float, goodput: GoodputConfig | None = None,
    members: Iterable[RequestRecord] | None = None, metrics: MetricsConfig | None = None,
) -> dict[str, Any]:
    """Metrics of one phase window ``[start, end)`` (epoch seconds), one server's requests.

    Args:
        records: every load record of the run for one server (the window is applied
            here; unavailability and the later tries of a logical request are found in it).
        start, end: the phase window (see :func:`phase_windows`).
        goodput: per-request limits for goodput; ``None`` or no limit set leaves
            ``goodput_rps`` as None (as vLLM without ``--goodput``).
        members: the tries this phase answers for (see :func:`assign_phases`);
            default: those sent inside the window (:func:`records_in`).
        metrics: ``min_samples`` and the ITL-per-token grouping gap (defaults of
            :class:`~harness.metrics.config.MetricsConfig` when None).

    Returns:
        A dict (seconds unless named otherwise)::

            start, end, duration_s
            requests          logical (user-visible) requests whose first try is a member
                              (:func:`harness.metrics.availability.request_counts`)
            errors            of those, failed: their last try is not complete
            error_rate        errors / requests (None without requests)
            retried           of ``requests``, those tried more than once
            tries             the phase's tries (``members``), each HTTP request once
            failed_tries      of those, not complete
            complete          of the tries, complete (is_complete): the latency figures' n
            unavailable_s     seconds of the window in which the server refused or failed
                              every request (harness.metrics.availability)
            min_samples, enough_samples   ``complete`` ≥ ``min_samples``: below it the
                              figures are printed as ``n=K`` and not judged
            ttft_s, tpot_s, e2e_s, itl_s (per chunk, vLLM's ITL), itl_per_token_s:
                              {"n","mean","p50","p90","p95","p99","p99.9"} over the
                              phase's complete tries (:func:`latency_metrics`)
            latency_window    where those figures come from: {"first_send", "last_send"}
                              (epoch, the complete tries' sends), "outage_start",
                              "outage_end" (the last unavailability interval that
                              overlaps the window, None if none; end None while it
                              lasts) and "sent_after_outage_start" (complete tries sent
                              at or after its start: a request sent into an outage that
                              completed was served once the server was back) — a
                              killed server completes nothing while it is down, so a
                              fault phase's latencies describe the server before the
                              kill or after it came back
            buckets           {prompt_class: latency_metrics + "tries"} per prompt-length
                              bucket of the phase's tries
            request_classes   {request_class: latency_metrics + "tries"} likewise, only when
                              a record of the run is of a class other than ``plain``
            output_tokens     tokens of complete requests whose chunk ARRIVED in the window
                              (any send time: send_time + chunk_offsets_s)
            output_tokens_per_s   output_tokens / duration (tokens arriving in the window)
            total_output_tokens   Σ usage.completion_tokens of the phase's complete tries
            output_throughput_tps total_output_tokens / duration (vLLM's output token
                              throughput over the phase)
            request_throughput_rps  complete tries / duration (vLLM's request throughput)
            goodput_rps       complete tries meeting every per-request goodput limit
                              / duration (vLLM's request goodput); None without limits
            mean_tokens_per_chunk   output tokens / output chunks over the phase's
                              complete requests (> 1 means speculative bundling)

        Rates are None for an empty window (``end ≤ start``).
    """
    cfg = metrics or MetricsConfig()
    records = list(records)
    duration = float(end - start)
    sent = records_in(records, start, end) if members is None else list(members)
    complete = [r for r in sent if is_complete(r)[0]]
    counts = request_counts(sent, records)

    tokens = 0
    for r in records:
        if not is_complete(r)[0]:
            continue
        for off, k in zip(r.chunk_offsets_s, r.chunk_tokens):
            if start <= r.send_time + off < end:
                tokens += k

    ids = {r.request_id for r in records}
    intervals = unavailable_intervals([*records, *(r for r in sent if r.request_id not in ids)])
    overlapping = [(a, b) for a, b in intervals if a < end and b > start]
    outage = overlapping[-1] if overlapping else None
    sends = [r.send_time for r in complete]

    buckets = _grouped(sent, lambda r: r.prompt_class or "unknown", cfg)

    chunks = sum(len(r.chunk_tokens) for r in complete)
    ctoks = sum(sum(r.chunk_tokens) for r in complete)
    total_out = sum(int(r.output_tokens or 0) for r in complete)
    good = sum(1 for r in complete if is_good(r, goodput)) if goodput is not None and goodput.enabled else None
    lat = latency_metrics(complete, cfg)

    out = {
        "start": float(start),
        "end": float(end),
        "duration_s": duration,
        "requests": counts["requests"],
        "errors": counts["failed"],
        "error_rate": counts["failed"] / counts["requests"] if counts["requests"] else None,
        "retried": counts["retried"],
        "tries": counts["tries"],
        "failed_tries": counts["failed_tries"],
        "complete": len(complete),
        "unavailable_s": overlap_s(intervals, start, end),
        "min_samples": cfg.min_samples,
        **{k: v for k, v in lat.items() if k != "complete"},
        "latency_window": {
            "first_send": min(sends) if sends else None,
            "last_send": max(sends) if sends else None,
            "outage_start": None if outage is None else outage[0],
            "outage_end": None if outage is None or math.isinf(outage[1]) else outage[1],
            "sent_after_outage_start": 0 if outage is None else sum(1 for t in sends if t >= outage[0]),
        },
        "buckets": buckets,
        "output_tokens": tokens,
        "output_tokens_per_s": _rate(tokens, duration),
        "total_output_tokens": total_out,
        "output_throughput_tps": _rate(total_out, duration),
        "request_throughput_rps": _rate(len(complete), duration),
        "goodput_rps": None if good is None else _rate(good, duration),
        "mean_tokens_per_chunk": ctoks / chunks if chunks else None,
    }
    if any(r.request_class != "plain" for r in records):   # load.request_classes
        out["request_classes"] = _grouped(sent, lambda r: r.request_class, cfg)
    return out


def _grouped(sent: Iterable[RequestRecord], key: Callable[[RequestRecord], str],
             cfg: MetricsConfig) -> dict[str, dict[str, Any]]:
    """``{group: {"tries", **latency_metrics}}`` of the tries ``sent``, grouped by ``key``."""
    by: dict[str, list[RequestRecord]] = {}
    for r in sent:
        by.setdefault(key(r), []).append(r)
    return {g: {"tries": len(rs), **latency_metrics((r for r in rs if is_complete(r)[0]), cfg)}
            for g, rs in sorted(by.items())}

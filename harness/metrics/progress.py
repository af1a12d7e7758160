"""Live figures for the terminal's progress display, folded from records as they arrive.

Pure: :func:`fold` takes the state and a batch of new records (read incrementally, e.g.
with :class:`harness.load.records.RecordTail`) and returns the new state;
:func:`snapshot` turns a state into the figures shown. Nothing here reads a file or a
clock: the caller passes ``now`` (epoch seconds, :func:`harness.clock.now`).

Only load requests count (``source == "load"``; in mirror mode both servers' requests);
probes and reference fetches do not. A request counts when its record is read, which is
when it ended (the load writes a record at the end of each request); each try under a
retry policy is one request. An *error* is a request that is not complete
(:func:`harness.load.records.is_complete`, the strict rule the checks use).

The live figures are over a sliding window of the last ``window_s`` seconds of request
ends (default 10 s):

* ``p95_ttft_s``: the 95th percentile of TTFT (seconds, send → first output chunk, as in
  vLLM's serving benchmark, :func:`harness.metrics.latency.ttft_s`) of the complete
  requests that ended in the window, with linear interpolation
  (:func:`harness.metrics.latency.percentiles`); None without any.
* ``tokens_per_s``: output tokens (``usage.completion_tokens``) of the complete requests
  that ended in the window, divided by the window's length (or by the time since the
  state began when that is shorter): vLLM's "output token throughput" over the window.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable

from harness.load.records import RequestRecord, is_complete
from harness.metrics.latency import percentiles, ttft_s

__all__ = ["LiveState", "ProgressSnapshot", "fold", "start_phase", "snapshot", "WINDOW_S"]

#: Default length of the sliding window of the live figures (seconds).
WINDOW_S = 10.0


@dataclass(frozen=True)
class LiveState:
    """What the display has folded so far.

    Fields:
        started_at: epoch seconds when folding began (bounds the first window).
        requests, errors: load requests and errors (not complete) read in the whole run.
        phase_requests, phase_errors: the same since the current phase began
            (:func:`start_phase`).
        recent: ``(end epoch s, TTFT s, output tokens)`` of the complete requests that
            ended within the last window, oldest first.
    """

    started_at: float
    requests: int = 0
    errors: int = 0
    phase_requests: int = 0
    phase_errors: int = 0
    recent: tuple[tuple[float, float | None, int], ...] = ()


@dataclass(frozen=True)
class ProgressSnapshot:
    """One line of progress.

    Fields:
        phase: the run's phase (``"start-up"``, ``"warm-up"``, ``"baseline"``, ...).
        elapsed_s: seconds since the phase began.
        planned_s: the phase's planned length in seconds (None: not known).
        planned_is_limit: ``planned_s`` is an upper bound (fault, recovery), not a plan.
        requests, errors: in the current phase.
        total_requests, total_errors: in the whole run so far.
        p95_ttft_s, tokens_per_s, n_window: the live figures (see module doc) and the
            number of complete requests they rest on.
        window_s: the window's length in seconds.
    """

    phase: str
    elapsed_s: float
    planned_s: float | None
    planned_is_limit: bool
    requests: int
    errors: int
    total_requests: int
    total_errors: int
    p95_ttft_s: float | None
    tokens_per_s: float
    n_window: int
    window_s: float


def _trim(recent: tuple[tuple[float, float | None, int], ...], now: float, window_s: float):
    cut = now - window_s
    return tuple(x for x in recent if x[0] >= cut)


def fold(state: LiveState, records: Iterable[RequestRecord], now: float, window_s: float = WINDOW_S) -> LiveState:
    """The state after the new ``records`` (any order; non-load records ignored), with
    the window trimmed to ``[now - window_s, now]``."""
    n = err = 0
    recent = list(state.recent)
    for r in records:
        if r.source != "load":
            continue
        n += 1
        if not is_complete(r)[0]:
            err += 1
            continue
        end = r.end_time if r.end_time is not None else now
        recent.append((end, ttft_s(r), int(r.output_tokens or 0)))
    recent.sort(key=lambda x: x[0])
    return replace(state, requests=state.requests + n, errors=state.errors + err,
                   phase_requests=state.phase_requests + n, phase_errors=state.phase_errors + err,
                   recent=_trim(tuple(recent), now, window_s))


def start_phase(state: LiveState) -> LiveState:
    """The state with the phase counters reset (a new phase began)."""
    return replace(state, phase_requests=0, phase_errors=0)


def snapshot(state: LiveState, *, phase: str, elapsed_s: float, planned_s: float | None, now: float,
             planned_is_limit: bool = False, window_s: float = WINDOW_S) -> ProgressSnapshot:
    """The figures of ``state`` at ``now`` (see module doc for their definitions)."""
    recent = _trim(state.recent, now, window_s)
    span = max(1e-9, min(window_s, now - state.started_at))
    return ProgressSnapshot(
        phase=phase, elapsed_s=max(0.0, elapsed_s), planned_s=planned_s, planned_is_limit=planned_is_limit,
        requests=state.phase_requests, errors=state.phase_errors,
        total_requests=state.requests, total_errors=state.errors,
        p95_ttft_s=percentiles([x[1] for x in recent], (95,))["p95"],
        tokens_per_s=sum(x[2] for x in recent) / span,
        n_window=len(recent), window_s=window_s,
    )

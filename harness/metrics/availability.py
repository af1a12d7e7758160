"""Failure accounting users recognise: unavailability as time, and failures counted once per
user-visible request. Pure functions of request records
(:class:`~harness.load.records.RequestRecord`), one server's at a time.

**Unavailability** (seconds the server refused or failed every request). Every try gives
one *outcome* on the run's clock:

* a **failure** at the instant the client learned it — the end of the exchange
  (``send_time + e2e_s``: the refused connect, the error status, the cut); a try that
  never ended gives none;
* a **success** at the instant the client first saw the server serve it — the arrival of
  its first output chunk (``send_time + ttft``), only for complete tries
  (:func:`~harness.load.records.is_complete`).

The server is *unavailable* from a failure that follows a success (or opens the record)
until the next success: the intervals are ``[failure, next success)``, merged, and an
interval with no success after it lasts to the end of the observation. Unavailable
seconds in a phase are the overlap of those intervals with the phase window
``[start, end)``. So a killed server whose requests fail from its kill until the first
response after its restart is unavailable for that whole stretch, however often the load
retried (the count of failed tries measures the retry rate, not the outage); a frozen
server whose requests wait and then complete is never unavailable (that is a stall,
judged by the hang and liveness checks); a stray error between successes adds the time
to the next success.

**Logical requests**. A try is one HTTP request; under the client's retry policy several
tries share a ``logical_id`` (``attempt`` 1, 2, …) and form one *logical* request, what a
user sees. A logical request counts once, in the phase of its first try, and is *failed*
only when its last try (highest ``attempt``, then latest send) is not complete. Records
written before retries existed (``attempt`` 1, empty ``logical_id``) are each their own
logical request (:attr:`~harness.load.records.RequestRecord.logical`).
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

from harness.load.records import RequestRecord, is_complete

__all__ = ["Interval", "outcomes", "unavailable_intervals", "overlap_s", "tries_by_logical", "last_try",
           "request_counts"]

#: A stretch of unavailability ``(start, end)``, epoch seconds; ``end`` may be ``math.inf``.
Interval = tuple[float, float]


def outcomes(records: Iterable[RequestRecord]) -> list[tuple[float, bool]]:
    """``(instant, succeeded)`` of every try that has an outcome (module doc), in time
    order; at one instant a success sorts before a failure."""
    out: list[tuple[float, bool]] = []
    for r in records:
        if is_complete(r)[0]:
            first = r.ttft_s if r.ttft_s is not None else (r.chunk_offsets_s[0] if r.chunk_offsets_s else r.e2e_s)
            out.append((r.send_time + float(first or 0.0), True))
        elif r.end_time is not None:
            out.append((float(r.end_time), False))
    out.sort(key=lambda o: (o[0], not o[1]))
    return out


def unavailable_intervals(records: Iterable[RequestRecord], until: float = math.inf) -> list[Interval]:
    """The intervals during which the server refused or failed every request (module doc):
    from a failure that follows a success (or opens the record) to the next success; the
    last one, when no success follows, ends at ``until`` (default ``math.inf``). Disjoint,
    in time order, epoch seconds; empty when nothing failed."""
    out: list[Interval] = []
    down_since: float | None = None
    for t, ok in outcomes(records):
        if ok:
            if down_since is not None:
                if t > down_since:
                    out.append((down_since, t))
                down_since = None
        elif down_since is None:
            down_since = t
    if down_since is not None and until > down_since:
        out.append((down_since, until))
    return out


def overlap_s(intervals: Sequence[Interval], start: float, end: float) -> float:
    """Seconds of ``intervals`` inside ``[start, end)``."""
    return float(sum(max(0.0, min(b, end) - max(a, start)) for a, b in intervals))


def tries_by_logical(records: Iterable[RequestRecord]) -> dict[str, list[RequestRecord]]:
    """Every try of each logical request, ``{logical id: [tries]}``, tries ordered by
    ``(attempt, send_time)``. A try seen twice (same ``request_id``) counts once."""
    seen: set[str] = set()
    out: dict[str, list[RequestRecord]] = {}
    for r in records:
        if r.request_id in seen:
            continue
        seen.add(r.request_id)
        out.setdefault(r.logical, []).append(r)
    for tries in out.values():
        tries.sort(key=lambda r: (int(r.attempt or 1), r.send_time))
    return out


def last_try(tries: Sequence[RequestRecord]) -> RequestRecord:
    """The try that decides a logical request: the highest ``attempt``, then the latest send."""
    return tries[-1]


def request_counts(members: Sequence[RequestRecord], records: Iterable[RequestRecord] = ()) -> dict[str, int]:
    """Requests and failures of one phase, counted once per logical request (module doc).

    Args:
        members: the tries the phase answers for
            (:func:`harness.metrics.phases.assign_phases`).
        records: every try of the run (to find the later tries of a logical request that
            began in this phase; ``members`` are always included).

    Returns:
        ``{"requests"`` (logical requests whose first try is a member), ``"failed"`` (of
        those, the ones whose last try, in whatever phase, is not complete), ``"retried"``
        (of those, the ones with more than one try), ``"tries"`` (the members, each
        ``request_id`` once), ``"failed_tries"`` (of those, not complete)``}``.
    """
    members = list({r.request_id: r for r in members}.values())
    index = tries_by_logical([*members, *records])
    ids = {r.logical for r in members if index[r.logical][0].request_id == r.request_id}
    return {
        "requests": len(ids),
        "failed": sum(1 for lid in ids if not is_complete(last_try(index[lid]))[0]),
        "retried": sum(1 for lid in ids if len(index[lid]) > 1),
        "tries": len(members),
        "failed_tries": sum(1 for r in members if not is_complete(r)[0]),
    }

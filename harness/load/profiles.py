"""Workload profiles as pure arithmetic: who sends what, and when (no locust, no I/O).

The locustfile drives the load from these functions, and the session digests the same
plan, so what the digest describes is what the load sends.

* **Schedule**: a profile's users (closed loop) or rate in requests/s (open loop) as a
  function of the time ``t`` in seconds since the load started: a linear ``ramp`` from
  ``from_users``/``from_rate`` over ``ramp.duration_s``, then the profile's value, then
  each step's value from its ``at_s`` on (:func:`schedule`, :func:`value_at`,
  :func:`users_at`, :func:`rate_at`).
* **Arrivals** (open loop): a renewal process whose gaps are gamma distributed with shape
  ``burstiness`` and scale ``1 / (rate * burstiness)`` — mean ``1 / rate`` s, coefficient
  of variation ``1 / sqrt(burstiness)``, ``burstiness = 1`` being a Poisson process —
  exactly the distribution of ``vllm bench serve --burstiness`` (vllm/benchmarks/serve.py,
  ``get_request``: ``np.random.gamma(shape=burstiness, scale=1/(rate*burstiness))``). Two
  differences, both deliberate: vLLM rescales the sum of a fixed number of gaps to
  ``N / rate`` (a fixed count), here arrivals run for a time, unscaled; and a rate that
  changes with time (ramp, steps) is applied by time rescaling — unit-rate gamma gaps in
  "operational time" ``Λ(t) = ∫ rate``, mapped back through ``Λ⁻¹`` — so a step changes the
  rate at its instant, not at the next request index as vLLM's ramp-up does. Seeded with
  numpy's PCG64 (``numpy.random.default_rng([seed, 1])``).
* **Trace arrivals** (open loop, timed source): the source's own ``arrival_s``
  (:func:`trace_arrivals`), request ``i`` at its instant, regardless of earlier responses;
  the trace repeats while the load runs, pass ``k`` shifted by ``k`` periods
  (:func:`trace_period_s`: the trace's span plus its mean gap, so a pass never lands on
  the one before).
* **Walk**: each user's seeded prompt order (a fresh shuffle per pass of the prompt set,
  ``random.Random(seed + user)``; a traffic source's prompt set in its own order instead,
  wrapping, user ``u`` starting at :func:`source_start`) and sampling draws (by weight,
  ``random.Random(f"sampling:{seed}:{user}")``, no draw with one class) and request-class
  draws (the same, ``random.Random(f"class:{seed}:{user}")``). The open loop is
  one walk (user 0) whose ``i``-th step is the ``i``-th arrival's request.
* **Plan digest** and ``report.json``'s ``load`` section (:func:`load_section`): sha256 over the prompt set and the first requests of the plan
  (:func:`plan_digest`): the same seed and configuration give the same digest, so two
  runs can be compared.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
from typing import Any, Iterator, Sequence

import numpy as np

from harness.load.config import GREEDY, PLAIN, LoadConfig, ProfileConfig, RequestClass, SamplingClass
from harness.load.lag import LagHistogram
from harness.load.prompts import Prompt
from harness.load.records import worker_record_files
from harness.load.retry import describe

__all__ = ["Segment", "schedule", "value_at", "users_at", "rate_at", "max_users", "iter_arrivals",
           "arrival_times", "trace_period_s", "trace_arrivals", "arrivals", "timed", "source_start", "Walk",
           "planned_requests", "plan_digest", "PLAN_REQUESTS", "load_section", "read_load_stats", "share"]

#: One piece of a schedule: ``(start_s, end_s, value at start, value at end)``, linear in
#: between; the last piece ends at ``math.inf`` with a constant value.
Segment = tuple[float, float, float, float]

#: Requests per stream (per closed-loop user, or of the open loop's arrivals) that
#: :func:`plan_digest` covers by default.
PLAN_REQUESTS = 256


def schedule(profile: ProfileConfig, default_users: int = 1) -> list[Segment]:
    """The profile's users (closed) or rate (open) over time as linear pieces.

    Args:
        profile: the validated profile (steps after the ramp, in increasing ``at_s``).
        default_users: ``load.users``, used when a closed profile gives no ``users``.

    Returns:
        Contiguous segments from 0 to ``math.inf`` (see :data:`Segment`).
    """
    closed = profile.kind == "closed"
    base = float((profile.users or default_users) if closed else profile.rate)
    out: list[Segment] = []
    t = 0.0
    if profile.ramp is not None:
        start = float(profile.ramp.from_users if closed else profile.ramp.from_rate)
        t = profile.ramp.duration_s
        out.append((0.0, t, start, base))
    value = base
    for st in profile.steps:
        if st.at_s > t:
            out.append((t, st.at_s, value, value))
        t = st.at_s
        value = float(st.users if closed else st.rate)
    out.append((t, math.inf, value, value))
    return out


def value_at(segments: Sequence[Segment], t: float) -> float:
    """The schedule's value at ``t`` seconds (the first segment's start value before 0)."""
    for start, end, v0, v1 in segments:
        if t < end:
            if t <= start or end == math.inf:
                return v0
            return v0 + (v1 - v0) * (t - start) / (end - start)
    return segments[-1][3]


def users_at(profile: ProfileConfig, t: float, default_users: int = 1) -> int:
    """Closed loop: users that should run at ``t`` s (the nearest whole user, halves up)."""
    return int(math.floor(value_at(schedule(profile, default_users), t) + 0.5))


def rate_at(profile: ProfileConfig, t: float) -> float:
    """Open loop: the arrival rate at ``t`` s, requests/s."""
    return value_at(schedule(profile), t)


def max_users(profile: ProfileConfig, default_users: int = 1) -> int:
    """Closed loop: the most users the schedule ever asks for
    (:meth:`~harness.load.config.ProfileConfig.peak_users`)."""
    return profile.peak_users(default_users)


def _invert(segments: Sequence[Segment], cum: Sequence[float], u: float) -> float:
    """``Λ⁻¹(u)``: the time at which the integrated rate reaches ``u``."""
    for (start, end, r0, r1), c0, c1 in zip(segments, cum, list(cum[1:]) + [math.inf]):
        if u >= c1:
            continue
        du = u - c0
        if end == math.inf or r0 == r1:
            return start + du / r0
        a = (r1 - r0) / (end - start)
        # root of c0 + r0 x + a x^2 / 2 = u, in the form that is stable for either sign of a
        return start + 2.0 * du / (r0 + math.sqrt(max(r0 * r0 + 2.0 * a * du, 0.0)))
    raise ValueError("the rate schedule has no mass left")  # unreachable: the last rate is > 0


def iter_arrivals(profile: ProfileConfig, seed: int, batch: int = 1024) -> Iterator[float]:
    """Open loop: arrival instants in seconds since the load started, increasing, forever
    (see module doc). The first arrival comes after one gap, not at 0.

    Raises:
        ValueError: ``profile`` is not an open-loop profile.
    """
    if profile.kind != "open":
        raise ValueError("arrivals exist only for an open-loop profile")
    segments = schedule(profile)
    cum = [0.0]
    for start, end, r0, r1 in segments[:-1]:
        cum.append(cum[-1] + (r0 + r1) / 2.0 * (end - start))
    rng = np.random.default_rng([seed, 1])
    shape = profile.burstiness
    u = 0.0
    while True:
        for gap in rng.gamma(shape=shape, scale=1.0 / shape, size=batch):
            u += float(gap)
            yield _invert(segments, cum, u)


def arrival_times(rate: float, burstiness: float, seed: int, duration_s: float) -> np.ndarray:
    """Arrival instants (seconds, increasing) in ``[0, duration_s)`` of a constant-rate
    open loop: gamma gaps of shape ``burstiness``, scale ``1 / (rate * burstiness)``.

    Raises:
        ValueError: ``rate`` or ``burstiness`` is not > 0.
    """
    if not (rate > 0 and burstiness > 0):
        raise ValueError(f"rate ({rate}) and burstiness ({burstiness}) must be > 0")
    profile = ProfileConfig(kind="open", rate=rate, burstiness=burstiness)
    return np.fromiter(itertools.takewhile(lambda t: t < duration_s, iter_arrivals(profile, seed)), dtype=float)


def trace_period_s(arrival_s: Sequence[float]) -> float:
    """Seconds after which a timed trace starts again (:func:`trace_arrivals`): its span
    (last ``arrival_s`` − first) plus its mean gap (span / (n − 1)); 1.0 when the span is 0
    (one request, or all at one instant).

    Raises:
        ValueError: no arrivals, or arrivals not in increasing order.
    """
    if not arrival_s:
        raise ValueError("a timed trace needs at least one arrival")
    if any(b < a for a, b in zip(arrival_s, arrival_s[1:])):
        raise ValueError("a timed trace's arrivals must not decrease")
    span = arrival_s[-1] - arrival_s[0]
    return span + span / (len(arrival_s) - 1) if span > 0 else 1.0


def trace_arrivals(arrival_s: Sequence[float]) -> Iterator[float]:
    """Open loop from a timed trace: its arrival instants (seconds since the load started,
    the first at its own ``arrival_s``, normally 0), then the trace again, pass ``k``
    shifted by ``k`` × :func:`trace_period_s`, forever; the ``i``-th instant is request
    ``i % len(arrival_s)``'s.

    Raises:
        ValueError: as :func:`trace_period_s`.
    """
    period = trace_period_s(arrival_s)
    for k in itertools.count():
        for at in arrival_s:
            yield at + k * period


def timed(prompts: Sequence[Prompt]) -> bool:
    """Whether the prompt set is a timed source's (every prompt has an ``arrival_s``)."""
    return bool(prompts) and all(p.arrival_s is not None for p in prompts)


def arrivals(profile: ProfileConfig, prompts: Sequence[Prompt], seed: int) -> Iterator[float]:
    """The open loop's arrival instants: a timed source's (:func:`trace_arrivals`), else the
    profile's seeded process (:func:`iter_arrivals`).

    Raises:
        ValueError: ``profile`` is not an open-loop profile.
    """
    if profile.kind != "open":
        raise ValueError("arrivals exist only for an open-loop profile")
    if timed(prompts):
        return trace_arrivals([p.arrival_s for p in prompts])  # type: ignore[misc]
    return iter_arrivals(profile, seed)


#: The golden ratio's fractional part: user ``u`` of a source walk starts at ``frac(u · φ)``
#: of the way through the source, spreading any number of users evenly (a Weyl sequence).
_PHI = 0.6180339887498949


def source_start(user_id: int, n: int) -> int:
    """Where user ``user_id`` (0-based) starts walking a traffic source of ``n`` requests:
    ``floor(frac(user_id · 0.618…) · n)`` (0 for user 0), so concurrent users send
    different requests however many there are."""
    return int((user_id * _PHI) % 1.0 * n) % n if n else 0


class Walk:
    """One user's seeded request sequence: prompts in a fresh shuffle per pass of the set
    (a traffic source's set, whose prompts carry an ``origin``: in the set's order from
    :func:`source_start`, wrapping), sampling classes and request classes drawn by weight,
    each from its own generator (see module doc), so adding classes of one kind changes
    neither the prompt walk nor the other kind's draws."""

    def __init__(self, prompts: Sequence[Prompt], sampling: Sequence[SamplingClass], seed: int, user_id: int,
                 classes: Sequence[RequestClass] = (PLAIN,)):
        if not prompts:
            raise ValueError("the prompt set is empty")
        self.prompts = list(prompts)
        self.sampling = list(sampling) or [GREEDY]
        self.classes = list(classes) or [PLAIN]
        self.rng = random.Random(seed + user_id)
        self.sampling_rng = random.Random(f"sampling:{seed}:{user_id}")
        self.class_rng = random.Random(f"class:{seed}:{user_id}")
        self._order: list[Prompt] = []
        #: a source's set: the next index of the in-order walk; None: shuffled passes
        self._next: int | None = (source_start(user_id, len(self.prompts))
                                  if any(p.origin is not None for p in self.prompts) else None)

    def next_prompt(self) -> Prompt:
        """The next prompt of the walk."""
        if self._next is not None:
            p = self.prompts[self._next % len(self.prompts)]
            self._next += 1
            return p
        if not self._order:
            self._order = list(self.prompts)
            self.rng.shuffle(self._order)
            self._order.reverse()  # pop() from the end walks the shuffle in order
        return self._order.pop()

    def next_sampling(self) -> SamplingClass:
        """The next request's sampling class (no draw when there is only one class)."""
        if len(self.sampling) == 1:
            return self.sampling[0]
        return self.sampling_rng.choices(self.sampling, weights=[c.weight for c in self.sampling])[0]

    def next_class(self) -> RequestClass:
        """The next request's class (no draw when there is only one class)."""
        if len(self.classes) == 1:
            return self.classes[0]
        return self.class_rng.choices(self.classes, weights=[c.weight for c in self.classes])[0]

    def next(self) -> tuple[Prompt, SamplingClass]:
        """The next request: its prompt, then its sampling class."""
        return self.next_prompt(), self.next_sampling()


def planned_requests(load: LoadConfig, prompts: Sequence[Prompt], count: int = PLAN_REQUESTS) -> list[dict]:
    """The first ``count`` planned requests of each stream: per closed-loop user (users
    ``0 .. max_users - 1``) ``{"user", "prompt_id", "sampling", "max_tokens"}``, or for the
    open loop the first ``count`` arrivals ``{"at_s" (µs-rounded), "prompt_id", "sampling",
    "max_tokens"}``; with ``load.request_classes``, each also names its ``"request_class"``.
    Which of them a run really sends depends on time; this is the plan."""
    out: list[dict] = []
    streams = ([(0, {})] if load.profile.kind == "open"
               else [(user, {"user": user}) for user in range(max_users(load.profile, load.users))])
    for user, head in streams:
        walk = Walk(prompts, load.sampling, load.seed, user, load.classes())
        times = (arrivals(load.profile, prompts, load.seed) if load.profile.kind == "open"
                 else itertools.repeat(None))
        for at in itertools.islice(times, count):
            p, s = walk.next()
            step = {**head, **({"at_s": round(at, 6)} if at is not None else {}), "prompt_id": p.prompt_id,
                    "sampling": s.name, "max_tokens": p.max_tokens}
            if load.request_classes is not None:
                step["request_class"] = walk.next_class().name
            out.append(step)
    return out


def plan_digest(load: LoadConfig, prompts: Sequence[Prompt], count: int = PLAN_REQUESTS) -> str:
    """sha256 (hex) of the prompt set (id, bucket, tokens, max_tokens, text; a source's
    prompts also endpoint, body, origin and arrival) and of
    :func:`planned_requests`: equal for the same seed, configuration and tokenizer."""
    doc = {
        "kind": load.profile.kind,
        "prompts": [[p.prompt_id, p.prompt_class, p.prompt_tokens, p.max_tokens, p.text]
                    + ([p.endpoint, p.body, p.origin, p.arrival_s] if p.body is not None else []) for p in prompts],
        "sampling": [s.model_dump() for s in load.sampling],
        "requests": planned_requests(load, prompts, count),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def load_section(load: LoadConfig, prompts: Sequence[Prompt], count: int = PLAN_REQUESTS) -> dict:
    """``report.json``'s (and ``run.json``'s) ``load``: the effective profile (a closed
    loop's ``users`` resolved), the effective retry policy
    (:func:`harness.load.retry.describe`), ``error_backoff_s``, the seed, the plan's
    digest (:func:`plan_digest`) with what it covers, and with ``load.request_classes``
    ``request_classes``: ``[{"name", "weight", "endpoint", "turns"}]``; with ``load.source``
    ``source``: ``{"format", "path", "requests", "order"}`` and for a timed trace its
    ``speedup`` and ``period_s`` (:func:`trace_period_s`)."""
    profile = load.profile.model_dump()
    streams = 1
    if load.profile.kind == "closed":
        profile["users"] = load.closed_users()
        streams = max_users(load.profile, load.users)
    out = {
        "profile": profile,
        "retry": describe(load.retry),
        "error_backoff_s": load.error_backoff_s,
        "seed": load.seed,
        "plan_digest": plan_digest(load, prompts, count),
        "plan_covers": (f"prompt set ({len(prompts)} prompts) and the first {count} requests of "
                        + (f"each of {streams} users" if load.profile.kind == "closed" else "the arrivals")),
    }
    if load.request_classes is not None:
        out["request_classes"] = [c.model_dump(include={"name", "weight", "endpoint", "turns"})
                                  for c in load.request_classes]
    if load.source is not None:
        src = {"format": load.source.format, "path": load.source.path, "requests": len(prompts),
               "order": load.source.order}
        if timed(prompts):
            src.update(speedup=load.source.speedup,
                       period_s=round(trace_period_s([p.arrival_s for p in prompts]), 6))  # type: ignore[misc]
        out["source"] = src
    return out


def share(total: int, n: int, index: int) -> int:
    """Worker ``index``'s (0-based) share of ``total`` split over ``n`` workers: an even
    split, the first ``total % n`` workers one more, so the shares sum to ``total``."""
    return total // n + (1 if index < total % n else 0)


def _read_json(path) -> dict | None:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def lag_fields(hist: LagHistogram) -> dict[str, Any]:
    """A pacer's lag as ``load_stats.json`` holds it: the histogram (``lag_histogram``) and
    its summary in seconds and fractions of arrivals (``lag_p50_s``, ``lag_p95_s``,
    ``lag_p99_s``, ``lag_max_s``, ``lag_mean_s``, ``share_late_1ms``, ``share_late_10ms``;
    None without arrivals)."""
    s = hist.summary()
    return {"lag_p50_s": s["p50_s"], "lag_p95_s": s["p95_s"], "lag_p99_s": s["p99_s"], "lag_max_s": s["max_s"],
            "lag_mean_s": s["mean_s"], "share_late_1ms": s["share_late_1ms"],
            "share_late_10ms": s["share_late_10ms"], "lag_histogram": hist.to_dict()}


def read_load_stats(path) -> dict | None:
    """The open loop's ``load_stats.json`` (:class:`OpenLoopStats` in the locustfile), or
    None when absent or unreadable. With a distributed load (``load.workers``) each worker
    wrote its own ``load_stats.worker<i>.json`` beside it (``rate`` the run's, the others its
    own part's): they are merged (arrivals, drops and ``max_in_flight`` summed, the lag
    histograms added and their summary taken again, :func:`lag_fields`) and ``workers``
    says how many were read."""
    single = _read_json(path)
    if single is not None:
        return single
    parts = [d for f in worker_record_files(path) if (d := _read_json(f)) is not None]
    if not parts:
        return None
    merged = dict(parts[0])
    for key in ("arrivals", "dropped", "max_in_flight"):
        merged[key] = sum(int(d.get(key) or 0) for d in parts)
    hist = LagHistogram()
    for d in parts:
        hist = hist.merge(LagHistogram.from_dict(d.get("lag_histogram")))
    merged.update(lag_fields(hist))
    merged["workers"] = len(parts)
    return merged

"""Toxics of the fault proxy (:mod:`faults.proxy`), with toxiproxy's names and semantics.

A toxic is plain data, as in toxiproxy's HTTP API::

    {"name": "latency_downstream", "type": "latency", "stream": "downstream",
     "toxicity": 1.0, "attributes": {"latency": 50, "jitter": 25}}

* ``type``: one of :data:`TOXIC_TYPES`; ``attributes`` are validated by the type's
  ``Attrs`` model (units as toxiproxy's: ms, KB/s, µs for the slicer's delay);
* ``stream``: ``"upstream"`` (client → server: the request) or ``"downstream"``
  (server → client: the response);
* ``toxicity``: the fraction of connections the toxic acts on, in [0, 1]. The decision is
  drawn once per (toxic, connection) from :func:`connection_rng`, seeded by the proxy's
  seed, the toxic's name and the connection's index (order of acceptance), so the same
  seed gives the same decisions for the same connection sequence, whatever the timing.
  Every further draw of the toxic on that connection (jitter, slice sizes, the corrupted
  event) continues that same generator.

Each type is one :class:`ToxicPipe` subclass (toxiproxy's pipe), registered in
:data:`TOXICS` by its ``kind``: adding a toxic is one new class. ``corrupt`` and ``abort``
re-frame streamed SSE responses (:class:`SseReframer`, h11 parses the HTTP); the others act
on raw TCP bytes.
"""

from __future__ import annotations

import json
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

import h11
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from faults.sse_rewrite import ResponseRewrite

__all__ = ["TOXICS", "TOXIC_TYPES", "STREAMS", "Toxic", "ToxicPipe", "ToxicStats", "Delays", "Segments",
           "connection_rng", "slice_sizes", "SseReframer", "corrupt_events", "Corruption", "parse_toxic",
           "CorruptPlan"]

STREAMS = ("upstream", "downstream")
#: Pieces of one chunk on their way through the toxics: ``(not before, perf_counter s; bytes)``.
Segments = list[tuple[float, bytes]]
_SAMPLES = 2000


def _error_line(exc: ValidationError, where: str = "", unknown: str = "") -> str:
    """One line naming the field of a pydantic error (``"latency: Input should be ..."``);
    ``where`` stands for an empty location, ``unknown`` is the message for an unknown field."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or where
    msg = unknown if err["type"] == "extra_forbidden" and unknown else str(err["msg"]).removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg


def attributes_error(toxic_type: str, attributes: Any) -> str | None:
    """None when ``attributes`` are valid for ``toxic_type``, else one line naming the
    attribute (``"latency: Input should be greater than or equal to 0"``)."""
    pipe = TOXICS.get(toxic_type)
    if pipe is None:
        return f"unknown toxic type {toxic_type!r} (known: {', '.join(TOXIC_TYPES)})"
    try:
        pipe.Attrs.model_validate(attributes or {})
    except ValidationError as exc:
        return _error_line(exc, "attributes",
                           f"unknown attribute of {toxic_type} (takes: {', '.join(pipe.Attrs.model_fields)})")
    return None


class Toxic(BaseModel):
    """One toxic (toxiproxy's JSON shape). ``name`` defaults to ``<type>_<stream>``;
    ``attrs`` is the validated attribute model."""

    model_config = ConfigDict(extra="forbid")

    name: str = ""
    type: str
    stream: Literal["upstream", "downstream"] = "downstream"
    toxicity: float = Field(1.0, ge=0, le=1)
    attributes: dict[str, Any] = Field(default_factory=dict)

    @field_validator("type")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in TOXICS:
            raise ValueError(f"Input should be {', '.join(map(repr, TOXIC_TYPES[:-1]))} or {TOXIC_TYPES[-1]!r}")
        return v

    @model_validator(mode="after")
    def _check(self) -> "Toxic":
        problem = attributes_error(self.type, self.attributes)
        if problem:
            raise ValueError(f"attributes.{problem}")
        if not self.name:
            self.name = f"{self.type}_{self.stream}"
        return self

    @property
    def attrs(self) -> Any:
        return TOXICS[self.type].Attrs.model_validate(self.attributes)

    def public(self) -> dict[str, Any]:
        """The JSON toxiproxy's API returns for a toxic."""
        return self.model_dump(mode="json")


def parse_toxic(data: Any) -> Toxic:
    """Validate a toxic's JSON.

    Raises:
        ValueError: one line naming the field (``stream: Input should be 'upstream' or
            'downstream'``, ``attributes.latency: ...``).
    """
    try:
        return Toxic.model_validate(data)
    except ValidationError as exc:
        raise ValueError(_error_line(exc)) from None


def connection_rng(seed: int, toxic_name: str, connection: int) -> random.Random:
    """The generator of one toxic on one connection (string seeding is stable across runs
    and Python processes: it hashes with SHA-512, not ``hash()``)."""
    return random.Random(f"specchaos/{seed}/{toxic_name}/{connection}")


def affected(rng: random.Random, toxicity: float) -> bool:
    """The toxicity draw (the first draw of a connection's generator)."""
    return toxicity >= 1.0 or rng.random() < toxicity


# ---------------------------------------------------------------- measurements

class Delays:
    """Running summary of delays in ms (count, mean, max; p50/p99 over the last samples)."""

    def __init__(self) -> None:
        self.count, self.total, self.max = 0, 0.0, 0.0
        self.recent: deque[float] = deque(maxlen=_SAMPLES)

    def add(self, ms: float) -> None:
        self.count += 1
        self.total += ms
        self.max = max(self.max, ms)
        self.recent.append(ms)

    def summary(self) -> dict[str, Any]:
        xs = sorted(self.recent)

        def q(p: float) -> float | None:
            return round(xs[min(len(xs) - 1, int(p * len(xs)))], 3) if xs else None

        return {"count": self.count, "mean": round(self.total / self.count, 3) if self.count else None,
                "p50": q(0.5), "p99": q(0.99), "max": round(self.max, 3)}


class ToxicStats:
    """What one toxic (by name) met and did, over every connection since it was first added:
    ``connections_seen`` (connections with data on its stream while it was there),
    ``connections_affected`` (those its toxicity draw picked), ``chunks_seen`` (chunks read
    on its stream while it was there), ``chunks`` and ``bytes`` (those on affected
    connections), ``added_ms`` (arrival at the proxy → end of write of those chunks, ms),
    and the type's own counters (:attr:`ToxicPipe.counters`)."""

    def __init__(self) -> None:
        self.added = Delays()
        self.count: dict[str, Any] = dict.fromkeys(
            ("connections_seen", "connections_affected", "chunks_seen", "chunks", "bytes"), 0)

    def as_dict(self) -> dict[str, Any]:
        return self.count | {"added_ms": self.added.summary()}


# ---------------------------------------------------------------- the interface

class Link(Protocol):
    """What a toxic may do to its connection (the proxy's connection implements it):
    ``index`` (order of acceptance), ``pending`` (a request awaits its response's end),
    :meth:`later`: call ``act`` in ``delay_s`` s if ``pipe`` is still on the open connection
    then, :meth:`close` both sides (``reset``: a TCP RST to the client)."""

    index: int
    pending: bool

    def later(self, pipe: ToxicPipe, delay_s: float, act: Callable[[], None]) -> None: ...
    def close(self, reset: bool = False) -> None: ...


#: Toxic types by name (``type`` of a toxic's JSON): every :class:`ToxicPipe` subclass.
TOXICS: dict[str, type[ToxicPipe]] = {}


class _Attrs(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ToxicPipe:
    """One toxic on one connection's stream (toxiproxy's ``Pipe``), with that connection's
    state. A subclass is one toxic type: its docstring says what it does, ``kind`` names it
    (and registers it in :data:`TOXICS`), ``Attrs`` is its attribute model, ``counters``
    its own counters in :class:`ToxicStats` (with start values), and :meth:`pipe` does it;
    a ``per_response`` toxic acts on every connection and draws per response instead (the
    proxy counts its streams in flight).

    Attributes:
        affected: the toxicity draw for this connection (the toxic acts only where True).
        end: set by :meth:`pipe` to end the connection once its returned pieces are written.
    """

    kind: ClassVar[str]
    Attrs: ClassVar[type[_Attrs]]
    counters: ClassVar[dict[str, Any]] = {}
    per_response: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        TOXICS[cls.kind] = cls

    def __init__(self, toxic: Toxic, rng: random.Random, stats: ToxicStats, link: Link, mid_stream: bool):
        self.toxic, self.attrs, self.rng, self.stats, self.link = toxic, toxic.attrs, rng, stats, link
        for k, v in self.counters.items():
            stats.count.setdefault(k, type(v)())
        self.affected = self.per_response or affected(rng, toxic.toxicity)
        self.end = self.timer = False

    def pipe(self, segments: Segments, arrived: float, now: float) -> Segments:
        """The pieces to write for one chunk's ``segments`` (``arrived``, ``now``: perf_counter s)."""
        raise NotImplementedError

    def close_later(self, delay_s: float, count: str, reset: bool = False) -> None:
        """Once per connection: in ``delay_s`` s count ``count`` and close (``reset``: RST)."""
        if not self.timer:
            self.timer = True
            self.link.later(self, delay_s, lambda: self._close(count, reset))

    def _close(self, count: str, reset: bool) -> None:
        self.stats.count[count] += 1
        self.link.close(reset=reset)


# ---------------------------------------------------------------- the toxics

class Latency(ToxicPipe):
    """``latency`` ms added to every chunk (from its arrival at the proxy), plus a jitter
    drawn per chunk: uniform in ±``jitter`` ms (toxiproxy's) or normal with sd ``jitter``
    ms (``distribution: normal``); the delay never goes below 0."""

    class Attrs(_Attrs):
        latency: float = Field(0.0, ge=0)
        jitter: float = Field(0.0, ge=0)
        distribution: Literal["uniform", "normal"] = "uniform"

    kind = "latency"

    def pipe(self, segments: Segments, arrived: float, now: float) -> Segments:
        return [(max(t, arrived + latency_s(self.attrs, self.rng)), b) for t, b in segments]


def latency_s(attrs: Latency.Attrs, rng: random.Random) -> float:
    """One chunk's delay in seconds (≥ 0)."""
    if attrs.jitter <= 0:
        return attrs.latency / 1000.0
    if attrs.distribution == "normal":
        ms = rng.gauss(attrs.latency, attrs.jitter)
    else:
        ms = attrs.latency + rng.uniform(-attrs.jitter, attrs.jitter)
    return max(0.0, ms) / 1000.0


def max_chunk_delay_s(attrs: Latency.Attrs) -> float:
    """The most one chunk's delay may be, by the toxic's declaration, in seconds: ``latency``
    + ``jitter`` for the uniform distribution (its upper end), ``latency`` + 3 ``jitter`` for
    the normal one (its 99.87th percentile; :func:`latency_s` draws it).

    Chunks are delayed from their arrival and written in order, so a request's TTFT and E2E
    each gain about one chunk's delay, not one per chunk: this bound is what a downstream (or
    upstream) latency toxic adds to them by design (:mod:`harness.checks.slo` judges the
    stack's degradation beyond it)."""
    spread = 3.0 * attrs.jitter if attrs.distribution == "normal" else attrs.jitter
    return (attrs.latency + spread) / 1000.0


class Bandwidth(ToxicPipe):
    """At most ``rate`` KB/s (1 KB = 1000 bytes) through the stream, in pieces of 100 ms."""

    class Attrs(_Attrs):
        rate: float = Field(gt=0)

    kind, t_next = "bandwidth", 0.0

    def pipe(self, segments: Segments, arrived: float, now: float) -> Segments:
        rate = self.attrs.rate * 1000.0                   # bytes/s
        step = max(1, int(rate * 0.1))
        out, t_next = [], max(now, self.t_next)
        for t, b in segments:
            for i in range(0, len(b), step):
                t_next = max(t_next, t)
                out.append((t_next, b[i:i + step]))
                t_next += len(out[-1][1]) / rate
        self.t_next = t_next
        return out


class Slicer(ToxicPipe):
    """Split every chunk into pieces of ``average_size`` ± ``size_variation`` bytes,
    ``delay`` µs apart (as an SSE stream split across TCP segments)."""

    class Attrs(_Attrs):
        average_size: int = Field(64, ge=1)
        size_variation: int = Field(0, ge=0)
        delay: float = Field(0.0, ge=0)

        @model_validator(mode="after")
        def _variation(self) -> Slicer.Attrs:
            if self.size_variation >= self.average_size:
                raise ValueError("size_variation must be smaller than average_size")
            return self

    kind, counters = "slicer", {"pieces": 0}

    def pipe(self, segments: Segments, arrived: float, now: float) -> Segments:
        out = []
        for t, b in segments:
            pos = 0
            for j, n in enumerate(slice_sizes(len(b), self.attrs, self.rng)):
                out.append((t + j * self.attrs.delay / 1e6, b[pos:pos + n]))
                pos += n
        self.stats.count["pieces"] += len(out)
        return out


def slice_sizes(n: int, attrs: Slicer.Attrs, rng: random.Random) -> list[int]:
    """Sizes of the pieces a chunk of ``n`` bytes is split into (each ≥ 1, summing to ``n``)."""
    sizes = []
    left = n
    while left > 0:
        size = attrs.average_size
        if attrs.size_variation:
            size += rng.randint(-attrs.size_variation, attrs.size_variation)
        size = max(1, min(size, left))
        sizes.append(size)
        left -= size
    return sizes


class ResetPeer(ToxicPipe):
    """Reset the connection (TCP RST to the client, close to the server) ``timeout`` ms
    after the toxic first sees data on it (0: at once)."""

    class Attrs(_Attrs):
        timeout: float = Field(0.0, ge=0)

    kind, counters = "reset_peer", {"resets": 0}

    def pipe(self, segments: Segments, arrived: float, now: float) -> Segments:
        self.close_later(self.attrs.timeout / 1000.0, "resets", reset=True)
        return segments


class Timeout(ToxicPipe):
    """Blackhole: drop all data; close the connection after ``timeout`` ms (0: never,
    data is dropped until the toxic is removed)."""

    Attrs = ResetPeer.Attrs
    kind, counters = "timeout", {"bytes_dropped": 0, "closed": 0}

    def pipe(self, segments: Segments, arrived: float, now: float) -> Segments:
        self.stats.count["bytes_dropped"] += sum(len(b) for _, b in segments)
        if self.attrs.timeout > 0:
            self.close_later(self.attrs.timeout / 1000.0, "closed")
        return []


class LimitData(ToxicPipe):
    """Close the connection once ``bytes`` bytes went through the stream."""

    class Attrs(_Attrs):
        bytes: int = Field(ge=0)

    kind, counters, sent = "limit_data", {"bytes_cut": 0, "closed": 0}, 0

    def pipe(self, segments: Segments, arrived: float, now: float) -> Segments:
        out = []
        for t, b in segments:
            keep = b[:max(0, self.attrs.bytes - self.sent)]
            self.sent += len(keep)
            self.stats.count["bytes_cut"] += len(b) - len(keep)
            if keep:
                out.append((t, keep))
        if self.sent >= self.attrs.bytes:
            self.stats.count["closed"] += 1
            self.end = True
        return out


class Corrupt(ToxicPipe):
    """Corrupt one SSE event of every streamed response (:class:`CorruptPlan`): ``mode``
    ``alter`` (the first output token id + 1, else ``usage.completion_tokens`` + 1),
    ``drop``, ``duplicate``, or ``any`` (one of these three, drawn per response); the
    event's index is drawn in [0, ``max_event``] (a response with fewer events is left
    alone). ``data: [DONE]`` is never touched. The semantic modes rewrite the events' JSON,
    each breaking one request-class invariant (:mod:`faults.sse_rewrite`):
    ``append_after_stop``, ``drop_token_text`` (its event: the ``k``-th with token text,
    ``k`` drawn in [0, ``max_event``]), ``break_json``, ``zero_logprobs``; ``any`` never
    draws them. Counts ``events_corrupted`` and keeps the first 50 ``corruptions``."""

    class Attrs(_Attrs):
        mode: Literal["alter", "drop", "duplicate", "any", "append_after_stop", "drop_token_text", "break_json",
                      "zero_logprobs"] = "any"
        max_event: int = Field(3, ge=0)

    kind, counters = "corrupt", {"events_corrupted": 0, "corruptions": []}

    def __init__(self, toxic: Toxic, rng: random.Random, stats: ToxicStats, link: Link, mid_stream: bool):
        super().__init__(toxic, rng, stats, link, mid_stream)
        self.plan = CorruptPlan(self.rng, self.attrs)
        self.reframer = SseReframer(self.plan, mid_stream)
        self.reported = 0

    def pipe(self, segments: Segments, arrived: float, now: float) -> Segments:
        out = [(t, self.reframer.feed(b)) for t, b in segments]
        new, count = self.plan.done[self.reported:], self.stats.count
        self.reported = len(self.plan.done)
        count["events_corrupted"] += len(new)
        count["corruptions"] += [c.as_dict() | {"connection": self.link.index} for c in new[:50 - len(count["corruptions"])]]
        return out


class Abort(ToxicPipe):
    """Close the connection (to the server: a client disconnect; to the client: a cut
    stream) right after the ``after_events``-th SSE event of a streamed response (1: after
    the first chunk). For ``abort`` the toxicity is the fraction of *responses* aborted,
    drawn per response (an aborted connection is gone, so the next request opens another).
    It is its own :class:`SseReframer` plan: at each response's start it draws whether to
    abort it; ``abort_now`` turns True once that response's ``after_events``-th event passed
    (the re-framer then emits nothing more). Counts ``aborted`` (and the last 200 times)."""

    class Attrs(_Attrs):
        after_events: int = Field(1, ge=1)

    kind, counters, per_response = "abort", {"aborted": 0, "abort_times": []}, True

    def __init__(self, toxic: Toxic, rng: random.Random, stats: ToxicStats, link: Link, mid_stream: bool):
        super().__init__(toxic, rng, stats, link, mid_stream)
        self.aborting = self.abort_now = False
        self.reframer = SseReframer(self, mid_stream)
        self.completed = 0

    def start(self, response: int) -> None:
        self.aborting = self.rng.random() < self.toxic.toxicity     # (the control API may change it in place)

    def event(self, index: int, event: bytes) -> list[bytes]:
        if self.aborting and index == self.attrs.after_events - 1 and not is_done(event):
            self.abort_now = True
        return [event]

    def pipe(self, segments: Segments, arrived: float, now: float) -> Segments:
        out = [(t, self.reframer.feed(b)) for t, b in segments]
        if self.reframer.completed > self.completed:
            self.completed = self.reframer.completed
            self.link.pending = self.reframer.in_response
        if self.abort_now:
            self.stats.count["aborted"] += 1
            times = self.stats.count["abort_times"]
            times.append(time.time())
            del times[:-200]
            self.end = True
        return out


#: The toxic types' names, in registration order.
TOXIC_TYPES = tuple(TOXICS)
LatencyAttrs = Latency.Attrs
SlicerAttrs = Slicer.Attrs
CorruptAttrs = Corrupt.Attrs


@dataclass
class Corruption:
    """What ``corrupt`` did to one response: ``event`` (index among its SSE events),
    ``mode``, and the event ``before`` and ``after`` (``after`` None for a drop).
    :meth:`as_dict` keeps 200 characters of each: the first ones, or for a semantic mode
    (:mod:`faults.sse_rewrite`) those from 60 before the first changed character on."""

    response: int
    event: int
    mode: str
    before: str
    after: str | None

    def as_dict(self) -> dict[str, Any]:
        at = 0
        if self.after is not None and self.mode not in ("alter", "drop", "duplicate"):
            at = next((i for i, (a, b) in enumerate(zip(self.before, self.after)) if a != b),
                      min(len(self.before), len(self.after)))
            at = max(0, at - 60)
        return {"response": self.response, "event": self.event, "mode": self.mode,
                "before": self.before[at:at + 200], "after": None if self.after is None else self.after[at:at + 200]}


def alter_event(event: bytes) -> bytes:
    """An altered copy of one SSE event: the first output token id + 1, else
    ``usage.completion_tokens`` + 1, else ``~`` appended to the text, else the data
    replaced by a non-JSON line. Never equal to ``event``."""
    text = event.decode("utf-8", "replace")
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if not line.startswith("data:"):
            continue
        raw = line[5:].strip()
        try:
            payload = json.loads(raw)
        except ValueError:
            lines[i] = "data: " + raw + "~"
            return "\n".join(lines).encode()
        if isinstance(payload, dict):
            choices = payload.get("choices") or []
            c0 = choices[0] if choices and isinstance(choices[0], dict) else None
            if c0 is not None and c0.get("token_ids"):
                c0["token_ids"][0] = int(c0["token_ids"][0]) + 1
            elif isinstance(payload.get("usage"), dict) and payload["usage"].get("completion_tokens") is not None:
                payload["usage"]["completion_tokens"] = int(payload["usage"]["completion_tokens"]) + 1
            elif c0 is not None:
                c0["text"] = str(c0.get("text") or "") + "~"
            else:
                payload["specchaos_corrupt"] = True
            lines[i] = "data: " + json.dumps(payload, separators=(",", ":"))
            return "\n".join(lines).encode()
        lines[i] = "data: " + raw + "~"
        return "\n".join(lines).encode()
    return event + b"~"


def is_done(event: bytes) -> bool:
    return event.strip() == b"data: [DONE]"


class CorruptPlan:
    """``corrupt`` on one connection: at each response's start it draws the event index in
    [0, ``max_event``] and (mode ``any``) the mode from ``rng``; :meth:`event` then
    transforms that event as it passes. A semantic mode starts a
    :class:`faults.sse_rewrite.ResponseRewrite` per response instead, which rewrites every
    event it applies to. ``done`` lists what was done (one entry per changed event)."""

    def __init__(self, rng: random.Random, attrs: Corrupt.Attrs):
        self.rng, self.attrs = rng, attrs
        self.done: list[Corruption] = []
        self._response, self._k, self._mode = -1, -1, "alter"
        self._rewrite: ResponseRewrite | None = None
        self.abort_now = False

    def start(self, response: int) -> None:
        self._response = response
        if self.attrs.mode not in ("alter", "drop", "duplicate", "any"):    # a semantic mode (faults.sse_rewrite)
            self._mode = self.attrs.mode
            self._rewrite = ResponseRewrite(self._mode, self.rng, self.attrs.max_event)
            return
        self._k = self.rng.randint(0, self.attrs.max_event)
        self._mode = self.attrs.mode if self.attrs.mode != "any" else self.rng.choice(("alter", "drop", "duplicate"))

    def event(self, index: int, event: bytes) -> list[bytes]:
        """The events to send for the response's ``index``-th event."""
        if self._rewrite is not None:
            after = None if is_done(event) else self._rewrite.event(event)
            if after is None:
                return [event]
            self.done.append(Corruption(self._response, index, self._mode, event.decode("utf-8", "replace"),
                                        after.decode("utf-8", "replace")))
            return [after]
        if index != self._k or is_done(event):
            return [event]
        if self._mode == "drop":
            out, after = [], None
        elif self._mode == "duplicate":
            out, after = [event, event], event
        else:
            after = alter_event(event)
            out = [after]
        self.done.append(Corruption(self._response, index, self._mode, event.decode("utf-8", "replace"),
                                    None if after is None else after.decode("utf-8", "replace")))
        return out


def corrupt_events(events: list[bytes], rng: random.Random, attrs: Corrupt.Attrs,
                   response: int = 0) -> tuple[list[bytes], Corruption | None]:
    """Apply ``corrupt`` to one response's list of SSE events (each without its blank-line
    terminator), as the proxy does event by event. Returns the new list and what was done
    first (None: the drawn index is past the events before ``[DONE]``, or a semantic mode
    found nothing to rewrite)."""
    plan = CorruptPlan(rng, attrs)
    plan.start(response)
    out = [o for i, e in enumerate(events) for o in plan.event(i, e)]
    return out, (plan.done[0] if plan.done else None)


def split_events(buf: bytes) -> tuple[list[bytes], bytes]:
    """Complete SSE events of ``buf`` (separated by a blank line, ``\\n\\n``), and the rest."""
    *events, rest = buf.split(b"\n\n")
    return events, rest


def chunk(payload: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _head(line: bytes, headers: Any) -> bytes:
    """``line``, then h11's ``headers`` as they came (names' case kept), then the blank line."""
    return line + b"".join(b"%s: %s\r\n" % kv for kv in headers.raw_items()) + b"\r\n"


class SseReframer:
    """Incremental HTTP/1.1 response re-framer for the downstream stream of one connection
    (keep-alive: several responses in turn; h11 parses them). A ``text/event-stream``
    response with a chunked body is re-framed one SSE event per HTTP chunk, each complete
    event passing through ``plan`` (a :class:`CorruptPlan` or an :class:`Abort`, or None)
    as it arrives; every other response passes as it came (head, body, the same chunks).
    ``mid_stream``: attached to a connection mid-response, bytes pass as they come until a
    read starts with a response head. :meth:`feed` returns the bytes to send on now; once
    h11 refuses the stream (not HTTP it knows, or a response that ends with the
    connection), the rest passes as it comes."""

    def __init__(self, plan: CorruptPlan | Abort | None = None, mid_stream: bool = False):
        self.plan = plan
        self.responses = 0              # SSE responses seen
        self.in_response = False        # inside an SSE response (a stream in flight)
        self.completed = 0              # SSE responses that ended
        self.halted = False             # the plan aborted: nothing more is emitted
        self._http = h11.Connection(h11.CLIENT)
        self._expect()
        self._sync = mid_stream         # attached mid-response: wait for a response head
        self._raw = False               # h11 refused the stream: the rest passes as it comes
        self._chunked = self._sse = False
        self._payload = b""             # SSE: the body after its last complete event; else: the chunk so far
        self._event = 0

    def feed(self, data: bytes) -> bytes:
        if self.halted or not data:          # (h11 takes b"" for the end of the connection)
            return b""
        if self._sync:
            if not data.startswith(b"HTTP/"):
                return data
            self._sync = False
        if self._raw:
            return data
        out = bytearray()
        self._http.receive_data(data)
        try:
            while not self.halted:
                event = self._http.next_event()
                if event is h11.NEED_DATA:
                    break
                if event is h11.PAUSED:
                    self._http.start_next_cycle()
                    self._expect()
                else:
                    self._on(event, out)
        except h11.ProtocolError:
            self._raw = True
            out += self._http.trailing_data[0]
        return bytes(out)

    def _expect(self) -> None:
        """Tell h11 a request went out (the re-framer sees responses only)."""
        self._http.send(h11.Request(method="GET", target="/", headers=[("host", "upstream")]))
        self._http.send(h11.EndOfMessage())

    def _on(self, event: Any, out: bytearray) -> None:
        if isinstance(event, (h11.Response, h11.InformationalResponse)):
            out += _head(b"HTTP/%s %d %s\r\n" % (event.http_version, event.status_code, event.reason), event.headers)
            headers = {k: v.lower() for k, v in event.headers}
            self._chunked = b"chunked" in headers.get(b"transfer-encoding", b"")
            self._sse = self._chunked and b"text/event-stream" in headers.get(b"content-type", b"")
            self._payload, self._event = b"", 0
            if self._sse and isinstance(event, h11.Response):
                if self.plan is not None:
                    self.plan.start(self.responses)
                self.responses += 1
                self.in_response = True
        elif isinstance(event, h11.Data):
            if not self._chunked:
                out += event.data
            elif self._sse:
                events, self._payload = split_events(self._payload + event.data)
                self._emit(events, out)
            else:
                self._payload += event.data
                if event.chunk_end:
                    out += chunk(self._payload)
                    self._payload = b""
        elif isinstance(event, h11.EndOfMessage):
            if self._chunked:
                if self._sse:
                    events, rest = split_events(self._payload)
                    self._emit(events, out)
                    if self.halted:
                        return
                    if rest:
                        out += chunk(rest)
                out += _head(b"0\r\n", event.headers)
            self.completed += self.in_response
            self.in_response = False

    def _emit(self, events: list[bytes], out: bytearray) -> None:
        for e in events:
            sent = self.plan.event(self._event, e) if self.plan is not None else [e]
            self._event += 1
            for s in sent:
                out += chunk(s + b"\n\n")
            if self.plan is not None and self.plan.abort_now:
                self.halted = True
                return

"""Toxics of the fault proxy (:mod:`faults.proxy`), with toxiproxy's names and semantics.

A toxic is plain data, as in toxiproxy's HTTP API::

    {"name": "latency_downstream", "type": "latency", "stream": "downstream",
     "toxicity": 1.0, "attributes": {"latency": 50, "jitter": 25}}

* ``type``: one of :data:`TOXIC_TYPES`; ``attributes`` are validated by the type's model
  below (units as toxiproxy's: milliseconds, KB/s, microseconds for the slicer's delay);
* ``stream``: ``"upstream"`` (client → server: the request) or ``"downstream"``
  (server → client: the response);
* ``toxicity``: the fraction of connections the toxic acts on, in [0, 1]. The decision is
  drawn once per (toxic, connection) from :func:`connection_rng`, seeded by the proxy's
  seed, the toxic's name and the connection's index (order of acceptance), so the same
  seed gives the same decisions for the same connection sequence, whatever the timing.
  Every further draw of the toxic on that connection (jitter, slice sizes, the corrupted
  event) continues that same generator.

The byte-level transformations are pure functions here (:func:`slice_sizes`,
:class:`SseReframer`, :func:`corrupt_events`); the proxy applies them and does the
waiting. ``corrupt`` (not a toxiproxy toxic) alters, drops or duplicates one SSE event of
each streamed (``text/event-stream``, chunked) response on an affected connection,
re-framing the HTTP chunked body so the HTTP layer stays valid: only the SSE content lies.
Its semantic modes (``append_after_stop``, ``drop_token_text``, ``break_json``,
``zero_logprobs``) rewrite the events' JSON instead, each aimed at one request-class
invariant (:mod:`faults.sse_rewrite`); they ride the same re-framing, plan and evidence.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from faults.sse_rewrite import ResponseRewrite

__all__ = ["TOXIC_TYPES", "STREAMS", "Toxic", "ATTRIBUTES", "connection_rng", "slice_sizes", "SseReframer",
           "corrupt_events", "Corruption", "parse_toxic", "AbortPlan", "CorruptPlan"]

TOXIC_TYPES = ("latency", "bandwidth", "slicer", "reset_peer", "timeout", "limit_data", "corrupt", "abort")
STREAMS = ("upstream", "downstream")


class _Attrs(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LatencyAttrs(_Attrs):
    """``latency`` ms added to every chunk (from its arrival at the proxy), plus a jitter
    drawn per chunk: uniform in ±``jitter`` ms (toxiproxy's) or normal with sd ``jitter``
    ms (``distribution: normal``); the delay never goes below 0."""

    latency: float = Field(0.0, ge=0)
    jitter: float = Field(0.0, ge=0)
    distribution: Literal["uniform", "normal"] = "uniform"


class BandwidthAttrs(_Attrs):
    """At most ``rate`` KB/s (1 KB = 1000 bytes) through the stream."""

    rate: float = Field(gt=0)


class SlicerAttrs(_Attrs):
    """Split every chunk into pieces of ``average_size`` ± ``size_variation`` bytes,
    ``delay`` µs apart (as an SSE stream split across TCP segments)."""

    average_size: int = Field(64, ge=1)
    size_variation: int = Field(0, ge=0)
    delay: float = Field(0.0, ge=0)

    @model_validator(mode="after")
    def _variation(self) -> "SlicerAttrs":
        if self.size_variation >= self.average_size:
            raise ValueError("size_variation must be smaller than average_size")
        return self


class ResetPeerAttrs(_Attrs):
    """Reset the connection (TCP RST to the client, close to the server) ``timeout`` ms
    after the toxic first sees data on it (0: at once)."""

    timeout: float = Field(0.0, ge=0)


class TimeoutAttrs(_Attrs):
    """Blackhole: drop all data; close the connection after ``timeout`` ms (0: never,
    data is dropped until the toxic is removed)."""

    timeout: float = Field(0.0, ge=0)


class LimitDataAttrs(_Attrs):
    """Close the connection once ``bytes`` bytes went through the stream."""

    bytes: int = Field(ge=0)


class CorruptAttrs(_Attrs):
    """Corrupt one SSE event of every streamed response: ``mode`` ``alter`` (the first
    output token id + 1, else ``usage.completion_tokens`` + 1), ``drop``, ``duplicate``,
    or ``any`` (one of these three, drawn per response); the event's index is drawn in
    [0, ``max_event``] (a response with fewer events is left alone). ``data: [DONE]`` is
    never touched. The semantic modes rewrite the events' JSON, each breaking one
    request-class invariant (:mod:`faults.sse_rewrite`): ``append_after_stop``,
    ``drop_token_text`` (its event: the ``k``-th with token text, ``k`` drawn in
    [0, ``max_event``]), ``break_json``, ``zero_logprobs``; ``any`` never draws them."""

    mode: Literal["alter", "drop", "duplicate", "any", "append_after_stop", "drop_token_text", "break_json",
                  "zero_logprobs"] = "any"
    max_event: int = Field(3, ge=0)


class AbortAttrs(_Attrs):
    """Close the connection (to the server: a client disconnect; to the client: a cut
    stream) right after the ``after_events``-th SSE event of a streamed response (1: after
    the first chunk). For ``abort`` the toxicity is the fraction of *responses* aborted,
    drawn per response (an aborted connection is gone, so the next request opens another)."""

    after_events: int = Field(1, ge=1)


ATTRIBUTES: dict[str, type[_Attrs]] = {
    "latency": LatencyAttrs, "bandwidth": BandwidthAttrs, "slicer": SlicerAttrs, "reset_peer": ResetPeerAttrs,
    "timeout": TimeoutAttrs, "limit_data": LimitDataAttrs, "corrupt": CorruptAttrs, "abort": AbortAttrs,
}


def attributes_error(toxic_type: str, attributes: Any) -> str | None:
    """None when ``attributes`` are valid for ``toxic_type``, else one line naming the
    attribute (``"latency: Input should be greater than or equal to 0"``)."""
    model = ATTRIBUTES.get(toxic_type)
    if model is None:
        return f"unknown toxic type {toxic_type!r} (known: {', '.join(TOXIC_TYPES)})"
    try:
        model.model_validate(attributes or {})
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "attributes"
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = f"unknown attribute of {toxic_type} (takes: {', '.join(model.model_fields)})"
        return f"{loc}: {msg}"
    return None


class Toxic(BaseModel):
    """One toxic (toxiproxy's JSON shape). ``name`` defaults to ``<type>_<stream>``;
    ``attrs`` is the validated attribute model."""

    model_config = ConfigDict(extra="forbid")

    name: str = ""
    type: Literal["latency", "bandwidth", "slicer", "reset_peer", "timeout", "limit_data", "corrupt", "abort"]
    stream: Literal["upstream", "downstream"] = "downstream"
    toxicity: float = Field(1.0, ge=0, le=1)
    attributes: dict[str, Any] = Field(default_factory=dict)

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
        return ATTRIBUTES[self.type].model_validate(self.attributes)

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
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        raise ValueError(f"{loc}: {msg}" if loc else msg) from None


def connection_rng(seed: int, toxic_name: str, connection: int) -> random.Random:
    """The generator of one toxic on one connection (string seeding is stable across runs
    and Python processes: it hashes with SHA-512, not ``hash()``)."""
    return random.Random(f"specchaos/{seed}/{toxic_name}/{connection}")


def affected(rng: random.Random, toxicity: float) -> bool:
    """The toxicity draw (the first draw of a connection's generator)."""
    return toxicity >= 1.0 or rng.random() < toxicity


def latency_s(attrs: LatencyAttrs, rng: random.Random) -> float:
    """One chunk's delay in seconds (≥ 0)."""
    if attrs.jitter <= 0:
        return attrs.latency / 1000.0
    if attrs.distribution == "normal":
        ms = rng.gauss(attrs.latency, attrs.jitter)
    else:
        ms = attrs.latency + rng.uniform(-attrs.jitter, attrs.jitter)
    return max(0.0, ms) / 1000.0


def max_chunk_delay_s(attrs: LatencyAttrs) -> float:
    """The most one chunk's delay may be, by the toxic's declaration, in seconds: ``latency``
    + ``jitter`` for the uniform distribution (its upper end), ``latency`` + 3 ``jitter`` for
    the normal one (its 99.87th percentile; :func:`latency_s` draws it).

    Chunks are delayed from their arrival and written in order, so a request's TTFT and E2E
    each gain about one chunk's delay, not one per chunk: this bound is what a downstream (or
    upstream) latency toxic adds to them by design (:mod:`harness.checks.slo` judges the
    stack's degradation beyond it)."""
    spread = 3.0 * attrs.jitter if attrs.distribution == "normal" else attrs.jitter
    return (attrs.latency + spread) / 1000.0


def slice_sizes(n: int, attrs: SlicerAttrs, rng: random.Random) -> list[int]:
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


# ---------------------------------------------------------------- HTTP/SSE re-framing (corrupt)

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

    def __init__(self, rng: random.Random, attrs: CorruptAttrs):
        self.rng, self.attrs = rng, attrs
        self.done: list[Corruption] = []
        self._response, self._k, self._mode = -1, -1, "alter"
        self._rewrite: ResponseRewrite | None = None

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


class AbortPlan:
    """``abort`` on one connection: at each response's start it draws whether to abort it
    (``rng.random() < fraction``); :attr:`abort_now` turns True once the response's
    ``after_events``-th event passed (the re-framer then emits nothing more)."""

    def __init__(self, rng: random.Random, attrs: AbortAttrs, fraction: float):
        self.rng, self.attrs, self.fraction = rng, attrs, fraction
        self.aborting = False
        self.abort_now = False

    def start(self, response: int) -> None:
        self.aborting = self.rng.random() < self.fraction

    def event(self, index: int, event: bytes) -> list[bytes]:
        if self.aborting and index == self.attrs.after_events - 1 and not is_done(event):
            self.abort_now = True
        return [event]


def corrupt_events(events: list[bytes], rng: random.Random, attrs: CorruptAttrs,
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
    events: list[bytes] = []
    while True:
        i = buf.find(b"\n\n")
        if i < 0:
            return events, buf
        events.append(buf[:i])
        buf = buf[i + 2:]


def chunk(payload: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


class SseReframer:
    """Incremental HTTP/1.1 response parser for the downstream stream of one connection
    (keep-alive: several responses in turn). A ``text/event-stream`` response with a
    chunked body is re-framed one SSE event per HTTP chunk, each complete event passing
    through ``plan`` (a :class:`CorruptPlan`, or None) as it arrives; every other response
    passes byte for byte. :meth:`feed` returns the bytes to send on now."""

    def __init__(self, plan: CorruptPlan | AbortPlan | None = None, mid_stream: bool = False):
        self.plan = plan
        self.responses = 0              # SSE responses seen
        self.in_response = False        # inside an SSE response (a stream in flight)
        self.completed = 0              # SSE responses that ended
        self.halted = False             # the plan aborted: nothing more is emitted
        self._buf = b""
        # head | length | raw | size | data | trailer; "sync": attached to a connection
        # mid-response, pass bytes on until a read starts with a response head
        self._state = "sync" if mid_stream else "head"
        self._sse = False
        self._left = 0
        self._payload = b""
        self._event = 0

    def feed(self, data: bytes) -> bytes:
        if self.halted:
            return b""
        self._buf += data
        out = bytearray()
        while not self.halted and self._step(out):
            pass
        return bytes(out)

    def _emit(self, events: list[bytes], out: bytearray) -> None:
        for e in events:
            sent = self.plan.event(self._event, e) if self.plan is not None else [e]
            self._event += 1
            for s in sent:
                out += chunk(s + b"\n\n")
            if getattr(self.plan, "abort_now", False):
                self.halted, self._buf = True, b""
                return

    def _step(self, out: bytearray) -> bool:
        b = self._buf
        if not b:
            return False
        if self._state == "raw" or (self._state == "sync" and not b.startswith(b"HTTP/")):
            out += b
            self._buf = b""
            return False
        if self._state == "sync":
            self._state = "head"
        if self._state == "head":
            i = b.find(b"\r\n\r\n")
            if i < 0:
                return False
            head, self._buf = b[:i + 4], b[i + 4:]
            out += head
            lines = head.decode("latin-1").lower().split("\r\n")
            parts = lines[0].split(" ")
            code = parts[1] if len(parts) > 1 else ""
            headers = dict((k.strip(), v.strip()) for k, _, v in (ln.partition(":") for ln in lines[1:] if ":" in ln))
            if code.startswith("1") or code in ("204", "304"):
                return True
            if "chunked" in headers.get("transfer-encoding", ""):
                self._sse = "text/event-stream" in headers.get("content-type", "")
                self._state, self._payload, self._event = "size", b"", 0
                if self._sse:
                    if self.plan is not None:
                        self.plan.start(self.responses)
                    self.responses += 1
                    self.in_response = True
            elif headers.get("content-length", "0").isdigit() and int(headers.get("content-length", "0")) > 0:
                self._left, self._state = int(headers["content-length"]), "length"
            elif "content-length" not in headers:
                self._state = "raw"             # delimited by the close
            return True
        if self._state == "length":
            n = min(self._left, len(b))
            out += b[:n]
            self._buf, self._left = b[n:], self._left - n
            if self._left == 0:
                self._state = "head"
            return True
        if self._state == "size":
            i = b.find(b"\r\n")
            if i < 0:
                return False
            line, self._buf = b[:i + 2], b[i + 2:]
            size = int(line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                if self._sse:
                    events, rest = split_events(self._payload)
                    self._emit(events, out)
                    if rest:
                        out += chunk(rest)
                self._state = "trailer"
            else:
                self._left, self._state = size + 2, "data"      # the data and its CRLF
            if not self._sse or size == 0:
                out += line
            return True
        if self._state == "data":
            n = min(self._left, len(b))
            piece, self._buf, self._left = b[:n], b[n:], self._left - n
            if not self._sse:
                out += piece
            else:
                self._payload += piece
            if self._left == 0:
                if self._sse:
                    self._payload = self._payload[:-2]          # the chunk's CRLF
                    events, self._payload = split_events(self._payload)
                    self._emit(events, out)
                self._state = "size"
            return True
        if self._state == "trailer":
            i = b.find(b"\r\n")
            if i < 0:
                return False
            line, self._buf = b[:i + 2], b[i + 2:]
            out += line
            if line == b"\r\n":
                self._state = "head"
                if self.in_response:
                    self.completed += 1
                self.in_response = False
            return True
        return False

"""The one streaming client: locust users, the reference fetch and liveness probes all use it.

One request is a streaming ``POST /v1/completions`` (greedy unless a sampling class says otherwise) (OpenAI completions API as
served by vLLM), or ``POST /v1/chat/completions`` for a chat request class
(:func:`request_body`) or a traffic source's chat request (:func:`completion_body`), whose whole exchange becomes one :class:`~harness.load.records.RequestRecord`.
Server and network faults never raise: they become ``record.error`` (classes documented
in :mod:`harness.load.records`). SSE is parsed with ``httpx-sse``.

Timing: ``send_time`` is epoch seconds (:func:`harness.clock.now`) taken just before the
request is sent; every offset is seconds after that instant. An SSE event's offset is the
arrival of the read that completed it: with a client from :func:`make_client`, the
kernel's receive stamp of that data (:mod:`harness.load.rxstamp`; epoch ns, so the offset
is the stamp − ``send_time``), never later than the moment the client parsed the event
(:func:`time.perf_counter` since the send); with another ``httpx.Client``, that moment
itself. So neither the load process's wait for a core nor the parsing delays a stamp.
Errors and timeouts are timed with :func:`time.perf_counter` when the client sees them.
An output chunk is an SSE event whose first choice carries output tokens: its token
count is ``len(choice["token_ids"])`` (``return_token_ids``), or 1 for a non-empty
``text`` (chat: ``delta.content`` or a ``delta.tool_calls``) when the server sent no ``token_ids``.

Connections: after ``data: [DONE]`` the client reads the body to its end (the chunked
terminator vLLM's server sends right after it), as the OpenAI Python SDK does, so the
connection goes back to the client's pool and the next request reuses it; stopping at
``[DONE]`` would close it and make every request open a new TCP connection (more work for
the server's event loop than ``vllm bench serve``'s keep-alive client gives it, measured in
``bench/accuracy.py``). That drain is bounded by :data:`DRAIN_LIMIT_S`; it never changes
the record (its E2E ends at ``[DONE]``): a server that keeps the body open after
``[DONE]`` only costs the connection.

Traffic goes to loopback only (127.0.0.0/8, ::1, ``localhost``): any other host is
refused with :class:`~harness.errors.LoadError`.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import uuid
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, Callable, Iterator, Sequence

import httpx
from httpx_sse import EventSource, SSEError

from harness import clock
from harness.errors import LoadError
from harness.net import LOOPBACK_HINT, UPSTREAM_HEADER, is_allowed_host
from harness.load.config import FOLLOW_UP, GREEDY, RequestClass, SamplingClass, asked_max_tokens
from harness.load.endpoints import ENDPOINTS, passed_through
from harness.load.prompts import Prompt
from harness.load.records import FINISH_REASONS, RequestRecord
from harness.load.rxstamp import last_rx_s, make_transport

log = logging.getLogger(__name__)

COMPLETIONS_PATH = "/v1/completions"
_DETAIL_CHARS = 300
#: Longest wait (seconds) for the end of the body after ``data: [DONE]`` (see module doc).
DRAIN_LIMIT_S = 1.0


def completion_body(prompt: Prompt, model: str, ignore_eos: bool = False,
                    sampling: SamplingClass | None = None, top_logprobs: int = 0) -> dict[str, Any]:
    """The JSON body of a streaming completion for ``prompt``.

    Sampling from ``sampling`` (default :data:`~harness.load.config.GREEDY`: ``temperature``
    0, so outputs are comparable with a reference; a sampled class adds its
    ``temperature`` and ``top_p``), ``stream_options.include_usage`` (final usage chunk:
    ``completion_tokens`` as in vLLM's serving benchmark) and ``return_token_ids`` (vLLM
    extension: per-chunk ``token_ids``). With ``top_logprobs`` > 0, the OpenAI ``logprobs``
    field asks for that many most likely tokens per position, named by id (vLLM's
    ``return_tokens_as_token_ids``: keys ``"token_id:<id>"``).

    A traffic source's prompt (``prompt.body`` set): the same defaults, then the source's
    body on top (its ``prompt`` or ``messages`` and every field it sets win; the harness's
    ``model``, ``stream`` and ``stream_options`` stay, :data:`~harness.load.endpoints.HARNESS_FIELDS`).
    The sampling class applies only when the body sets neither ``temperature`` nor
    ``top_p``; ``top_logprobs`` only to a completions body (chat names tokens otherwise).
    """
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt.text,
        "max_tokens": prompt.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "ignore_eos": ignore_eos,
    }
    source = prompt.body
    if source is None or not {"temperature", "top_p"} & source.keys():
        body.update((sampling or GREEDY).body())
    if top_logprobs > 0 and prompt.endpoint == "completions":
        body.update(logprobs=top_logprobs, return_tokens_as_token_ids=True)
    if source is not None:
        del body["prompt"]
        body.update(passed_through(source))
    return body


#: The record's ``request_class`` of a traffic source's request (``load.source``) that
#: carries no category (a categorised one carries its category).
SOURCE_CLASS = "source"

#: The record's ``sampling`` of a source request whose body sets a non-zero ``temperature``
#: (not a sampling class of ``load.sampling``; never compared with the reference).
SOURCE_SAMPLED = "source-sampled"


def sampling_name(prompt: Prompt, sampling: SamplingClass | None) -> str:
    """The record's ``sampling``: the class's name, or for a source body that sets its own
    ``temperature`` or ``top_p`` (the class is then not applied, :func:`completion_body`)
    :data:`~harness.load.config.GREEDY`'s name at temperature 0 (the harness's, when the
    body sets only ``top_p``), else :data:`SOURCE_SAMPLED`."""
    if prompt.body is not None and {"temperature", "top_p"} & prompt.body.keys():
        return GREEDY.name if prompt.body.get("temperature", 0) == 0 else SOURCE_SAMPLED
    return (sampling or GREEDY).name


def request_body(prompt: Prompt, model: str, ignore_eos: bool = False, sampling: SamplingClass | None = None,
                 request_class: RequestClass | None = None, history: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """The JSON body of a streaming request of ``request_class`` for ``prompt``: the
    :func:`completion_body`, then for a chat class ``prompt`` (a completions field) replaced
    by ``messages`` (the class body's own messages, the conversation's earlier turns
    ``history``, then the user's message: the prompt, or after earlier turns
    :data:`~harness.load.config.FOLLOW_UP`), then the class body's fields
    (:func:`harness.load.endpoints.passed_through`), which win. Without a class, or with an
    empty completions one, exactly :func:`completion_body`."""
    body = completion_body(prompt, model, ignore_eos, sampling)
    if request_class is None:
        return body
    extra = passed_through(request_class.body)
    if request_class.endpoint == "chat":
        del body["prompt"]
        body["messages"] = [*extra.pop("messages", []), *history, user_message(prompt, history)]
    body.update(extra)
    return body


def user_message(prompt: Prompt, history: Sequence[dict[str, Any]] = ()) -> dict[str, str]:
    """The user's message of a chat turn after ``history`` (earlier turns' messages): the
    prompt's text first, :data:`~harness.load.config.FOLLOW_UP` after."""
    return {"role": "user", "content": FOLLOW_UP if history else prompt.text}


def check_loopback_url(base_url: str, where: str = "base_url") -> httpx.URL:
    """Parse ``base_url`` and refuse anything but http(s) to a loopback host.

    Raises:
        LoadError: not a URL, not http(s), or a non-loopback host.
    """
    try:
        url = httpx.URL(base_url)
    except Exception:
        raise LoadError(f"not a URL: {base_url!r}", where=where) from None
    if url.scheme not in ("http", "https") or not url.host:
        raise LoadError(f"not an http(s) URL: {base_url!r}", where=where)
    if not is_allowed_host(url.host):
        raise LoadError(f"refusing non-loopback host {url.host!r}", where=where,
                        hint=LOOPBACK_HINT)
    return url


def make_client(max_connections: int = 64) -> httpx.Client:
    """An ``httpx.Client`` for :func:`stream_completion`: ignores proxy environment
    variables (loopback traffic must not be routed through a proxy) and stamps every read
    with its data's arrival (:mod:`harness.load.rxstamp`, see "Timing" in the module doc)."""
    limits = httpx.Limits(max_connections=max_connections)
    return httpx.Client(trust_env=False, limits=limits, transport=make_transport(limits))


class _Deadline:
    """Bounds a whole exchange: at the deadline, shuts the connection's socket down, which
    wakes a read blocked on it (works for threads and gevent greenlets alike)."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.fired = False
        #: the deadline hit while draining the body after ``[DONE]`` (see :meth:`drain`)
        self.drain_cut = False
        self._draining = False
        self._lock = threading.Lock()
        self._done = False
        self._sock: socket.socket | None = None
        self._timer: threading.Timer | None = None

    def remaining(self) -> float:
        return self.deadline - time.perf_counter()

    def arm(self, network_stream: Any) -> None:
        """Watch the socket of ``network_stream`` (an httpcore network stream)."""
        try:
            sock = network_stream.get_extra_info("socket")
        except Exception:
            sock = None
        if sock is None:
            return
        with self._lock:
            if self._done or self._sock is not None:
                return
            self._sock = sock
            self._timer = threading.Timer(max(0.0, self.remaining()), self._fire)
            self._timer.daemon = True
            self._timer.start()

    def trace(self, event: str, info: dict) -> None:
        """httpcore ``trace`` extension: arm as soon as a new connection exists."""
        if event == "connection.connect_tcp.complete" and info.get("return_value") is not None:
            self.arm(info["return_value"])

    def drain(self, limit_s: float) -> None:
        """The exchange is complete; from now on the deadline is at most ``limit_s`` away
        and firing it only cuts the drain (:attr:`drain_cut`), never the request."""
        with self._lock:
            if self._done:
                return
            self._draining = True
            self.deadline = min(self.deadline, time.perf_counter() + limit_s)
            if self._timer is not None:
                self._timer.cancel()
                self._timer = threading.Timer(max(0.0, self.remaining()), self._fire)
                self._timer.daemon = True
                self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            if self._done or self._sock is None:
                return
            if self._draining:
                self.drain_cut = True
            else:
                self.fired = True
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cancel(self) -> None:
        """After this returns the socket is never touched again."""
        with self._lock:
            self._done = True
            if self._timer is not None:
                self._timer.cancel()


def _detail(text: Any) -> str:
    return str(text)[:_DETAIL_CHARS]


def _classify(exc: BaseException) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.ConnectError):
        return "connect"
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError, httpx.CloseError)):
        return "stream_cut"
    if isinstance(exc, (httpx.DecodingError, SSEError)):
        return "bad_payload"
    return f"other:{type(exc).__name__}"


def error_message(payload: dict) -> str | None:
    """The error text of an in-stream error event, or None if ``payload`` is not one.
    vLLM sends ``{"error": {"message", "type", "code", ...}}`` (older: ``{"object": "error", ...}``)."""
    err = payload.get("error")
    if err is not None:
        return _detail(err.get("message", err) if isinstance(err, dict) else err)
    if payload.get("object") == "error":
        return _detail(payload.get("message", payload))
    return None


def stream_completion(
    client: httpx.Client,
    base_url: str,
    model: str,
    prompt: Prompt,
    *,
    timeout_s: float,
    source: str = "load",
    user_id: int = -1,
    ignore_eos: bool = False,
    on_interrupt: Callable[[RequestRecord], None] | None = None,
    server: str = "spec",
    sampling: SamplingClass | None = None,
    attempt: int = 1,
    logical_id: str = "",
    read_stamps: bool = False,
    top_logprobs: int = 0,
    request_class: RequestClass | None = None,
    history: Sequence[dict[str, Any]] = (),
) -> RequestRecord:
    """Send one streaming completion and record the whole exchange.

    Args:
        client: an ``httpx.Client`` (see :func:`make_client`); thread-safe, may be shared.
        base_url: server root, e.g. ``"http://127.0.0.1:8000"``; loopback only.
        model: served model name.
        prompt: what to send (text, max_tokens; its id and class go into the record).
        timeout_s: bound on the whole exchange (connect to last byte), not per read. A
            watchdog shuts the socket down at the deadline; the record's error is then
            ``"timeout"``.
        source: ``"load"``, ``"reference"`` or ``"probe"``.
        user_id: locust user index, -1 otherwise.
        ignore_eos: ask the server to ignore EOS (always ``max_tokens`` outputs).
        on_interrupt: called with the partial record (``error="other:<Name>"``; a record
            that already ended with ``[DONE]``, interrupted while draining, as it is) when a
            non-``Exception`` interrupts the request (gevent's ``GreenletExit`` when locust
            stops a user, ``KeyboardInterrupt``); the interrupt is then re-raised.
        server: the record's ``server``: ``"spec"`` or ``"ref"`` (which server
            ``base_url`` is; the record says so, the URL is not inspected).
        sampling: the request's sampling class (default greedy); its name goes into the
            record's ``sampling``.
        attempt, logical_id: the record's try number (1-based) and the id shared by every
            try of one logical request under the retry policy (``load.retry``).
        read_stamps: also record the user-space instant each chunk was parsed (the
            record's ``read_offsets_s`` and ``e2e_read_s``; ``load.read_stamps``).
        top_logprobs: ask for that many most likely tokens per output position (the
            record's ``top_logprobs``; 0: none asked, the field stays None).
        request_class: the request's class (``load.request_classes``): its endpoint and
            body fields (:func:`request_body`); its name, endpoint and, when its body asks
            for them, the per-token logprobs go into the record. None: a plain completion,
            recorded as class ``"plain"``.
        history: a multi-turn chat class's earlier turns (user and assistant messages, in
            order); the record's ``turn`` is ``len(history) // 2 + 1``.

    Returns:
        The record (see :class:`~harness.load.records.RequestRecord` for every field).
        ``ok`` is True only for HTTP 200, no error, ``[DONE]`` seen and a finish_reason.

    Raises:
        LoadError: ``base_url`` is not a loopback http(s) URL. Nothing else for server or
            network faults.
    """
    check_loopback_url(base_url)
    endpoint = (prompt.endpoint if prompt.body is not None
                else request_class.endpoint if request_class is not None else "completions")
    url = base_url.rstrip("/") + ENDPOINTS[endpoint]
    if request_class is not None:
        body = request_body(prompt, model, ignore_eos, sampling, request_class, history)
    else:
        body = completion_body(prompt, model, ignore_eos, sampling, top_logprobs)
    rec = RequestRecord(
        request_id=uuid.uuid4().hex,
        source=source,
        user_id=user_id,
        prompt_id=prompt.prompt_id,
        prompt_class=prompt.prompt_class,
        max_tokens=asked_max_tokens(body) or prompt.max_tokens,
        server=server,
        sampling=sampling_name(prompt, sampling),
        attempt=attempt,
        logical_id=logical_id,
        request_class=((prompt.category or SOURCE_CLASS) if prompt.body is not None
                       else request_class.name if request_class is not None else "plain"),
        endpoint=endpoint,
        turn=len(history) // 2 + 1,
        origin=prompt.origin,
    )
    if (request_class is not None or prompt.body is not None) and body.get("logprobs") not in (None, False):
        rec.logprobs = []   # the class (or the source's body) asks for logprobs: collect them (see _take_chunk)
    rec.send_time = clock.now()
    t0 = time.perf_counter()
    guard = _Deadline(t0 + timeout_s)

    def since() -> float:
        return time.perf_counter() - t0

    stream: Any = None   # the connection's network stream, once the response head came
    if read_stamps:
        rec.read_offsets_s = []

    def arrival() -> tuple[float, float]:
        """Offsets (s) of the latest read's data arrival (module doc, "Timing") and of
        this moment, when the client has parsed it."""
        t = since()
        rx = last_rx_s(stream)
        return (t if rx is None else min(t, max(0.0, rx - rec.send_time))), t

    def fail(error: str, detail: Any) -> None:
        if rec.error is None:
            rec.error = error
            rec.error_detail = _detail(detail)
            if rec.e2e_s is None:
                rec.e2e_s = since()

    try:
        with client.stream(
            "POST", url, json=body,
            headers={"Accept": "text/event-stream"},
            timeout=httpx.Timeout(timeout_s),
            extensions={"trace": guard.trace},
        ) as response:
            try:
                stream = response.extensions.get("network_stream")
                guard.arm(stream)
                rec.status = response.status_code
                rec.served_by = response.headers.get(UPSTREAM_HEADER)
                if response.status_code != 200:
                    try:
                        response.read()
                        text = response.text
                    except Exception as exc:  # the body is only detail
                        text = f"(body unreadable: {type(exc).__name__})"
                    fail(f"http_{response.status_code}", text)
                else:
                    _read_stream(response, rec, arrival, fail, guard)
            finally:
                guard.cancel()
    except Exception as exc:
        if guard.fired:
            fail("timeout", f"no end of exchange within {timeout_s:g} s ({type(exc).__name__})")
        else:
            fail(_classify(exc), f"{type(exc).__name__}: {exc}")
    except BaseException as exc:
        guard.cancel()
        if not rec.done:   # after [DONE] only the drain was interrupted: the exchange is complete
            fail(f"other:{type(exc).__name__}", "request interrupted by the client side (e.g. load shutdown)")
        rec.ok = rec.status == 200 and rec.error is None and rec.done and rec.finish_reason is not None
        if on_interrupt is not None:
            on_interrupt(rec)
        raise
    if guard.fired and rec.error is None:
        fail("timeout", f"no end of exchange within {timeout_s:g} s")
    if rec.e2e_s is None:
        rec.e2e_s = since()
    rec.ok = rec.status == 200 and rec.error is None and rec.done and rec.finish_reason is not None
    return rec


def _read_stream(response: httpx.Response, rec: RequestRecord, arrival: Callable[[], tuple[float, float]],
                 fail: Callable[[str, Any], None], guard: _Deadline) -> None:
    """Consume the SSE stream of a 200 response into ``rec`` (see :func:`stream_completion`);
    ``arrival()`` is the (arrival, parsed) offsets of the event just parsed (module doc, "Timing").
    Exceptions from the transport propagate; what arrived before them stays in ``rec``."""
    texts: list[str] = []
    events = EventSource(response).iter_sse()
    try:
        for event in events:
            t, read = arrival()
            data = event.data.strip()
            if data == "[DONE]":
                rec.done = True
                if rec.error is None:
                    rec.e2e_s = t
                    if rec.read_offsets_s is not None:
                        rec.e2e_read_s = read
                break
            if guard.remaining() <= 0:
                fail("timeout", "no end of exchange within the request timeout")
                break
            if not data:
                continue
            try:
                payload = json.loads(data)
                if not isinstance(payload, dict):
                    raise ValueError("chunk is not a JSON object")
            except ValueError as exc:
                fail("bad_payload", f"{exc}: {data[:200]}")
                break
            message = error_message(payload)
            if message is not None:
                fail("stream_error", message)
                continue  # vLLM follows an error event with [DONE]; keep reading for it
            if rec.error is not None:
                continue
            try:
                _take_chunk(payload, t, rec, texts, read)
            except (AttributeError, TypeError, ValueError) as exc:
                fail("bad_payload", f"{type(exc).__name__}: {exc}: {data[:200]}")
                break
    finally:
        rec.text = "".join(texts)
    if rec.error is None:
        if guard.fired:
            fail("timeout", "no end of exchange within the request timeout")
        elif not rec.done:
            fail("stream_cut", "connection closed before data: [DONE]")
        elif rec.finish_reason is None:
            fail("bad_payload", "stream ended with [DONE] but no finish_reason")
        elif rec.finish_reason not in FINISH_REASONS:
            # vLLM ends the streams in flight with finish_reason "abort" when it shuts down
            # (SIGTERM, e.g. a planned restart): a cut response, never a success
            fail("aborted", f"the server ended the stream with finish_reason {rec.finish_reason!r}")
    if rec.done:   # the record is final; an interrupt from here on leaves it as it is
        _drain(events, guard)


def _drain(events: Iterator[Any], guard: _Deadline) -> None:
    """Read what follows ``data: [DONE]`` to the end of the body (see module doc), at most
    :data:`DRAIN_LIMIT_S`; events there are ignored, a transport error only loses the
    connection."""
    guard.drain(DRAIN_LIMIT_S)
    try:
        for _ in events:
            pass
    except Exception as exc:  # noqa: BLE001 - the request is complete; only the connection is lost
        log.debug("body not read to its end after [DONE]: %s", exc)


def _take_chunk(payload: dict, t: float, rec: RequestRecord, texts: list[str], read: float = 0.0) -> None:
    """Fold one chunk (``choices[0]`` and ``usage``) arriving at offset ``t`` (parsed at
    offset ``read``, kept when the record has ``read_offsets_s``) into ``rec``: a completion
    chunk's ``text``, a chat chunk's ``delta.content`` and ``delta.tool_calls``; either's
    ``token_ids``, ``logprobs`` (when the record collects them), ``finish_reason`` and
    ``stop_reason``."""
    usage = payload.get("usage")
    if isinstance(usage, dict):
        if usage.get("completion_tokens") is not None:
            rec.output_tokens = int(usage["completion_tokens"])
        if usage.get("prompt_tokens") is not None:
            rec.prompt_tokens = int(usage["prompt_tokens"])
    choices = payload.get("choices") or []
    if not isinstance(choices, list):
        raise ValueError("choices is not a list")
    for choice in choices:
        if int(choice.get("index", 0)) != 0:
            continue
        delta = choice.get("delta") if rec.endpoint == "chat" else None
        text = (delta or {}).get("content") if rec.endpoint == "chat" else choice.get("text")
        text = text or ""
        if not isinstance(text, str):
            raise ValueError("text is not a string")
        calls = _take_tool_calls((delta or {}).get("tool_calls"), rec)
        ids = choice.get("token_ids")
        if ids is not None:
            ids = [int(i) for i in ids]
            if rec.token_ids is None:
                rec.token_ids = []
            rec.token_ids.extend(ids)
            n = len(ids)
        else:
            n = 1 if text or calls else 0
        texts.append(text)
        logprobs = choice.get("logprobs") or {}
        top = logprobs.get("top_logprobs") if rec.endpoint == "completions" else None
        if top:
            if rec.top_logprobs is None:
                rec.top_logprobs = []
            rec.top_logprobs.extend(_ranked(position) for position in top)
        if rec.logprobs is not None:
            rec.logprobs.extend(_chosen_logprobs(logprobs, rec.endpoint))
        if n:
            rec.chunk_offsets_s.append(t)
            rec.chunk_tokens.append(n)
            if rec.read_offsets_s is not None:
                rec.read_offsets_s.append(read)
            if rec.ttft_s is None:
                rec.ttft_s = t
        if choice.get("finish_reason") is not None:
            rec.finish_reason = str(choice["finish_reason"])
        if choice.get("stop_reason") is not None:
            rec.stop_reason = choice["stop_reason"]


def _chosen_logprobs(logprobs: dict, endpoint: str) -> list[float | None]:
    """The chosen tokens' logprobs of one chunk: completions ``token_logprobs``, chat
    ``content[i].logprob`` (None where the server sent null or no number)."""
    if endpoint == "chat":
        values = [entry.get("logprob") if isinstance(entry, dict) else None for entry in logprobs.get("content") or []]
    else:
        values = list(logprobs.get("token_logprobs") or [])
    return [float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None for v in values]


def _take_tool_calls(deltas: Any, rec: RequestRecord) -> bool:
    """Fold a chat chunk's ``delta.tool_calls`` into ``rec.tool_calls`` (by ``index``: a
    call's name, then its arguments in pieces); True when the chunk carried any."""
    if not deltas:
        return False
    if not isinstance(deltas, list):
        raise ValueError("delta.tool_calls is not a list")
    calls = rec.tool_calls if rec.tool_calls is not None else []
    rec.tool_calls = calls
    for d in deltas:
        i = int(d.get("index", len(calls)))
        while len(calls) <= i:
            calls.append({"name": None, "arguments": ""})
        fn = d.get("function") or {}
        if fn.get("name"):
            calls[i]["name"] = fn["name"]
        calls[i]["arguments"] += fn.get("arguments") or ""
    return True


def _ranked(position: dict | None) -> list[list[float]]:
    """One position of the OpenAI ``top_logprobs`` (``{"token_id:<id>": logprob}``) as
    ``[[id, logprob], ...]``, most likely first; keys that name no id are left out."""
    out = []
    for key, lp in (position or {}).items():
        _, sep, tid = str(key).rpartition("token_id:")
        if sep and tid.lstrip("-").isdigit() and lp is not None:
            out.append([int(tid), float(lp)])
    out.sort(key=lambda pair: -pair[1])
    return out


def fetch_reference(
    base_url: str,
    model: str,
    prompts: Sequence[Prompt],
    *,
    timeout_s: float,
    concurrency: int = 4,
    ignore_eos: bool = False,
    retries: int = 3,
    retry_backoff_s: float = 0.5,
    server: str = "ref",
    top_logprobs: int = 2,
    request_class: RequestClass | None = None,
) -> dict[int, RequestRecord]:
    """Fetch one complete greedy output per prompt (``source="reference"``, the records'
    ``server`` as given: the reference server, ``"ref"``, by default), with the
    ``top_logprobs`` most likely tokens at each position (the records' ``top_logprobs``:
    what the integrity check needs to recognise a near-tie; 0 asks for none). With a
    ``request_class``, each request is that class's first turn (its endpoint and body
    fields, :func:`request_body`), recorded with the class's name: the reference of the
    class's own invariants (a stop string's cut, logprob values).

    A prompt whose record is not ``ok`` is retried up to ``retries`` times (sleeping
    ``retry_backoff_s`` x attempt in between). At most ``concurrency`` requests in flight.

    Returns:
        ``{prompt_id: ok record}`` for every prompt.

    Raises:
        LoadError: ``base_url`` is not loopback, or a prompt has no ok record after all
            attempts (names the prompt and its last error).
    """
    check_loopback_url(base_url)

    def one(client: httpx.Client, prompt: Prompt) -> RequestRecord:
        rec: RequestRecord | None = None
        for attempt in range(retries + 1):
            if attempt:
                time.sleep(retry_backoff_s * attempt)
            rec = stream_completion(client, base_url, model, prompt, timeout_s=timeout_s,
                                    source="reference", ignore_eos=ignore_eos, server=server,
                                    top_logprobs=top_logprobs, request_class=request_class)
            if rec.ok:
                return rec
            log.warning("reference prompt %d attempt %d failed: %s (%s)", prompt.prompt_id,
                        attempt + 1, rec.error, rec.error_detail)
        assert rec is not None
        raise LoadError(
            f"no reference output for prompt {prompt.prompt_id} after {retries + 1} attempts: "
            f"{rec.error} ({rec.error_detail})",
            where=f"{base_url}{COMPLETIONS_PATH}",
            hint="check the reference server log",
        )

    out: dict[int, RequestRecord] = {}
    with make_client(max_connections=max(1, concurrency)) as client, \
            ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="reference") as pool:
        futures = {pool.submit(one, client, p): p for p in prompts}
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for f in pending:
            f.cancel()
        for f in done:
            if f.exception() is not None:
                pool.shutdown(wait=True, cancel_futures=True)
                raise f.exception()  # type: ignore[misc]
            rec = f.result()
            out[rec.prompt_id] = rec
    return dict(sorted(out.items()))

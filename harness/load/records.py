"""The request record: one JSON object per request, one line each in ``records.jsonl``.

This is the single boundary between the load side (locust process, reference fetch,
liveness probes) and everything that judges (metrics, checks, report). Everything
downstream is a pure function of these records.

Instants are seconds since the epoch (:func:`harness.clock.now`); durations are seconds.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator


@dataclass
class RequestRecord:
    """One streaming completion request as seen by the client.

    Fields:
        request_id: unique id (uuid4 hex) of this request.
        source: who sent it: ``"load"`` (locust user), ``"reference"``, ``"probe"``.
        user_id: locust user index (``-1`` when not from locust).
        prompt_id: id of the prompt in the prompt set (see :mod:`harness.load.prompts`).
        prompt_class: ``"short"`` (< 64 tokens), ``"medium"`` (~128), ``"long"`` (~512).
        max_tokens: the ``max_tokens`` asked for.
        send_time: epoch seconds when the request was sent.
        ttft_s: seconds from send to the first chunk carrying output (None if none came).
        chunk_offsets_s: arrival time of every chunk that carried output tokens, in seconds
            after ``send_time`` (so ``chunk_offsets_s[0] == ttft_s``).
        chunk_tokens: output tokens in each of those chunks (same length as
            ``chunk_offsets_s``); speculative decoding bundles several tokens per chunk.
        e2e_s: seconds from send to the end of the exchange: the final ``[DONE]``, the
            error, or the cut, whichever ended it (None only if it never ended).
        output_tokens: ``usage.completion_tokens`` from the final usage chunk (None if absent).
        prompt_tokens: ``usage.prompt_tokens`` (None if absent).
        finish_reason: the choice's ``finish_reason`` (``"stop"``, ``"length"``, None).
        text: concatenated output text.
        token_ids: concatenated output token ids (``return_token_ids``), None if the
            server did not return them.
        status: HTTP status code, None if no response head arrived.
        error: error class, None on success. One of ``"connect"`` (refused/unreachable),
            ``"http_<code>"``, ``"stream_error"`` (an error event inside the stream),
            ``"stream_cut"`` (connection closed before ``[DONE]``), ``"timeout"``,
            ``"bad_payload"`` (unparsable chunk), ``"aborted"`` (``[DONE]`` after a
            finish_reason other than stop/length, e.g. vLLM's ``abort`` at shutdown), or
            ``"other:<ExceptionName>"``.
        error_detail: short human text for the error (first 300 chars).
        done: True if the stream ended with ``data: [DONE]``.
        ok: the client's own verdict: HTTP 200, no error, ``[DONE]`` seen, a
            finish_reason present. Checks re-derive this strictly (see
            :func:`is_complete`) and never trust it alone.
        server: which server the request went to: ``"spec"`` (the speculative server) or
            ``"ref"`` (the non-speculative reference; mirror mode sends the load to both).
            Records written before this field existed read as ``"spec"``.
        sampling: the name of the request's sampling class (``load.sampling``, e.g.
            ``"greedy"``, temperature 0); older records read as ``"greedy"``.
        attempt: 1 for a request's first try; ``n`` for the ``n``-th try of the same
            logical request under the client's retry policy (``load.retry``).
        logical_id: shared by every try of one logical request (a user-visible request);
            empty for records written before retries existed (then ``request_id`` stands
            for it, see :meth:`logical`).
        read_offsets_s: only with ``load.read_stamps`` (else None): for each output chunk,
            the moment the client had parsed it (user space, :func:`time.perf_counter`
            seconds after the send), where ``chunk_offsets_s`` holds the kernel's arrival
            stamp. It is where ``vllm bench serve`` stamps its chunks; the difference is the
            load process's own delay (a wait for a core, gevent's turn, parsing).
        e2e_read_s: only with ``load.read_stamps``: the same user-space instant for
            ``data: [DONE]`` (None otherwise, or when the stream did not end with it).
        top_logprobs: reference records (the reference fetch asks the server for them):
            for each output token, the server's most likely tokens at that position as
            ``[[token_id, logprob], ...]``, best first (OpenAI completions ``logprobs``
            with vLLM's ``return_tokens_as_token_ids``; natural log). The integrity check
            uses them to tell a near-tie flipped by numerics from a changed output. None
            for other records or a server that sent none.
        request_class: the name of the request's class (``load.request_classes``; the
            implicit plain completions class is ``"plain"``, as older records read).
        endpoint: ``"completions"`` (``/v1/completions``) or ``"chat"``
            (``/v1/chat/completions``).
        stop_reason: vLLM's ``stop_reason`` of the choice: the stop string or stop token
            id that ended the output; None for EOS, a length finish, or none sent.
        logprobs: only when the request's class asks for logprobs (else None): the chosen
            token's logprob (nats) per output token, in order (completions:
            ``logprobs.token_logprobs``; chat: ``logprobs.content[i].logprob``); an entry
            is None where the server sent null.
        tool_calls: chat: the streamed tool calls as ``[{"name", "arguments"}]``, each
            call's argument deltas joined (None when the server sent none).
        turn: the request's turn in its conversation (1-based; a multi-turn chat class's
            turn ``n`` carries the ``n - 1`` earlier ones); 1 for every other request.
        origin: a traffic source's request (``load.source``; ``request_class`` ``"source"``):
            ``"FILE:LINE"`` of the line it came from; None for generated prompts.
        served_by: the upstream that served the request when the load went through the
            harness's load router (its ``x-specchaos-upstream`` response header,
            :mod:`harness.stack.router`): ``server`` itself (e.g. ``"spec"``), or the warm
            plain server the speculation breaker routed new requests to (e.g. ``"ref"``);
            None when the request went straight to ``server`` (no router: it served it).
    """

    request_id: str
    source: str = "load"
    user_id: int = -1
    prompt_id: int = -1
    prompt_class: str = ""
    max_tokens: int = 0
    send_time: float = 0.0
    ttft_s: float | None = None
    chunk_offsets_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    e2e_s: float | None = None
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    text: str = ""
    token_ids: list[int] | None = None
    status: int | None = None
    error: str | None = None
    error_detail: str | None = None
    done: bool = False
    ok: bool = False
    server: str = "spec"
    sampling: str = "greedy"
    attempt: int = 1
    logical_id: str = ""
    read_offsets_s: list[float] | None = None
    e2e_read_s: float | None = None
    top_logprobs: list[list[list[float]]] | None = None
    request_class: str = "plain"
    endpoint: str = "completions"
    stop_reason: str | int | None = None
    logprobs: list[float | None] | None = None
    tool_calls: list[dict] | None = None
    turn: int = 1
    origin: str | None = None
    served_by: str | None = None

    @property
    def logical(self) -> str:
        """The id of the logical (user-visible) request this try belongs to."""
        return self.logical_id or self.request_id

    @property
    def served(self) -> str:
        """The server that answered: ``served_by`` when the load router named one, else ``server``."""
        return self.served_by or self.server

    @property
    def end_time(self) -> float | None:
        """Epoch seconds when the exchange ended, or None."""
        return None if self.e2e_s is None else self.send_time + self.e2e_s

    def to_json(self) -> str:
        # the fields are scalars and flat lists: vars() gives what asdict() would, without
        # its deep copy (5x cheaper; the load process writes one record per request)
        return json.dumps(vars(self), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict) -> "RequestRecord":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def append_record(path: str | os.PathLike, record: RequestRecord) -> None:
    """Append one record as a JSON line and flush it to the OS (crash-safe enough)."""
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(record.to_json() + "\n")


def write_records(path: str | os.PathLike, records: Iterable[RequestRecord]) -> None:
    """Write records as JSONL, replacing the file."""
    with open(path, "w", encoding="utf-8") as fh:
        for r in records:
            fh.write(r.to_json() + "\n")


def iter_records(path: str | os.PathLike) -> Iterator[RequestRecord]:
    """Yield records from a JSONL file and from its workers' files (distributed load,
    ``load.workers``: see :func:`record_files`), the main file first, then worker 0, 1, ….
    A torn last line (writer killed mid-write) is skipped."""
    for p in record_files(path):
        yield from _iter_file(p)


def _iter_file(p: Path) -> Iterator[RequestRecord]:
    if not p.exists():
        return
    with p.open(encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                yield RequestRecord.from_dict(json.loads(line))
            except (json.JSONDecodeError, TypeError):
                continue


def unreadable_lines(path: str | os.PathLike) -> list[int]:
    """Line numbers (1-based) of a records file that are not records, a torn last line
    excepted (a writer killed mid-write): recorded data that was lost, for the judge to
    report instead of silently skipping."""
    p = Path(path)
    if not p.exists():
        return []
    bad: list[int] = []
    lines = p.read_text(encoding="utf-8", errors="replace").splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            RequestRecord.from_dict(json.loads(line))
        except (json.JSONDecodeError, TypeError):
            bad.append(i)
    if bad and bad[-1] == len(lines):
        bad.pop()
    return bad


def read_records(path: str | os.PathLike) -> list[RequestRecord]:
    """All records of a JSONL file and its workers' files (see :func:`iter_records`)."""
    return list(iter_records(path))


def is_spec_load(r: RequestRecord) -> bool:
    """True for a load request sent to the speculative server (``source == "load"`` and
    ``server == "spec"``): what every check that is not mirror-aware judges, so mirror
    mode's requests to the reference server change no existing verdict."""
    return r.source == "load" and r.server == "spec"


def is_ref_load(r: RequestRecord) -> bool:
    """True for a load request mirror mode sent to the reference (plain) server."""
    return r.source == "load" and r.server == "ref"


#: The finish reasons of a complete response (``"tool_calls"``: a chat response that ends
#: by calling tools).
FINISH_REASONS = ("stop", "length", "tool_calls")
#: Client error classes that describe the server's payload rather than an error the server
#: reported: the load client labels "[DONE] without a finish_reason" ``bad_payload``.
PAYLOAD_ERRORS = ("bad_payload",)


def presented_finished(r: RequestRecord) -> bool:
    """True when the server presented the response as finished: HTTP 200, the stream ended
    with ``[DONE]``, and no error was reported (the client's own ``bad_payload`` label on a
    finished stream, e.g. ``[DONE]`` without a finish_reason, is the malformation itself,
    not an error the server reported)."""
    return r.status == 200 and bool(r.done) and (r.error is None or r.error in PAYLOAD_ERRORS)


def is_complete(r: RequestRecord) -> tuple[bool, str]:
    """Strictly re-derive whether a response is complete; never trusts ``r.ok``.

    Complete means all of: HTTP 200; no error; ``[DONE]`` seen; the exchange ended
    (``e2e_s`` known); ``finish_reason`` in :data:`FINISH_REASONS`; ``output_tokens``
    (``usage.completion_tokens``) known; one token count per chunk arrival;
    ``sum(chunk_tokens) == output_tokens``; ``len(token_ids) == output_tokens`` when token
    ids were returned; ``max_tokens`` recorded and ``output_tokens ≤ max_tokens``; and
    ``finish_reason == "length"`` ⇒ ``output_tokens == max_tokens``.

    Returns:
        ``(True, "")``, or ``(False, reason)`` with the first broken rule in words.
    """
    if r.status != 200:
        return False, f"HTTP status {r.status}"
    if r.error is not None:
        return False, f"error {r.error}" + (f": {r.error_detail}" if r.error_detail else "")
    if not r.done:
        return False, "stream ended before [DONE]"
    if r.e2e_s is None:
        return False, "exchange never ended"
    if r.finish_reason not in FINISH_REASONS:
        return False, f"finish_reason {r.finish_reason!r} not in {FINISH_REASONS}"
    if r.output_tokens is None:
        return False, "no usage.completion_tokens"
    if len(r.chunk_tokens) != len(r.chunk_offsets_s):
        return False, f"{len(r.chunk_tokens)} chunk token counts for {len(r.chunk_offsets_s)} chunk arrivals"
    total = sum(r.chunk_tokens)
    if total != r.output_tokens:
        return False, f"chunks carried {total} tokens, usage says {r.output_tokens}"
    if r.token_ids is not None and len(r.token_ids) != r.output_tokens:
        return False, f"{len(r.token_ids)} token ids, usage says {r.output_tokens}"
    if r.max_tokens <= 0:
        return False, "max_tokens not recorded"
    if r.output_tokens > r.max_tokens:
        return False, f"{r.output_tokens} output tokens exceed max_tokens {r.max_tokens}"
    if r.finish_reason == "length" and r.output_tokens != r.max_tokens:
        return False, f"finish_reason 'length' at {r.output_tokens} tokens, max_tokens is {r.max_tokens}"
    return True, ""


# ---------------------------------------------------------------- distributed load files
#: How a locust worker's records file is named next to ``records.jsonl`` (``load.workers``):
#: each worker appends to its own file, so no two processes write one file.
WORKER_FILE = "{stem}.worker{index}{suffix}"
_WORKER_RE = re.compile(r"^(?P<stem>.+)\.worker(?P<index>\d+)(?P<suffix>\.[^.]*)$")


def worker_records_path(path: str | os.PathLike, index: int) -> Path:
    """The records file of locust worker ``index`` (0-based) for the run file ``path``:
    ``records.jsonl`` → ``records.worker0.jsonl``."""
    p = Path(path)
    return p.with_name(WORKER_FILE.format(stem=p.stem, index=index, suffix=p.suffix))


def worker_record_files(path: str | os.PathLike) -> list[Path]:
    """The workers' records files that exist next to ``path``, by worker index."""
    p = Path(path)
    found = []
    if p.parent.is_dir():
        for f in p.parent.iterdir():
            m = _WORKER_RE.match(f.name)
            if m and m["stem"] == p.stem and m["suffix"] == p.suffix:
                found.append((int(m["index"]), f))
    return [f for _, f in sorted(found)]


def record_files(path: str | os.PathLike) -> list[Path]:
    """Every file that holds the records of the run file ``path``: ``path`` itself (the
    single load process, probes) and, with distributed load, each worker's file
    (:func:`worker_records_path`). Each record lives in exactly one of them, so reading
    them all in turn loses and doubles nothing."""
    return [Path(path), *worker_record_files(path)]


class RecordTail:
    """Reads the records appended to a run's records files since the last call
    (:func:`record_files`, re-listed on each call so workers' files that appear later are
    followed too): only whole lines; a line still being written is read next time.

    Not thread-safe: one reader per instance.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._offsets: dict[Path, int] = {}

    def read_new(self) -> list[RequestRecord]:
        """The records completed since the previous call (unparsable lines skipped)."""
        out: list[RequestRecord] = []
        for f in record_files(self.path):
            try:
                with open(f, "rb") as fh:
                    fh.seek(self._offsets.get(f, 0))
                    data = fh.read()
            except OSError:
                continue
            end = data.rfind(b"\n") + 1   # whole lines only
            self._offsets[f] = self._offsets.get(f, 0) + end
            for line in data[:end].splitlines():
                try:
                    out.append(RequestRecord.from_dict(json.loads(line)))
                except (json.JSONDecodeError, TypeError, UnicodeDecodeError):
                    continue
        return out

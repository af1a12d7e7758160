"""Hand-built request records and timeline events for unit tests of metrics, checks, report.

``make_record`` builds a *complete* streaming response by default (HTTP 200, ``[DONE]``,
consistent usage and chunk counts); keyword arguments override any field, and the
``cut``/``fail`` helpers build the usual defects.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Sequence

from harness.load.records import RequestRecord

_ids = itertools.count()


def make_record(
    *,
    send_time: float = 1000.0,
    ttft: float = 0.1,
    gaps: Sequence[float] | None = None,
    chunk_tokens: Sequence[int] | None = None,
    token_ids: Sequence[int] | None = None,
    tail_s: float = 0.001,
    max_tokens: int | None = None,
    finish_reason: str | None = None,
    prompt_id: int = 0,
    **overrides: Any,
) -> RequestRecord:
    """A complete record: first chunk at ``ttft`` s, later chunks ``gaps`` apart, each chunk
    carrying ``chunk_tokens`` tokens (default: 4 chunks of 1 token, 0.05 s apart); ``[DONE]``
    ``tail_s`` after the last chunk. Token ids default to ``prompt_id*1000 + i``.
    ``max_tokens`` defaults to the output length with ``finish_reason="length"``."""
    if chunk_tokens is None:
        chunk_tokens = [1] * (len(gaps) + 1 if gaps is not None else 4)
    if gaps is None:
        gaps = [0.05] * (len(chunk_tokens) - 1)
    assert len(gaps) == len(chunk_tokens) - 1
    offsets = [ttft]
    for g in gaps:
        offsets.append(offsets[-1] + g)
    n = sum(chunk_tokens)
    if token_ids is None:
        token_ids = [prompt_id * 1000 + i for i in range(n)]
    if max_tokens is None:
        max_tokens = n
        finish_reason = finish_reason or "length"
    rec = RequestRecord(
        request_id=f"r{next(_ids)}",
        source="load",
        prompt_id=prompt_id,
        prompt_class="short",
        max_tokens=max_tokens,
        send_time=send_time,
        ttft_s=ttft if chunk_tokens else None,
        chunk_offsets_s=offsets if chunk_tokens else [],
        chunk_tokens=list(chunk_tokens),
        e2e_s=(offsets[-1] if chunk_tokens else 0.0) + tail_s,
        output_tokens=n,
        prompt_tokens=10,
        finish_reason=finish_reason or "stop",
        text="".join(f"<{t}>" for t in token_ids),
        token_ids=list(token_ids),
        status=200,
        error=None,
        done=True,
        ok=True,
    )
    return dataclasses.replace(rec, **overrides) if overrides else rec


def cut(r: RequestRecord, after_chunks: int, *, labelled_ok: bool = False, at_s: float | None = None) -> RequestRecord:
    """The same stream cut after ``after_chunks`` chunks, before ``[DONE]`` and usage
    (``labelled_ok=True`` models a client that wrongly calls it a success)."""
    offs = r.chunk_offsets_s[:after_chunks]
    toks = r.chunk_tokens[:after_chunks]
    n = sum(toks)
    end = at_s if at_s is not None else (offs[-1] + 0.01 if offs else 0.01)
    return dataclasses.replace(
        r,
        chunk_offsets_s=offs,
        chunk_tokens=toks,
        ttft_s=offs[0] if offs else None,
        token_ids=None if r.token_ids is None else r.token_ids[:n],
        text="".join(f"<{t}>" for t in (r.token_ids or [])[:n]),
        e2e_s=end,
        output_tokens=None,
        finish_reason=None,
        done=False,
        error=None if labelled_ok else "stream_cut",
        ok=labelled_ok,
    )


def fail(*, send_time: float = 1000.0, after_s: float | None = 0.2, status: int | None = 500,
         error: str = "http_500", **overrides: Any) -> RequestRecord:
    """A failed request that ended ``after_s`` after sending (None = never ended)."""
    return RequestRecord(
        request_id=f"f{next(_ids)}",
        source="load",
        prompt_id=overrides.pop("prompt_id", 0),
        max_tokens=overrides.pop("max_tokens", 8),
        send_time=send_time,
        e2e_s=after_s,
        status=status,
        error=error if after_s is not None else None,
        done=False,
        ok=False,
        **overrides,
    )


def ev(t: float, event: str, source: str = "runner", **data: Any) -> dict[str, Any]:
    """One timeline event."""
    return {"t": t, "source": source, "event": event, **data}


def phase_events(starts: dict[str, float], stop: float) -> list[dict[str, Any]]:
    """``load_started``, one ``phase_start`` per phase, and ``load_stopped``."""
    out = [ev(min(starts.values()), "load_started")]
    out += [ev(t, "phase_start", phase=p) for p, t in starts.items()]
    out.append(ev(stop, "load_stopped"))
    return out

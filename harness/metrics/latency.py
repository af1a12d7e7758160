"""Per-request latency metrics, defined as in vLLM's serving benchmark (``vllm bench serve``,
module ``vllm.benchmarks.serve``), one small function each.

Every function takes one :class:`~harness.load.records.RequestRecord` and returns seconds
(or a list of seconds); ``None`` (or ``[]``) when the record cannot give the value.
They do not judge whether the request succeeded: callers feed only *complete* requests
(:func:`harness.load.records.is_complete`) into latency statistics, as vLLM feeds only
successful outputs.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from harness.load.records import RequestRecord

__all__ = ["ttft_s", "e2e_s", "tpot_s", "itl_s", "itl_per_token_s", "percentiles"]


def ttft_s(r: RequestRecord) -> float | None:
    """Time to first token, seconds: request send → first chunk carrying output.

    Source: ``ttft`` in vLLM's serving benchmark. ``None`` when no output chunk arrived.
    """
    if r.ttft_s is not None:
        return float(r.ttft_s)
    if r.chunk_offsets_s:
        return float(r.chunk_offsets_s[0])
    return None


def e2e_s(r: RequestRecord) -> float | None:
    """End-to-end latency, seconds: request send → end of the stream.

    Source: ``latency`` (E2EL) in vLLM's serving benchmark. ``None`` if the exchange never
    ended.
    """
    return None if r.e2e_s is None else float(r.e2e_s)


def tpot_s(r: RequestRecord) -> float | None:
    """Time per output token excluding the first, seconds per token:
    ``(E2E − TTFT) ÷ (output_tokens − 1)``.

    Source: TPOT in vLLM's serving benchmark. ``None`` when ``output_tokens`` is unknown
    or ≤ 1, or when TTFT/E2E are missing.
    """
    n = r.output_tokens
    t, e = ttft_s(r), e2e_s(r)
    if n is None or n <= 1 or t is None or e is None:
        return None
    return (e - t) / (n - 1)


def itl_s(r: RequestRecord) -> list[float]:
    """Inter-token latency, seconds per chunk: the gaps between consecutive output chunks
    (``len(chunks) − 1`` values).

    Source: ``itl`` in vLLM's serving benchmark, which records one gap per streamed chunk
    (the field's definition: with speculative decoding one chunk may carry several
    tokens; see :func:`itl_per_token_s` for the per-token variant).
    """
    offs = r.chunk_offsets_s
    return [float(b - a) for a, b in zip(offs, offs[1:])]


def itl_per_token_s(r: RequestRecord) -> list[float]:
    """ITL per token (a specchaos variant, not vLLM's ITL), seconds per token: each chunk
    gap ÷ the tokens in the later chunk.

    Speculative decoding bundles several accepted tokens into one chunk, so the per-chunk
    gap overstates the time per token; this spreads each gap over the tokens it brought.
    A chunk recorded with ≤ 0 tokens counts as one token. Same length as
    :func:`itl_s`.
    """
    gaps = itl_s(r)
    toks = list(r.chunk_tokens[1:]) if len(r.chunk_tokens) == len(r.chunk_offsets_s) else []
    if len(toks) != len(gaps):
        return gaps
    return [g / max(int(k), 1) for g, k in zip(gaps, toks)]


def percentiles(values: Iterable[float | None], qs: Sequence[float] = (50, 95, 99)) -> dict[str, float | None]:
    """Percentiles of ``values`` (``None`` entries dropped), as ``{"p50": .., "p95": .., "p99": ..}``.

    Uses ``numpy.percentile`` with linear interpolation, as vLLM's serving benchmark. Keys
    are ``f"p{q:g}"``. Every value is ``None`` when there is no data (vLLM reports 0 there;
    a missing measurement must not look like a perfect one).
    """
    data = [float(v) for v in values if v is not None]
    keys = [f"p{q:g}" for q in qs]
    if not data:
        return {k: None for k in keys}
    arr = np.asarray(data, dtype=float)
    return {k: float(np.percentile(arr, q, method="linear")) for k, q in zip(keys, qs)}

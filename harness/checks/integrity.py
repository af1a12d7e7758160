"""Sequence integrity: is a response really complete, and is it the reference's output?

Three defects are judged here, from request records alone:

* **mismatched** — a complete greedy response that differs from the non-speculative
  reference for the same prompt (speculative decoding must not change greedy output);
* **malformed** — a response the server presented as finished (HTTP 200, no error,
  ``[DONE]`` seen) that is internally inconsistent (no finish_reason, chunk token total
  ≠ ``usage.completion_tokens``, token ids ≠ usage, a broken length limit);
* **false success** — a record the client labelled ``ok=True`` that is not complete
  (e.g. a stream cut by a kill reported as a success).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Iterable, Sequence

from harness.checks.base import CheckResult
from harness.load.records import RequestRecord

__all__ = [
    "FINISH_REASONS",
    "PAYLOAD_ERRORS",
    "is_complete",
    "presented_finished",
    "divergence_index",
    "first_divergence",
    "integrity_checks",
]

log = logging.getLogger(__name__)

FINISH_REASONS = ("stop", "length")
_EXAMPLES = 5


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
    (``e2e_s`` known); ``finish_reason`` in ``{"stop", "length"}``; ``output_tokens``
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


def divergence_index(got: Sequence, expected: Sequence) -> int | None:
    """Index of the first position where two sequences differ, ``None`` if equal.

    A strict prefix diverges at the shorter length."""
    for i, (a, b) in enumerate(zip(got, expected)):
        if a != b:
            return i
    if len(got) != len(expected):
        return min(len(got), len(expected))
    return None


def _at(seq: Sequence, i: int) -> str:
    return repr(seq[i]) if i < len(seq) else "<end>"


def first_divergence(got: RequestRecord, expected: RequestRecord) -> str | None:
    """Where ``got``'s output first differs from ``expected``'s, in words; ``None`` if equal.

    Compares token ids exactly when both records have them, otherwise the text. The
    sentence names the index, both tokens (or characters) there, and both lengths, e.g.
    ``"token 5: got 812, expected 17 (got 32 tokens, expected 32)"``.
    """
    if got.token_ids is not None and expected.token_ids is not None:
        a, b, unit = got.token_ids, expected.token_ids, "token"
    else:
        a, b, unit = got.text, expected.text, "char"
    i = divergence_index(a, b)
    if i is None:
        return None
    return f"{unit} {i}: got {_at(a, i)}, expected {_at(b, i)} (got {len(a)} {unit}s, expected {len(b)})"


def _aligned(got: RequestRecord, ref: RequestRecord) -> tuple[RequestRecord, RequestRecord]:
    """Make two complete records comparable when they were asked for different max_tokens:
    the one cut by its (smaller) length limit is compared as a prefix of the other."""
    if got.max_tokens == ref.max_tokens:
        return got, ref
    short, long_ = (got, ref) if got.max_tokens < ref.max_tokens else (ref, got)
    if short.finish_reason != "length":
        return got, ref
    n = short.output_tokens or 0
    cut = dataclasses.replace(
        long_,
        token_ids=None if long_.token_ids is None else long_.token_ids[:n],
        text=long_.text[: len(short.text)],
    )
    return (got, cut) if short is got else (cut, ref)


def integrity_checks(
    records: Iterable[RequestRecord], reference: dict[int, RequestRecord], min_compared: int
) -> tuple[list[CheckResult], dict]:
    """Judge sequence integrity of load records against the non-speculative reference.

    Args:
        records: load records (``source == "load"``).
        reference: complete reference record per ``prompt_id`` (greedy, non-speculative
            server). Reference records that are not complete are ignored.
        min_compared: how many complete responses must have been compared at least
            (coverage: nothing compared fails, never passes vacuously).

    Returns:
        ``(checks, summary)``: checks ``integrity.mismatched == 0``,
        ``integrity.malformed == 0``, ``integrity.false_success == 0``,
        ``integrity.compared ≥ min_compared``; summary ``{"compared", "mismatched",
        "malformed", "false_success", "first_divergence", "examples"}`` where
        ``first_divergence`` is the first mismatch in words (or None) and ``examples``
        holds up to 5 request ids with reasons per defect.
    """
    refs: dict[int, RequestRecord] = {}
    for pid, ref in reference.items():
        ok, why = is_complete(ref)
        if ok:
            refs[pid] = ref
        else:
            log.warning("reference for prompt %s is not complete (%s); not compared", pid, why)

    compared = mismatched = malformed = false_success = 0
    first: str | None = None
    examples: dict[str, list[dict]] = {"mismatched": [], "malformed": [], "false_success": []}

    def note(kind: str, r: RequestRecord, why: str) -> None:
        if len(examples[kind]) < _EXAMPLES:
            examples[kind].append({"request_id": r.request_id, "prompt_id": r.prompt_id, "detail": why})

    for r in records:
        ok, why = is_complete(r)
        if not ok:
            if presented_finished(r):
                malformed += 1
                note("malformed", r, why)
            if r.ok:
                false_success += 1
                note("false_success", r, why)
            continue
        ref = refs.get(r.prompt_id)
        if ref is None:
            continue
        compared += 1
        diff = first_divergence(*_aligned(r, ref))
        if diff is not None:
            mismatched += 1
            note("mismatched", r, diff)
            if first is None:
                first = f"request {r.request_id} (prompt {r.prompt_id}): {diff}"

    def zero(name: str, n: int, what: str) -> CheckResult:
        ex = examples[name]
        detail = f"{n} {what}" + (f"; first: {ex[0]['request_id']}: {ex[0]['detail']}" if ex else "")
        if name == "mismatched" and first:
            detail = f"{n} {what}; first: {first}"
        return CheckResult(f"integrity.{name}", "integrity", n == 0, n, 0, detail)

    checks = [
        zero("mismatched", mismatched, "complete responses differ from the reference"),
        zero("malformed", malformed, "responses presented as finished are internally inconsistent"),
        zero("false_success", false_success, "records labelled ok by the client are not complete"),
        CheckResult(
            "integrity.compared",
            "coverage",
            compared >= min_compared and compared > 0,
            compared,
            min_compared,
            f"{compared} complete responses compared with the reference (need ≥ {max(min_compared, 1)})",
        ),
    ]
    summary = {
        "compared": compared,
        "mismatched": mismatched,
        "malformed": malformed,
        "false_success": false_success,
        "first_divergence": first,
        "examples": examples,
    }
    return checks, summary

"""The properties, as pure functions over recorded completions (no server is asked).

Each checker returns a list of problems in words (empty: the property holds), so a test
can join them with the request's replay line (:func:`tests.property.wire.curl_line`)
and each checker is tested on synthetic completions with a known defect
(``tests/property/test_invariants.py``).

Definitions (the OpenAI completions API as vLLM 0.32 serves it):

* ``usage.completion_tokens`` counts the output token ids returned (``return_token_ids``),
  ``usage.prompt_tokens`` the prompt's ids, ``total_tokens`` their sum; a stream asked
  for ``stream_options.include_usage`` carries exactly one usage event, the last before
  ``[DONE]``, with no choices; a stream not asked for it carries none.
* ``max_tokens`` bounds ``completion_tokens``; ``finish_reason == "length"`` means the
  bound was reached exactly.
* A stop string ends the text right before its first occurrence (vLLM's default
  ``include_stop_str_in_output: false``; of several, the one completing earliest, see
  :func:`first_stop`) with ``finish_reason "stop"`` and the string as ``stop_reason``;
  the returned token ids end with the token that completed it (vLLM drops tokens a
  speculative step appended after it), so their text starts with ``text + stop_reason``. ``finish_reason "stop"`` without a
  stop string means the end-of-sequence token was generated: the last token id is EOS.
* The text of a response that was not cut by a stop string is exactly the text of its
  token ids (:func:`ids_text`): their decode by the target's tokenizer (special tokens
  skipped, as vLLM does), less a trailing incomplete UTF-8 sequence. vLLM detokenizes
  incrementally (``tokenizers``' ``DecodeStream``), which emits nothing while the text
  ends in U+FFFD, so a response whose last byte-level tokens stop mid-character ends
  before that character (measured: a 1-token answer of byte ``0xE2`` has text ``""``,
  its full decode is ``"\ufffd"``; ``test_stack_properties.py`` pins it).
* Greedy (``temperature`` 0) speculative decoding returns what the non-speculative
  reference returns: the same token ids, text, finish and stop reason, usage, and
  logprobs (tokens equal, values within :data:`LOGPROB_ATOL`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from harness.checks import request_classes
from harness.checks.integrity import divergence_index
# one definition of the stop and text rules, shared with the harness's per-class judge
from harness.checks.request_classes import LOGPROB_ATOL, Response, first_stop, ids_text, stops_of
from tests.property.wire import Completion

__all__ = ["LOGPROB_ATOL", "GREEDY_SLACK", "failed", "first_stop", "ids_text", "length_problems", "logprobs_problems",
           "response_problems", "same_output", "settled_problems", "stop_problems", "stopped_early_problems",
           "stops_of", "text_problems", "usage_problems"]

#: Slack for "the greedy token has the top logprob" (nats).
GREEDY_SLACK = 1e-5

Decode = Callable[[Sequence[int]], str]


def failed(c: Completion) -> list[str]:
    """The exchange itself: HTTP 200, no error, a stream ended by ``[DONE]``, a finish reason."""
    out = []
    if c.status != 200 or c.error is not None:
        out.append(f"HTTP {c.status}: {c.error}")
        return out
    if not c.done:
        out.append("stream ended without data: [DONE]")
    if c.finish_reason not in ("stop", "length"):
        out.append(f"finish_reason {c.finish_reason!r} is neither 'stop' nor 'length'")
    if c.token_ids is None:
        out.append("no token_ids although return_token_ids was asked")
    return out


def usage_problems(c: Completion) -> list[str]:
    """``usage`` against what was delivered (module doc); for a stream, also where the
    usage event is and that every chunk's token ids add up to the output."""
    out = []
    ids = c.token_ids or []
    wants_usage = (not c.streamed) or bool((c.body.get("stream_options") or {}).get("include_usage"))
    if c.streamed:
        last = c.events - 1
        if wants_usage and c.usage_events != [last]:
            out.append(f"usage events at {c.usage_events} of {c.events} events; expected exactly one, the last ({last})")
        if not wants_usage and c.usage_events:
            out.append(f"usage events at {c.usage_events} although stream_options.include_usage was not asked")
        chunk_ids = sum(len(ch["token_ids"] or []) for ch in c.chunks)
        if chunk_ids != len(ids):
            out.append(f"chunks carried {chunk_ids} token ids, the output has {len(ids)}")
    if not wants_usage:
        return out
    u = c.usage or {}
    if c.usage is None:
        return out + ["no usage"]
    if u.get("completion_tokens") != len(ids):
        out.append(f"usage.completion_tokens {u.get('completion_tokens')} but {len(ids)} token ids were delivered")
    if c.prompt_token_ids is not None and u.get("prompt_tokens") != len(c.prompt_token_ids):
        out.append(f"usage.prompt_tokens {u.get('prompt_tokens')} but the prompt has {len(c.prompt_token_ids)} token ids")
    if u.get("total_tokens") != (u.get("prompt_tokens") or 0) + (u.get("completion_tokens") or 0):
        out.append(f"usage.total_tokens {u.get('total_tokens')} != prompt_tokens {u.get('prompt_tokens')} "
                   f"+ completion_tokens {u.get('completion_tokens')}")
    return out


def length_problems(c: Completion, eos_id: int | None = None) -> list[str]:
    """``max_tokens`` holds: at most that many output tokens, exactly that many when the
    finish reason is ``"length"``; a ``"stop"`` with no stop string ends in EOS
    (``eos_id``, unless ``ignore_eos`` was asked or ``eos_id`` is None)."""
    out = []
    n, limit = len(c.token_ids or []), int(c.body["max_tokens"])
    if n > limit:
        out.append(f"{n} output tokens exceed max_tokens {limit}")
    if c.finish_reason == "length" and n != limit:
        out.append(f"finish_reason 'length' after {n} tokens, max_tokens is {limit}")
    if c.finish_reason == "stop" and c.stop_reason is None and eos_id is not None and not c.body.get("ignore_eos"):
        if not c.token_ids or c.token_ids[-1] != eos_id:
            last = c.token_ids[-1] if c.token_ids else None
            out.append(f"finish_reason 'stop' with no stop_reason, but the last token is {last}, not EOS {eos_id}")
    return out


def _response(c: Completion) -> Response:
    """The harness's view of a completion (:class:`harness.checks.request_classes.Response`)."""
    return Response(request_id=c.url, body=c.body, text=c.text, token_ids=c.token_ids or [],
                    finish_reason=c.finish_reason, stop_reason=c.stop_reason)


def stop_problems(c: Completion, decode: Decode) -> list[str]:
    """Nothing after a stop string, and the finish reason says so (module doc;
    :func:`harness.checks.request_classes.stop_problems`, ``decode``: token ids → text,
    special tokens skipped)."""
    return request_classes.stop_problems(_response(c), decode)


def text_problems(c: Completion, decode: Decode) -> list[str]:
    """The delivered text (streamed: the chunks' texts joined) is the text of the
    delivered token ids (:func:`ids_text`), unless a stop string cut it (then
    :func:`stop_problems` judges); :func:`harness.checks.request_classes.text_problems`."""
    return request_classes.text_problems(_response(c), decode)


def logprobs_problems(c: Completion) -> list[str]:
    """Logprobs present exactly when asked (``logprobs: k``), one entry per output token,
    every value ≤ 0, at most ``k + 1`` alternatives per position (the top k and the
    chosen token), offsets non-decreasing from 0, and — greedy — the chosen token has
    the highest logprob of its position (within :data:`GREEDY_SLACK`)."""
    k = c.body.get("logprobs")
    lp = c.logprobs
    if k is None:
        return [] if lp is None else ["logprobs returned although none were asked"]
    if lp is None:
        return [f"logprobs {k} asked, none returned"]
    out = []
    n = len(c.token_ids or [])
    lens = {key: len(v) for key, v in lp.items()}
    if any(v != n for v in lens.values()):
        out.append(f"logprobs lengths {lens} for {n} output tokens")
    for i, v in enumerate(lp["token_logprobs"]):
        if v is None or math.isnan(v) or v > GREEDY_SLACK:
            out.append(f"token_logprobs[{i}] = {v} is not a log-probability")
            break
    for i, top in enumerate(lp["top_logprobs"]):
        if top is None or len(top) > k + 1 or (k > 0 and len(top) < 1):
            out.append(f"top_logprobs[{i}] has {None if top is None else len(top)} entries for logprobs {k}")
            break
        chosen = lp["token_logprobs"][i] if i < len(lp["token_logprobs"]) else None
        if float(c.body.get("temperature", 1)) == 0 and top and chosen is not None \
                and chosen < max(top.values()) - GREEDY_SLACK:
            out.append(f"position {i}: greedy chose logprob {chosen} but {max(top, key=top.get)!r} has "
                       f"{max(top.values())}")
            break
    offs = lp["text_offset"]
    if offs and (offs[0] != 0 or any(b < a for a, b in zip(offs, offs[1:]))):
        out.append(f"text_offset {offs[:10]}... does not rise from 0")
    return out


def response_problems(c: Completion, decode: Decode, eos_id: int | None = None) -> list[str]:
    """Every property of one response: :func:`failed`, then (if it completed)
    :func:`usage_problems`, :func:`length_problems`, :func:`stop_problems`,
    :func:`text_problems`, :func:`logprobs_problems`."""
    bad = failed(c)
    if bad:
        return bad
    return (usage_problems(c) + length_problems(c, eos_id) + stop_problems(c, decode)
            + text_problems(c, decode) + logprobs_problems(c))


def same_output(got: Completion, expected: Completion, what: str = "reference") -> list[str]:
    """``got`` returned what ``expected`` (the ``what``) returned: token ids (the first
    divergence named), text, finish and stop reason, usage counts, logprob tokens and
    values (within :data:`LOGPROB_ATOL`)."""
    out = []
    a, b = got.token_ids or [], expected.token_ids or []
    i = divergence_index(a, b)
    if i is not None:
        at = (lambda s: s[i] if i < len(s) else "<end>")
        out.append(f"token {i}: got {at(a)}, {what} has {at(b)} (got {len(a)} tokens, {what} {len(b)})")
    if got.text != expected.text:
        j = divergence_index(got.text, expected.text)
        out.append(f"text differs from the {what}'s at char {j}: {got.text[j:j + 30]!r} vs {expected.text[j:j + 30]!r}")
    for key in ("finish_reason", "stop_reason"):
        if getattr(got, key) != getattr(expected, key):
            out.append(f"{key} {getattr(got, key)!r}, {what} {getattr(expected, key)!r}")
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        x, y = (got.usage or {}).get(key), (expected.usage or {}).get(key)
        if x != y:
            out.append(f"usage.{key} {x}, {what} {y}")
    if (got.logprobs is None) != (expected.logprobs is None):
        out.append(f"logprobs {'present' if got.logprobs else 'absent'}, {what} "
                   f"{'present' if expected.logprobs else 'absent'}")
    elif got.logprobs is not None and expected.logprobs is not None:
        if got.logprobs["tokens"] != expected.logprobs["tokens"]:
            out.append(f"logprob tokens differ from the {what}'s")
        for n, (x, y) in enumerate(zip(got.logprobs["token_logprobs"], expected.logprobs["token_logprobs"])):
            if x is None or y is None or abs(x - y) > LOGPROB_ATOL:
                out.append(f"token_logprobs[{n}] {x}, {what} {y} (tolerance {LOGPROB_ATOL})")
                break
    return out


def stopped_early_problems(stopped: Completion, unstopped: Completion) -> list[str]:
    """A request with stop strings returns exactly the text of the same request without
    them up to the stop string that completes first (:func:`first_stop`; nothing more,
    nothing less), finished by that string; when none occurs there, it returns the same
    text with the same finish reason."""
    hit = first_stop(unstopped.text, stops_of(stopped.body))
    if hit is None:
        if stopped.text != unstopped.text or stopped.finish_reason != unstopped.finish_reason:
            return [f"no stop string occurs in the unstopped text, yet the output changed: "
                    f"{stopped.text!r} ({stopped.finish_reason}) vs {unstopped.text!r} ({unstopped.finish_reason})"]
        return []
    i, s = hit
    out = []
    if stopped.text != unstopped.text[:i]:
        out.append(f"stopped text {stopped.text!r} is not the unstopped text before its first stop string "
                   f"{s!r} (char {i}): {unstopped.text[:i]!r}")
    if stopped.finish_reason != "stop" or stopped.stop_reason != s:
        out.append(f"finish_reason {stopped.finish_reason!r} / stop_reason {stopped.stop_reason!r}, "
                   f"expected 'stop' / {s!r} (it completes first, at char {i + len(s)})")
    return out


def settled_problems(open_faults: Sequence[dict[str, Any]], health: dict[str, int | None],
                     incarnations: dict[str, tuple[int, int]], pending: int) -> list[str]:
    """The stack after every fault was cleared (the stateful test's invariant).

    Args:
        open_faults: the ledger's entries not cleared (:meth:`faults.ledger.Ledger.open_faults`).
        health: server name → HTTP status of ``GET /health`` (None: no answer).
        incarnations: server name → (incarnation before the run, incarnation now).
        pending: requests sent during a fault and not yet judged.

    Returns:
        Problems: a fault open in the ledger, a server not answering 200, a server that
        restarted (a fault needing no restart must cause none), a request left pending.
    """
    out = [f"fault {e.get('fault_id')} ({e.get('kind')}) is {e.get('state')} in the ledger, not cleared"
           for e in open_faults]
    out += [f"{name} /health answered {status}" for name, status in health.items() if status != 200]
    out += [f"{name} restarted (incarnation {a} -> {b})" for name, (a, b) in incarnations.items() if a != b]
    if pending:
        out.append(f"{pending} request(s) still pending with no fault active")
    return out

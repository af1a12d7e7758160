"""Integrity invariants per request class: pure functions over one recorded response.

A request class (stop strings, structured output, tool calls, logprobs, chat, plain) has
failures of its own under speculative decoding, each with an invariant that catches it:

=================  ==========================================================  =====================
invariant          holds when                                                  field reports
=================  ==========================================================  =====================
``stop``           no stop string in the text; a stop-string finish names one  sglang#31599,
                   of the request's strings and the token ids' text is the     vllm PR#47616
                   text + that string; a stop string in the ids' text means
                   ``finish_reason "stop"``
``stop_cut``       (reference) the same stop string cut the same text          same
``text``           the delivered text is the text of the delivered token ids   vllm PR#26027
``usage``          the chunks' token count and the token ids both equal        ik_llama.cpp PR#2358,
                   ``usage.completion_tokens``                                 sglang#39826
``structured``     a finished structured output parses and satisfies its       vllm#9423, #27969
                   schema (JSON object, JSON schema, choice, regex)
``tool_calls``     each tool call names a declared tool and its arguments      vllm#40875
                   parse as a JSON object satisfying the tool's parameters
``logprobs``       a logprob for every output token, each a log-probability,   vllm#17876, #34497
                   not all exactly zero
``logprobs_ref``   (reference) where the token ids agree, each logprob within  same
                   ``atol`` nats of the reference's
=================  ==========================================================  =====================

Every invariant is a function ``(Response[, reference], ...) -> list[str]``: the problems in
words, empty when it holds. :func:`applicable` says which invariants a request's body asks
for; :func:`judge` runs them over many responses and returns, per invariant, how many were
judged, how many violated it and the first example: the shape of ``report.json``'s
``integrity.classes.NAME``. Nothing here talks to a server; a response is what was
recorded (:class:`Response`).

Definitions follow the OpenAI API as vLLM 0.32 serves it: stop strings end the text right
before their first occurrence (``include_stop_str_in_output`` false), the stop string that
*completes* earliest wins (:func:`first_stop`, vLLM's ``check_stop_strings``); vLLM's
incremental detokenizer holds back a trailing incomplete UTF-8 sequence (:func:`ids_text`);
structured output is asked with ``response_format`` (``json_object``, ``json_schema``),
vLLM's ``structured_outputs`` (``json``, ``json_object``, ``choice``, ``regex``; ``grammar``
is not judged) or, on older vLLM, ``guided_json``/``guided_choice``/``guided_regex``.
JSON schemas are checked with the ``jsonschema`` library (the draft the schema's
``$schema`` names, else the latest). Logprobs are natural logs (nats).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Iterable, Mapping, Sequence

import jsonschema

from harness.checks.base import CheckResult
from harness.checks.diff import divergence_index
from harness.load.config import RequestClass
from harness.load.records import FINISH_REASONS, RequestRecord, presented_finished

__all__ = [
    "INVARIANTS",
    "LOGPROB_ATOL",
    "Response",
    "applicable",
    "class_checks",
    "classes_checks",
    "classes_section",
    "first_stop",
    "reference_invariants",
    "ids_text",
    "judge",
    "logprob_problems",
    "logprob_reference_problems",
    "response_of",
    "stop_cut_problems",
    "stop_problems",
    "stops_of",
    "structure_of",
    "structured_problems",
    "text_problems",
    "tool_call_problems",
    "usage_problems",
    "wants_logprobs",
]

#: How far a speculative logprob may be from the reference's (nats): the verification
#: pass scores k+1 positions at once, so float32 sums may round differently.
LOGPROB_ATOL = 1e-3

Decode = Callable[[Sequence[int]], str]


@dataclass(frozen=True)
class Response:
    """What the invariants read of one recorded response (one choice).

    Fields:
        request_id: the request's id (named in examples).
        body: the request body as sent (its ``stop``, ``logprobs``, ``response_format``,
            ``tools``... say which invariants apply).
        text: the delivered text (a stream: every delta joined; chat: the message content).
        token_ids: the delivered output token ids (vLLM's ``return_token_ids``), None if none
            were returned.
        finish_reason: as sent (``"stop"``, ``"length"``, ``"tool_calls"``, None).
        stop_reason: vLLM's ``stop_reason``: the stop string or stop token id that ended the
            output, None for EOS or a length finish.
        completion_tokens: ``usage.completion_tokens``, None if no usage came.
        delivered_tokens: output tokens the stream's chunks carried (the sum of the
            per-chunk counts), None if not counted.
        logprobs: the chosen token's logprob (nats) per output token, in order (completions:
            ``logprobs.token_logprobs``; chat: ``logprobs.content[i].logprob``; a stream's
            chunks joined); None when the server sent none. An entry is None where the
            server sent null.
        tool_calls: chat: ``[{"name": str, "arguments": str}]`` (a stream's argument deltas
            joined per call), None when the server sent none.
    """

    request_id: str
    body: Mapping[str, Any]
    text: str
    token_ids: Sequence[int] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    completion_tokens: int | None = None
    delivered_tokens: int | None = None
    logprobs: Sequence[float | None] | None = None
    tool_calls: Sequence[Mapping[str, Any]] | None = None

    @property
    def stopped_by_string(self) -> bool:
        """True when a stop string (not EOS, not a stop token id) ended the output."""
        return self.finish_reason == "stop" and isinstance(self.stop_reason, str)


# ----------------------------------------------------------------------------- stop
def stops_of(body: Mapping[str, Any]) -> list[str]:
    """The request's stop strings (``stop`` is a string, a list, or absent), empty ones left out."""
    stop = body.get("stop")
    if stop is None:
        return []
    return [s for s in ([stop] if isinstance(stop, str) else list(stop)) if s]


def first_stop(text: str, stops: Sequence[str]) -> tuple[int, str] | None:
    """``(index, stop string)`` of the stop string that *completes* earliest in ``text``
    (ties: the first in ``stops``), or None when none occurs. This is vLLM's rule
    (``vllm.v1.engine.detokenizer.check_stop_strings``, 0.32), chosen so that several
    tokens appended in one step (speculative decoding) stop where appending them one at
    a time would."""
    best: tuple[int, int, str] | None = None
    for s in stops:
        i = text.find(s) if s else -1
        if i >= 0 and (best is None or i + len(s) < best[0]):
            best = (i + len(s), i, s)
    return None if best is None else (best[1], best[2])


def ids_text(ids: Sequence[int], decode: Decode) -> str:
    """The text vLLM delivers for output token ids ``ids``: ``decode(ids)`` (special tokens
    skipped) without trailing U+FFFD, an incomplete UTF-8 sequence vLLM's incremental
    detokenizer holds back (a 1-token answer of byte ``0xE2`` has text ``""``)."""
    return decode(ids).rstrip("\ufffd")


def stop_problems(r: Response, decode: Decode | None = None) -> list[str]:
    """Nothing after a stop string, and the finish reason says so.

    The text contains none of the request's stop strings; a stop-string finish names one of
    them; with ``decode`` (token ids → text) and token ids, a stop-string finish's ids' text
    starts with ``text + stop string`` (the ids end with the token that completed it:
    vLLM drops tokens a speculative step appended after it), and an output whose ids' text
    holds a stop string finished by it (not by ``"length"`` or EOS)."""
    out = []
    stops = stops_of(r.body)
    for s in stops:
        if s in r.text:
            at = r.text.index(s)
            out.append(f"stop string {s!r} appears in the text at char {at}: {r.text[max(0, at - 20):at + 40]!r}")
    raw = decode(r.token_ids) if decode is not None and r.token_ids is not None else None
    full = None if raw is None else raw.rstrip("\ufffd")
    if r.stopped_by_string:
        cut = r.text + str(r.stop_reason)
        if r.stop_reason not in stops:
            out.append(f"stop_reason {r.stop_reason!r} is not one of the request's stop strings {stops!r}")
        elif raw is not None and not raw.startswith(cut):
            out.append(f"the token ids' text {raw[:80]!r} does not start with text + stop string {cut[:80]!r}")
    elif stops and full is not None and r.finish_reason in ("length", "stop"):
        met = [s for s in stops if s in full]
        if met:
            out.append(f"finish_reason {r.finish_reason!r} (stop_reason {r.stop_reason!r}) although the output's "
                       f"text contains stop string(s) {met!r}")
    return out


def stop_cut_problems(r: Response, ref: Response) -> list[str]:
    """The same cut as the non-speculative reference (a deterministic request): the same
    stop string ended both at the same text, or neither was ended by one."""
    if not (r.stopped_by_string or ref.stopped_by_string):
        return []
    if r.stop_reason != ref.stop_reason or r.finish_reason != ref.finish_reason:
        return [f"finish_reason {r.finish_reason!r} / stop_reason {r.stop_reason!r}, the reference "
                f"{ref.finish_reason!r} / {ref.stop_reason!r}"]
    if r.text != ref.text:
        i = divergence_index(r.text, ref.text)
        return [f"cut by {r.stop_reason!r} at char {len(r.text)}, the reference at char {len(ref.text)}; first "
                f"difference at char {i}: {r.text[i:i + 30]!r} vs {ref.text[i:i + 30]!r}"]
    return []


# ------------------------------------------------------------------------- text, usage
def text_problems(r: Response, decode: Decode) -> list[str]:
    """The delivered text is the text of the delivered token ids (:func:`ids_text`), unless
    a stop string cut it (then :func:`stop_problems` judges) or no ids were returned."""
    if r.stopped_by_string or r.token_ids is None:
        return []
    full = ids_text(r.token_ids, decode)
    if full == r.text:
        return []
    i = divergence_index(r.text, full)
    return [f"text differs from the token ids' text at char {i}: got {r.text[i:i + 30]!r}, "
            f"token ids give {full[i:i + 30]!r} ({len(r.text)} vs {len(full)} chars)"]


def usage_problems(r: Response) -> list[str]:
    """Delivered tokens equal ``usage.completion_tokens``: the chunks' token count and the
    number of token ids, each where known."""
    if r.completion_tokens is None:
        return ["no usage.completion_tokens"]
    out = []
    if r.delivered_tokens is not None and r.delivered_tokens != r.completion_tokens:
        out.append(f"the stream delivered {r.delivered_tokens} tokens, usage.completion_tokens is "
                   f"{r.completion_tokens}")
    if r.token_ids is not None and len(r.token_ids) != r.completion_tokens:
        out.append(f"{len(r.token_ids)} token ids delivered, usage.completion_tokens is {r.completion_tokens}")
    return out


# -------------------------------------------------------------------- structured output
def structure_of(body: Mapping[str, Any]) -> tuple[str, Any] | None:
    """What structure the request asks its output to have, as ``(kind, spec)``:
    ``("json_object", None)``, ``("json_schema", schema)``, ``("choice", [str, ...])``,
    ``("regex", pattern)``; None for free text or a structure not judged here (a grammar)."""
    rf = body.get("response_format")
    if isinstance(rf, Mapping):
        if rf.get("type") == "json_object":
            return "json_object", None
        if rf.get("type") == "json_schema":
            js = rf.get("json_schema") or {}
            return "json_schema", js.get("schema", {}) if isinstance(js, Mapping) else {}
    so = body.get("structured_outputs")
    so = so if isinstance(so, Mapping) else {}
    for key, kind in (("json", "json_schema"), ("choice", "choice"), ("regex", "regex")):
        value = so.get(key)
        if value is None:
            value = body.get(f"guided_{key}")   # vLLM before structured_outputs
        if value is not None:
            if kind == "json_schema" and isinstance(value, str):
                try:
                    value = json.loads(value)
                except ValueError:
                    pass   # judged as a schema that is not one
            return kind, value
    if so.get("json_object"):
        return "json_object", None
    return None


@lru_cache(maxsize=64)
def _validator(schema_json: str) -> Any:
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _schema_errors(instance: Any, schema: Any) -> list[str]:
    """The first violation of ``schema`` by ``instance`` in words (empty: it holds)."""
    if not isinstance(schema, (Mapping, bool)):
        return [f"the request's schema is not a JSON schema: {str(schema)[:80]!r}"]
    try:
        v = _validator(json.dumps(schema, sort_keys=True))
    except jsonschema.SchemaError as exc:
        return [f"the request's schema is not a valid JSON schema: {exc.message}"]
    err = jsonschema.exceptions.best_match(v.iter_errors(instance))
    if err is None:
        return []
    where = "/".join(str(p) for p in err.absolute_path) or "(root)"
    return [f"violates its schema at {where}: {err.message}"]


def _parse_json(text: str, what: str) -> tuple[Any, list[str]]:
    try:
        return json.loads(text), []
    except ValueError as exc:
        return None, [f"{what} is not JSON ({getattr(exc, 'msg', exc)} at char {getattr(exc, 'pos', '?')}): "
                      f"{text[:80]!r}"]


def structured_problems(r: Response) -> list[str]:
    """A structured output that finished (``finish_reason "stop"``) has its structure
    (:func:`structure_of`): a JSON object; JSON satisfying the schema; one of the choices;
    a full match of the regex. An output cut by ``"length"`` is not judged (its text is
    a prefix by design)."""
    want = structure_of(r.body)
    if want is None or r.finish_reason != "stop":
        return []
    kind, spec = want
    if kind == "choice":
        return [] if r.text in spec else [f"text {r.text[:80]!r} is none of the choices {list(spec)[:5]!r}"]
    if kind == "regex":
        return [] if re.fullmatch(spec, r.text) else [f"text {r.text[:80]!r} does not match {spec!r}"]
    value, bad = _parse_json(r.text, "the output")
    if bad:
        return bad
    if kind == "json_object":
        return [] if isinstance(value, dict) else [f"the output is a JSON {type(value).__name__}, not an object"]
    return _schema_errors(value, spec)


def tool_call_problems(r: Response) -> list[str]:
    """Each tool call names a tool of the request's ``tools`` and its ``arguments`` parse
    as a JSON object that satisfies the tool's ``parameters`` schema (when it has one). A
    response without tool calls has none to judge; one cut by ``"length"`` is not judged."""
    if not r.tool_calls or r.finish_reason == "length":
        return []
    tools = {t["function"]["name"]: t["function"].get("parameters") for t in r.body.get("tools") or ()
             if isinstance(t, Mapping) and isinstance(t.get("function"), Mapping) and "name" in t["function"]}
    out = []
    for i, call in enumerate(r.tool_calls):
        name = call.get("name")
        if name not in tools:
            out.append(f"tool_calls[{i}] names {name!r}, not a tool of the request ({sorted(tools)!r})")
            continue
        args, bad = _parse_json(call.get("arguments") or "", f"tool_calls[{i}] ({name}) arguments")
        if bad:
            out += bad
        elif not isinstance(args, dict):
            out.append(f"tool_calls[{i}] ({name}) arguments are a JSON {type(args).__name__}, not an object")
        elif tools[name]:
            out += [f"tool_calls[{i}] ({name}) arguments {p}" for p in _schema_errors(args, tools[name])]
    return out


# ---------------------------------------------------------------------------- logprobs
def wants_logprobs(body: Mapping[str, Any]) -> bool:
    """Whether the request asks for logprobs (completions: ``logprobs`` an integer;
    chat: ``logprobs: true``)."""
    lp = body.get("logprobs")
    return lp is not None and lp is not False


def logprob_problems(r: Response) -> list[str]:
    """Logprobs asked are present for every output token, each a log-probability (a number
    ≤ 0), and not all exactly zero (a response of two tokens or more: certainty at every
    position is what a server that sends zeros for missing values looks like)."""
    if not wants_logprobs(r.body):
        return []
    n = len(r.token_ids) if r.token_ids is not None else r.completion_tokens
    if r.logprobs is None:
        return [f"logprobs asked, none returned ({n} output tokens)"]
    out = []
    if n is not None and len(r.logprobs) != n:
        out.append(f"{len(r.logprobs)} logprobs for {n} output tokens")
    for i, v in enumerate(r.logprobs):
        if v is None or not isinstance(v, (int, float)) or math.isnan(v) or v > 0:
            out.append(f"logprobs[{i}] = {v!r} is not a log-probability")
            break
    if len(r.logprobs) >= 2 and all(v == 0 for v in r.logprobs):
        out.append(f"all {len(r.logprobs)} logprobs are exactly 0")
    return out


def logprob_reference_problems(r: Response, ref: Response, atol: float = LOGPROB_ATOL) -> list[str]:
    """Where the response's token ids agree with the reference's (up to their first
    difference, which the token comparison judges), each logprob is within ``atol`` nats
    of the reference's."""
    if r.logprobs is None or ref.logprobs is None or r.token_ids is None or ref.token_ids is None:
        return []
    end = divergence_index(r.token_ids, ref.token_ids)
    end = min(len(r.token_ids), len(ref.token_ids)) if end is None else end
    for i, (a, b) in enumerate(zip(r.logprobs[:end], ref.logprobs[:end])):
        if a is None or b is None or abs(a - b) > atol:
            return [f"logprobs[{i}] = {a}, the reference's {b} (tolerance {atol:g} nats)"]
    return []


# ------------------------------------------------------------------------------- judge
#: The invariants by name, in report order: ``(applies to body, needs the reference, check)``
#: where check is ``(response, reference or None, decode or None) -> problems``.
INVARIANTS: dict[str, tuple[Callable[[Mapping[str, Any]], bool], bool,
                            Callable[[Response, Response | None, Decode | None], list[str]]]] = {
    "stop": (lambda b: bool(stops_of(b)), False, lambda r, ref, d: stop_problems(r, d)),
    "stop_cut": (lambda b: bool(stops_of(b)), True, lambda r, ref, d: stop_cut_problems(r, ref)),  # type: ignore[arg-type]
    "text": (lambda b: True, False, lambda r, ref, d: text_problems(r, d) if d is not None else []),
    "usage": (lambda b: True, False, lambda r, ref, d: usage_problems(r)),
    "structured": (lambda b: structure_of(b) is not None, False, lambda r, ref, d: structured_problems(r)),
    "tool_calls": (lambda b: bool(b.get("tools")), False, lambda r, ref, d: tool_call_problems(r)),
    "logprobs": (wants_logprobs, False, lambda r, ref, d: logprob_problems(r)),
    "logprobs_ref": (wants_logprobs, True, lambda r, ref, d: logprob_reference_problems(r, ref)),  # type: ignore[arg-type]
}


def applicable(body: Mapping[str, Any], with_reference: bool = False) -> list[str]:
    """Names of the invariants (:data:`INVARIANTS`) that judge a request with this body;
    the reference ones only ``with_reference``."""
    return [name for name, (applies, needs_ref, _) in INVARIANTS.items()
            if applies(body) and (with_reference or not needs_ref)]


def reference_invariants(body: Mapping[str, Any]) -> list[str]:
    """Names of the invariants that judge a request with this body against the
    non-speculative reference's response to the same request (``stop_cut``,
    ``logprobs_ref``): empty when none applies."""
    return [name for name in applicable(body, with_reference=True) if INVARIANTS[name][1]]


def judge(pairs: Iterable[tuple[Response, Response | None]], decode: Decode | None = None) -> dict[str, Any]:
    """Judge complete responses of one request class by every invariant that applies.

    Args:
        pairs: ``(response, reference)`` per response; ``reference`` is the
            non-speculative server's complete response to the same deterministic (greedy)
            request, else None (the reference invariants are then not judged for it).
        decode: token ids → text with the target's tokenizer (special tokens skipped); None
            leaves the ``text`` invariant and the ids' side of ``stop`` unjudged.

    Returns:
        ``{"responses": n, "compared": responses with a reference, "invariants": {name:
        {"judged": n, "violations": n, "first": {"request_id", "detail"} | None}}}`` for
        every invariant that applied to at least one response (the shape of
        ``report.json``'s ``integrity.classes.NAME``).
    """
    out: dict[str, dict[str, Any]] = {}
    responses = compared = 0
    for r, ref in pairs:
        responses += 1
        compared += ref is not None
        for name in applicable(r.body, with_reference=ref is not None):
            if name == "text" and decode is None:
                continue
            entry = out.setdefault(name, {"judged": 0, "violations": 0, "first": None})
            entry["judged"] += 1
            problems = INVARIANTS[name][2](r, ref, decode)
            if problems:
                entry["violations"] += 1
                if entry["first"] is None:
                    entry["first"] = {"request_id": r.request_id, "detail": "; ".join(problems)}
    return {"responses": responses, "compared": compared,
            "invariants": {name: out[name] for name in INVARIANTS if name in out}}


def class_checks(name: str, section: Mapping[str, Any]) -> list[CheckResult]:
    """One check per invariant :func:`judge` judged for request class ``name``:
    ``integrity.classes.NAME.INVARIANT``, passed when it has no violation (observed: the
    violations, limit 0), the detail naming how many of how many and the first example."""
    out = []
    for inv, entry in section.get("invariants", {}).items():
        n, judged, first = entry["violations"], entry["judged"], entry["first"]
        detail = f"{n} of {judged} {name} responses violate {inv}"
        if first:
            detail += f"; first: {first['request_id']}: {first['detail']}"
        out.append(CheckResult(f"integrity.classes.{name}.{inv}", "integrity", n == 0, n, 0, detail))
    return out


# -------------------------------------------------------------------- a run's classes
def response_of(r: RequestRecord, body: Mapping[str, Any]) -> Response:
    """The :class:`Response` of a load record of a class with ``body``: its text, token
    ids, finish and stop reasons, ``usage.completion_tokens`` (``output_tokens``), the
    tokens its chunks carried, its logprobs and tool calls."""
    return Response(request_id=r.request_id, body=body, text=r.text, token_ids=r.token_ids,
                    finish_reason=r.finish_reason, stop_reason=r.stop_reason, completion_tokens=r.output_tokens,
                    delivered_tokens=sum(r.chunk_tokens), logprobs=r.logprobs, tool_calls=r.tool_calls)


def finished(r: RequestRecord) -> bool:
    """Whether a record is judged by its class's invariants: the server presented it as
    finished (:func:`harness.load.records.presented_finished`) with a finish reason of a
    complete response. A response that is also internally inconsistent is judged all the
    same (the ``usage`` invariant names what ``integrity.malformed`` counts)."""
    return presented_finished(r) and r.finish_reason in FINISH_REASONS


def classes_section(records: Iterable[RequestRecord], classes: Sequence[RequestClass],
                    decode: Decode | None = None, ref_records: Iterable[RequestRecord] = (),
                    greedy: Iterable[str] = ("greedy",)) -> dict[str, dict[str, Any]]:
    """``report.json``'s ``integrity.classes``: per configured request class (in order),
    :func:`judge` over the :func:`finished` records of that class.

    The reference of a response is the non-speculative server's finished response to the
    same request: mirror mode's load record to the reference server (``ref_records``) of
    the same prompt, class, conversation turn and a greedy sampling class (``greedy``:
    deterministic), or the run's per-class reference fetch (``class_reference.jsonl``: each
    prompt sent once as the class's first turn), the first such (a later turn's reference
    carries the reference's own earlier answers: equal when the earlier turns were); a sampled
    response, or one without such a record (a later turn outside mirror mode), has none, and
    the reference invariants (``stop_cut``, ``logprobs_ref``) are not judged for it; the
    entry's ``compared`` counts the responses that had one."""
    greedy = set(greedy)
    by_name: dict[str, list[RequestRecord]] = {c.name: [] for c in classes}
    for r in records:
        if r.request_class in by_name and finished(r):
            by_name[r.request_class].append(r)
    refs: dict[tuple[int, str, int], RequestRecord] = {}
    for r in ref_records:
        if r.request_class in by_name and r.sampling in greedy and finished(r):
            refs.setdefault((r.prompt_id, r.request_class, r.turn), r)
    out = {}
    for c in classes:
        pairs = []
        for r in by_name[c.name]:
            ref = refs.get((r.prompt_id, c.name, r.turn)) if r.sampling in greedy else None
            pairs.append((response_of(r, c.body), None if ref is None else response_of(ref, c.body)))
        out[c.name] = judge(pairs, decode)
    return out


def classes_checks(section: Mapping[str, Mapping[str, Any]], classes: Sequence[RequestClass],
                   decode: Decode | None = None) -> list[CheckResult]:
    """One check per request class and invariant (:func:`class_checks`); an invariant the
    class's body asks for that judged no response (no finished response of the class, or
    none it applies to) is a not-judged check, so a class that was never answered shows."""
    out: list[CheckResult] = []
    for c in classes:
        entry = section.get(c.name, {})
        out += class_checks(c.name, entry)
        judged = set(entry.get("invariants", {}))
        for inv in applicable(c.body):
            if inv not in judged and (inv != "text" or decode is not None):
                out.append(CheckResult.not_judged(
                    f"integrity.classes.{c.name}.{inv}", "integrity", 0, 0,
                    f"no finished {c.name} response to judge {inv} on ({entry.get('responses', 0)} finished)"))
        for inv in reference_invariants(c.body):
            if inv not in judged:
                out.append(CheckResult.not_judged(
                    f"integrity.classes.{c.name}.{inv}", "integrity", 0, 0,
                    f"no {c.name} response had a reference to compare with ({entry.get('responses', 0)} finished, "
                    f"{entry.get('compared', 0)} compared): no reference server, or only sampled or later-turn "
                    f"responses outside mirror mode"))
    return out

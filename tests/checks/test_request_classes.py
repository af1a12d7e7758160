"""Every per-request-class invariant can fail: each is fed a response with one known defect
(the field's reported failures) and must name it; a clean response passes. Fast, no server."""

from __future__ import annotations

import dataclasses
import json

import pytest

from harness.checks.request_classes import (INVARIANTS, Response, applicable, class_checks, first_stop, ids_text, judge,
                                            logprob_problems, logprob_reference_problems, stop_cut_problems,
                                            stop_problems, structure_of, structured_problems, text_problems,
                                            tool_call_problems, usage_problems)

#: A toy byte-level vocabulary: id → bytes (5: the lone lead byte of "—"; 1, 2: BOS, EOS).
VOCAB = {1: b"", 2: b"", 3: b" the", 4: b" river", 5: b"\xe2", 6: b"\x80\x94", 7: b" end", 8: b".", 9: b" sea",
         10: b"{", 11: b'"a"', 12: b":", 13: b"1", 14: b"}", 15: b'"x"'}


def decode(ids):
    return b"".join(VOCAB[i] for i in ids).decode("utf-8", errors="replace")


def resp(ids=(3, 4, 3, 7), finish="length", **kw) -> Response:
    """A consistent response to ``body`` (default: 4 tokens of free text, cut by length)."""
    body = kw.pop("body", {"prompt": "Go", "max_tokens": len(ids)})
    fields = dict(request_id="r1", body=body, text=ids_text(ids, decode), token_ids=list(ids), finish_reason=finish,
                  completion_tokens=len(ids), delivered_tokens=len(ids))
    fields.update(kw)
    return Response(**fields)


def stopped(ids=(3, 4, 8, 3), text=" the river", **kw) -> Response:
    """Cut by the stop string "." after ' the river' (the ids run one token past it)."""
    return resp(ids, "stop", text=text, stop_reason=".", body={"prompt": "Go", "max_tokens": 8, "stop": ["."]}, **kw)


# --------------------------------------------------------------------------------- stop
def test_a_clean_stop_passes():
    assert stop_problems(stopped(), decode) == []
    r = resp((3, 4), body={"prompt": "Go", "max_tokens": 2, "stop": ["."]})   # no stop string met: length is right
    assert stop_problems(r, decode) == []


def test_text_past_the_stop_string_is_caught():
    p, q = stop_problems(stopped(text=" the river. the"), decode)   # sglang#31599: an accepted block crossed it
    assert p.startswith("stop string '.' appears in the text at char 10")
    assert q.startswith("the token ids' text ' the river. the' does not start with text + stop string")


def test_a_stop_string_met_without_a_stop_finish_is_caught():
    r = resp((3, 4, 8, 3), body={"prompt": "Go", "max_tokens": 4, "stop": ["."]}, text=" the river")
    assert stop_problems(r, decode) == ["finish_reason 'length' (stop_reason None) although the output's text "
                                        "contains stop string(s) ['.']"]


def test_a_stop_reason_not_asked_or_not_at_the_cut_is_caught():
    assert "stop_reason 'sea' is not one of the request's stop strings" in \
        stop_problems(dataclasses.replace(stopped(), stop_reason="sea"), decode)[0]
    (p,) = stop_problems(stopped(text=" the"), decode)   # cut too early: ids' text is ' the river.'
    assert "does not start with text + stop string ' the.'" in p


def test_the_same_cut_as_the_reference():
    ref = stopped()
    assert stop_cut_problems(stopped(), ref) == []
    assert stop_cut_problems(resp(), resp()) == []   # neither stopped by a string
    (p,) = stop_cut_problems(stopped(ids=(3, 8), text=" the"), ref)
    assert p.startswith("cut by '.' at char 4, the reference at char 10")
    (p,) = stop_cut_problems(resp((3, 4, 3, 7), body=ref.body), ref)
    assert p == "finish_reason 'length' / stop_reason None, the reference 'stop' / '.'"


def test_the_stop_string_that_completes_first_wins():
    assert first_stop("xaby", ["by", "ab"]) == (1, "ab")
    assert first_stop("xab", ["b", "ab"]) == (2, "b")
    assert first_stop("xyz", ["q", ""]) is None


# ------------------------------------------------------------------------- text, usage
def test_stream_text_equals_the_detokenised_ids():
    assert text_problems(resp(), decode) == []
    dropped = resp(text=" the river end")   # vllm PR#26027: a token of a multi-token step lost
    (p,) = text_problems(dropped, decode)
    assert p.startswith("text differs from the token ids' text at char 11: got 'end', token ids give 'the end' "
                        "(14 vs 18 chars)")
    held_back = resp((3, 5))   # a trailing incomplete character is held back, as vLLM does
    assert held_back.text == " the" and text_problems(held_back, decode) == []


def test_delivered_tokens_equal_usage():
    assert usage_problems(resp()) == []
    assert usage_problems(resp(completion_tokens=5)) == [
        "the stream delivered 4 tokens, usage.completion_tokens is 5",
        "4 token ids delivered, usage.completion_tokens is 5"]
    assert usage_problems(resp(delivered_tokens=3)) == ["the stream delivered 3 tokens, usage.completion_tokens is 4"]
    assert usage_problems(resp(completion_tokens=None)) == ["no usage.completion_tokens"]


# -------------------------------------------------------------------- structured output
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
          "additionalProperties": False}


def structured(text: str, body_extra: dict, finish: str = "stop") -> Response:
    return resp((3,), finish, text=text, body={"prompt": "Go", "max_tokens": 16, **body_extra})


@pytest.mark.parametrize("extra, want", [
    ({"response_format": {"type": "json_object"}}, ("json_object", None)),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}},
     ("json_schema", SCHEMA)),
    ({"structured_outputs": {"json": json.dumps(SCHEMA)}}, ("json_schema", SCHEMA)),
    ({"structured_outputs": {"choice": ["yes", "no"]}}, ("choice", ["yes", "no"])),
    ({"guided_regex": "[0-9]+"}, ("regex", "[0-9]+")),
    ({"structured_outputs": {"json_object": True}}, ("json_object", None)),
    ({"structured_outputs": {"grammar": "root ::= 'a'"}}, None),
    ({"response_format": {"type": "text"}}, None),
])
def test_the_structure_a_request_asks_for(extra, want):
    assert structure_of(extra) == want


def test_clean_structured_outputs_pass():
    js = {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}}
    assert structured_problems(structured('{"a": 1}', js)) == []
    assert structured_problems(structured('{"b": []}', {"response_format": {"type": "json_object"}})) == []
    assert structured_problems(structured("no", {"structured_outputs": {"choice": ["yes", "no"]}})) == []
    assert structured_problems(structured("42", {"guided_regex": "[0-9]+"})) == []
    assert structured_problems(structured('{"a": ', js, finish="length")) == []   # cut by length: not judged


def test_broken_structured_output_is_caught():
    js = {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}}
    (p,) = structured_problems(structured('{"a": 1', js))   # vllm#27969: broken JSON under speculation
    assert p.startswith("the output is not JSON (Expecting ',' delimiter at char 7): '{\"a\": 1'")
    (p,) = structured_problems(structured('{"a": "one"}', js))
    assert p == "violates its schema at a: 'one' is not of type 'integer'"
    (p,) = structured_problems(structured('{"a": 1, "b": 2}', js))
    assert p.startswith("violates its schema at (root): Additional properties are not allowed")
    (p,) = structured_problems(structured("[1]", {"response_format": {"type": "json_object"}}))
    assert p == "the output is a JSON list, not an object"
    assert structured_problems(structured("maybe", {"structured_outputs": {"choice": ["yes", "no"]}})) == [
        "text 'maybe' is none of the choices ['yes', 'no']"]
    assert structured_problems(structured("42a", {"structured_outputs": {"regex": "[0-9]+"}})) == [
        "text '42a' does not match '[0-9]+'"]
    bad_schema = {"structured_outputs": {"json": {"type": 12}}}
    assert structured_problems(structured("{}", bad_schema))[0].startswith(
        "the request's schema is not a valid JSON schema")


# ------------------------------------------------------------------------- tool calls
TOOLS = {"messages": [{"role": "user", "content": "weather?"}],
         "tools": [{"type": "function", "function": {"name": "weather", "parameters": {
             "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
                   {"type": "function", "function": {"name": "now"}}]}


def called(*calls: tuple[str, str], finish: str = "tool_calls") -> Response:
    return resp((3,), finish, text="", body=TOOLS, tool_calls=[{"name": n, "arguments": a} for n, a in calls])


def test_clean_tool_calls_pass():
    assert tool_call_problems(called(("weather", '{"city": "Oslo"}'), ("now", "{}"))) == []
    assert tool_call_problems(resp(body=TOOLS)) == []   # answered in text: no call to judge


def test_broken_tool_calls_are_caught():
    (p,) = tool_call_problems(called(("weather", '{"city": "Os')))   # vllm#40875: tool calls broken with ngram
    assert p.startswith("tool_calls[0] (weather) arguments is not JSON (Unterminated string")
    assert tool_call_problems(called(("now", "[]"))) == ["tool_calls[0] (now) arguments are a JSON list, not an object"]
    assert tool_call_problems(called(("weather", '{"town": "Oslo"}'))) == [
        "tool_calls[0] (weather) arguments violates its schema at (root): 'city' is a required property"]
    assert tool_call_problems(called(("rain", "{}"))) == [
        "tool_calls[0] names 'rain', not a tool of the request (['now', 'weather'])"]


# ---------------------------------------------------------------------------- logprobs
def with_lp(values, **kw) -> Response:
    return resp(body={"prompt": "Go", "max_tokens": 4, "logprobs": 1}, logprobs=values, **kw)


def test_clean_logprobs_pass():
    assert logprob_problems(with_lp([-0.1, -2.0, -0.0, -0.5])) == []
    assert logprob_problems(resp(logprobs=None)) == []   # not asked


def test_broken_logprobs_are_caught():
    assert logprob_problems(with_lp(None)) == ["logprobs asked, none returned (4 output tokens)"]   # vllm#17876
    assert logprob_problems(with_lp([-0.1, -0.2, -0.3])) == ["3 logprobs for 4 output tokens"]
    assert logprob_problems(with_lp([0.0, 0.0, 0.0, 0.0])) == ["all 4 logprobs are exactly 0"]   # vllm#34497
    assert logprob_problems(with_lp([-0.1, None, -0.3, -0.1])) == ["logprobs[1] = None is not a log-probability"]
    assert logprob_problems(with_lp([-0.1, 0.5, -0.3, -0.1])) == ["logprobs[1] = 0.5 is not a log-probability"]
    assert logprob_problems(with_lp([-0.1, float("nan"), -0.3, -0.1])) == ["logprobs[1] = nan is not a log-probability"]


def test_logprobs_within_a_tolerance_of_the_reference():
    ref = with_lp([-0.1, -2.0, -0.3, -0.5])
    assert logprob_reference_problems(with_lp([-0.1004, -2.0, -0.3, -0.5]), ref) == []
    assert logprob_reference_problems(with_lp([-0.1, -2.5, -0.3, -0.5]), ref) == [
        "logprobs[1] = -2.5, the reference's -2.0 (tolerance 0.001 nats)"]
    diverged = with_lp([-0.1, -2.0, -9.0, -9.0], token_ids=[3, 4, 7, 7])   # after the divergence: not compared
    assert logprob_reference_problems(diverged, ref) == []
    assert logprob_reference_problems(with_lp([-0.1, -2.5, -0.3, -0.5]), ref, atol=1.0) == []


# ------------------------------------------------------------------------------ judge
def test_applicable_invariants_follow_the_body():
    assert applicable({"prompt": "x"}) == ["text", "usage"]
    assert applicable({"prompt": "x", "stop": "."}, with_reference=True) == ["stop", "stop_cut", "text", "usage"]
    assert applicable({**TOOLS, "logprobs": True, "response_format": {"type": "json_object"}}) == [
        "text", "usage", "structured", "tool_calls", "logprobs"]
    assert "logprobs_ref" in applicable({"prompt": "x", "logprobs": 0}, with_reference=True)
    assert applicable({"prompt": "x", "logprobs": False}) == ["text", "usage"]


def test_judge_counts_violations_per_invariant_with_a_first_example():
    clean, ref = stopped(), stopped()
    past = dataclasses.replace(stopped(text=" the river. the"), request_id="r2")
    early = dataclasses.replace(stopped(ids=(3, 8), text=" the"), request_id="r3")
    section = judge([(clean, ref), (past, None), (early, ref), (resp(), None)], decode)
    assert (section["responses"], section["compared"]) == (4, 2)
    inv = section["invariants"]
    assert list(inv) == ["stop", "stop_cut", "text", "usage"]
    assert inv["stop"]["judged"] == 3 and inv["stop"]["violations"] == 1
    assert inv["stop"]["first"]["request_id"] == "r2" and "appears in the text" in inv["stop"]["first"]["detail"]
    assert inv["stop_cut"] == {"judged": 2, "violations": 1, "first": {
        "request_id": "r3", "detail": inv["stop_cut"]["first"]["detail"]}}
    assert inv["text"] == {"judged": 4, "violations": 0, "first": None}
    assert "text" not in judge([(clean, None)])["invariants"]   # no decode: not judged
    assert judge([]) == {"responses": 0, "compared": 0, "invariants": {}}


def test_every_invariant_is_tested_here():
    assert set(INVARIANTS) == {"stop", "stop_cut", "text", "usage", "structured", "tool_calls", "logprobs",
                               "logprobs_ref"}


def test_class_checks_fail_on_a_violation_and_name_the_first():
    past = dataclasses.replace(stopped(text=" the river. the"), request_id="r2")
    checks = class_checks("stop", judge([(stopped(), None), (past, None)], decode))
    assert [(c.name, c.category, c.passed, c.observed, c.limit) for c in checks] == [
        ("integrity.classes.stop.stop", "integrity", False, 1, 0),
        ("integrity.classes.stop.text", "integrity", True, 0, 0),
        ("integrity.classes.stop.usage", "integrity", True, 0, 0)]
    assert checks[0].detail.startswith("1 of 2 stop responses violate stop; first: r2: stop string '.' appears")
    assert checks[1].detail == "0 of 2 stop responses violate text"
    assert class_checks("plain", judge([])) == []

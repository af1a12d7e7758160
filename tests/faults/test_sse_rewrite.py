"""The ``corrupt`` toxic's semantic modes (:mod:`faults.sse_rewrite`) as pure functions on
SSE bytes, completions and chat: what each changes, that every other event passes byte
for byte, the evidence, the same through the proxy's re-framer, and — fed to the real
client's chunk parser and judged by the request-class invariants — that each breaks its
own invariant and no other."""

from __future__ import annotations

import json
import random

import pytest

from faults.sse_rewrite import MODES, OVERRUN, STRAY, ResponseRewrite, append_after_stop, break_json, zero_logprobs
from faults.toxics import CorruptAttrs, CorruptPlan, SseReframer, corrupt_events
from harness.checks.request_classes import judge, response_of
from harness.load.client import _take_chunk
from harness.load.records import RequestRecord, is_complete
from tests.faults.test_toxics import decode as decode_stream, sse_response

DONE = b"data: [DONE]"


def word(tid: int) -> str:
    return f" w{tid}"


def ids_decode(ids) -> str:
    """The token ids' text in this test's vocabulary (as the fake vLLM's: id i is ' w<i>')."""
    return "".join(word(i) for i in ids)


def stream(chat: bool, steps: list[list[int]], *, finish: str = "length", stop_reason: str | int | None = None,
           logprobs: bool = False, json_text: bool = False) -> list[bytes]:
    """A vLLM-shaped stream (``return_token_ids``, usage last): one event per step of ids,
    the last with ``finish`` and ``stop_reason`` (a stop string: the last step's text ends
    right before it, as vLLM cuts it); ``json_text``: the text is ``{"w": "w1 w2 ..."}``."""
    events, n = [], sum(len(s) for s in steps)
    kind = "chat.completion.chunk" if chat else "text_completion"
    if chat:
        role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        events.append({"id": "c", "object": kind, "choices": [role]})
    for i, ids in enumerate(steps):
        last = i == len(steps) - 1
        text = "".join(word(t) for t in ids)
        if json_text:
            text = ('{"w": "' if i == 0 else "") + text.strip() + ('"}' if last else " ")
        if last and isinstance(stop_reason, str):
            text = text[:text.index(stop_reason)]
        lps = [-0.25 - t / 1000 for t in ids]
        lp = None
        if logprobs:
            lp = ({"content": [{"token": f"token_id:{t}", "logprob": v, "bytes": None,
                                "top_logprobs": [{"token": f"token_id:{t}", "logprob": v}]} for t, v in zip(ids, lps)]}
                  if chat else {"text_offset": [0] * len(ids), "token_logprobs": lps,
                                "tokens": [f"token_id:{t}" for t in ids], "top_logprobs": [{f"token_id:{t}": v}
                                                                                           for t, v in zip(ids, lps)]})
        choice = {"index": 0, **({"delta": {"content": text}} if chat else {"text": text}), "logprobs": lp,
                  "finish_reason": finish if last else None, "stop_reason": stop_reason if last else None,
                  "token_ids": ids}
        events.append({"id": "c", "object": kind, "choices": [choice], "usage": None})
    events.append({"id": "c", "object": kind, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n,
                                                                         "total_tokens": 3 + n}})
    return [b"data: " + json.dumps(e).encode() for e in events] + [DONE]


def payload(event: bytes) -> dict:
    return json.loads(event[len(b"data: "):])


def text_of(event: bytes) -> str | None:
    c = payload(event)["choices"]
    return (c[0]["delta"].get("content") if "delta" in c[0] else c[0]["text"]) if c else None


def record_of(events: list[bytes], chat: bool, body: dict) -> RequestRecord:
    """What the real client records of these events (its chunk parser, as after a stream)."""
    rec = RequestRecord(request_id="r", source="load", user_id=0, prompt_id=0, prompt_class="short", max_tokens=64,
                        request_class="x", endpoint="chat" if chat else "completions", status=200, e2e_s=1.0)
    rec.logprobs = [] if body.get("logprobs") else None
    texts: list[str] = []
    for i, e in enumerate(events):
        if e == DONE:
            rec.done = True
            break
        _take_chunk(payload(e), 0.01 * i, rec, texts)
    rec.text = "".join(texts)
    rec.max_tokens = rec.output_tokens if rec.finish_reason == "length" else 64
    return rec


def violated(events: list[bytes], chat: bool, body: dict, decode=ids_decode) -> set[str]:
    rec = record_of(events, chat, body)
    assert is_complete(rec) == (True, "")          # never malformed: ids, usage, finish untouched
    section = judge([(response_of(rec, body), None)], decode)
    return {name for name, e in section["invariants"].items() if e["violations"]}


def rewrite_all(mode: str, events: list[bytes], seed: int = 0, max_event: int = 3):
    return corrupt_events(events, random.Random(seed), CorruptAttrs(mode=mode, max_event=max_event))


CHAT = [True, False]


# ------------------------------------------------------------------ each mode, alone

@pytest.mark.parametrize("chat", CHAT)
def test_append_after_stop_runs_the_text_on_past_the_stop_string(chat):
    events = stream(chat, [[11, 12], [13, 14, 15]], finish="stop", stop_reason=" w15")
    out, what = rewrite_all("append_after_stop", events)
    k = len(events) - 3                                          # the finish event (then usage, [DONE])
    assert out[:k] == events[:k] and out[k + 1:] == events[k + 1:]
    assert text_of(out[k]) == text_of(events[k]) + " w15" + OVERRUN
    before, after = payload(events[k])["choices"][0], payload(out[k])["choices"][0]
    for field in ("token_ids", "finish_reason", "stop_reason", "logprobs"):
        assert after[field] == before[field]
    assert (what.mode, what.event, what.before, what.after) == ("append_after_stop", k, events[k].decode(),
                                                                 out[k].decode())
    assert OVERRUN in what.as_dict()["after"]                    # the evidence shows the change itself


@pytest.mark.parametrize("chat", CHAT)
@pytest.mark.parametrize("finish, stop", [("length", None), ("stop", 2), ("stop", None)])   # EOS: an id or none
def test_append_after_stop_leaves_other_finishes_alone(chat, finish, stop):
    events = stream(chat, [[11, 12], [13]], finish=finish, stop_reason=stop)
    assert append_after_stop(events[-3]) is None
    assert rewrite_all("append_after_stop", events) == (events, None)


@pytest.mark.parametrize("chat", CHAT)
def test_drop_token_text_removes_the_last_token_text_of_the_drawn_event(chat):
    events = stream(chat, [[11, 12, 13], [14], [15, 16], [17]])
    first = 1 if chat else 0                                     # the chat role event carries no text
    for k in range(4):
        out, what = rewrite_all("drop_token_text", events, max_event=0 if k == 0 else 3,
                                seed=next(s for s in range(200) if random.Random(s).randint(0, 3) == k))
        i = first + k
        assert what.event == i and out[:i] == events[:i] and out[i + 1:] == events[i + 1:]
        ids = payload(events[i])["choices"][0]["token_ids"]
        assert text_of(out[i]) == "".join(word(t) for t in ids[:-1])       # one id: all of its text
        before, after = payload(events[i])["choices"][0], payload(out[i])["choices"][0]
        assert after["token_ids"] == before["token_ids"] and after["logprobs"] == before["logprobs"]


def test_drop_token_text_is_seeded_and_skips_short_responses():
    events = stream(False, [[11], [12]])
    draws = [rewrite_all("drop_token_text", events, seed=s, max_event=5)[1] for s in range(30)]
    again = [rewrite_all("drop_token_text", events, seed=s, max_event=5)[1] for s in range(30)]
    assert [d and d.event for d in draws] == [d and d.event for d in again]
    assert {d.event for d in draws if d} == {0, 1} and None in draws     # k past the 2 events: left alone


@pytest.mark.parametrize("chat", CHAT)
def test_break_json_inserts_a_stray_character_after_the_opening_brace(chat):
    events = stream(chat, [[11, 12], [13], [14]], finish="stop", json_text=True)
    out, what = rewrite_all("break_json", events)
    i = 1 if chat else 0
    assert what.event == i and out[:i] == events[:i] and out[i + 1:] == events[i + 1:]
    assert text_of(out[i]) == "{" + STRAY + text_of(events[i])[1:]
    joined = "".join(text_of(e) or "" for e in out[:-1])
    with pytest.raises(ValueError):
        json.loads(joined)
    assert json.loads("".join(text_of(e) or "" for e in events[:-1])) == {"w": "w11 w12 w13 w14"}


def test_break_json_looks_past_leading_whitespace_events():
    events = stream(True, [[11], [12], [13]], finish="stop", json_text=True)
    ws = events[1].replace(b'"content": "{', b'"content": "\\n", "x": "{', 1)   # a whitespace-only first text
    out, what = rewrite_all("break_json", [events[0], ws] + events[1:])
    assert what.event == 2 and text_of(out[2]).startswith("{" + STRAY) and out[1] == ws


@pytest.mark.parametrize("chat", CHAT)
def test_break_json_leaves_text_that_is_no_json_alone(chat):
    events = stream(chat, [[11, 12], [13]])
    assert rewrite_all("break_json", events) == (events, None)
    assert break_json(b'data: {"choices":[{"index":0,"text":"  [1]"}]}') == \
        b'data: {"choices":[{"index":0,"text":"  [' + STRAY.encode() + b'1]"}]}'


@pytest.mark.parametrize("chat", CHAT)
def test_zero_logprobs_zeroes_every_logprob_and_nothing_else(chat):
    events = stream(chat, [[11, 12], [13], [14, 15]], logprobs=True)
    plan = CorruptPlan(random.Random(0), CorruptAttrs(mode="zero_logprobs"))
    plan.start(0)
    out = [o for i, e in enumerate(events) for o in plan.event(i, e)]
    changed = [i for i, (a, b) in enumerate(zip(events, out)) if a != b]
    assert changed == ([1, 2, 3] if chat else [0, 1, 2]) and [c.event for c in plan.done] == changed
    for i in changed:
        before, after = payload(events[i])["choices"][0], payload(out[i])["choices"][0]
        lp = after["logprobs"]
        if chat:
            values = [e["logprob"] for e in lp["content"]] + [t["logprob"] for e in lp["content"]
                                                              for t in e["top_logprobs"]]
        else:
            values = lp["token_logprobs"] + [v for pos in lp["top_logprobs"] for v in pos.values()]
        assert values and all(v == 0.0 for v in values)
        del after["logprobs"], before["logprobs"]
        assert after == before
    assert zero_logprobs(out[changed[0]]) is None                 # already zero: nothing to do
    assert rewrite_all("zero_logprobs", stream(chat, [[11], [12]])) == (stream(chat, [[11], [12]]), None)


def test_events_that_are_no_json_object_pass_untouched():
    for mode in MODES:
        r = ResponseRewrite(mode, random.Random(1), 0)
        for e in (DONE, b": keep-alive", b"data: not json", b"data: [1, 2]", b'data: {"choices": []}'):
            assert r.event(e) is None
    with pytest.raises(ValueError, match="unknown rewrite mode"):
        ResponseRewrite("flip", random.Random(1), 0)


def test_any_never_draws_a_semantic_mode():
    events = stream(False, [[11, 12], [13, 9]], finish="stop", stop_reason=" w9")
    modes = {what.mode for s in range(200) if (what := rewrite_all("any", events, seed=s)[1])}
    assert modes == {"alter", "drop", "duplicate"}


# ------------------------------------------------------------------ the proxy's path

@pytest.mark.parametrize("mode", MODES)
def test_through_the_reframer_each_mode_matches_the_pure_function(mode):
    as_json = mode == "break_json"
    events = stream(True, [[11, 12], [13], [14, 15]], finish="stop", stop_reason=None if as_json else " w15",
                    logprobs=True, json_text=as_json)
    attrs = CorruptAttrs(mode=mode, max_event=2)
    for seed in range(5):
        plan = CorruptPlan(random.Random(seed), attrs)
        out = SseReframer(plan).feed(sse_response(events, [17, 90, 300]) * 2)   # two responses, keep-alive
        expected, _ = rewrite_all(mode, events, seed=seed, max_event=2)
        got = decode_stream(out)
        assert got[0] == expected and got[0] != events
        assert plan.done and {c.response for c in plan.done} == {0, 1}


# ------------------------------------------------------------------ one invariant each

#: mode → (the request body of the class it targets, the stream's options, the one invariant it must break)
TARGETS = {
    "append_after_stop": ({"stop": [" w15"], "ignore_eos": True}, {"finish": "stop", "stop_reason": " w15"}, "stop"),
    "drop_token_text": ({}, {}, "text"),
    "break_json": ({"response_format": {"type": "json_object"}}, {"finish": "stop", "json_text": True}, "structured"),
    "zero_logprobs": ({"logprobs": True}, {"logprobs": True}, "logprobs"),
}


@pytest.mark.parametrize("chat", CHAT)
@pytest.mark.parametrize("mode", MODES)
def test_each_mode_breaks_its_own_invariant_only(mode, chat):
    body, opts, invariant = TARGETS[mode]
    steps = [[11], [13], [15]] if mode == "break_json" else [[11, 12], [13, 14], [15]]
    events = stream(chat, steps, **opts)
    decode = ids_decode
    if mode == "break_json":     # one id per step: each id's text is its step's piece of the object
        pieces = {payload(e)["choices"][0]["token_ids"][0]: text_of(e) for e in events[:-1]
                  if payload(e)["choices"] and payload(e)["choices"][0].get("token_ids")}
        decode = lambda ids: "".join(pieces[i] for i in ids)   # noqa: E731
    assert violated(events, chat, body, decode) == set()          # the healthy stream holds every invariant
    out, what = rewrite_all(mode, events, max_event=0)
    assert what is not None
    if mode == "break_json":
        # any change of the text breaks ``text`` too where it is judged (a tokenizer given);
        # a run judges without one (harness.checks.integrity), as here with decode None
        assert violated(out, chat, body, decode) == {invariant, "text"}
        assert violated(out, chat, body, None) == {invariant}
    else:
        assert violated(out, chat, body, decode) == {invariant}

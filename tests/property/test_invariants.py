"""Every property of the suite can fail: each checker of :mod:`tests.property.invariants`
is fed a synthetic completion with one known defect and must name it; a good completion
passes them all. Also: the replay line is a valid shell command that gives back the exact
request. Fast, no server."""

from __future__ import annotations

import copy
import json
import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.property import profiles
from tests.property.invariants import (failed, first_stop, ids_text, length_problems, logprobs_problems,
                                       response_problems, same_output, settled_problems, stop_problems, stopped_early_problems,
                                       text_problems, usage_problems)
from tests.property.wire import Completion, curl_line, expect

#: A toy byte-level vocabulary: id → bytes (5: the lone lead byte of "—", 2: EOS).
VOCAB = {1: b"", 2: b"", 3: b" the", 4: b" river", 5: b"\xe2", 6: b"\x80\x94", 7: b" end", 8: b"s"}
EOS = 2


def decode(ids):
    return b"".join(VOCAB[i] for i in ids).decode("utf-8", errors="replace")


def good(stream: bool = False, usage: bool = True, **body) -> Completion:
    """A consistent response: ' the river the end' in 4 tokens, finished by length."""
    body = {"model": "target", "prompt": "Go", "max_tokens": 4, "temperature": 0, "return_token_ids": True, **body}
    ids = [3, 4, 3, 7]
    c = Completion(url="http://127.0.0.1:1/v1/completions", body=body, status=200, text=decode(ids),
                   token_ids=list(ids), prompt_token_ids=[1, 99], finish_reason="length", done=True, events=1,
                   usage={"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6})
    if stream:
        c.body.update(stream=True)
        if usage:
            c.body["stream_options"] = {"include_usage": True}
        c.chunks = [{"text": " the river", "token_ids": [3, 4], "finish_reason": None},
                    {"text": " the end", "token_ids": [3, 7], "finish_reason": "length"}]
        c.events = 3 if usage else 2
        c.usage_events = [2] if usage else []
        if not usage:
            c.usage = None
    if "logprobs" in body:
        c.logprobs = {"tokens": [" the", " river", " the", " end"], "token_logprobs": [-0.1, -0.2, -0.3, -0.4],
                      "top_logprobs": [{" the": -0.1, "x": -2.0}, {" river": -0.2}, {" the": -0.3}, {" end": -0.4}],
                      "text_offset": [0, 4, 10, 14]}
    return c


@pytest.mark.parametrize("c", [good(), good(stream=True), good(stream=True, usage=False), good(logprobs=1)],
                         ids=["whole", "stream", "stream-no-usage", "logprobs"])
def test_a_consistent_response_passes_every_check(c):
    assert response_problems(c, decode, EOS) == []
    assert same_output(c, copy.deepcopy(c)) == []


def test_a_failed_exchange_is_named():
    c = good()
    c.status, c.error = 500, "boom"
    assert failed(c) == ["HTTP 500: boom"]
    c = good(stream=True)
    c.done = False
    assert "without data: [DONE]" in failed(c)[0]
    c = good()
    c.finish_reason = "abort"
    assert "'abort'" in failed(c)[0]


def test_usage_off_by_one_is_caught():
    c = good()
    c.usage["completion_tokens"] = 5
    c.usage["total_tokens"] = 7
    assert usage_problems(c) == ["usage.completion_tokens 5 but 4 token ids were delivered"]
    c = good()
    c.usage["prompt_tokens"] = 3
    assert any("prompt_tokens 3" in p for p in usage_problems(c))
    c = good()
    c.usage["total_tokens"] = 5
    assert any("total_tokens 5" in p for p in usage_problems(c))


def test_a_misplaced_or_unasked_usage_event_is_caught():
    c = good(stream=True)
    c.usage_events = [0, 2]
    assert "expected exactly one, the last (2)" in usage_problems(c)[0]
    c = good(stream=True, usage=False)
    c.usage_events, c.usage = [1], {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}
    assert "include_usage was not asked" in usage_problems(c)[0]
    c = good(stream=True)
    c.chunks[1]["token_ids"] = [3]
    assert "chunks carried 3 token ids" in usage_problems(c)[0]


def test_max_tokens_broken_is_caught():
    c = good()
    c.body["max_tokens"] = 3
    assert length_problems(c, EOS) == ["4 output tokens exceed max_tokens 3",
                                       "finish_reason 'length' after 4 tokens, max_tokens is 3"]
    c = good()
    c.body["max_tokens"] = 8
    assert length_problems(c, EOS) == ["finish_reason 'length' after 4 tokens, max_tokens is 8"]
    c = good()
    c.finish_reason = "stop"
    assert "not EOS 2" in length_problems(c, EOS)[0]
    c.token_ids[-1] = EOS
    assert length_problems(c, EOS) == []


def test_text_after_a_stop_string_is_caught():
    c = good(stop=["river"])
    c.finish_reason, c.stop_reason = "stop", "river"           # claims a stop, but delivered everything
    problems = stop_problems(c, decode)
    assert "stop string 'river' appears in the text at char 5" in problems[0]
    assert "does not start with text + stop string" in problems[1]
    c = good(stop=["end"])                                     # 'end' met, finish_reason 'length'
    c.text = " the river the "
    assert "finish_reason 'length' (stop_reason None) although the output's text contains stop string(s) ['end']" \
        in stop_problems(c, decode)
    c = good(stop=["river"])
    c.text, c.token_ids, c.finish_reason, c.stop_reason = " the ", [3, 4], "stop", "sea"
    assert "stop_reason 'sea' is not one of the request's stop strings" in stop_problems(c, decode)[0]
    c.stop_reason = "river"
    assert stop_problems(c, decode) == []


def test_a_stream_whose_text_differs_from_its_token_ids_is_caught():
    c = good(stream=True)
    c.text = " the river the ends"
    assert "text differs from the token ids' text at char 18" in text_problems(c, decode)[0]
    c = good(stream=True)
    c.token_ids = [3, 4, 3, 8]
    assert text_problems(c, decode)


def test_an_incomplete_last_character_is_held_back_as_vllm_does():
    assert ids_text([3, 5], decode) == " the" and decode([3, 5]) == " the\ufffd"
    c = good()
    c.token_ids, c.text = [3, 5, 6, 7], " the\u2014 end"
    assert text_problems(c, decode) == []
    c.token_ids, c.text = [3, 4, 3, 5], " the river the"        # ends mid-character: held back
    assert text_problems(c, decode) == []
    c.text = " the river the\ufffd"                             # delivered: not what vLLM sends
    assert text_problems(c, decode)


def test_broken_logprobs_are_caught():
    c = good(logprobs=1)
    c.logprobs["top_logprobs"][0] = {" the": -0.1, "x": -0.05}   # greedy did not pick the top token
    assert "greedy chose logprob -0.1" in logprobs_problems(c)[0]
    c = good(logprobs=1)
    c.logprobs["tokens"].pop()
    assert "logprobs lengths" in logprobs_problems(c)[0]
    c = good(logprobs=1)
    c.logprobs["token_logprobs"][1] = 0.5
    assert "is not a log-probability" in logprobs_problems(c)[0]
    c = good(logprobs=0)
    assert "has 2 entries for logprobs 0" in logprobs_problems(c)[0]
    c = good(logprobs=1)
    c.logprobs["text_offset"] = [0, 4, 3, 14]
    assert "does not rise from 0" in logprobs_problems(c)[0]
    c = good()
    c.logprobs = {"tokens": []}
    assert logprobs_problems(c) == ["logprobs returned although none were asked"]
    c = good(logprobs=2)
    c.logprobs = None
    assert logprobs_problems(c) == ["logprobs 2 asked, none returned"]


def test_output_differing_from_the_reference_is_caught():
    ref = good(logprobs=1)
    spec = copy.deepcopy(ref)
    spec.token_ids[2], spec.text = 8, " the riversend"
    problems = same_output(spec, ref)
    assert problems[0] == "token 2: got 8, reference has 3 (got 4 tokens, reference 4)"
    assert "text differs from the reference's at char 10" in problems[1]
    spec = copy.deepcopy(ref)
    spec.logprobs["token_logprobs"][3] = -0.41
    assert same_output(spec, ref) == ["token_logprobs[3] -0.41, reference -0.4 (tolerance 0.001)"]
    spec = copy.deepcopy(ref)
    spec.usage["completion_tokens"] = 5
    spec.finish_reason = "stop"
    assert same_output(spec, ref) == ["finish_reason 'stop', reference 'length'", "usage.completion_tokens 5, reference 4"]


def test_a_stack_not_settled_after_the_faults_is_caught():
    fine = settled_problems([], {"spec": 200, "ref": 200}, {"spec": (0, 0), "ref": (1, 1)}, 0)
    assert fine == []
    bad = settled_problems([{"fault_id": "process-freeze-1", "kind": "process-freeze", "state": "injected"}],
                           {"spec": None, "ref": 503}, {"spec": (0, 1), "ref": (0, 0)}, 2)
    assert bad == ["fault process-freeze-1 (process-freeze) is injected in the ledger, not cleared",
                   "spec /health answered None", "ref /health answered 503",
                   "spec restarted (incarnation 0 -> 1)", "2 request(s) still pending with no fault active"]


def test_the_stop_string_that_completes_first_wins():
    assert first_stop("xaby", ["by", "ab"]) == (1, "ab")
    assert first_stop("xab", ["b", "ab"]) == (2, "b")           # both end at 3: list order
    assert first_stop("xab", ["ab", "b"]) == (1, "ab")
    assert first_stop("xyz", ["q", ""]) is None


def test_a_stop_that_cuts_too_late_or_too_early_is_caught():
    unstopped = good()
    stopped = good(stop=["river"])
    stopped.text, stopped.token_ids, stopped.finish_reason, stopped.stop_reason = " the ", [3, 4], "stop", "river"
    assert stopped_early_problems(stopped, unstopped) == []
    late = copy.deepcopy(stopped)
    late.text = " the river"
    assert "is not the unstopped text before its first stop string 'river'" in stopped_early_problems(late, unstopped)[0]
    wrong = copy.deepcopy(stopped)
    wrong.finish_reason, wrong.stop_reason = "length", None
    assert "expected 'stop' / 'river'" in stopped_early_problems(wrong, unstopped)[0]
    never = good(stop=["sea"])
    never.text = " the"
    assert "no stop string occurs in the unstopped text" in stopped_early_problems(never, unstopped)[0]


@given(prompt=st.text(), stop=st.lists(st.text(min_size=1, max_size=4), max_size=3))
def test_the_replay_line_is_a_valid_command_that_gives_back_the_exact_request(prompt, stop):
    body = {"model": "target", "prompt": prompt, "max_tokens": 3, "stop": stop}
    url = "http://127.0.0.1:8000/v1/completions"
    argv = shlex.split(curl_line(url, body))
    assert argv[:6] == ["curl", "-sN", "-X", "POST", url, "-H"] and argv[6] == "Content-Type: application/json"
    assert argv[7] == "-d" and len(argv) == 9
    assert json.loads(argv[8]) == body


def test_the_replay_line_of_quotes_and_unicode():
    body = {"prompt": "it's \"q\" \\ $HOME `x` e\u0301 \U0001D518 \u4e2d\n", "stop": ["'", "\U0001F600"]}
    line = curl_line("http://127.0.0.1:8000/v1/completions", body)
    assert line.isascii() and "\n" not in line
    assert json.loads(shlex.split(line)[-1]) == body


def test_a_failure_prints_the_problems_and_the_replay_line():
    c = good(prompt="it's")
    with pytest.raises(AssertionError) as info:
        expect(["usage off"], c)
    msg = str(info.value)
    assert "usage off" in msg and c.curl() in msg and shlex.split(c.curl())[4] == c.url


def test_the_profiles(monkeypatch):
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "ci")
    ci = profiles.stack_settings(10)
    assert (ci.max_examples, ci.derandomize, ci.database, ci.deadline) == (10, True, None, None)
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "nightly")
    nightly = profiles.stack_settings(10)
    assert nightly.max_examples == 250 and not nightly.derandomize and nightly.deadline is None
    assert nightly.stateful_step_count > ci.stateful_step_count
    assert profiles.stack_settings(3, 20).max_examples == 20
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "nigthly")
    with pytest.raises(ValueError, match="HYPOTHESIS_PROFILE='nigthly': unknown profile; known: ci, nightly"):
        profiles.active()


def test_the_profile_loaded_by_the_command_line_option_counts(monkeypatch):
    """``--hypothesis-profile nightly`` loads the profile globally; without the variable,
    :func:`profiles.active` follows it, and any profile not of this suite means ``ci``."""
    monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
    before = settings.get_current_profile_name()
    try:
        settings.load_profile("nightly")
        assert profiles.active() == "nightly"
        settings.load_profile("default")
        assert profiles.active() == "ci"
    finally:
        settings.load_profile(before)

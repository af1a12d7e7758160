"""The body rules per endpoint: a field of the other endpoint, a mistyped judged field and a
missing input are named; anything else passes through. No server."""

from __future__ import annotations

import pytest

from harness.load.endpoints import HARNESS_FIELDS, ONLY, body_problem, endpoint_of, passed_through

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("endpoint, body", [
    ("completions", {"prompt": "x", "stop": ["."], "logprobs": 2, "seed": 1, "ignore_eos": True,
                     "response_format": {"type": "json_object"}, "structured_outputs": {"choice": ["a"]},
                     "suffix": "", "echo": False}),
    ("completions", {"prompt": [1, 2, 3], "max_tokens": 1}),
    ("chat", {**CHAT, "logprobs": True, "top_logprobs": 3, "tools": [], "tool_choice": "auto",
              "max_completion_tokens": 4, "stop": "x"}),
])
def test_good_bodies(endpoint, body):
    assert body_problem(endpoint, body) is None and endpoint_of(body) == endpoint


@pytest.mark.parametrize("endpoint, body, problem", [
    ("completions", {"prompt": "x", "tools": []}, "tools: belongs to /v1/chat/completions, not /v1/completions"),
    ("completions", {"prompt": "x", "top_logprobs": 2}, "top_logprobs: belongs to /v1/chat/completions"),
    ("chat", {**CHAT, "suffix": "s"}, "suffix: belongs to /v1/completions, not /v1/chat/completions"),
    ("chat", {"prompt": "x"}, "prompt: belongs to /v1/completions, not /v1/chat/completions"),
    ("completions", {"prompt": "x", "logprobs": True}, "logprobs: Input should be a valid integer"),
    ("completions", {"prompt": "x", "logprobs": -1}, "logprobs: Input should be greater than or equal to 0"),
    ("chat", {**CHAT, "logprobs": 2}, "logprobs: Input should be a valid boolean"),
    ("chat", {**CHAT, "n": 3}, "n: must be 1, not 3: the harness judges one choice per request"),
    ("chat", {"max_tokens": 3}, "missing field 'messages'"),
    ("completions", {"max_tokens": 3}, "missing field 'prompt'"),
    ("embeddings", {"input": "x"}, "unknown endpoint 'embeddings' (one of ['chat', 'completions'])"),
])
def test_bad_bodies_name_the_field(endpoint, body, problem):
    assert body_problem(endpoint, body).startswith(problem)


def test_the_harness_sets_its_own_fields_and_the_endpoints_own_fields_are_apart():
    assert passed_through({"model": "m", "stream": False, "stream_options": {}, "prompt": "x", "seed": 2}) == {
        "prompt": "x", "seed": 2}
    assert not ONLY["chat"] & ONLY["completions"] and not set(HARNESS_FIELDS) & (ONLY["chat"] | ONLY["completions"])
    assert endpoint_of({"prompt": "x", "messages": []}) is None and endpoint_of({}) is None

"""Traffic sources: each reader on a good file and on bad ones (one line naming FILE:LINE),
measuring with the target's tokenizer, the max_model_len refusal and bucketing. No server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.errors import SourceError
from harness.load.config import LoadConfig
from harness.load.prompts import load_token_counter
from harness.load.sources import (HARNESS_FIELDS, RequestSpec, bucket, check_model_len, load_source, measure,
                                  plain_token_ids, prompt_token_counter, read_mooncake_trace, read_openai_requests,
                                  read_sharegpt, read_source, read_vllm_custom)

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "models" / "target"
needs_target = pytest.mark.skipif(not (TARGET / "tokenizer.json").is_file(), reason="models/target not built")


def write(tmp_path: Path, name: str, lines: list) -> Path:
    p = tmp_path / name
    p.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines), encoding="utf-8")
    return p


def one_line(exc_info) -> str:
    text = exc_info.value.one_line()
    assert "\n" not in text
    return text


# ------------------------------------------------------------------------------ openai
def test_openai_bodies_keep_every_field_but_the_harnesss(tmp_path):
    p = write(tmp_path, "req.jsonl", [
        {"model": "prod-70b", "prompt": "Once", "max_tokens": 8, "stop": ["."], "seed": 3, "stream": True,
         "stream_options": {"include_usage": False}, "logprobs": 2, "guided_choice": ["a", "b"]},
        "",
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
         "response_format": {"type": "json_object"}, "tools": [{"type": "function", "function": {"name": "f"}}]},
        {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "user", "content": "batch"}], "max_completion_tokens": 5}},
        {"prompt": [1, 5, 9]},
    ])
    a, b, c, d = read_openai_requests(p)
    assert (a.endpoint, a.path, a.origin) == ("completions", "/v1/completions", f"{p}:1")
    assert a.body == {"prompt": "Once", "max_tokens": 8, "stop": ["."], "seed": 3, "logprobs": 2,
                      "guided_choice": ["a", "b"]}
    assert not set(HARNESS_FIELDS) & set(a.body) and a.max_tokens == 8
    assert (b.endpoint, b.path, b.origin) == ("chat", "/v1/chat/completions", f"{p}:3")
    assert b.body["response_format"] == {"type": "json_object"} and b.body["tools"][0]["function"]["name"] == "f"
    assert (c.endpoint, c.body, c.max_tokens) == ("chat", {"messages": [{"role": "user", "content": "batch"}],
                                                           "max_completion_tokens": 5}, 5)
    assert d.body == {"prompt": [1, 5, 9]} and d.arrival_s is None and d.prompt_tokens is None


@pytest.mark.parametrize("line, message", [
    ("not json", "2: not JSON: Expecting value (column 1)"),
    ('["a list"]', "2: a JSON list, not an object"),
    ({"max_tokens": 4}, "2: needs exactly one of 'prompt' (completions) and 'messages' (chat)"),
    ({"prompt": "a", "messages": []}, "2: has both 'prompt' and 'messages'"),
    ({"prompt": ""}, "2: prompt: must be a non-empty string"),
    ({"prompt": ["x"]}, "2: prompt: must be a non-empty string or a non-empty list of token ids"),
    ({"prompt": "a", "max_tokens": 0}, "2: max_tokens: Input should be greater than or equal to 1"),
    ({"prompt": "a", "n": 2}, "2: n: must be 1, not 2"),
    ({"messages": []}, "2: messages: List should have at least 1 item"),
    ({"messages": [{"content": "hi"}]}, "2: missing field 'messages.0.role'"),
    ({"messages": [{"role": "bot", "content": "hi"}]}, "2: messages.0.role: Input should be 'system'"),
    ({"url": "/v1/embeddings", "body": {"input": "x"}}, "2: url '/v1/embeddings' is not one of"),
    ({"prompt": "a", "tools": []}, "2: tools: belongs to /v1/chat/completions, not /v1/completions"),
    ({"url": "/v1/completions", "body": {"messages": [{"role": "user", "content": "x"}]}},
     "2: messages: belongs to /v1/chat/completions, not /v1/completions"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": 5}, "2: logprobs: Input should be a valid boolean"),
])
def test_a_bad_openai_line_is_one_line_naming_file_and_line(tmp_path, line, message):
    p = write(tmp_path, "req.jsonl", [{"prompt": "fine"}, line])
    with pytest.raises(SourceError) as ei:
        read_openai_requests(p)
    assert one_line(ei).startswith(f"{p}:{message}")


def test_an_empty_or_missing_file_is_refused(tmp_path):
    empty = write(tmp_path, "empty.jsonl", ["", "  "])
    for reader in (read_openai_requests, read_sharegpt, read_vllm_custom):
        with pytest.raises(SourceError) as ei:
            reader(empty)
        assert one_line(ei) == f"{empty}: empty file: no requests (a source needs at least one line)"
    with pytest.raises(SourceError) as ei:
        read_mooncake_trace(empty, vocab=[1])
    assert "empty file" in one_line(ei)
    with pytest.raises(SourceError) as ei:
        read_openai_requests(tmp_path / "nope.jsonl")
    assert one_line(ei).startswith(f"{tmp_path / 'nope.jsonl'}: no such file")
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(SourceError, match="not UTF-8"):
        read_openai_requests(bad)


# ----------------------------------------------------------------------------- sharegpt
CONV = {"id": "c1", "conversations": [
    {"from": "system", "value": "S"}, {"from": "human", "value": "Q1"}, {"from": "gpt", "value": "A1"},
    {"from": "human", "value": "Q2"}, {"from": "gpt", "value": "A2"}]}


def test_sharegpt_turns_carry_the_earlier_turns(tmp_path):
    p = tmp_path / "sg.json"   # a JSON array, as ShareGPT dumps are
    p.write_text(json.dumps([CONV, {"conversations": [{"from": "user", "value": "only"}]}], indent=1))
    first, second, third = read_sharegpt(p, max_tokens=16, extra={"temperature": 0})
    assert first.body == {"temperature": 0, "max_tokens": 16,
                          "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q1"}]}
    assert second.body["messages"] == [{"role": "system", "content": "S"}, {"role": "user", "content": "Q1"},
                                       {"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"}]
    assert [(s.conversation, s.turn, s.endpoint) for s in (first, second)] == [("c1", 0, "chat"), ("c1", 1, "chat")]
    assert first.origin == second.origin == f"{p}:2"
    assert third.conversation == f"line {third.origin.rsplit(':', 1)[1]}" and third.turn == 0
    assert third.body["messages"] == [{"role": "user", "content": "only"}]
    assert first.body["messages"] is not second.body["messages"]   # each turn its own list
    jl = write(tmp_path, "sg.jsonl", [CONV])   # JSONL works too
    assert [s.body for s in read_sharegpt(jl, max_tokens=16, extra={"temperature": 0})] == [first.body, second.body]


@pytest.mark.parametrize("item, message", [
    ({"id": 1}, "missing field 'conversations'"),
    ({"conversations": []}, "'conversations' must be a non-empty list"),
    ({"conversations": [{"from": "human"}]}, "conversations[0] needs 'from' and 'value' strings"),
    ({"conversations": [{"from": "robot", "value": "x"}]}, "conversations[0]: unknown speaker 'robot'"),
    ({"conversations": [{"from": "gpt", "value": "x"}]}, "conversation has no human turn"),
])
def test_a_bad_sharegpt_conversation_names_its_line(tmp_path, item, message):
    p = tmp_path / "sg.json"
    p.write_text("[\n" + json.dumps(CONV) + ",\n" + json.dumps(item) + "\n]\n")
    with pytest.raises(SourceError) as ei:
        read_sharegpt(p)
    assert one_line(ei).startswith(f"{p}:3: {message}")


def test_a_broken_sharegpt_array_names_its_line(tmp_path):
    p = tmp_path / "sg.json"
    p.write_text("[\n" + json.dumps(CONV) + "\n" + json.dumps(CONV) + "\n]\n")   # a missing comma
    with pytest.raises(SourceError) as ei:
        read_sharegpt(p)
    assert one_line(ei).startswith(f"{p}:3: not JSON: expected ','")
    p.write_text("[\n" + json.dumps(CONV) + ",\n{\"conversations\": [\n")
    with pytest.raises(SourceError) as ei:
        read_sharegpt(p)
    assert one_line(ei).startswith(f"{p}:") and "not JSON" in one_line(ei)
    p.write_text("[ ]")
    with pytest.raises(SourceError, match="empty JSON array"):
        read_sharegpt(p)


# -------------------------------------------------------------------------- vllm custom
def test_vllm_custom_dataset(tmp_path):
    p = write(tmp_path, "custom.jsonl", [{"prompt": "What is the capital of India?", "output_tokens": 10},
                                         {"prompt": "And of Iran?"}])
    a, b = read_vllm_custom(p, max_tokens=4)
    assert (a.endpoint, a.body, b.body) == ("completions", {"prompt": "What is the capital of India?",
                                                             "max_tokens": 10}, {"prompt": "And of Iran?",
                                                                                 "max_tokens": 4})
    c, d = read_vllm_custom(p, chat=True, extra={"temperature": 0})
    assert (c.endpoint, c.body) == ("chat", {"temperature": 0, "max_tokens": 10,
                                             "messages": [{"role": "user", "content": "What is the capital of India?"}]})
    assert "max_tokens" not in d.body
    assert [s.body for s in read_source("vllm-custom", p, max_tokens=4)] == [a.body, b.body]


@pytest.mark.parametrize("line, message", [
    ({"text": "x"}, "missing field 'prompt'"),
    ({"prompt": 3}, "'prompt' must be a non-empty string"),
    ({"prompt": "x", "output_tokens": "ten"}, "'output_tokens' must be an integer >= 1, not 'ten'"),
    ({"prompt": "x", "output_tokens": 0}, "'output_tokens' must be an integer >= 1, not 0"),
])
def test_a_bad_vllm_custom_line(tmp_path, line, message):
    p = write(tmp_path, "custom.jsonl", [{"prompt": "ok"}, line])
    with pytest.raises(SourceError) as ei:
        read_vllm_custom(p)
    assert one_line(ei) == f"{p}:2: {message}"


# ----------------------------------------------------------------------------- mooncake
TRACE = [{"timestamp": 1000, "input_length": 10, "output_length": 3, "hash_ids": [7, 8, 9]},
         {"timestamp": 1500, "input_length": 9, "output_length": 5, "hash_ids": [7, 8, 11]},
         {"timestamp": 3000, "input_length": 4, "output_length": 1}]


def test_mooncake_trace_arrivals_and_shared_prefixes(tmp_path):
    p = write(tmp_path, "trace.jsonl", TRACE)
    vocab = list(range(10, 60))
    a, b, c = read_mooncake_trace(p, vocab=vocab, speedup=2.0, block_tokens=4, seed=5)
    assert [s.arrival_s for s in (a, b, c)] == [0.0, 0.25, 1.0]   # (ms - first) / 1000 / speed-up
    assert [s.prompt_tokens for s in (a, b, c)] == [10, 9, 4] == [len(s.body["prompt"]) for s in (a, b, c)]
    assert a.body["prompt"][:8] == b.body["prompt"][:8]   # hash ids 7, 8 shared: 2 blocks of 4 tokens
    assert a.body["prompt"][8:] != b.body["prompt"][8:]
    assert all(t in vocab for s in (a, b, c) for t in s.body["prompt"])
    assert (a.body["max_tokens"], a.body["ignore_eos"], a.endpoint) == (3, True, "completions")
    again = read_mooncake_trace(p, vocab=vocab, speedup=2.0, block_tokens=4, seed=5)
    assert [s.body for s in again] == [s.body for s in (a, b, c)]   # seeded: the same prompts
    other = read_mooncake_trace(p, vocab=vocab, block_tokens=4, seed=6, ignore_eos=False)
    assert other[0].body["prompt"] != a.body["prompt"] and "ignore_eos" not in other[0].body
    assert other[1].arrival_s == 0.5


def test_mooncake_a_partial_last_block_is_a_prefix_of_its_block(tmp_path):
    p = write(tmp_path, "trace.jsonl", [{"timestamp": 0, "input_length": 8, "output_length": 1, "hash_ids": [1, 2]},
                                        {"timestamp": 0, "input_length": 6, "output_length": 1, "hash_ids": [1, 2]}])
    a, b = read_mooncake_trace(p, vocab=list(range(100)), block_tokens=4)
    assert b.body["prompt"] == a.body["prompt"][:6]


@pytest.mark.parametrize("line, message", [
    ({"input_length": 4, "output_length": 1}, "missing field 'timestamp'"),
    ({"timestamp": 0, "input_length": "x", "output_length": 1}, "input_length: Input should be a valid integer"),
    ({"timestamp": 0, "input_length": 4, "output_length": 0}, "output_length: Input should be greater than"),
    ({"timestamp": 999, "input_length": 4, "output_length": 1}, "timestamp 999 ms is before the line before's"),
    ({"timestamp": 2000, "input_length": 9, "output_length": 1, "hash_ids": [1, 2]},
     "input_length 9 needs 3 block(s) of 4 tokens, hash_ids has 2 (set block_tokens to the trace's block size)"),
    ({"timestamp": 2000, "input_length": 4, "output_length": 1, "hash_ids": [1, 2]},
     "input_length 4 needs 1 block(s) of 4 tokens, hash_ids has 2"),
])
def test_a_bad_trace_line(tmp_path, line, message):
    p = write(tmp_path, "trace.jsonl", [TRACE[0], line])
    with pytest.raises(SourceError) as ei:
        read_mooncake_trace(p, vocab=[1, 2, 3], block_tokens=4)
    assert one_line(ei).startswith(f"{p}:2: {message}")


def test_a_bad_speedup_or_kind(tmp_path):
    p = write(tmp_path, "trace.jsonl", TRACE)
    with pytest.raises(SourceError) as ei:
        read_mooncake_trace(p, vocab=[1], speedup=0)
    assert one_line(ei) == f"{p}: speed-up factor must be > 0, not 0"
    with pytest.raises(SourceError) as ei:
        read_source("csv", p)
    assert one_line(ei) == f"{p}: unknown source kind 'csv' (one of ['mooncake', 'openai', 'sharegpt', 'vllm-custom'])"


# ------------------------------------------------------------- measuring and bucketing
def spec(tokens: int, line: int = 1, **body) -> RequestSpec:
    return RequestSpec("completions", {"prompt": "x", **body}, f"f.jsonl:{line}", prompt_tokens=tokens)


def test_buckets_by_measured_length_and_reports_those_outside():
    buckets = LoadConfig().bucket_specs()   # short 16..60, medium 120..136, long 496..528
    inside, outside = bucket([spec(16), spec(60), spec(61), spec(130), spec(528), spec(529), spec(3)], buckets)
    assert [(s.prompt_tokens, s.prompt_class) for s in inside] == [(16, "short"), (60, "short"), (130, "medium"),
                                                                    (528, "long")]
    assert [s.prompt_tokens for s in outside] == [61, 529, 3] and all(s.prompt_class is None for s in outside)
    with pytest.raises(ValueError, match="not measured"):
        bucket([RequestSpec("completions", {"prompt": "x"}, "f:1")], buckets)


def test_a_prompt_longer_than_max_model_len_is_refused_naming_its_line():
    check_model_len([spec(100, max_tokens=28), spec(120)], max_model_len=128, default_max_tokens=8)
    with pytest.raises(SourceError) as ei:
        check_model_len([spec(100), spec(101, line=7, max_tokens=28)], max_model_len=128, default_max_tokens=8)
    assert one_line(ei) == ("f.jsonl:7: prompt of 101 tokens plus max_tokens 28 exceeds max_model_len 128 (shorten "
                            "the prompt, lower max_tokens or raise stack.max_model_len)")
    with pytest.raises(SourceError) as ei:
        check_model_len([spec(125)], max_model_len=128, default_max_tokens=8)
    assert one_line(ei).startswith("f.jsonl:1: prompt of 125 tokens plus max_tokens 8 exceeds")


def test_measure_fills_only_what_is_unmeasured():
    specs = [RequestSpec("completions", {"prompt": "a b c"}, "f:1"), spec(9)]
    assert [s.prompt_tokens for s in measure(specs, lambda s: len(s.body["prompt"].split()))] == [3, 9]


@needs_target
def test_measuring_with_the_targets_tokenizer_counts_as_vllm_does(tmp_path):
    count_text = load_token_counter(TARGET)
    count = prompt_token_counter(TARGET)
    text = "The river ran past the old stone bridge."
    assert count(RequestSpec("completions", {"prompt": text}, "f:1")) == count_text(text)   # BOS included
    assert count(RequestSpec("completions", {"prompt": [5, 6, 7]}, "f:1")) == 3   # token ids: nothing added
    vocab = plain_token_ids(TARGET)
    assert 1 not in vocab and 2 not in vocab and len(vocab) > 100   # <s>, </s> are special


@needs_target
def test_chat_prompts_are_measured_with_the_chat_template():
    count = prompt_token_counter(TARGET)
    msgs = [{"role": "user", "content": "The river ran past the old stone bridge."}]
    n = count(RequestSpec("chat", {"messages": msgs}, "f:1"))
    # the tiny target's template renders "user: ...\nassistant:" and adds no BOS of its own
    rendered = "user: The river ran past the old stone bridge.\nassistant:"
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(TARGET / "tokenizer.json"))
    assert n == len(tok.encode(rendered, add_special_tokens=False).ids)


@needs_target
def test_load_source_reads_measures_checks_and_buckets(tmp_path):
    p = write(tmp_path, "custom.jsonl", [{"prompt": " ".join(["river"] * 30), "output_tokens": 8},
                                         {"prompt": "short"}])
    inside, outside = load_source("vllm-custom", p, tokenizer_dir=TARGET, max_model_len=512, default_max_tokens=16,
                                  buckets=LoadConfig().bucket_specs())
    assert [s.prompt_class for s in inside] == ["short"] and len(outside) == 1 and outside[0].prompt_tokens < 16
    t = write(tmp_path, "trace.jsonl", [{"timestamp": 0, "input_length": 600, "output_length": 4,
                                         "hash_ids": [1, 2]}])
    inside, outside = load_source("mooncake", t, tokenizer_dir=TARGET, max_model_len=2048, default_max_tokens=16,
                                  buckets=LoadConfig().bucket_specs())
    assert not inside and [s.prompt_tokens for s in outside] == [600]
    with pytest.raises(SourceError) as ei:
        load_source("mooncake", t, tokenizer_dir=TARGET, max_model_len=512, default_max_tokens=16,
                    buckets=LoadConfig().bucket_specs())
    assert one_line(ei).startswith(f"{t}:1: prompt of 600 tokens plus max_tokens 4 exceeds max_model_len 512")


# ------------------------------------------------------------------------- properties
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=5))
_EXTRA = st.dictionaries(st.text(min_size=1, max_size=8).filter(lambda k: k not in ("prompt", "messages", "n",
                                                                                      "max_tokens", "url", "body")),
                         st.one_of(_SCALARS, st.lists(_SCALARS, max_size=3)), max_size=4)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompts=st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=5), extra=_EXTRA,
       blank=st.lists(st.booleans(), min_size=5, max_size=5))
def test_any_body_round_trips_less_the_harnesss_fields(tmp_path, prompts, extra, blank):
    lines: list = []
    for i, text in enumerate(prompts):
        if blank[i]:
            lines.append("")
        lines.append({"prompt": text, **extra})
    p = write(tmp_path, "req.jsonl", lines)
    specs = read_openai_requests(p)
    want = {k: v for k, v in extra.items() if k not in HARNESS_FIELDS}
    assert [s.body for s in specs] == [{"prompt": t, **want} for t in prompts]
    numbers = [n for n, line in enumerate(lines, 1) if line != ""]
    assert [s.origin for s in specs] == [f"{p}:{n}" for n in numbers]

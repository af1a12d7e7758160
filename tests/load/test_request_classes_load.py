"""Request classes on the load side (``load.request_classes``): what a class may say, how
each request draws one, the body it is sent with, and the client reading a chat stream
from the fake vLLM (:mod:`tests.fakes.fake_vllm`)."""

from __future__ import annotations

import pytest

from harness.errors import ExperimentError
from harness.experiment.config import parse_config
from harness.load.client import completion_body, make_client, request_body, stream_completion
from harness.load.config import FOLLOW_UP, PLAIN, LoadConfig, RequestClass, SamplingClass
from harness.load.profiles import Walk, load_section, planned_requests
from harness.load.prompts import Prompt
from harness.report.summary import workload_line

from tests.fakes import run_fake

PROMPT = Prompt(prompt_id=3, prompt_class="short", text="hello there friend", prompt_tokens=4, max_tokens=12)
PROMPTS = [Prompt(prompt_id=i, prompt_class="short", text=f"p {i}", prompt_tokens=3, max_tokens=8) for i in range(5)]
CHAT_LP = RequestClass(name="chat", endpoint="chat", body={"logprobs": True, "messages": [
    {"role": "system", "content": "be brief"}]})


def error(classes: list) -> str:
    with pytest.raises(ExperimentError) as ei:
        parse_config({"load": {"request_classes": classes}})
    line = ei.value.one_line()
    assert "\n" not in line
    return line


def test_absent_classes_are_the_plain_completions_of_today():
    lc = LoadConfig()
    assert lc.request_classes is None and lc.classes() == [PLAIN]
    assert request_body(PROMPT, "m", True, None, PLAIN) == completion_body(PROMPT, "m", True)
    assert "request_class" not in planned_requests(lc, PROMPTS, 3)[0]


def test_good_classes_parse_and_round_trip():
    raw = [{"name": "stop", "weight": 2, "body": {"stop": ["\n"], "max_tokens": 64, "ignore_eos": False}},
           {"name": "json", "endpoint": "chat", "body": {"response_format": {"type": "json_object"}, "seed": 7}},
           {"name": "tools", "endpoint": "chat", "body": {"tools": [{"type": "function", "function": {"name": "f"}}]}},
           {"name": "lp", "body": {"logprobs": 2, "structured_outputs": {"choice": ["a", "b"]}}}]
    cfg = parse_config({"load": {"request_classes": raw}})
    assert [c.name for c in cfg.load.classes()] == ["stop", "json", "tools", "lp"]
    assert parse_config({"load": cfg.load.model_dump()}).load == cfg.load


@pytest.mark.parametrize("classes, needles", [
    ([{"name": "t", "body": {"tools": []}}],
     ["load.request_classes.0", "request class 't' (completions): body.tools: belongs to /v1/chat/completions"]),
    ([{"name": "c", "endpoint": "chat", "body": {"logprobs": 3}}], ["'c' (chat): body.logprobs"]),
    ([{"name": "c", "endpoint": "chat", "body": {"top_logprobs": -1}}], ["body.top_logprobs"]),
    ([{"name": "m", "body": {"max_tokens": 0}}], ["'m' (completions): body.max_tokens"]),
    ([{"name": "n", "body": {"n": 2}}], ["body.n: ", "must be 1"]),
    ([{"name": "s", "body": {"stream": False}}], ["body.stream: not allowed in a request class"]),
    ([{"name": "p", "body": {"prompt": "x"}}], ["body.prompt: not allowed", "prompt set"]),
    ([{"name": "h", "body": {"temperature": 1}}], ["body.temperature: not allowed", "load.sampling"]),
    ([{"name": "e", "endpoint": "embeddings"}], ["load.request_classes.0.endpoint"]),
    ([{"name": "a"}, {"name": "a"}], ["request class name 'a' is used twice"]),
    ([], ["needs at least one request class"]),
    ([{"name": "w", "weight": 0}], ["load.request_classes.0.weight"]),
])
def test_bad_classes_are_one_line_naming_class_and_field(classes, needles):
    line = error(classes)
    for n in needles:
        assert n in line, (n, line)


def test_class_draws_are_seeded_and_leave_the_prompt_walk_and_sampling_alone():
    classes = [RequestClass(name="a", weight=1), RequestClass(name="b", weight=3)]
    sampling = [SamplingClass(name="g"), SamplingClass(name="hot", temperature=1.0)]
    one, two = (Walk(PROMPTS, sampling, 9, 2, classes) for _ in range(2))
    drawn = [(one.next(), one.next_class().name) for _ in range(40)]
    assert drawn == [(two.next(), two.next_class().name) for _ in range(40)]
    plain = Walk(PROMPTS, sampling, 9, 2)
    assert [(p, s) for (p, s), _ in drawn] == [plain.next() for _ in range(40)]
    names = [n for _, n in drawn]
    assert {"a", "b"} == set(names) and names.count("b") > names.count("a")
    other = Walk(PROMPTS, sampling, 9, 3, classes)
    assert [other.next_class().name for _ in range(40)] != names


def test_the_plan_and_the_workload_line_name_the_classes():
    lc = LoadConfig(users=2, request_classes=[{"name": "a"}, {"name": "b", "endpoint": "chat", "turns": 2}])
    plan = planned_requests(lc, PROMPTS, 10)
    assert {p["request_class"] for p in plan} == {"a", "b"} and plan == planned_requests(lc, PROMPTS, 10)
    line = workload_line(load_section(lc, PROMPTS))
    assert "; classes a (completions, weight 1), b (chat, 2 turns, weight 1); seed 1234" in line
    assert "classes" not in workload_line(load_section(LoadConfig(), PROMPTS))


def test_chat_body_puts_the_prompt_last_and_the_class_fields_win():
    body = request_body(PROMPT, "m", False, SamplingClass(name="hot", temperature=0.5), RequestClass(
        name="c", endpoint="chat", body={**CHAT_LP.body, "max_completion_tokens": 5, "ignore_eos": True}))
    assert "prompt" not in body and body["messages"] == [{"role": "system", "content": "be brief"},
                                                         {"role": "user", "content": PROMPT.text}]
    assert (body["temperature"], body["logprobs"], body["ignore_eos"], body["stream"]) == (0.5, True, True, True)
    assert body["stream_options"] == {"include_usage": True} and body["return_token_ids"] is True


@pytest.fixture(scope="module")
def fake():
    with run_fake("--step-delay-s", "0.005") as srv:
        yield srv


def send(fake, request_class: RequestClass | None, prompt: Prompt = PROMPT):
    with make_client() as c:
        return stream_completion(c, fake.base_url, fake.served_model_name, prompt, timeout_s=10,
                                 request_class=request_class)


def test_client_reads_a_chat_stream_with_logprobs(fake):
    r = send(fake, CHAT_LP)
    assert fake.bodies[-1]["messages"][-1] == {"role": "user", "content": PROMPT.text}
    assert (r.ok, r.endpoint, r.request_class, r.error) == (True, "chat", "chat", None)
    assert r.finish_reason in ("stop", "length") and r.output_tokens == len(r.token_ids) == sum(r.chunk_tokens)
    assert r.text == "".join(f" w{t}" for t in r.token_ids if t != 2)
    assert len(r.logprobs) == len(r.token_ids) and all(-1 <= v < 0 for v in r.logprobs)
    assert r.max_tokens == PROMPT.max_tokens and r.ttft_s == r.chunk_offsets_s[0]


def test_client_records_the_stop_string_that_ended_a_completion(fake):
    r = send(fake, RequestClass(name="stop", body={"stop": [" w1"], "max_tokens": 64, "ignore_eos": True}))
    assert r.ok and r.max_tokens == 64
    assert (r.finish_reason, r.stop_reason) == ("stop", " w1") and " w1" not in r.text
    assert "".join(f" w{t}" for t in r.token_ids).startswith(r.text + " w1")


def test_the_plain_request_and_record_are_todays(fake):
    r = send(fake, None)
    assert fake.bodies[-1] == completion_body(PROMPT, fake.served_model_name)
    assert (r.request_class, r.endpoint, r.logprobs, r.tool_calls, r.stop_reason) == ("plain", "completions", None,
                                                                                     None, None)
    assert r.ok and r.top_logprobs is None


def test_client_joins_a_streamed_tool_call(fake):
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    r = send(fake, RequestClass(name="tools", endpoint="chat", body={"tools": [tool]}))
    assert r.ok and (r.finish_reason, r.text) == ("tool_calls", "")
    (call,) = r.tool_calls
    assert call["name"] == "lookup" and call["arguments"].startswith('{"w": "w') and call["arguments"].endswith('"}')
    assert r.output_tokens == len(r.token_ids) == sum(r.chunk_tokens) > 1


def test_turns_need_chat():
    assert "'t' (completions): turns: 3 turns need endpoint chat" in error([{"name": "t", "turns": 3}])
    assert RequestClass(name="t", endpoint="chat", turns=3).turns == 3


def test_a_later_turn_carries_the_earlier_ones(fake):
    history = ({"role": "user", "content": PROMPT.text}, {"role": "assistant", "content": " w5 w6"})
    body = request_body(PROMPT, "m", False, None, CHAT_LP, history)
    assert body["messages"] == [CHAT_LP.body["messages"][0], *history, {"role": "user", "content": FOLLOW_UP}]
    with make_client() as c:
        r = stream_completion(c, fake.base_url, fake.served_model_name, PROMPT, timeout_s=10, request_class=CHAT_LP,
                              history=history)
    assert r.ok and r.turn == 2 and fake.bodies[-1]["messages"][1:] == body["messages"][1:]


@pytest.mark.parametrize("request_class, needle", [
    ({"name": "big", "body": {"max_tokens": 600}}, "class big: the longest prompts (528 tokens) plus 1 turn(s) of 600"),
    ({"name": "talk", "endpoint": "chat", "turns": 8, "body": {"max_completion_tokens": 64}}, "8 turn(s) of 64"),
])
def test_a_class_whose_requests_cannot_fit_the_context_is_refused(request_class, needle):
    raw = {"load": {"request_classes": [{"name": "plain"}, request_class]}, "stack": {"max_model_len": 1024}}
    with pytest.raises(ExperimentError) as ei:
        parse_config(raw)
    assert needle in ei.value.one_line() and "exceed stack.max_model_len (1024)" in ei.value.one_line()
    raw["load"]["request_classes"][1]["turns" if "turns" in request_class else "body"] = (
        7 if "turns" in request_class else {"max_tokens": 400})
    parse_config(raw)

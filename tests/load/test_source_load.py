"""What the load sends for a traffic source (``load.source``), as pure functions: the
source's requests as the run's prompt set, their bodies, the in-order walk with per-user
offsets, and a timed trace's open-loop arrivals (repeated with a period)."""

from __future__ import annotations

import itertools

import pytest

from harness.experiment.config import parse_config
from harness.load.client import SOURCE_SAMPLED, completion_body, sampling_name
from harness.load.config import GREEDY, LoadConfig, SamplingClass
from harness.load.profiles import (Walk, arrivals, load_section, plan_digest, planned_requests, source_start, timed,
                                   trace_arrivals, trace_period_s)
from harness.load.prompts import Prompt, load_prompt_set, save_prompt_set
from harness.load.source_prep import source_prompts
from harness.load.sources import RequestSpec
from harness.report.summary import workload_line


def spec(i: int, body: dict, endpoint: str = "completions", arrival_s: float | None = None,
         bucket: str = "short") -> RequestSpec:
    return RequestSpec(endpoint, body, f"src.jsonl:{i + 1}", arrival_s=arrival_s, prompt_tokens=20 + i,
                       prompt_class=bucket)


SPECS = [
    spec(0, {"prompt": "hello there", "max_tokens": 5, "stop": ["."]}),
    spec(1, {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 7}, "chat", bucket="medium"),
    spec(2, {"prompt": [5, 6, 7], "temperature": 0.8}),
    spec(3, {"prompt": "plain"}),
]
LOAD = LoadConfig(source={"format": "openai", "path": "src.jsonl", "max_tokens": 9}, max_tokens=4)


def test_source_requests_become_the_prompt_set():
    prompts = source_prompts(SPECS, LOAD)
    assert [p.prompt_id for p in prompts] == [0, 1, 2, 3]
    assert [p.prompt_class for p in prompts] == ["short", "medium", "short", "short"]
    assert [p.origin for p in prompts] == [f"src.jsonl:{i}" for i in range(1, 5)]
    assert [p.endpoint for p in prompts] == ["completions", "chat", "completions", "completions"]
    assert [p.text for p in prompts] == ["hello there", "", "", "plain"]
    assert [p.max_tokens for p in prompts] == [5, 7, 9, 9]   # its own, else load.source.max_tokens
    assert [p.deterministic for p in prompts] == [True, True, False, True]
    assert [p.prompt_tokens for p in prompts] == [20, 21, 22, 23]


def test_a_source_prompt_set_survives_the_file(tmp_path):
    prompts = source_prompts(SPECS, LOAD) + [Prompt(4, "long", "generated", 500, 16)]
    save_prompt_set(tmp_path / "p.json", prompts)
    back = load_prompt_set(tmp_path / "p.json")
    assert [(p.body, p.origin, p.endpoint, p.arrival_s) for p in back] == \
        [(p.body, p.origin, p.endpoint, p.arrival_s) for p in prompts]
    assert '"origin"' not in (tmp_path / "p.json").read_text().split('"generated"')[1]   # a generated prompt: as always


def test_a_source_body_is_sent_as_given_with_the_harness_streaming_fields():
    p = source_prompts(SPECS, LOAD)
    b = completion_body(p[0], "m", ignore_eos=False, sampling=SamplingClass(name="hot", temperature=0.7))
    assert b["prompt"] == "hello there" and b["stop"] == ["."] and b["max_tokens"] == 5
    assert b["temperature"] == 0.7   # the body sets none: the drawn sampling class applies
    assert b["stream"] is True and b["stream_options"] == {"include_usage": True} and b["model"] == "m"
    chat = completion_body(p[1], "m", top_logprobs=2)
    assert "prompt" not in chat and chat["messages"] == [{"role": "user", "content": "hi"}]
    assert chat["max_completion_tokens"] == 7 and "logprobs" not in chat   # no completions logprobs on chat
    ids = completion_body(p[2], "m", sampling=GREEDY, top_logprobs=2)
    assert ids["prompt"] == [5, 6, 7] and ids["temperature"] == 0.8 and ids["logprobs"] == 2
    assert ids["max_tokens"] == 9


def test_the_record_names_the_source_sampling():
    p = source_prompts(SPECS, LOAD)
    hot = SamplingClass(name="hot", temperature=0.7)
    assert sampling_name(p[0], hot) == "hot" and sampling_name(p[0], None) == GREEDY.name
    assert sampling_name(p[2], GREEDY) == SOURCE_SAMPLED   # its own temperature 0.8
    zero = Prompt(0, "short", "x", 3, 4, body={"prompt": "x", "temperature": 0}, origin="f:1")
    assert sampling_name(zero, hot) == GREEDY.name and LOAD.greedy_classes() == {GREEDY.name}
    top_p = Prompt(0, "short", "x", 3, 4, body={"prompt": "x", "top_p": 0.5}, origin="f:1")
    assert completion_body(top_p, "m", sampling=hot)["temperature"] == 0 and sampling_name(top_p, hot) == GREEDY.name
    assert GREEDY.name in LoadConfig(source={"format": "openai", "path": "a"},
                                     sampling=[{"name": "g0", "temperature": 0}]).greedy_classes()


def test_users_walk_the_source_in_order_from_spread_offsets_and_wrap():
    prompts = source_prompts(SPECS * 5, LOAD)   # 20 requests (ids 0..19)
    n = len(prompts)
    starts = [source_start(u, n) for u in range(8)]
    assert starts[0] == 0 and len(set(starts)) == 8   # every user starts elsewhere
    for u in (0, 3):
        walk = Walk(prompts, [GREEDY], seed=7, user_id=u)
        got = [walk.next_prompt().prompt_id for _ in range(2 * n + 3)]
        assert got == [(starts[u] + k) % n for k in range(2 * n + 3)]   # in order, wrapping
    # a generated prompt set is still shuffled per pass
    gen = [Prompt(i, "short", f"t{i}", 3, 4) for i in range(20)]
    walk = Walk(gen, [GREEDY], seed=7, user_id=0)
    assert [walk.next_prompt().prompt_id for _ in range(20)] != list(range(20))


def test_the_trace_period_is_its_span_plus_its_mean_gap():
    assert trace_period_s([0.0, 1.0, 3.0]) == pytest.approx(4.5)
    assert trace_period_s([0.0]) == 1.0 and trace_period_s([2.0, 2.0]) == 1.0
    with pytest.raises(ValueError):
        trace_period_s([])
    with pytest.raises(ValueError):
        trace_period_s([1.0, 0.5])


def test_trace_arrivals_repeat_the_trace_shifted_by_its_period():
    got = list(itertools.islice(trace_arrivals([0.0, 0.2, 1.0]), 7))
    assert got == pytest.approx([0.0, 0.2, 1.0, 1.5, 1.7, 2.5, 3.0])
    assert all(b > a for a, b in zip(got, got[1:]))


def timed_prompts(arrival_s):
    specs = [spec(i, {"prompt": [1, 2, 3], "max_tokens": 4}, arrival_s=a) for i, a in enumerate(arrival_s)]
    return source_prompts(specs, LoadConfig(source={"format": "mooncake", "path": "t.jsonl"}))


def test_the_open_loop_takes_a_timed_sources_arrivals():
    prompts = timed_prompts([0.0, 0.5, 0.6, 2.0])
    assert timed(prompts) and not timed(source_prompts(SPECS, LOAD))
    load = LoadConfig(source={"format": "mooncake", "path": "t.jsonl"})
    assert list(itertools.islice(arrivals(load.profile, prompts, 1), 5)) == pytest.approx([0, 0.5, 0.6, 2.0, 8 / 3])
    plan = planned_requests(load, prompts, count=6)
    assert [s["prompt_id"] for s in plan] == [0, 1, 2, 3, 0, 1]
    assert [s["at_s"] for s in plan] == pytest.approx([0, 0.5, 0.6, 2.0, 8 / 3, 8 / 3 + 0.5])
    # an untimed source under a rate: the seeded process, the source in order
    rated = LoadConfig(source={"format": "openai", "path": "a"}, profile={"kind": "open", "rate": 5})
    plan = planned_requests(rated, source_prompts(SPECS, LOAD), count=6)
    assert [s["prompt_id"] for s in plan] == [0, 1, 2, 3, 0, 1] and plan[0]["at_s"] > 0


def test_the_load_section_and_digest_name_the_source():
    prompts = timed_prompts([0.0, 1.0, 2.0])
    load = parse_config({"load": {"source": {"format": "mooncake", "path": "t.jsonl", "speedup": 2}}}).load
    sec = load_section(load, prompts)
    assert sec["source"] == {"format": "mooncake", "path": "t.jsonl", "requests": 3, "order": "file",
                             "speedup": 2.0, "period_s": 3.0}
    assert sec["profile"]["kind"] == "open" and sec["profile"]["rate"] is None
    other = timed_prompts([0.0, 1.0, 2.5])
    assert plan_digest(load, prompts) != plan_digest(load, other)   # arrival times are part of the plan


def test_the_workload_line_says_the_trace_sets_the_arrivals():
    load = parse_config({"load": {"source": {"format": "mooncake", "path": "t.jsonl", "speedup": 2},
                                  "profile": {"kind": "open", "max_in_flight": 8}}}).load
    line = workload_line(load_section(load, timed_prompts([0.0, 1.0, 2.0])))
    assert line.startswith("workload: open loop at the trace's timestamps (speedup 2, repeats every 3 s), "
                           "max in flight 8;")
    assert "; source mooncake t.jsonl (3 requests)" in line
    closed = workload_line(load_section(LOAD, source_prompts(SPECS, LOAD)))
    assert "closed loop" in closed and "source openai src.jsonl (4 requests)" in closed

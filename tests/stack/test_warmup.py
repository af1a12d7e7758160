"""The warm-up of a started stack (harness.stack.warmup): what it plans, what it refuses,
and that it sends the plan to a (fake) vLLM and records ``stack_warmed``."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from harness.errors import StackError
from harness.stack.warmup import (LOGPROBS_BATCH, WARMUP_LOGPROBS, WARMUP_MAX_REQUESTS, WARMUP_MAX_TOKENS,
                                  plan_warmup, warm_server, warm_up)
from harness.timeline import Timeline


def test_plan_starts_with_a_logprobs_batch_then_sweeps_concurrency_up_to_max_num_seqs():
    plan = plan_warmup(16, 1024)
    assert plan[0].logprobs == WARMUP_LOGPROBS and plan[0].concurrency == LOGPROBS_BATCH
    assert [b.concurrency for b in plan[1:]] == [1, 2, 4, 8, 16]
    assert all(b.logprobs == 0 for b in plan[1:])
    assert len({n for b in plan for n in b.prompt_tokens}) >= 3          # several prompt lengths
    assert all(n + b.max_tokens <= 1024 for b in plan for n in b.prompt_tokens)


@pytest.mark.parametrize("max_num_seqs", [1, 3, 5, 16, 17, 64, 256, 10_000])
@pytest.mark.parametrize("max_model_len", [WARMUP_MAX_TOKENS + 1, 64, 300, 1024, 32_768])
def test_plan_is_bounded_in_count_and_fits_the_context(max_num_seqs, max_model_len):
    plan = plan_warmup(max_num_seqs, max_model_len)
    assert 1 <= sum(b.concurrency for b in plan) <= WARMUP_MAX_REQUESTS
    assert all(1 <= b.concurrency <= max_num_seqs for b in plan)
    assert all(1 <= n and n + b.max_tokens <= max_model_len for b in plan for n in b.prompt_tokens)
    assert plan[0].logprobs                                                # the one-time compile first
    if max_num_seqs <= 16:                                                 # the sweep reaches the server's widest batch
        assert plan[-1].concurrency == max_num_seqs


def test_plan_refuses_what_cannot_be_sent():
    with pytest.raises(StackError, match="max_model_len"):
        plan_warmup(16, WARMUP_MAX_TOKENS)
    with pytest.raises(StackError, match="max_num_seqs"):
        plan_warmup(0, 1024)
    assert sum(b.concurrency for b in plan_warmup(16, 1024, max_requests=5)) <= 5


@pytest.mark.parametrize("url", ["http://10.0.0.1:8000", "http://example.com:80", "ftp://127.0.0.1:21", "not a url"])
def test_warm_up_refuses_a_non_loopback_server_before_sending_anything(url):
    servers = {"ref": SimpleNamespace(name="ref", base_url="http://127.0.0.1:9", model="m"),
               "spec": SimpleNamespace(name="spec", base_url=url, model="m")}
    timeline = Timeline()
    with pytest.raises(StackError, match="loopback|URL"):
        warm_up(servers, max_num_seqs=4, max_model_len=256, timeline=timeline)
    assert timeline.events == []


def test_warm_up_sends_the_plan_to_each_server_ref_first_and_records_it(fake_vllm):
    spec, ref = fake_vllm(num_speculative_tokens=4), fake_vllm()
    servers = {"spec": SimpleNamespace(name="spec", base_url=spec.base_url, model=spec.served_model_name),
               "ref": SimpleNamespace(name="ref", base_url=ref.base_url, model=ref.served_model_name)}
    timeline = Timeline()
    out = warm_up(servers, max_num_seqs=4, max_model_len=128, timeline=timeline)
    plan = plan_warmup(4, 128)
    events = [e for e in timeline.events if e["event"] == "stack_warmed"]
    assert [e["server"] for e in events] == ["ref", "spec"] and [e["server"] for e in out] == ["ref", "spec"]
    for e in events:
        assert e["source"] == "stack" and e["requests"] == sum(b.concurrency for b in plan)
        assert e["failed"] == 0 and e["skipped"] == 0 and e["seconds"] >= e["first_logprobs_s"] > 0
    for fake in (spec, ref):
        bodies = fake.bodies
        assert len(bodies) == sum(b.concurrency for b in plan)
        assert sorted(len(b["prompt"]) for b in bodies) == sorted(n for b in plan for n in b.prompt_tokens)
        assert sum(1 for b in bodies if b.get("logprobs") == WARMUP_LOGPROBS) == LOGPROBS_BATCH
        assert all(b["temperature"] == 0 and b["stream"] and b["max_tokens"] == WARMUP_MAX_TOKENS for b in bodies)


def test_warm_server_stops_at_its_deadline_and_counts_what_it_skipped(fake_vllm):
    fake = fake_vllm()
    server = SimpleNamespace(name="ref", base_url=fake.base_url, model=fake.served_model_name)
    plan = plan_warmup(4, 128)
    out = warm_server(server, plan, deadline=time.monotonic() - 1)
    assert out["requests"] == 0 and out["skipped"] == sum(b.concurrency for b in plan)
    assert fake.bodies == []


def test_a_failing_warm_up_request_is_counted_not_raised(fake_vllm):
    fake = fake_vllm()
    server = SimpleNamespace(name="ref", base_url=fake.base_url, model="scenario:http500")
    out = warm_server(server, plan_warmup(2, 128), deadline=time.monotonic() + 30)
    assert out["failed"] == out["requests"] > 0

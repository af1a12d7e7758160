"""The workload options of the ``load`` block: prompt-length buckets, sampling classes,
mirror mode — what is accepted, and every bad input as one error naming the field."""

from __future__ import annotations

import json

import pytest

from harness.errors import ExperimentError
from harness.experiment.config import parse_config
from harness.load.client import completion_body
from harness.load.config import DEFAULT_BUCKETS, LoadConfig
from harness.load.prompts import Prompt
from harness.load.records import RequestRecord, is_ref_load, is_spec_load

T07 = {"name": "t07p09", "temperature": 0.7, "top_p": 0.9, "weight": 1}


def bucket(name, lo, hi, n=2):
    return {"name": name, "min_prompt_tokens": lo, "max_prompt_tokens": hi, "count": n}


def error(raw: dict) -> str:
    with pytest.raises(ExperimentError) as ei:
        parse_config(raw)
    return ei.value.one_line()


def test_defaults_are_todays_workload():
    lc = LoadConfig()
    assert [s.name for s in lc.sampling] == ["greedy"] and lc.sampling[0].greedy and not lc.mirror
    assert lc.bucket_names() == ["short", "medium", "long"]
    assert lc.bucket_specs() == [(n, *DEFAULT_BUCKETS[n], c) for n, c in (("short", 12), ("medium", 8), ("long", 4))]
    assert lc.greedy_classes() == {"greedy"}


def test_configured_buckets_and_sampling():
    lc = LoadConfig(buckets=[bucket("tiny", 8, 20), bucket("mid", 100, 140), bucket("xl", 700, 760, 1)],
                    sampling=[{"name": "greedy", "weight": 3}, T07])
    assert lc.bucket_names() == ["tiny", "mid", "xl"]
    assert lc.bucket_specs()[2] == ("xl", 700, 760, 700, 760, 1)
    assert lc.longest_prompt_tokens() == 760
    assert lc.greedy_classes() == {"greedy"}
    assert parse_config({"load": lc.model_dump(), "stack": {"max_model_len": 1024}}).load == lc


@pytest.mark.parametrize("buckets, needle", [
    ([bucket("a", 100, 200), bucket("b", 50, 90)], "load.buckets: buckets must be in increasing order"),
    ([bucket("a", 10, 100), bucket("b", 100, 200)], "[1] b (100..200 tokens) starts at or below the end of [0] a"),
    ([bucket("a", 10, 20), bucket("a", 30, 40)], "load.buckets: bucket name 'a' is used twice"),
    ([bucket("a", 30, 20)], "load.buckets.0: max_prompt_tokens 20 < min_prompt_tokens 30"),
    ([bucket("a b", 10, 20)], "load.buckets.0.name"),
    ([bucket("a", 10, 20, -1)], "load.buckets.0.count"),
    ([], "load.buckets: needs at least one bucket"),
])
def test_bad_buckets(buckets, needle):
    assert needle in error({"load": {"buckets": buckets}})


def test_buckets_replace_the_legacy_counts():
    msg = error({"load": {"buckets": [bucket("a", 10, 20)], "short_prompts": 3}})
    assert "load: buckets replaces short_prompts" in msg


def test_buckets_must_fit_max_model_len():
    msg = error({"load": {"buckets": [bucket("huge", 900, 1000)], "max_tokens": 32}, "stack": {"max_model_len": 1024}})
    assert "load.buckets: the longest prompts (1000 tokens) plus load.max_tokens (32) exceed stack.max_model_len" in msg
    # an empty bucket asks for nothing
    parse_config({"load": {"buckets": [bucket("a", 10, 20), bucket("huge", 900, 1000, 0)]}})


@pytest.mark.parametrize("sampling, needle", [
    ([{"name": "g"}, {"name": "g", "temperature": 1}], "load.sampling: sampling class name 'g' is used twice"),
    ([{"name": "g", "weight": 0}], "load.sampling.0.weight"),
    ([{"name": "g", "temperature": -0.1}], "load.sampling.0.temperature"),
    ([{"name": "g", "top_p": 0}], "load.sampling.0.top_p"),
    ([{"name": "g", "top_p": 1.5}], "load.sampling.0.top_p"),
    ([{"name": "g", "top_k": 5}], "load.sampling.0.top_k"),
    ([], "load.sampling"),
])
def test_bad_sampling(sampling, needle):
    assert needle in error({"load": {"sampling": sampling}})


def test_mirror_needs_the_reference_server():
    msg = error({"load": {"mirror": True}, "stack": {"reference": False}, "integrity": {"min_compared": 0}})
    assert "load.mirror needs the reference server" in msg
    assert parse_config({"load": {"mirror": True}}).load.mirror


def test_completion_body_carries_the_sampling_class():
    p = Prompt(0, "short", "hello", 4, 8)
    greedy = completion_body(p, "m")
    assert greedy["temperature"] == 0 and "top_p" not in greedy
    lc = LoadConfig(sampling=[T07, {"name": "t1", "temperature": 1.0}])
    sampled = completion_body(p, "m", sampling=lc.sampling[0])
    assert sampled["temperature"] == 0.7 and sampled["top_p"] == 0.9 and sampled["stream"] is True
    assert completion_body(p, "m", sampling=lc.sampling[1])["temperature"] == 1.0
    assert "top_p" not in completion_body(p, "m", sampling=lc.sampling[1])


def test_records_without_server_and_sampling_read_as_spec_greedy():
    old = {"request_id": "x", "source": "load", "prompt_class": "short"}
    r = RequestRecord.from_dict(old)
    assert (r.server, r.sampling) == ("spec", "greedy") and is_spec_load(r) and not is_ref_load(r)
    new = RequestRecord.from_dict(json.loads(RequestRecord("y", server="ref", sampling="t07p09").to_json()))
    assert (new.server, new.sampling) == ("ref", "t07p09") and is_ref_load(new) and not is_spec_load(new)
    assert not is_spec_load(RequestRecord("z", source="reference"))


def test_a_bucket_may_ask_for_its_own_output_length():
    lc = LoadConfig(buckets=[bucket("a", 10, 20), {**bucket("b", 100, 200), "max_tokens": 128}], max_tokens=16)
    assert lc.bucket_max_tokens() == {"a": 16, "b": 128}
    assert lc.longest_request_tokens() == ("b", 200, 128)
    msg = error({"load": {"buckets": [{**bucket("huge", 800, 900), "max_tokens": 200}]}, "stack": {"max_model_len": 1024}})
    assert "the longest prompts (900 tokens) plus its max_tokens (200) exceed stack.max_model_len (1024) in bucket huge" \
        in msg
    assert "load.buckets.0.max_tokens" in error({"load": {"buckets": [{**bucket("a", 10, 20), "max_tokens": 0}]}})


def test_the_default_profile_is_todays_closed_loop():
    lc = LoadConfig(users=6)
    assert lc.profile.kind == "closed" and lc.closed_users() == 6 and lc.profile.ramp is None
    assert parse_config({"load": lc.model_dump()}).load == lc   # a dumped config (config.json) parses again
    op = LoadConfig(profile={"kind": "open", "rate": 3, "burstiness": 0.5, "ramp": {"from_rate": 0, "duration_s": 5},
                             "steps": [{"at_s": 10, "rate": 6}]})
    assert parse_config({"load": op.model_dump()}).load == op


@pytest.mark.parametrize("profile, needle", [
    ({"kind": "open", "rate": 5, "burst": 2}, "load.profile.burst: unknown field 'burst'"),
    ({"kind": "open", "rate": 0}, "load.profile.rate: Input should be greater than 0"),
    ({"kind": "open", "rate": -3}, "load.profile.rate: Input should be greater than 0"),
    ({"kind": "open"}, "load: an open-loop profile needs rate"),
    ({"kind": "open", "rate": 2, "burstiness": 0}, "load.profile.burstiness: Input should be greater than 0"),
    ({"kind": "open", "rate": 2, "max_in_flight": 0}, "load.profile.max_in_flight"),
    ({"kind": "poisson", "rate": 2}, "load.profile.kind"),
    ({"kind": "closed", "rate": 2}, "load.profile: rate belong(s) to the other kind of profile"),
    ({"kind": "closed", "burstiness": 2}, "load.profile: burstiness belong(s) to the other kind"),
    ({"kind": "open", "rate": 2, "users": 3}, "load.profile: users belong(s) to the other kind"),
    ({"kind": "open", "rate": 2, "ramp": {"from_users": 1, "duration_s": 5}}, "ramp of a open-loop profile needs from_rate"),
    ({"ramp": {"from_users": 1}}, "load.profile.ramp.duration_s"),
    ({"ramp": {"from_users": 1, "duration_s": 0}}, "load.profile.ramp.duration_s"),
    ({"steps": [{"at_s": 5, "rate": 3}]}, "steps[0] of a closed-loop profile needs users"),
    ({"steps": [{"at_s": 5, "users": 3}, {"at_s": 5, "users": 4}]}, "steps[1].at_s 5 must be after"),
    ({"ramp": {"from_users": 1, "duration_s": 10}, "steps": [{"at_s": 5, "users": 3}]}, "steps[0].at_s 5 must be after"),
    ({"steps": [{"at_s": 5, "users": 3, "spawn": 1}]}, "load.profile.steps.0.spawn: unknown field 'spawn'"),
])
def test_bad_profiles(profile, needle):
    assert needle in error({"load": {"profile": profile}})


@pytest.mark.parametrize("retry, needle", [
    ({"max_retries": -1}, "load.retry.max_retries"),
    ({"jitter": "equal"}, "load.retry.jitter"),
    ({"initial_s": 2, "max_s": 1}, "load.retry: max_s 1 < initial_s 2"),
    ({"tries": 3}, "load.retry.tries: unknown field 'tries'"),
])
def test_bad_retry_policies(retry, needle):
    assert needle in error({"load": {"retry": retry}})


def test_source_block_accepted():
    load = LoadConfig(source={"format": "mooncake", "path": "sources/t.jsonl", "speedup": 4, "limit": 10})
    assert (load.source.format, load.source.speedup, load.source.limit) == ("mooncake", 4.0, 10)
    assert load.source.order == "file" and load.source.max_tokens is None
    assert LoadConfig(source={"format": "openai", "path": "a", "order": "shuffled"}).source.order == "shuffled"


@pytest.mark.parametrize("source, extra, needle", [
    ({"format": "csv", "path": "a"}, {}, "load.source.format"),
    ({"format": "mooncake", "path": "a", "speedup": 0}, {}, "load.source.speedup"),
    ({"format": "openai", "path": "a", "colour": 1}, {}, "load.source.colour"),
    ({"format": "openai", "path": "a"}, {"short_prompts": 3}, "remove short_prompts"),
    ({"format": "openai", "path": "a"}, {"long_prompts": 0}, "remove long_prompts"),
    ({"format": "mooncake", "path": "a", "order": "shuffled"}, {}, "order must be file"),
    ({"format": "openai", "path": "a"},
     {"request_classes": [{"name": "x", "weight": 1, "endpoint": "completions", "body": {}}]},
     "remove request_classes"),
])
def test_bad_source_block(source, extra, needle):
    msg = error({"load": {"source": source, **extra}})
    assert needle in msg and "\n" not in msg


def test_a_trace_implies_the_open_loop():
    load = LoadConfig(source={"format": "mooncake", "path": "t.jsonl"})
    assert load.profile.kind == "open" and load.profile.rate is None
    assert parse_config({"load": load.model_dump()}).load == load   # config.json parses again
    mif = LoadConfig(source={"format": "mooncake", "path": "t.jsonl"}, profile={"kind": "open", "max_in_flight": 8})
    assert mif.profile.max_in_flight == 8 and mif.profile.rate is None
    # an untimed source keeps the profile it is given (default: closed loop)
    assert LoadConfig(source={"format": "openai", "path": "a"}).profile.kind == "closed"


@pytest.mark.parametrize("profile, needle", [
    ({"kind": "closed"}, "kind: closed contradicts it"),
    ({"kind": "closed", "users": 4}, "kind: closed contradicts it"),
    ({"kind": "open", "rate": 3}, "profile.rate contradicts it"),
    ({"kind": "open", "burstiness": 2}, "profile.burstiness contradicts it"),
    ({"kind": "open", "steps": [{"at_s": 5, "rate": 3}]}, "profile.steps contradicts it"),
])
def test_a_profile_contradicting_the_trace_is_refused(profile, needle):
    msg = error({"load": {"source": {"format": "mooncake", "path": "t.jsonl"}, "profile": profile}})
    assert "load: a mooncake trace is replayed open loop" in msg and needle in msg and "\n" not in msg


def test_an_untimed_source_needs_a_rate_for_the_open_loop():
    msg = error({"load": {"source": {"format": "openai", "path": "a"}, "profile": {"kind": "open"}}})
    assert "an open-loop profile needs rate" in msg and "only a timed source" in msg

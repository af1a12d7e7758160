"""Content categories of a traffic source: each record's ``category`` (or the field
``load.source.category_field`` names) becomes its requests' class, is never sent, and a bad
one is a bad line; acceptance is then reported per category and per category × bucket, and
a floor per category is judged (and can fail)."""

from __future__ import annotations

import json

import pytest

from harness.checks import acceptance_floor
from harness.errors import SourceError
from harness.load.client import SOURCE_CLASS
from harness.load.config import LoadConfig
from harness.load.prompts import load_prompt_set, save_prompt_set
from harness.load.source_prep import source_prompts
from harness.load.sources import read_openai_requests, read_sharegpt, read_vllm_custom
from tests.checks.test_acceptance_floor import BAD, HEALTHY, load, names, run_of


def lines(tmp_path, name, objs):
    p = tmp_path / name
    p.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return p


def test_openai_lines_and_batch_lines_carry_their_category_out_of_the_body(tmp_path):
    p = lines(tmp_path, "o.jsonl", [
        {"prompt": "def f():", "category": "code"},
        {"custom_id": "1", "url": "/v1/chat/completions", "category": "chat",
         "body": {"messages": [{"role": "user", "content": "hi"}]}},
        {"url": "/v1/completions", "body": {"prompt": "{\"a\":", "category": "json"}},
        {"prompt": "plain text"}])
    specs = read_openai_requests(p)
    assert [s.category for s in specs] == ["code", "chat", "json", None]
    assert all("category" not in s.body for s in specs)


def test_sharegpt_and_vllm_custom_categories_and_a_custom_field(tmp_path):
    conv = {"id": "c1", "domain": "prose", "conversations": [{"from": "human", "value": "a"},
                                                              {"from": "gpt", "value": "b"},
                                                              {"from": "human", "value": "c"}]}
    specs = read_sharegpt(lines(tmp_path, "s.jsonl", [conv]), category_field="domain")
    assert [s.category for s in specs] == ["prose", "prose"] and all("domain" not in s.body for s in specs)
    specs = read_vllm_custom(lines(tmp_path, "v.jsonl", [{"prompt": "x", "category": "code"}, {"prompt": "y"}]))
    assert [s.category for s in specs] == ["code", None]


def test_a_bad_category_is_a_bad_line(tmp_path):
    p = lines(tmp_path, "o.jsonl", [{"prompt": "a", "category": "has space"}, {"prompt": "b", "category": 3}])
    with pytest.raises(SourceError) as exc:
        read_openai_requests(p)
    assert "2 bad lines" in exc.value.message
    assert exc.value.details[0].startswith(f"{p}:1: category 'has space' is not a category name")
    assert exc.value.details[1].startswith(f"{p}:2: category 3 is not a category name")


def test_the_category_survives_the_prompt_set_and_names_the_request_class(tmp_path):
    p = lines(tmp_path, "o.jsonl", [{"prompt": "def f():", "category": "code"}, {"prompt": "plain"}])
    specs = [s.__class__(**{**s.__dict__, "prompt_tokens": 5, "prompt_class": "1-16"}) for s in read_openai_requests(p)]
    prompts = source_prompts(specs, LoadConfig(source={"format": "openai", "path": str(p)}))
    save_prompt_set(tmp_path / "prompts.json", prompts)
    back = load_prompt_set(tmp_path / "prompts.json")
    assert [q.category for q in back] == ["code", None]
    assert [q.category or SOURCE_CLASS for q in back] == ["code", "source"]   # the records' request_class


def categorised(cls, steps, bucket="short"):
    recs = load({bucket: steps})
    for r in recs:
        r.request_class = cls
    return recs


def test_acceptance_per_category_and_bucket_and_a_floor_per_category():
    recs = categorised("code", HEALTHY) + categorised("chat", BAD) + categorised("chat", HEALTHY, bucket="long")
    run = run_of(recs, acceptance_floor={"request_classes": {"code": 0.8, "chat": 0.8}},
                 load={"source": {"format": "openai", "path": "x.jsonl"}})
    checks = acceptance_floor.check(run)
    by = {c.name: c for c in checks}
    assert by["acceptance_floor.baseline.class.code"].passed is True
    assert by["acceptance_floor.baseline.class.chat"].passed is False   # short chat accepts nothing
    assert by["acceptance_floor.after.class.chat"].passed is False
    sec = acceptance_floor.section(run)
    cb = sec["request_class_buckets"]
    assert cb["chat"]["short"]["greedy"]["acceptance_rate"] == 0.0
    assert cb["chat"]["long"]["greedy"]["acceptance_rate"] == 1.0
    assert cb["code"]["short"]["greedy"]["acceptance_rate"] == 1.0


def test_a_category_floor_without_its_requests_is_not_judged():
    run = run_of(categorised("code", HEALTHY), acceptance_floor={"request_classes": {"prose": 0.5}},
                 load={"source": {"format": "openai", "path": "x.jsonl"}})
    prose = [c for c in acceptance_floor.check(run) if ".class." in c.name]
    assert prose and all(c.passed is None and "no complete greedy request of class 'prose'" in c.detail
                         for c in prose)
    assert names(acceptance_floor.check(run), passed=True)   # the bucket floors are still judged

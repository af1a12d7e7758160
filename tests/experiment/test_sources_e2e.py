"""Traffic sources (``load.source``) through the whole experiment path on the fake vLLM
(see :mod:`tests.experiment.fast_e2e`: the real supervisor, a real locust process, a
worker kill): the load sends the source's requests, records them with their ``FILE:LINE``
origin and measured bucket, and compares the deterministic ones with the reference; a
Mooncake trace is sent open loop at its own (sped-up) timestamps."""

from __future__ import annotations

import json
import shutil
import statistics
import time
from pathlib import Path

import pytest
import yaml

from harness.experiment.runner import run
from harness.load.config import source_buckets
from harness.load.prompts import load_prompt_set
from harness.metrics.mirror import ALL
from harness.load.records import read_records
from tests.experiment.fast_e2e import ROOT, fast_experiment

pytestmark = pytest.mark.timeout(300)

#: The fast settings' generated prompt counts are replaced by the source.
COUNTS = ("short_prompts", "medium_prompts", "long_prompts")


def run_source(tmp: Path, name: str, source: dict, **config) -> tuple[int, dict, Path]:
    """:func:`fast_experiment` with ``load.source`` (its path taken in ``tmp``) instead of
    the generated prompt counts; run in this process."""
    source = {**source, "path": str(tmp / source["path"])}   # (a relative path is the working directory's)
    # a sparse open loop on the fast fake often has nothing in flight at the kill: fail_fast would
    # be not judged by timing, and these runs exist for the source's replay, not for fail-fast
    config.setdefault("judge", {"optional": ["fail_fast"]})
    path = fast_experiment(tmp, name, load={"source": source, **config.pop("load", {})}, **config)
    doc = yaml.safe_load(path.read_text())
    load = doc["configuration"]["specchaos"]["load"]
    for k in COUNTS:
        load.pop(k, None)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    t0 = time.monotonic()
    code, report = run(path, tmp / f"{name}-out")
    print(f"{name}: {time.monotonic() - t0:.1f} s, verdict {report['verdict']}")
    return code, report, tmp / f"{name}-out"


def load_records(out: Path):
    return [r for r in read_records(out / "records.jsonl") if r.source == "load"]


def assert_passed(code: int, rep: dict) -> None:
    failed = [(c["name"], c["detail"]) for c in rep["checks"] if c["passed"] is False]
    assert code == 0 and rep["verdict"] == "pass", (rep["errors"], failed)


def test_an_openai_source_is_sent_line_by_line_with_origins_and_buckets(tmp_path):
    src = tmp_path / "requests.jsonl"
    shutil.copy(ROOT / "experiments" / "sources" / "requests.jsonl", src)
    lines = [json.loads(x) for x in src.read_text().splitlines() if x.strip()]
    code, rep, out = run_source(tmp_path, "openai", {"format": "openai", "path": "requests.jsonl"})
    assert_passed(code, rep)

    prompts = load_prompt_set(out / "prompts.json")
    assert [p.body for p in prompts] == lines   # the file's bodies, in file order
    assert [p.origin for p in prompts] == [f"{src}:{i}" for i in range(1, len(lines) + 1)]
    recs = load_records(out)
    assert len(recs) >= 2 * len(lines)   # the users wrapped around the source
    assert {r.origin for r in recs} == {p.origin for p in prompts}   # every line was sent
    for r in recs:
        line = lines[int(r.origin.rsplit(":", 1)[1]) - 1]
        p = prompts[r.prompt_id]
        assert r.origin == p.origin and r.prompt_class == p.prompt_class and r.request_class == "source"
        assert r.endpoint == ("chat" if "messages" in line else "completions")
        assert r.max_tokens == line["max_tokens"]
        assert r.sampling == ("greedy" if line["temperature"] == 0 else "source-sampled")
    assert {r.endpoint for r in recs} == {"chat", "completions"}

    # the deterministic lines are compared with the reference, the sampled ones are not
    refs = {r.prompt_id for r in read_records(out / "reference.jsonl")}
    assert refs == {p.prompt_id for p in prompts if p.body.get("temperature") == 0}
    integ = rep["integrity"]
    assert integ["compared"] >= 10 and integ["mismatched"] == 0
    assert integ["not_comparable"] == sum(1 for r in recs if r.ok and r.sampling == "source-sampled") > 0
    assert rep["load"]["source"]["requests"] == len(lines) and rep["load"]["source"]["format"] == "openai"


SHAREGPT = [
    {"id": "c1", "conversations": [
        {"from": "human", "value": "Tell me about rivers and the sea, in a few words please."},
        {"from": "gpt", "value": "Rivers run to the sea."},
        {"from": "human", "value": "And what about mountains and the snow on their tops?"}]},
    {"id": "c2", "conversations": [
        {"from": "system", "value": "You are brief."},
        {"from": "human", "value": "Name a city by a river, and say why it is there at all."}]},
    {"id": "c3", "conversations": [
        {"from": "human", "value": "What is a bridge for, in one or two sentences of plain words?"}]},
]


#: Buckets by measured length (tokens with the chat template): a first turn, a later one.
BUCKETS = [{"name": "turn", "min_prompt_tokens": 8, "max_prompt_tokens": 60, "count": 0},
           {"name": "later", "min_prompt_tokens": 61, "max_prompt_tokens": 400, "count": 0}]


def test_a_sharegpt_source_under_an_open_loop_rate_is_walked_in_order(tmp_path):
    (tmp_path / "chats.json").write_text(json.dumps(SHAREGPT, indent=1))
    code, rep, out = run_source(tmp_path, "sharegpt", {"format": "sharegpt", "path": "chats.json", "max_tokens": 12},
                                load={"profile": {"kind": "open", "rate": 8}, "buckets": BUCKETS})
    assert_passed(code, rep)
    prompts = load_prompt_set(out / "prompts.json")
    assert [(p.endpoint, len(p.body["messages"])) for p in prompts] == [("chat", 1), ("chat", 3), ("chat", 2),
                                                                        ("chat", 1)]
    assert prompts[1].body["messages"][1] == {"role": "assistant", "content": "Rivers run to the sea."}
    # measured with the chat template: the second turn carries the first, a longer prompt
    assert prompts[1].prompt_tokens > prompts[0].prompt_tokens + 10
    assert [p.prompt_class for p in prompts] == ["turn", "later", "turn", "turn"]
    recs = sorted((r for r in load_records(out) if r.attempt == 1), key=lambda r: r.send_time)
    assert {r.endpoint for r in recs} == {"chat"} and {r.max_tokens for r in recs} == {12}
    assert all(r.prompt_class == prompts[r.prompt_id].prompt_class for r in recs)
    # one walk in the source's order: arrival i sends request i % 4
    ids = [r.prompt_id for r in recs]
    in_order = sum((b - a) % len(prompts) == 1 for a, b in zip(ids, ids[1:]))
    assert ids[0] == 0 and in_order >= 0.9 * (len(ids) - 1), ids[:40]
    assert rep["integrity"]["compared"] >= 10 and rep["integrity"]["mismatched"] == 0


#: Timestamps (ms) with a distinctive rhythm; at speedup 4: arrivals 0, 0.05, 0.25, 0.3, 0.6 s,
#: the trace repeating every 0.75 s (its 0.6 s span plus its 0.15 s mean gap): about 6.7
#: requests/s, enough for the short fault phase of a kill on the fake to hold a few.
TRACE_MS = [0, 200, 1000, 1200, 2400]
TRACE_LEN = [40, 48, 128, 30, 50]
SPEEDUP = 4.0
#: the derived buckets' names (a source without load.buckets), and the pooled row's
BUCKET_NAMES = {b[0] for b in source_buckets()} | {ALL}
PERIOD_S = 0.75


def test_a_mooncake_trace_is_replayed_open_loop_at_its_timestamps(tmp_path):
    (tmp_path / "trace.jsonl").write_text("".join(
        json.dumps({"timestamp": t, "input_length": n, "output_length": 8, "hash_ids": [i % 2]}) + "\n"
        for i, (t, n) in enumerate(zip(TRACE_MS, TRACE_LEN))))
    code, rep, out = run_source(tmp_path, "trace", {"format": "mooncake", "path": "trace.jsonl", "speedup": SPEEDUP})
    print("requests per phase:", {ph: v.get("requests") for ph, v in rep["phases"].items()})
    assert_passed(code, rep)
    assert rep["load"]["profile"]["kind"] == "open" and rep["load"]["source"]["period_s"] == pytest.approx(PERIOD_S)
    prompts = load_prompt_set(out / "prompts.json")
    # no load.buckets: bucketed by the power-of-two range of each measured length
    assert [p.prompt_class for p in prompts] == [next(f"{lo}-{hi}" for _n, lo, hi, *_ in source_buckets()
                                                      if lo <= n <= hi) for n in TRACE_LEN]
    assert [p.arrival_s for p in prompts] == pytest.approx([t / 1000 / SPEEDUP for t in TRACE_MS])

    recs = sorted((r for r in load_records(out) if r.attempt == 1), key=lambda r: r.send_time)
    ids = [r.prompt_id for r in recs]
    n = len(TRACE_MS)
    assert ids[0] == 0 and all((b - a) % n == 1 for a, b in zip(ids, ids[1:])), ids[:40]   # trace order, wrapping
    # the gaps between sends follow the trace's gaps (divided by the speed-up), however
    # long the responses took (the kill's included): open loop
    expected = {i: ((TRACE_MS[(i + 1) % n] - TRACE_MS[i]) / 1000 / SPEEDUP if i + 1 < n
                    else PERIOD_S - TRACE_MS[-1] / 1000 / SPEEDUP) for i in range(n)}
    errors = [abs((b.send_time - a.send_time) - expected[a.prompt_id]) for a, b in zip(recs, recs[1:])]
    assert len(errors) >= 3 * n
    assert statistics.median(errors) < 0.02 and sum(e < 0.06 for e in errors) >= 0.9 * len(errors), \
        sorted(errors)[-10:]
    # about n requests per period over the whole load
    span = recs[-1].send_time - recs[0].send_time
    assert (len(recs) - 1) / span == pytest.approx(n / PERIOD_S, rel=0.1)
    assert {r.origin for r in recs} == {f"{tmp_path / 'trace.jsonl'}:{i}" for i in range(1, n + 1)}
    assert rep["integrity"]["compared"] >= 10 and rep["integrity"]["mismatched"] == 0


def test_a_vllm_custom_source_in_mirror_mode_sends_each_request_to_both_servers(tmp_path):
    words = "river stone bridge light water garden tower road field market".split()
    lines = [{"prompt": " ".join(words[i:] + words[:i]) + " and more words to say here", "output_tokens": 6 + i}
             for i in range(6)]
    (tmp_path / "custom.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    code, rep, out = run_source(tmp_path, "custom", {"format": "vllm-custom", "path": "custom.jsonl", "chat": True},
                                load={"users": 4, "mirror": True}, mirror={"min_requests": 3})
    assert_passed(code, rep)
    recs = [r for r in read_records(out / "records.jsonl") if r.source == "load"]
    spec = [r for r in recs if r.server == "spec"]
    ref = [r for r in recs if r.server == "ref"]
    assert spec and ref
    for side in (spec, ref):   # the same source requests on both sides, with their origins
        assert {r.origin for r in side} == {f"{tmp_path / 'custom.jsonl'}:{i}" for i in range(1, 7)}
        assert {r.endpoint for r in side} == {"chat"}
        assert all(r.max_tokens == lines[r.prompt_id]["output_tokens"] for r in side)
    # the mirror comparison groups them by measured bucket, as generated prompts
    judged = [g for g in rep["mirror"]["groups"] if g["judged"]]
    assert {g["sampling"] for g in judged} == {"greedy"} and all(g["bucket"] in BUCKET_NAMES for g in judged)
    assert all(g["spec"]["complete"] >= 3 and g["ref"]["complete"] >= 3 for g in judged)

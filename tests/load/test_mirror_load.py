"""Mirror mode and sampling classes in the real locust process, against two fake vLLM
servers (a speculative one and a plain one): the same request goes to both, the side that
goes first alternates, every record says its server and sampling class, and the servers
receive each class's sampling parameters."""

from __future__ import annotations

import time
from collections import Counter

import httpx
import pytest

from harness.errors import LoadError
from harness.load.config import LoadConfig
from harness.load.locust_process import LocustProcess
from harness.load.prompts import Prompt, save_prompt_set
from harness.load.records import read_records
from tests.fakes import run_fake

PROMPTS = [Prompt(i, ("short", "long")[i % 2], f"mirror prompt {i}", 4, 6) for i in range(6)]
SAMPLING = [{"name": "greedy", "weight": 3}, {"name": "t07p09", "temperature": 0.7, "top_p": 0.9, "weight": 1}]


def wait_for(pred, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.2)
    return pred()


def test_mirror_sends_each_request_to_both_servers_interleaved(tmp_path):
    save_prompt_set(tmp_path / "prompts.json", PROMPTS)
    cfg = LoadConfig(users=2, spawn_rate=50, request_timeout_s=10, seed=7, sampling=SAMPLING, mirror=True)
    with run_fake(num_speculative_tokens=4) as spec, run_fake() as ref:
        lp = LocustProcess(spec.base_url, prompts_path=tmp_path / "prompts.json", records_path=tmp_path / "r.jsonl",
                           model="fake", cfg=cfg, run_time_s=30, log_path=tmp_path / "locust.log",
                           mirror_url=ref.base_url, mirror_model="fake")
        lp.start()
        try:
            assert wait_for(lambda: len(read_records(lp.records_path)) >= 60, 40), (tmp_path / "locust.log").read_text()
        finally:
            assert lp.stop() == 0
        bodies = {name: httpx.get(f"{srv.base_url}/fake/requests").json()["bodies"]
                  for name, srv in (("spec", spec), ("ref", ref))}
    recs = read_records(lp.records_path)
    assert all(r.ok for r in recs), [(r.error, r.error_detail) for r in recs if not r.ok][:3]
    assert Counter(r.server for r in recs).keys() == {"spec", "ref"}
    for user in (0, 1):
        mine = sorted((r for r in recs if r.user_id == user), key=lambda r: r.send_time)
        pairs = [mine[i:i + 2] for i in range(0, len(mine) - 1, 2)]
        assert len(pairs) >= 8
        for a, b in pairs:   # the same request, once to each server
            assert (a.prompt_id, a.sampling) == (b.prompt_id, b.sampling) and {a.server, b.server} == {"spec", "ref"}
            if a.sampling == "greedy":   # the fake's greedy output depends only on the prompt
                assert a.token_ids == b.token_ids
        firsts = [a.server for a, _ in pairs]
        # the first side alternates step by step; user 1 starts on the other side
        assert firsts[:4] == (["spec", "ref"] * 2 if user == 0 else ["ref", "spec"] * 2)
    # speculation shows: the spec server bundles greedy tokens, the plain one never does
    assert max(n for r in recs if r.server == "spec" and r.sampling == "greedy" for n in r.chunk_tokens) > 1
    assert {n for r in recs if r.server == "ref" for n in r.chunk_tokens} == {1}
    mix = Counter(r.sampling for r in recs if r.server == "spec")
    assert set(mix) == {"greedy", "t07p09"} and mix["greedy"] > mix["t07p09"]
    for b in bodies["spec"] + bodies["ref"]:
        assert (b["temperature"], b.get("top_p")) in ((0, None), (0.7, 0.9))
    assert len(bodies["spec"]) >= 30 and len(bodies["ref"]) >= 30
    log = (tmp_path / "locust.log").read_text()
    assert "/v1/completions [short] [ref]" in log


def test_mirror_host_must_be_loopback(tmp_path):
    with pytest.raises(LoadError, match="non-loopback") as ei:
        LocustProcess("http://127.0.0.1:1", prompts_path=tmp_path / "p.json", records_path=tmp_path / "r.jsonl",
                      model="m", cfg=LoadConfig(mirror=True), run_time_s=5, log_path=tmp_path / "l.log",
                      mirror_url="http://10.1.2.3:8000")
    assert ei.value.where == "mirror host"

"""Distributed load against the real vLLM stack (tiny models, CPU): two locust workers'
merged records agree with what vLLM itself counted (``vllm:request_success_total`` on its
``/metrics``), nothing lost or counted twice, the request bound held across workers."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import psutil
import pytest

from harness.load.config import LoadConfig
from harness.load.locust_process import LocustProcess
from harness.load.prompts import build_prompt_set, save_prompt_set
from harness.load.records import read_records, worker_record_files

pytestmark = pytest.mark.stack

ROOT = Path(__file__).resolve().parents[2]


def success_by_reason(base_url: str) -> dict[str, float]:
    """``vllm:request_success_total`` summed per ``finished_reason`` label."""
    out: dict[str, float] = {}
    for ln in httpx.get(f"{base_url}/metrics", timeout=10).text.splitlines():
        if ln.startswith("vllm:request_success_total{"):
            reason = ln.split('finished_reason="', 1)[1].split('"', 1)[0]
            out[reason] = out.get(reason, 0.0) + float(ln.rsplit(" ", 1)[1])
    return out


@pytest.mark.nightly   # make test runs two workers end to end on the fake (tests/load/test_distributed_load.py)
def test_two_workers_count_what_vllm_counted(real_stack, tmp_path):
    spec = real_stack.stack.servers["spec"]
    prompts = build_prompt_set(ROOT / "models" / "target", seed=7, short=4, medium=2, long=1, max_tokens=16)
    save_prompt_set(tmp_path / "prompts.json", prompts)
    before = success_by_reason(spec.base_url)
    lp = LocustProcess(spec.base_url, prompts_path=tmp_path / "prompts.json", records_path=tmp_path / "records.jsonl",
                       model=spec.model, cfg=LoadConfig(users=4, workers=2, spawn_rate=50, max_requests=60,
                                                        request_timeout_s=60),
                       run_time_s=120, log_path=tmp_path / "locust.log", stop_timeout_s=30)
    t0 = time.monotonic()
    lp.start()
    try:
        end = time.monotonic() + 150
        while lp.is_running() and time.monotonic() < end:
            time.sleep(0.5)
        assert not lp.is_running(), "the master should quit once a worker used up its share of max_requests"
    finally:
        lp.stop(timeout_s=40)
    wall_s = time.monotonic() - t0
    assert all(not psutil.pid_exists(p) or psutil.Process(p).status() == psutil.STATUS_ZOMBIE for p in lp.pids)
    time.sleep(1.0)   # vLLM updates its counters after the last response
    after = success_by_reason(spec.base_url)
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    recs = read_records(tmp_path / "records.jsonl")
    ok = [r for r in recs if r.ok]
    print(f"2 workers: {len(recs)} records ({len(ok)} ok) in {wall_s:.1f} s; vLLM counted {delta}")
    assert len(worker_record_files(tmp_path / "records.jsonl")) == 2
    assert len({r.request_id for r in recs}) == len(recs)            # nothing counted twice
    assert {r.user_id for r in recs} == {0, 1, 2, 3}
    assert 30 <= len(recs) <= 60                                       # the bound held across workers
    assert len(ok) == delta.get("stop", 0) + delta.get("length", 0)    # nothing lost: vLLM's own count
    assert len(recs) - len(ok) == sum(v for k, v in delta.items() if k not in ("stop", "length"))

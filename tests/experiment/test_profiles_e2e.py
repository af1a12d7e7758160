"""A workload profile and the retry policy through the whole experiment path on the fake
vLLM (see :mod:`tests.experiment.fast_e2e`): an open loop at 16 requests/s sends about 16
per second, a SIGKILL of the worker makes the load retry (tries sharing a logical_id),
and report.json states the profile, the effective retry policy and the plan digest."""

from __future__ import annotations

import io
import json
from collections import defaultdict

import pytest
from rich.console import Console

from harness.load.records import read_records
from harness.report.summary import render_summary
from tests.experiment.fast_e2e import run_fast

pytestmark = pytest.mark.timeout(240)

RATE = 16.0


def test_open_loop_kill_and_retries_end_to_end(tmp_path):
    code, rep, seconds, out = run_fast(
        tmp_path, "open", load={"profile": {"kind": "open", "rate": RATE}, "seed": 21, "max_tokens": 80, "ignore_eos": True,
                                "retry": {"max_retries": 3, "initial_s": 0.2, "max_s": 1.0}})
    print(f"open-loop fast run: {seconds:.1f} s, verdict {rep['verdict']}")
    failed = [(c["name"], c["detail"]) for c in rep["checks"] if not c["passed"]]
    # 80 tokens (no EOS) take the fake ~0.5 s (16 steps of 30 ms; 0.15 s requests left: one
    # request in flight on average, none at the kill a third of the time, which fail_fast
    # rightly cannot judge)
    assert code == 0 and rep["verdict"] == "pass", (rep["errors"], failed)
    load = rep["load"]
    assert load["profile"]["kind"] == "open" and load["profile"]["rate"] == RATE
    assert load["retry"]["max_retries"] == 3 and load["retry"]["waits_s"] == [0.2, 0.4, 0.8]
    assert len(load["plan_digest"]) == 64 and load["seed"] == 21
    assert load["open_loop"]["dropped"] == 0 and load["open_loop"]["arrivals"] > 0
    assert json.loads((out / "run.json").read_text())["load"]["plan_digest"] == load["plan_digest"]

    recs = [r for r in read_records(out / "records.jsonl") if r.source == "load"]
    firsts = sorted(r.send_time for r in recs if r.attempt == 1)
    rate = (len(firsts) - 1) / (firsts[-1] - firsts[0])
    print(f"open loop: {len(firsts)} arrivals sent, {rate:.2f} req/s (asked {RATE})")
    assert 0.75 * RATE <= rate <= 1.25 * RATE

    tries: dict[str, list] = defaultdict(list)
    for r in sorted(recs, key=lambda r: r.send_time):
        tries[r.logical_id].append(r)
    retried = [t for t in tries.values() if len(t) > 1]
    assert retried, "the kill should have made the load retry"
    for t in retried:
        assert [r.attempt for r in t] == list(range(1, len(t) + 1)) and len(t) <= 4
        assert len({(r.prompt_id, r.sampling, r.max_tokens) for r in t}) == 1
    print(f"retried logical requests: {len(retried)}, of which recovered: {sum(t[-1].ok for t in retried)}")

    con = Console(file=io.StringIO(), width=200, record=True, color_system=None)
    con.print(render_summary(rep))
    assert f"workload: open loop {RATE:g} req/s" in con.export_text()


def test_concurrency_steps_are_reported_per_step_end_to_end(tmp_path):
    """Issue 20, per-step figures: a closed loop stepping from 1 to 4 users; report.json's
    ``steps`` has one entry per level with that level's requests only, and 4 users complete
    more requests per second than 1 on the fake (its engine batches)."""
    code, rep, seconds, out = run_fast(
        tmp_path, "steps", load={"profile": {"kind": "closed", "users": 1, "steps": [{"at_s": 4, "users": 4}]},
                                 "seed": 5})
    print(f"stepped fast run: {seconds:.1f} s, verdict {rep['verdict']}")
    sec = rep["steps"]
    one, four = sec["steps"]
    assert sec["unit"] == "users" and (one["level"], four["level"]) == (1, 4)
    assert one["offset_s"] == 0 and four["offset_s"] == pytest.approx(4)
    loads = [r for r in read_records(out / "records.jsonl") if r.source == "load" and r.server == "spec"]
    assert one["tries"] + four["tries"] == sum(1 for r in loads if r.send_time < four["end"]) > 0
    assert four["request_throughput_rps"] > 1.5 * one["request_throughput_rps"], (one, four)
    assert "warmup" in one["phases"] and "fault" in four["phases"]
    assert one["acceptance"]["acceptance_rate"] is not None
    con = Console(file=io.StringIO(), width=220, record=True, color_system=None)
    con.print(render_summary(rep))
    assert "per load step (users)" in con.export_text()

"""The benchmark scripts: their pure helpers against hand-computed values (definitions as
``vllm bench serve``'s), bad arguments, and a short run of each (``--quick``) whose last
line must be the JSON object with the documented keys and sane values. Targets are not
checked here: absolute figures depend on the machine; docs/benchmarks.md gives the measured ones."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.load.records import RequestRecord, write_records

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


accuracy = load("accuracy")
capacity = load("loadgen_capacity")


def record(ttft: float, gaps: list[float], tokens: list[int], done_after: float = 0.0, **kw) -> RequestRecord:
    offs = [ttft]
    for g in gaps:
        offs.append(offs[-1] + g)
    n = sum(tokens)
    return RequestRecord(request_id="r", source="load", status=200, done=True, ok=True, finish_reason="length",
                         max_tokens=n, output_tokens=n, ttft_s=ttft, chunk_offsets_s=offs, chunk_tokens=tokens,
                         e2e_s=offs[-1] + done_after, **kw)


def test_both_sides_compute_the_same_metrics_for_the_same_stream(tmp_path):
    # one stream: first chunk at 0.1 s, 3 more chunks 0.02, 0.03, 0.05 s apart, 4 tokens each
    write_records(tmp_path / "r.jsonl", [record(0.1, [0.02, 0.03, 0.05], [4, 4, 4, 4]),
                                          RequestRecord(request_id="x", source="load", error="connect")])
    h = accuracy.harness_values(tmp_path / "r.jsonl")
    b = accuracy.bench_values({"ttfts": [0.1, 0.0], "itls": [[0.02, 0.03, 0.05], []], "output_lens": [16, 0],
                               "errors": ["", "Connection refused"]})
    for k in ("ttft", "tpot", "e2e"):
        assert h[k] == pytest.approx(b[k]), k
    assert h["itl"] == pytest.approx(b["itl"])
    assert b["itl"] == pytest.approx([0.02, 0.03, 0.05])                                # per chunk, not per token
    assert b["tpot"] == pytest.approx([0.1 / 15])                                      # (E2E - TTFT) / (16 - 1)
    assert h["n"] == b["n"] == [1.0]                                                   # failures left out


def test_the_first_requests_sent_are_warm_ups_and_not_measured(tmp_path):
    # sent in the order slow (t=1), failed (t=2), fast (t=3): two warm-ups leave the fast one only
    slow, fast = record(0.5, [0.2], [1, 1], send_time=1.0), record(0.1, [0.02], [1, 1], send_time=3.0)
    failed = RequestRecord(request_id="x", source="load", error="connect", send_time=2.0)
    write_records(tmp_path / "r.jsonl", [fast, failed, slow])
    assert accuracy.harness_values(tmp_path / "r.jsonl", warmups=2)["ttft"] == pytest.approx([0.1])
    assert sorted(accuracy.harness_values(tmp_path / "r.jsonl")["ttft"]) == pytest.approx([0.1, 0.5])


def test_the_warm_up_mark_waits_for_the_servers_finished_count(monkeypatch):
    counts = iter([3.0, 4.0, 5.0, 6.0])
    monkeypatch.setattr(accuracy, "scrape", lambda url: {"e2e_count": next(counts)})
    mark = accuracy.WarmupMark("http://127.0.0.1:1", 5.0, interval_s=0.001)
    mark.start()
    mark.join(timeout=5)
    assert mark.scrape == {"e2e_count": 5.0}
    never = accuracy.WarmupMark("http://127.0.0.1:1", 1e9, interval_s=0.001)
    monkeypatch.setattr(accuracy, "scrape", lambda url: {"e2e_count": 0.0})
    never.start()
    never.stop()
    assert never.scrape is None and not never.is_alive()


def test_the_harness_side_is_also_timed_by_its_read_stamps(tmp_path):
    # the same stream parsed 5 ms after each arrival and [DONE] parsed 1 ms after the last
    rec = record(0.1, [0.02, 0.03, 0.05], [4, 4, 4, 4])
    rec.read_offsets_s = [o + 0.005 for o in rec.chunk_offsets_s]
    rec.read_offsets_s[-1] += 0.010                       # the last chunk waited for a core
    rec.e2e_read_s = rec.read_offsets_s[-1] + 0.001
    write_records(tmp_path / "r.jsonl", [rec])
    h = accuracy.harness_values(tmp_path / "r.jsonl")
    assert h["ttft"] == pytest.approx([0.1]) and h["read_ttft"] == pytest.approx([0.105])
    assert h["read_e2e"] == pytest.approx([0.215])
    assert h["read_itl"] == pytest.approx([0.02, 0.03, 0.06])
    assert h["read_tpot"] == pytest.approx([0.11 / 15])
    assert h["read_delay"] == pytest.approx([0.005, 0.005, 0.005, 0.015])


def test_summary_ratios_spread_and_server_means():
    def run(scale: float, server_ttft: float, read_scale: float | None = None) -> dict:
        values = {"ttft": [0.1 * scale, 0.3 * scale], "tpot": [0.01 * scale], "itl": [0.02 * scale],
                  "e2e": [1.0 * scale], "n": [2.0]}
        if read_scale is not None:   # the harness side: its read stamps too
            values.update({f"read_{k}": [v * read_scale for v in values[k]] for k in accuracy.METRICS})
            values["read_delay"] = [0.001, 0.003]
        return {"values": values,
                "requests": 2, "requests_with_warmups": 2, "client_cpu_s": 0.5, "wall_s": 3.0, "server_cpu_ms_per_request": 100.0,
                "server": {**{f"{k}_mean_ms": 10.0 for k in accuracy.SERVER_HISTOGRAMS},
                           **{f"{k}_count": 2 for k in accuracy.SERVER_HISTOGRAMS}, "ttft_mean_ms": server_ttft}}

    runs = [("harness", run(1.1, 22.0, 1.1)), ("bench", run(1.0, 20.0)), ("bench", run(1.0, 20.0)),
            ("harness", run(0.9, 18.0, 1.1))]
    args = type("A", (), {"pairs": 2, "users": 2, "requests": 2, "max_tokens": 8, "prompts": 4, "warmups": 0})()
    s = accuracy.summarize(runs, args)
    assert s["ttft_ratio"] == 0.95          # pooled medians: 190 ms (0.09, 0.11, 0.27, 0.33) vs 200 ms
    assert [p["ttft"]["ratio"] for p in s["pairs"]] == [1.1, 0.9]
    assert s["spread"]["e2e"] == [0.9, 1.1]
    assert s["pairs"][1]["order"] == ["bench", "harness"]
    assert s["server"]["ttft_mean_ms"] == {"harness": 20.0, "bench": 20.0} and s["server"]["ttft_ratio"] == 1.0
    assert s["cpu"]["client_cpu_ms_per_request"] == {"harness": 250.0, "bench": 250.0}
    # the read stamps (10 % later here) give their own ratios beside the arrival stamps'
    assert s["read_stamp_ratios"]["ttft"] == pytest.approx(1.045)     # 209 ms vs 200 ms
    assert [p["ttft"]["read_ratio"] for p in s["pairs"]] == [1.21, 0.99]
    assert s["read_spread"]["e2e"] == [0.99, 1.21]
    assert s["read_delay_ms"]["p50"] == 2.0 and s["read_delay_ms"]["max"] == 3.0
    # per run TTFT median ÷ server TTFT mean: harness 220/22 and 180/18 (10, 10), bench 200/20 (10):
    # the server's own drift explains the harness's pair ratios of 1.1 and 0.9 entirely
    assert s["server_normalized_ratios"]["ttft"] == 1.0


def test_server_means_over_one_run():
    before = {f"{k}_{x}": 0.0 for k in accuracy.SERVER_HISTOGRAMS for x in ("sum", "count")}
    after = dict(before, ttft_sum=3.0, ttft_count=10.0)
    m = accuracy.server_means(before, after)
    assert m["ttft_mean_ms"] == 300.0 and m["ttft_count"] == 10
    assert m["itl_mean_ms"] is None and m["itl_count"] == 0


def test_lateness_against_the_servers_send_stamps():
    r = record(0.010, [0.005], [4, 4], send_time=1000.0)
    # the server stamped the chunks 0.3 ms and 0.2 ms before they arrived
    r.text = f" t{int((1000.010 - 0.0003) * 1e9)} t{int((1000.015 - 0.0002) * 1e9)}"
    late = capacity.lateness_ms([r])
    assert late == pytest.approx([0.3, 0.2], abs=1e-3)
    t = capacity.timing([r])
    assert t["chunks"] == 2 and t["ttft_p50_ms"] == pytest.approx(0.3, abs=1e-3)
    r.text = r.text.split()[0]          # stamps and chunks do not pair up: left out, not guessed
    assert capacity.lateness_ms([r]) == []
    assert capacity.timing([r])["p50_ms"] is None


def run_quick(script: str, timeout: float) -> dict:
    """``bench/SCRIPT.py --quick`` in its own process: exit 0, its last JSON line."""
    p = subprocess.run([sys.executable, str(BENCH / f"{script}.py"), "--quick"], capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-3000:])
    return last_json(p.stdout)


@pytest.mark.parametrize("script,arg", [("accuracy", "--pairs=0"), ("accuracy", "--users=0"),
                                        ("loadgen_capacity", "--users=0"), ("loadgen_capacity", "--seconds=0"),
                                        ("sweep_overhead", "--phase-s=0"), ("pacer_lag", "--rates=0"),
                                        ("pacer_lag", "--seconds=0"), ("judge_scale", "--sizes=0"),
                                        ("judge_scale", "--template=/nonexistent")])
def test_bad_arguments_exit_2_with_one_line(script, arg):
    p = subprocess.run([sys.executable, str(BENCH / f"{script}.py"), arg], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and arg.split("=")[0] in p.stderr


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.mark.nightly   # a template run on the fake and two re-judgements: ~1 min
@pytest.mark.timeout(300)
def test_judge_scale_quick():
    out = run_quick("judge_scale", timeout=290)
    assert [r["records"] for r in out["rows"]] == [2000, 20000]
    assert all(r["seconds"] > 0 and r["peak_rss_mb"] > 0 and r["verdict"] == "pass" for r in out["rows"])


@pytest.mark.timeout(120)
def test_pacer_lag_quick():
    out = run_quick("pacer_lag", timeout=110)
    assert set(out["rates"]) == {"50", "200"} and out["p99_ms_at_200"] is not None
    for fig in out["rates"].values():
        assert fig["arrivals"] > 0 and fig["dropped"] == 0
        assert 0 <= fig["p50_ms"] <= fig["p95_ms"] <= fig["p99_ms"] <= fig["max_ms"]
        assert 0 <= fig["share_late_10ms"] <= fig["share_late_1ms"] <= 1


@pytest.mark.timeout(180)
def test_loadgen_capacity_quick():
    out = run_quick("loadgen_capacity", timeout=170)
    assert {"requests_per_s_per_core", "timing_error_ms", "timing_error_p99_ms", "capacity", "timing",
            "timing_at_capacity", "settings"} <= set(out)
    assert out["requests_per_s_per_core"] > 10
    assert 0 < out["timing_error_ms"] < 100 and out["timing_error_ms"] <= out["timing_error_p99_ms"]
    assert out["capacity"]["errors"] == [] and out["timing"]["errors"] == []
    assert out["timing"]["chunks"] == 8 * out["timing"]["ok"]
    assert 0 < out["capacity"]["client_cpu_percent"] <= 110


@pytest.mark.stack
@pytest.mark.nightly
@pytest.mark.own_stack
@pytest.mark.timeout(900)
def test_accuracy_quick():
    out = run_quick("accuracy", timeout=880)
    assert {"ttft_ratio", "tpot_ratio", "itl_ratio", "e2e_ratio", "pairs", "spread", "server", "cpu"} <= set(out)
    for k in ("ttft", "tpot", "itl", "e2e"):
        assert 0.2 < out[f"{k}_ratio"] < 5, (k, out)
    assert len(out["pairs"]) == 1 and out["requests"] == {"harness": 8, "bench": 8}
    assert out["server"]["ttft_mean_ms"]["harness"] > 0 and out["server"]["ttft_mean_ms"]["bench"] > 0
    for k in ("ttft", "tpot", "itl", "e2e"):   # the same records by their read stamps; the drift taken out
        assert 0.2 < out["read_stamp_ratios"][k] < 5 and 0.2 < out["server_normalized_ratios"][k] < 5, (k, out)
    assert out["read_delay_ms"]["p50"] >= 0
    if len(os.sched_getaffinity(0)) >= 2:
        assert out["settings"]["pinned"] == {"client_cpus": [min(os.sched_getaffinity(0))],
                                             "server_cpus": sorted(os.sched_getaffinity(0))[1:]}


@pytest.mark.nightly   # ~25 s of fake runs; the sweep's own e2e test (tests/experiment/test_sweep.py) is in make test
@pytest.mark.timeout(300)
def test_sweep_overhead_quick():
    out = run_quick("sweep_overhead", timeout=280)
    assert out["reuse"]["runs"] == out["fresh"]["runs"] == 2
    assert out["reuse"]["stack_starts"] == 1 and out["fresh"]["stack_starts"] == 2
    assert out["ratios"]["stack_starts_saved"] == 1
    for side in ("reuse", "fresh"):
        assert 0 < out[side]["harness_cpu_per_run_s"] < out[side]["wall_per_run_s"]
        assert 0 < out[side]["analysis_cpu_per_cell_s"] and 0 < out[side]["harness_cpu_share"] < 1


def test_launcher_recovery_refuses_bad_arguments_and_a_missing_engine(tmp_path):
    """bench/launcher_recovery.py: exit 2 on ``--repeat 0``, and exit 2 with one line naming
    the engine when no Docker engine answers at ``DOCKER_HOST``."""
    script = str(BENCH / "launcher_recovery.py")
    bad = subprocess.run([sys.executable, script, "--repeat", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--repeat must be at least 1" in bad.stderr
    env = dict(os.environ, DOCKER_HOST=f"unix://{tmp_path}/no-engine.sock")
    none = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=60, env=env)
    assert none.returncode == 2, none.stdout + none.stderr
    lines = none.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("launcher_recovery: ") and "no-engine.sock" in lines[0], none.stderr

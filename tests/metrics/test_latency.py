import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.factories import make_record
from harness.metrics.latency import distribution, e2e_s, itl_per_token_s, itl_s, percentiles, tpot_s, ttft_s


def test_ttft_e2e_from_record():
    r = make_record(ttft=0.2, gaps=[0.1, 0.3], chunk_tokens=[1, 2, 3], tail_s=0.05)
    assert ttft_s(r) == pytest.approx(0.2)
    # vLLM's E2EL ends at the last chunk carrying output: the usage chunk and [DONE] 0.05 s
    # later are not timed
    assert e2e_s(r) == pytest.approx(0.2 + 0.4)


def test_e2e_without_output_falls_back_to_the_end_of_the_exchange():
    r = make_record(ttft=0.2, tail_s=0.05)
    r.chunk_offsets_s, r.chunk_tokens = [], []
    assert e2e_s(r) == pytest.approx(r.e2e_s)


def test_ttft_falls_back_to_first_chunk_and_none_without_output():
    r = make_record(ttft=0.3)
    r.ttft_s = None
    assert ttft_s(r) == pytest.approx(0.3)
    r.chunk_offsets_s = []
    assert ttft_s(r) is None


def test_e2e_none_when_never_ended():
    r = make_record(e2e_s=None)
    r.chunk_offsets_s, r.chunk_tokens = [], []
    assert e2e_s(r) is None


def test_tpot_definition():
    r = make_record(ttft=0.5, gaps=[0.2, 0.2], chunk_tokens=[1, 2, 2], tail_s=0.3)
    # (E2E - TTFT) / (5 - 1), E2E at the last output chunk (0.9 s), not at [DONE] (1.2 s)
    assert tpot_s(r) == pytest.approx(0.4 / 4)


@pytest.mark.parametrize("n", [0, 1, None])
def test_tpot_none_for_short_or_unknown(n):
    r = make_record(chunk_tokens=[1])
    r.output_tokens = n
    assert tpot_s(r) is None


def test_itl_per_chunk_and_per_token():
    r = make_record(ttft=0.1, gaps=[0.2, 0.3], chunk_tokens=[1, 4, 3])
    assert itl_s(r) == pytest.approx([0.2, 0.3])
    # one value per token: the 0.2 s gap over the 4 tokens it brought, 0.3 s over 3
    assert itl_per_token_s(r) == pytest.approx([0.05] * 4 + [0.1] * 3)


def test_itl_empty_for_single_chunk_and_zero_token_chunk_counts_one():
    assert itl_s(make_record(chunk_tokens=[3])) == []
    assert itl_per_token_s(make_record(chunk_tokens=[3])) == []
    r = make_record(gaps=[0.2], chunk_tokens=[1, 1])
    r.chunk_tokens = [1, 0]
    assert itl_per_token_s(r) == pytest.approx([0.2])


def test_ngram_burst_per_token_itl_is_not_zero():
    # ngram: a 1-token step at 0.100 s, then twice three finished 1-token steps flushed
    # 0.02 ms apart, 40 ms after the previous arrival. vLLM's ITL (per chunk) reads mostly
    # 0.02 ms gaps: its p50 is 0.02 ms, the "0.0 ms" users saw. Per token, each 40 ms gap
    # is spread over the 3 tokens that arrived together: from the previous group's last
    # event to this group's last event, 40.04 ms / 3 = 13.35 ms for every token.
    r = make_record(ttft=0.1, gaps=[0.04, 0.00002, 0.00002, 0.04, 0.00002, 0.00002], chunk_tokens=[1] * 7)
    assert percentiles(itl_s(r), (50,))["p50"] == pytest.approx(0.00002)
    per_token = itl_per_token_s(r)
    assert per_token == pytest.approx([0.04004 / 3] * 6)
    assert percentiles(per_token, (50,))["p50"] == pytest.approx(0.013347, abs=1e-6)
    # the mean per token is the stream span over the tokens after the first: TPOT here
    assert sum(per_token) / len(per_token) == pytest.approx(tpot_s(r))
    # without grouping (gap 0) every event stands alone: the 0.0 ms again
    assert percentiles(itl_per_token_s(r, group_gap_s=0), (50,))["p50"] == pytest.approx(0.00002)


def test_distribution_has_n_mean_and_the_five_percentiles():
    vals = [0.1, 0.5, 0.2, 0.9, 0.3, None]
    d = distribution(vals)
    assert list(d) == ["n", "mean", "p50", "p90", "p95", "p99", "p99.9"]
    assert d["n"] == 5 and d["mean"] == pytest.approx(0.4)
    for q in (50, 90, 95, 99, 99.9):
        assert d[f"p{q:g}"] == pytest.approx(float(np.percentile([0.1, 0.5, 0.2, 0.9, 0.3], q)))
    # hand-computed, linear interpolation over the sorted 0.1 0.2 0.3 0.5 0.9: rank 0.9*4 = 3.6
    assert d["p90"] == pytest.approx(0.5 + 0.6 * 0.4)
    assert d["p50"] == pytest.approx(0.3)
    one = distribution([1.865])
    assert one == {"n": 1, "mean": 1.865, "p50": 1.865, "p90": 1.865, "p95": 1.865, "p99": 1.865, "p99.9": 1.865}
    assert distribution([]) == {"n": 0, "mean": None, "p50": None, "p90": None, "p95": None, "p99": None,
                                "p99.9": None}


def test_percentiles_match_numpy_linear_and_none_without_data():
    vals = [0.1, 0.5, 0.2, 0.9, 0.3]
    p = percentiles(vals)
    assert set(p) == {"p50", "p95", "p99"}
    for q in (50, 95, 99):
        assert p[f"p{q}"] == pytest.approx(float(np.percentile(vals, q)))
    assert percentiles([]) == {"p50": None, "p95": None, "p99": None}
    assert percentiles([None, None]) == {"p50": None, "p95": None, "p99": None}
    assert percentiles([1.0, None], qs=(90,)) == {"p90": 1.0}


floats = st.floats(min_value=0, max_value=1e4, allow_nan=False)


@given(st.lists(floats, min_size=1, max_size=200))
def test_percentiles_monotone_and_bounded(vals):
    p = percentiles(vals)
    assert min(vals) <= p["p50"] <= p["p95"] <= p["p99"] <= max(vals)


@given(
    ttft=st.floats(0.001, 10),
    gaps=st.lists(st.floats(0, 5), min_size=0, max_size=30),
    tail=st.floats(0, 1),
    data=st.data(),
)
def test_tpot_identity(ttft, gaps, tail, data):
    toks = data.draw(st.lists(st.integers(1, 8), min_size=len(gaps) + 1, max_size=len(gaps) + 1))
    r = make_record(ttft=ttft, gaps=gaps, chunk_tokens=toks, tail_s=tail)
    n = sum(toks)
    t = tpot_s(r)
    if n <= 1:
        assert t is None
    else:
        # TTFT + TPOT * (n - 1) == E2E
        assert math.isclose(ttft_s(r) + t * (n - 1), e2e_s(r), rel_tol=1e-9, abs_tol=1e-9)
    # per-chunk ITL sums to the stream span (TTFT + sum(ITL) == E2E, as in vLLM); per-token
    # ITL has one value per token after the first arrival group and sums to the span
    # between the first and last group's last events
    assert math.isclose(sum(itl_s(r)), r.chunk_offsets_s[-1] - r.chunk_offsets_s[0], abs_tol=1e-6)
    assert math.isclose(ttft_s(r) + sum(itl_s(r)), e2e_s(r), rel_tol=1e-9, abs_tol=1e-9)
    per_token = itl_per_token_s(r, group_gap_s=0)
    assert len(per_token) == n - toks[0]
    assert math.isclose(sum(per_token), r.chunk_offsets_s[-1] - r.chunk_offsets_s[0], abs_tol=1e-6)

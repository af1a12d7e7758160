import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.factories import make_record
from harness.metrics.latency import e2e_s, itl_per_token_s, itl_s, percentiles, tpot_s, ttft_s


def test_ttft_e2e_from_record():
    r = make_record(ttft=0.2, gaps=[0.1, 0.3], chunk_tokens=[1, 2, 3], tail_s=0.05)
    assert ttft_s(r) == pytest.approx(0.2)
    assert e2e_s(r) == pytest.approx(0.2 + 0.4 + 0.05)


def test_ttft_falls_back_to_first_chunk_and_none_without_output():
    r = make_record(ttft=0.3)
    r.ttft_s = None
    assert ttft_s(r) == pytest.approx(0.3)
    r.chunk_offsets_s = []
    assert ttft_s(r) is None


def test_e2e_none_when_never_ended():
    assert e2e_s(make_record(e2e_s=None)) is None


def test_tpot_definition():
    r = make_record(ttft=0.5, gaps=[0.2, 0.2], chunk_tokens=[1, 2, 2], tail_s=0.0)
    # (E2E - TTFT) / (5 - 1)
    assert tpot_s(r) == pytest.approx(0.4 / 4)


@pytest.mark.parametrize("n", [0, 1, None])
def test_tpot_none_for_short_or_unknown(n):
    r = make_record(chunk_tokens=[1])
    r.output_tokens = n
    assert tpot_s(r) is None


def test_itl_per_chunk_and_per_token():
    r = make_record(ttft=0.1, gaps=[0.2, 0.3], chunk_tokens=[1, 4, 3])
    assert itl_s(r) == pytest.approx([0.2, 0.3])
    assert itl_per_token_s(r) == pytest.approx([0.05, 0.1])


def test_itl_empty_for_single_chunk_and_zero_token_chunk_counts_one():
    assert itl_s(make_record(chunk_tokens=[3])) == []
    r = make_record(gaps=[0.2], chunk_tokens=[1, 1])
    r.chunk_tokens = [1, 0]
    assert itl_per_token_s(r) == pytest.approx([0.2])


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
    # per-token ITL never exceeds per-chunk ITL, and per-chunk ITL sums to the stream span
    assert all(a <= b + 1e-12 for a, b in zip(itl_per_token_s(r), itl_s(r)))
    assert math.isclose(sum(itl_s(r)), r.chunk_offsets_s[-1] - r.chunk_offsets_s[0], abs_tol=1e-6)

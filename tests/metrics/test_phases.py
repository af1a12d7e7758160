import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.metrics.config import GoodputConfig
from harness.metrics.phases import PHASES, assign_phases, is_good, phase_metrics, phase_windows, records_in
from tests.factories import cut, ev, fail, make_record, phase_events

STARTS = {"baseline": 100.0, "fault": 130.0, "recovery": 150.0, "after": 170.0}


def test_phase_windows_from_events():
    w = phase_windows(phase_events(STARTS, 200.0))
    assert list(w) == list(PHASES)
    assert w == {"baseline": (100.0, 130.0), "fault": (130.0, 150.0), "recovery": (150.0, 170.0), "after": (170.0, 200.0)}


def test_phase_windows_missing_phase_absent_and_order_by_time():
    evs = [ev(100, "phase_start", phase="baseline"), ev(120, "phase_start", phase="fault"),
           ev(150, "phase_start", phase="after"), ev(160, "load_stopped")]
    w = phase_windows(reversed(evs))
    assert "recovery" not in w
    assert w["fault"] == (120, 150) and w["after"] == (150, 160)


def test_phase_windows_ignores_noise_and_duplicates():
    evs = phase_events(STARTS, 200.0) + [
        ev(140, "phase_start", phase="baseline"),  # duplicate: first start kept
        ev(210, "phase_start", phase="after"),  # after load_stopped
        ev(135, "phase_start", phase="warmup"),  # unknown phase
        ev(131, "health", source="health", server="spec", status=200),
    ]
    assert phase_windows(evs) == phase_windows(phase_events(STARTS, 200.0))


def test_phase_windows_without_load_stopped_ends_at_last_event():
    evs = [ev(100, "phase_start", phase="baseline"), ev(110, "phase_start", phase="fault"),
           ev(117.5, "health", source="health", server="spec", status=200)]
    assert phase_windows(evs)["fault"] == (110, 117.5)
    assert phase_windows([]) == {}


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=4, unique=True),
       st.floats(0, 1e5, allow_nan=False))
def test_phase_windows_partition_the_load_window(times, tail):
    times = sorted(times)
    starts = dict(zip(PHASES, times))
    stop = times[-1] + tail
    w = phase_windows(phase_events(starts, stop))
    spans = sorted(w.values())
    assert len(spans) == len(times)
    assert spans[0][0] == times[0] and spans[-1][1] == stop
    for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
        assert a1 == b0  # contiguous, no gap, no overlap
    assert all(s <= e for s, e in spans)
    assert sum(e - s for s, e in spans) == pytest.approx(stop - times[0])


def test_records_in_by_send_time_half_open():
    rs = [make_record(send_time=t) for t in (99.9, 100.0, 120.0, 130.0)]
    assert [r.send_time for r in records_in(rs, 100.0, 130.0)] == [100.0, 120.0]


def test_phase_metrics_counts_latencies_and_rates():
    good = [make_record(send_time=100 + i, ttft=0.1 * (i + 1), gaps=[0.1, 0.1], chunk_tokens=[1, 2, 1])
            for i in range(4)]
    bad = [fail(send_time=105), cut(make_record(send_time=106), 1, labelled_ok=True)]
    m = phase_metrics(good + bad, 100.0, 110.0, GoodputConfig(ttft_s=2.0, tpot_s=0.5, e2e_s=10.0))
    assert m["requests"] == 6 and m["complete"] == 4 and m["errors"] == 2
    assert m["error_rate"] == pytest.approx(2 / 6)
    assert m["duration_s"] == 10.0
    assert m["ttft_s"]["p50"] == pytest.approx(0.25)
    assert m["itl_s"]["p50"] == pytest.approx(0.1)
    # per-token ITL, one value per token: 0.1/2 twice for the 2-token chunk, 0.1/1 for the last
    assert m["itl_per_token_s"]["n"] == 12 and m["itl_per_token_s"]["p50"] == pytest.approx(0.05)
    assert m["itl_per_token_s"]["p99"] == pytest.approx(0.1)
    assert m["itl_per_token_s"]["mean"] == pytest.approx(0.2 / 3)
    assert m["ttft_s"]["n"] == 4 and m["itl_s"]["n"] == 8
    # vLLM's output token throughput: the complete tries' usage tokens / duration
    assert m["total_output_tokens"] == 16 and m["output_throughput_tps"] == pytest.approx(1.6)
    assert m["mean_tokens_per_chunk"] == pytest.approx(4 / 3)
    assert m["output_tokens"] == 16
    assert m["output_tokens_per_s"] == pytest.approx(1.6)
    assert m["request_throughput_rps"] == pytest.approx(0.4)
    assert m["goodput_rps"] == pytest.approx(0.4)


def test_cut_stream_is_an_error_even_if_labelled_ok():
    m = phase_metrics([cut(make_record(send_time=100), 2, labelled_ok=True)], 100, 110)
    assert m["errors"] == 1 and m["complete"] == 0
    assert m["ttft_s"] == {"n": 0, "mean": None, "p50": None, "p90": None, "p95": None, "p99": None, "p99.9": None}
    assert m["output_tokens"] == 0
    assert m["goodput_rps"] is None  # no slo given


def test_output_tokens_counted_by_arrival_not_send():
    # sent before the window, chunks arrive at 99.5, 100.5, 101.5
    r = make_record(send_time=99.0, ttft=0.5, gaps=[1.0, 1.0], chunk_tokens=[3, 4, 5])
    m = phase_metrics([r], 100.0, 101.0)
    assert m["requests"] == 0
    assert m["output_tokens"] == 4
    assert m["output_tokens_per_s"] == pytest.approx(4.0)


def test_empty_window():
    m = phase_metrics([], 100.0, 100.0, GoodputConfig(ttft_s=2.0))
    assert m["requests"] == 0 and m["error_rate"] is None
    assert m["output_tokens_per_s"] is None and m["goodput_rps"] is None
    assert m["mean_tokens_per_chunk"] is None


def test_goodput_as_vllm():
    slo = GoodputConfig(ttft_s=0.5, tpot_s=0.1, e2e_s=2.0)
    ok = make_record(ttft=0.2, gaps=[0.05] * 3)
    slow_first = make_record(ttft=0.6)
    slow_tokens = make_record(ttft=0.1, gaps=[0.3, 0.3])
    slow_total = make_record(ttft=0.1, gaps=[1.25, 1.25], chunk_tokens=[1, 15, 15])  # TPOT 0.083, E2E 2.6
    one_token = make_record(ttft=0.2, chunk_tokens=[1])  # TPOT counts as 0
    assert is_good(ok, slo) and is_good(one_token, slo)
    assert not is_good(slow_first, slo)
    assert not is_good(slow_tokens, slo)
    assert not is_good(slow_total, slo)
    assert not is_good(cut(ok, 2, labelled_ok=True), slo)
    rs = [dataclasses.replace(r, send_time=100.0) for r in (ok, slow_first, slow_tokens, slow_total, one_token)]
    m = phase_metrics(rs, 100.0, 110.0, slo)
    assert m["goodput_rps"] == pytest.approx(0.2)
    assert m["request_throughput_rps"] == pytest.approx(0.5)


def test_goodput_uses_only_the_limits_that_are_set():
    slow_first = make_record(ttft=0.6, send_time=100.0)
    assert is_good(slow_first, GoodputConfig(e2e_s=5.0))           # TTFT not constrained
    assert not is_good(slow_first, GoodputConfig(ttft_s=0.5))
    assert phase_metrics([slow_first], 100.0, 110.0, GoodputConfig())["goodput_rps"] is None  # no limit: not computed


def test_itl_is_per_chunk_and_the_per_token_variant_has_its_own_name():
    r = make_record(send_time=100.0, ttft=0.1, gaps=[0.2, 0.2], chunk_tokens=[1, 4, 4])
    m = phase_metrics([r], 100.0, 110.0)
    assert m["itl_s"]["p50"] == pytest.approx(0.2)               # vLLM's ITL: the gap per chunk
    assert m["itl_per_token_s"]["p50"] == pytest.approx(0.05)    # the gap over the 4 tokens it brought


def test_assign_phases_gives_requests_in_flight_at_the_fault_to_the_fault():
    windows = {"baseline": (100.0, 130.0), "fault": (130.0, 140.0), "recovery": (140.0, 150.0)}
    done_before = make_record(send_time=120.0, ttft=0.1)                       # ends 120.3
    cut_by_kill = fail(send_time=129.9, after_s=0.3)                           # ends 130.2: in flight
    never_ended = fail(send_time=125.0, after_s=None)                           # hung: in flight
    in_fault = fail(send_time=131.0)
    in_recovery = make_record(send_time=145.0)
    before_all = make_record(send_time=50.0)
    got = assign_phases([done_before, cut_by_kill, never_ended, in_fault, in_recovery, before_all], windows)
    assert got["baseline"] == [done_before]
    assert got["fault"] == [cut_by_kill, never_ended, in_fault]
    assert got["recovery"] == [in_recovery]
    m = phase_metrics([], 100.0, 130.0, members=got["baseline"])
    assert m["requests"] == 1 and m["errors"] == 0


def test_assign_phases_without_a_fault_is_by_send_time():
    windows = {"baseline": (100.0, 130.0), "after": (130.0, 140.0)}
    straddling = make_record(send_time=129.95, ttft=0.1)
    assert assign_phases([straddling], windows) == {"baseline": [straddling], "after": []}


def test_latency_per_request_class_only_when_classes_were_sent():
    plain = [make_record(send_time=1000.0 + i) for i in range(3)]
    chat = [make_record(send_time=1000.5 + i, ttft=0.3, request_class="chat", endpoint="chat") for i in range(2)]
    assert "request_classes" not in phase_metrics(plain, 1000.0, 1010.0)
    m = phase_metrics(plain + chat, 1000.0, 1010.0)
    assert {c: (g["tries"], g["ttft_s"]["n"]) for c, g in m["request_classes"].items()} == {"chat": (2, 2),
                                                                                          "plain": (3, 3)}
    assert m["request_classes"]["chat"]["ttft_s"]["p50"] == pytest.approx(0.3)

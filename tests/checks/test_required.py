"""Required checks (:mod:`harness.checks.required`): the default table, what meets a
requirement, and the verdict of a run whose required check was not judged."""

import pytest

from harness.checks.base import CheckResult
from harness.checks.config import JudgeConfig
from harness.checks.required import (DEFAULTS, Requirement, judge_required, required_checks, required_section,
                                     unknown_requirements)
from harness.checks.verdict import verdict

OK = CheckResult("recovery.time_to_healthy_s", "recovery", True, 1.0, 90.0)
NJ_COMPARED = CheckResult.not_judged("integrity.compared", "integrity", 0, 20, "no reference server")
NJ_MISMATCHED = CheckResult.not_judged("integrity.mismatched", "integrity", 0, 0, "no reference server")
MALFORMED = CheckResult("integrity.malformed", "integrity", True, 0, 0)
DEGRADED = CheckResult("degradation.after_vs_baseline.ttft_p95", "degradation", True, 1.1, 2.0)
THIN = CheckResult.not_judged("degradation.fault_vs_baseline.ttft_p95", "degradation", None, 2.0, "n=2 < 10")


def names(reqs):
    return [r.name for r in reqs]


def test_defaults_follow_the_injected_faults_in_order_without_repeats():
    reqs = required_checks(["process-kill", "memory-hog", "process-kill"], JudgeConfig())
    assert names(reqs) == ["recovery", "fail_fast", "integrity", "degradation"]
    assert reqs[0].why == "default for process-kill" and reqs[3].why == "default for memory-hog"
    assert names(required_checks(["draft-swap"], JudgeConfig())) == ["speculation", "breaker"]
    assert names(required_checks([], JudgeConfig(), soak=True)) == ["soak"]
    assert required_checks(["an-unlisted-kind"], JudgeConfig()) == []


def test_configured_replaces_optional_removes_and_no_reference_drops_integrity():
    assert names(required_checks(["process-kill"], JudgeConfig(required=["slo", "integrity.compared"]))) == [
        "slo", "integrity.compared"]
    assert names(required_checks(["process-kill"], JudgeConfig(optional=["fail_fast"]))) == ["recovery", "integrity"]
    assert names(required_checks(["network"], JudgeConfig(), reference=False)) == ["degradation"]
    # named by the experiment, integrity is required even without a reference
    assert names(required_checks(["network"], JudgeConfig(required=["integrity"]), reference=False)) == ["integrity"]


def test_a_fault_class_override_replaces_its_default_row():
    reqs = required_checks(["process-kill"], JudgeConfig(), overrides={"process-kill": ("recovery",)})
    assert names(reqs) == ["recovery"]


def test_every_default_names_a_known_family_or_category():
    assert unknown_requirements(n for row in DEFAULTS.values() for n in row) == []
    assert unknown_requirements(["integrity", "recovery.time_to_healthy_s", "integrty"]) == ["integrty"]


def test_a_family_is_met_by_one_judged_check_and_not_by_none():
    (met,) = judge_required([DEGRADED, THIN], [Requirement("degradation", "x")])
    assert met.judged is True and met.reason is None and met.checks == 2
    (unmet,) = judge_required([THIN], [Requirement("degradation", "x")])
    assert unmet.judged is False
    assert unmet.message == ("required check degradation not judged: none of its 1 check(s) was judged "
                             "(degradation.fault_vs_baseline.ttft_p95: n=2 < 10)")


def test_integrity_needs_its_comparison_judged_not_only_some_check():
    (s,) = judge_required([MALFORMED, NJ_COMPARED, NJ_MISMATCHED], [Requirement("integrity", "x")])
    assert s.judged is False
    assert s.reason == "integrity.mismatched: no reference server"
    ok = [MALFORMED, CheckResult("integrity.compared", "integrity", True, 30, 20),
          CheckResult("integrity.mismatched", "integrity", False, 1, 0)]
    (s,) = judge_required(ok, [Requirement("integrity", "x")])
    assert s.judged is True   # judged (and failed): the requirement is about judging


def test_a_check_name_must_itself_be_judged_and_a_missing_one_is_named():
    (s,) = judge_required([MALFORMED, NJ_COMPARED], [Requirement("integrity.compared", "x")])
    assert s.judged is False and s.reason == "no reference server"
    (s,) = judge_required([OK], [Requirement("recovery.time_to_healthy_s", "x")])
    assert s.judged is True
    (s,) = judge_required([OK], [Requirement("hang", "x")])
    assert s.judged is False and s.reason == "no check of that name ran in this run"


def test_required_section_counts_judged_of_required():
    statuses = judge_required([OK, THIN], [Requirement("recovery", "a"), Requirement("degradation", "b")])
    sec = required_section(statuses)
    assert (sec["judged"], sec["of"]) == (1, 2)
    assert sec["checks"][1] == {"name": "degradation", "why": "b", "judged": False, "checks": 1,
                                "reason": "none of its 1 check(s) was judged (degradation.fault_vs_baseline.ttft_p95: "
                                          "n=2 < 10)"}


@pytest.mark.parametrize("checks, expected", [([OK, MALFORMED], "error"), ([OK, NJ_COMPARED, NJ_MISMATCHED], "error")])
def test_verdict_is_error_when_a_required_check_was_not_judged(checks, expected):
    required = judge_required(checks, [Requirement("recovery", "a"), Requirement("integrity", "b")])
    assert verdict(checks, fault_acted=True, errors=[], required=required) == expected


def test_verdict_passes_when_every_required_check_was_judged():
    good = [OK, MALFORMED, CheckResult("integrity.compared", "integrity", True, 30, 20),
            CheckResult("integrity.mismatched", "integrity", True, 0, 0)]
    required = judge_required(good, [Requirement("recovery", "a"), Requirement("integrity", "b")])
    assert verdict(good, fault_acted=True, errors=[], required=required) == "pass"
    # failed beats nothing: a required check that was judged and failed is a fail, not an error
    bad = [*good[:-1], CheckResult("integrity.mismatched", "integrity", False, 2, 0)]
    required = judge_required(bad, [Requirement("integrity", "b")])
    assert verdict(bad, fault_acted=True, errors=[], required=required) == "fail"

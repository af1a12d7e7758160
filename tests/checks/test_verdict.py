from harness.checks.base import CheckResult
from harness.checks.verdict import verdict

OK = CheckResult("a", "slo", True, 1, 2)
BAD = CheckResult("b", "slo", False, 3, 2)


def test_pass_when_all_checks_pass_and_fault_acted():
    assert verdict([OK, OK], fault_acted=True, errors=[]) == "pass"


def test_fail_when_a_check_fails():
    assert verdict([OK, BAD], fault_acted=True, errors=[]) == "fail"


def test_fault_without_evidence_is_error_never_pass():
    assert verdict([OK], fault_acted=False, errors=[]) == "error"
    assert verdict([BAD], fault_acted=False, errors=[]) == "error"


def test_run_error_or_interruption_is_error():
    assert verdict([OK], fault_acted=True, errors=["stack failed"]) == "error"
    assert verdict([OK], fault_acted=True, errors=[], interrupted=True) == "error"


def test_nothing_judged_is_error():
    assert verdict([], fault_acted=True, errors=[]) == "error"
    assert verdict(iter([OK]), fault_acted=True, errors=[]) == "pass"


NOT_JUDGED = CheckResult.not_judged("c", "slo", 1.9, 1.0, "p95 rests on 1 request (< metrics.min_samples 10)")


def test_a_check_not_judged_is_neither_passed_nor_failed():
    assert NOT_JUDGED.passed is None and not NOT_JUDGED.judged and not NOT_JUDGED.failed
    assert NOT_JUDGED.detail.startswith("not judged: ")
    d = NOT_JUDGED.to_dict()
    assert d["passed"] is None and d["judged"] is False
    assert OK.to_dict()["judged"] is True and BAD.failed


def test_verdict_ignores_checks_not_judged():
    # an observed value over its limit, not judged: it cannot fail the run ...
    assert verdict([OK, NOT_JUDGED], fault_acted=True, errors=[]) == "pass"
    # ... nor hide a failure, nor stand in for a judgement
    assert verdict([BAD, NOT_JUDGED], fault_acted=True, errors=[]) == "fail"
    assert verdict([NOT_JUDGED, NOT_JUDGED], fault_acted=True, errors=[]) == "error"


def test_a_safeguard_abort_is_aborted_unless_the_run_itself_broke():
    assert verdict([OK, BAD], fault_acted=True, errors=[], aborted=True) == "aborted"
    assert verdict([OK], fault_acted=False, errors=[], aborted=True) == "aborted"   # evidence cut short
    assert verdict([OK], fault_acted=True, errors=["cleanup failed"], aborted=True) == "error"
    assert verdict([OK], fault_acted=True, errors=[], interrupted=True, aborted=True) == "error"

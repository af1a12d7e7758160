"""Speculative vs plain (mirror mode): the metrics per phase × bucket × sampling class and
the checks, fed known defects (speculative TPOT 1.5× plain, a bucket that does not pay,
no reference records) and healthy records; and mirror records never change the verdicts
of the checks that are not mirror-aware."""

from __future__ import annotations

import dataclasses

import pytest

from harness.checks import integrity, mirror, slo
from harness.checks.run import recorded_run
from harness.experiment.config import SpecchaosConfig
from harness.metrics.mirror import ALL, compare, mirror_groups
from harness.report.summary import render_summary
from tests.asserts import assert_failed
from tests.factories import make_record

EVENTS = [{"t": 1000.0, "source": "runner", "event": "phase_start", "phase": "baseline"},
          {"t": 1100.0, "source": "runner", "event": "phase_start", "phase": "after"},
          {"t": 1200.0, "source": "runner", "event": "load_stopped"}]
SAMPLING = [{"name": "greedy", "weight": 3}, {"name": "t07p09", "temperature": 0.7, "top_p": 0.9}]


def cfg(**mirror_cfg) -> SpecchaosConfig:
    return SpecchaosConfig(load={"mirror": True, "sampling": SAMPLING}, mirror=mirror_cfg)


def rec(server: str, tpot: float, *, t: float, bucket: str = "short", sampling: str = "greedy", prompt_id: int = 0):
    """A complete record of 9 output tokens (8 gaps) whose TPOT is ``tpot`` seconds."""
    r = make_record(send_time=t, ttft=0.05, gaps=[tpot] * 8, tail_s=0.0, prompt_id=prompt_id)
    return dataclasses.replace(r, server=server, sampling=sampling, prompt_class=bucket)


def workload(spec_tpot: dict[tuple[str, str], float], ref_tpot: float = 0.010, n: int = 6) -> list:
    """``n`` mirrored pairs per (bucket, sampling) in each of baseline and after."""
    out = []
    for phase_t in (1000.0, 1100.0):
        for (bucket, sampling), tpot in spec_tpot.items():
            for i in range(n):
                t = phase_t + 1 + i
                out += [rec("spec", tpot, t=t, bucket=bucket, sampling=sampling, prompt_id=i),
                        rec("ref", ref_tpot, t=t + 0.5, bucket=bucket, sampling=sampling, prompt_id=i)]
    return out


def by_name(checks):
    return {c.name: c for c in checks}


def test_compare_gives_ratios_and_speedups():
    s = [rec("spec", 0.005, t=1000.0 + i) for i in range(4)]
    r = [rec("ref", 0.010, t=1000.0 + i) for i in range(4)]
    g = compare(s, r)
    assert g["spec"]["complete"] == 4 and g["spec"]["tpot_s"]["p50"] == pytest.approx(0.005)
    assert g["ratio"]["tpot_p50"] == pytest.approx(0.5) and g["speedup"] == pytest.approx(2.0)
    assert g["ratio"]["ttft_p50"] == pytest.approx(1.0)
    assert g["e2e_speedup"] == pytest.approx((0.05 + 0.08) / (0.05 + 0.04))
    # a missing side is never a ratio of 0 or 1
    empty = compare(s, [])
    assert empty["ratio"]["tpot_p50"] is None and empty["speedup"] is None and empty["ref"]["complete"] == 0


def test_groups_per_phase_bucket_and_sampling_in_configured_order():
    recs = workload({("short", "greedy"): 0.005, ("long", "greedy"): 0.008, ("long", "t07p09"): 0.012})
    spec = {"baseline": [r for r in recs if r.server == "spec" and r.send_time < 1100]}
    ref = {"baseline": [r for r in recs if r.server == "ref" and r.send_time < 1100]}
    rows = mirror_groups(spec, ref, buckets=["short", "medium", "long"], sampling=["greedy", "t07p09"])
    keys = [(g["bucket"], g["sampling"]) for g in rows]
    assert keys == [("short", "greedy"), ("long", "greedy"), ("long", "t07p09"), (ALL, "greedy"), (ALL, "t07p09")]
    long_sampled = rows[2]
    assert long_sampled["ratio"]["tpot_p50"] == pytest.approx(1.2) and long_sampled["spec"]["complete"] == 6
    pooled = rows[3]
    assert pooled["spec"]["complete"] == 12 and pooled["ref"]["complete"] == 12


def test_healthy_speculation_passes():
    run = recorded_run(workload({("short", "greedy"): 0.004, ("long", "t07p09"): 0.011}), [], EVENTS, cfg())
    checks = by_name(mirror.check(run))
    assert set(checks) == {"mirror.baseline.greedy.tpot_ratio", "mirror.baseline.t07p09.tpot_ratio",
                           "mirror.after.greedy.tpot_ratio", "mirror.after.t07p09.tpot_ratio", "mirror.compared"}
    assert all(c.passed for c in checks.values()), [c for c in checks.values() if not c.passed]
    assert checks["mirror.baseline.greedy.tpot_ratio"].observed == pytest.approx(0.4)
    assert checks["mirror.baseline.t07p09.tpot_ratio"].observed == pytest.approx(1.1)
    assert checks["mirror.compared"].observed == 4
    sec = mirror.section(run)
    assert sec["enabled"] and sec["requests"] == {"spec": 24, "ref": 24}
    assert all(g["judged"] for g in sec["groups"])


def test_speculative_tpot_one_and_a_half_times_plain_fails():
    run = recorded_run(workload({("short", "greedy"): 0.004, ("long", "t07p09"): 0.015}), [], EVENTS, cfg())
    checks = by_name(mirror.check(run))
    bad = checks["mirror.baseline.t07p09.tpot_ratio"]
    assert bad.passed is False and bad.observed == pytest.approx(1.5) and bad.limit == 1.2
    assert "speculative TPOT p50 15.0 ms ÷ plain 10.0 ms" in bad.detail
    assert checks["mirror.baseline.greedy.tpot_ratio"].passed


def test_limit_statistic_and_phases_are_configurable():
    recs = workload({("short", "greedy"): 0.015})
    assert by_name(mirror.check(recorded_run(recs, [], EVENTS, cfg(max_tpot_ratio=1.6))))[
        "mirror.after.greedy.tpot_ratio"].passed
    only_after = by_name(mirror.check(recorded_run(recs, [], EVENTS, cfg(phases=["after"], statistic="p95"))))
    assert "mirror.baseline.greedy.tpot_ratio" not in only_after
    assert_failed(only_after["mirror.after.greedy.tpot_ratio"])


def test_speedup_floor_per_bucket_when_set():
    recs = workload({("short", "greedy"): 0.004, ("long", "greedy"): 0.009})
    assert not any(c.name.endswith(".speedup") for c in mirror.check(recorded_run(recs, [], EVENTS, cfg())))
    checks = by_name(mirror.check(recorded_run(recs, [], EVENTS, cfg(min_speedup=1.5))))
    assert checks["mirror.baseline.short.greedy.speedup"].passed
    long_ = checks["mirror.baseline.long.greedy.speedup"]
    assert long_.passed is False and long_.observed == pytest.approx(10 / 9)


def test_nothing_to_compare_fails_never_passes():
    spec_only = [r for r in workload({("short", "greedy"): 0.004}) if r.server == "spec"]
    checks = mirror.check(recorded_run(spec_only, [], EVENTS, cfg()))
    assert [c.name for c in checks] == ["mirror.compared"] and checks[0].passed is False
    few = workload({("short", "greedy"): 0.004}, n=2)
    checks = by_name(mirror.check(recorded_run(few, [], EVENTS, cfg())))
    assert checks["mirror.compared"].passed is False and "too few requests: baseline/all/greedy (2 vs 2" in \
        checks["mirror.compared"].detail


def test_without_mirror_mode_nothing_is_judged():
    run = recorded_run(workload({("short", "greedy"): 0.004}), [], EVENTS, SpecchaosConfig())
    assert mirror.check(run) == [] and mirror.section(run) == {"enabled": False}


def test_reference_records_change_no_other_verdict():
    """The spec server's load alone is what SLO and integrity judge; mirror mode's slow
    reference requests and their sampled outputs do not move them."""
    spec = [r for r in workload({("short", "greedy"): 0.004}) if r.server == "spec"]
    ref = [dataclasses.replace(r, token_ids=[7] * 9) for r in workload({("short", "greedy"): 0.004}, ref_tpot=5.0)
           if r.server == "ref"]
    reference = [dataclasses.replace(r, source="reference", server="ref") for r in spec[:6]]
    alone = recorded_run(spec, reference, EVENTS, cfg())
    mirrored = recorded_run(spec + ref, reference, EVENTS, cfg())
    assert len(mirrored.records) == len(spec) and len(mirrored.ref_records) == len(ref)
    assert mirrored.phases == alone.phases
    for family in (slo, integrity):
        assert [c.to_dict() for c in family.check(mirrored)] == [c.to_dict() for c in family.check(alone)]


def test_sampled_requests_are_not_comparable_never_mismatches():
    greedy = [rec("spec", 0.004, t=1001.0 + i, prompt_id=i) for i in range(3)]
    sampled = [dataclasses.replace(rec("spec", 0.004, t=1010.0 + i, prompt_id=i, sampling="t07p09"), token_ids=[1] * 9)
               for i in range(3)]
    reference = [dataclasses.replace(r, source="reference", server="ref") for r in greedy]
    run = recorded_run(greedy + sampled, reference, EVENTS, cfg())
    checks = by_name(integrity.check(run))
    assert checks["integrity.mismatched"].passed and checks["integrity.compared"].observed == 3
    assert integrity.section(run)["not_comparable"] == 3
    # a greedy record with the same wrong ids is a mismatch
    wrong = dataclasses.replace(sampled[0], sampling="greedy")
    run = recorded_run(greedy + [wrong], reference, EVENTS, cfg())
    assert_failed(by_name(integrity.check(run))["integrity.mismatched"])


def test_summary_shows_the_mirror_table():
    from harness.report.judge import judge
    from rich.console import Console

    run = recorded_run(workload({("short", "greedy"): 0.004, ("long", "t07p09"): 0.011}), [], EVENTS, cfg())
    report = judge(run, {"experiment": "mirror"})
    assert report["mirror"]["enabled"] and len(report["mirror"]["groups"]) == 8
    console = Console(width=200, record=True)
    console.print(render_summary(report))
    text = console.export_text()
    assert "speculative vs plain" in text and "t07p09" in text and "2.50×" in text and "1.10" in text

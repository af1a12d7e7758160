"""The pacing check (harness.checks.pacing) fed a pacer on time and one that fell behind:
the late one fails ``pacing.lag_p99_s``, an empty account is not judged, a closed loop or
an undeclared limit has no check; the section carries the lag figures. Also the judge
reads ``load_stats.json`` from a run directory into ``RecordedRun.load_stats``."""

from __future__ import annotations

import json
import random

import pytest

from harness.checks.pacing import check, section
from harness.checks.run import load_run, recorded_run
from harness.experiment.config import SpecchaosConfig
from harness.load.lag import LagHistogram
from harness.load.profiles import lag_fields


def stats_with(lags: list[float]) -> dict:
    hist = LagHistogram()
    for x in lags:
        hist.add(x)
    return {"kind": "open", "rate": 200.0, "arrivals": len(lags), "dropped": 0, **lag_fields(hist)}


def run_with(stats: dict | None, limit: float | None):
    limits = SpecchaosConfig.model_validate({"load": {"max_lag_p99_s": limit}} if limit else {})
    run = recorded_run([], [], [], limits)
    run.load_stats = stats
    return run


rng = random.Random(3)
ON_TIME = [rng.expovariate(1 / 0.0002) for _ in range(5000)]           # p99 about 0.9 ms
BEHIND = ON_TIME[:4900] + [rng.uniform(0.02, 0.2) for _ in range(100)]  # 2 % of arrivals 20-200 ms late


def test_a_pacer_on_time_passes():
    (c,) = check(run_with(stats_with(ON_TIME), 0.005))
    assert c.name == "pacing.lag_p99_s" and c.passed is True and c.observed < 0.005
    assert "p99" in c.detail and "5000 arrivals" in c.detail


def test_a_pacer_that_fell_behind_fails():
    (c,) = check(run_with(stats_with(BEHIND), 0.005))
    assert c.passed is False and c.observed > 0.005 and "fell behind" in c.detail


def test_no_arrival_is_not_judged():
    (c,) = check(run_with(stats_with([]), 0.005))
    assert c.passed is None and c.detail.startswith("not judged")


def test_closed_loop_or_no_limit_has_no_check():
    assert check(run_with(None, 0.005)) == []
    assert check(run_with(stats_with(BEHIND), None)) == []
    assert section(run_with(None, None)) is None


def test_section_reports_the_lag_figures_without_a_limit():
    s = section(run_with(stats_with(BEHIND), None))
    assert s["arrivals"] == 5000 and s["lag_p50_s"] <= s["lag_p99_s"] <= s["lag_max_s"]
    assert s["share_late_10ms"] == pytest.approx(0.02)


def test_load_run_reads_the_open_loops_account(tmp_path):
    (tmp_path / "load_stats.json").write_text(json.dumps(stats_with(BEHIND)))
    run = load_run(tmp_path, SpecchaosConfig.model_validate({"load": {"max_lag_p99_s": 0.005}}))
    (c,) = check(run)
    assert c.passed is False
    assert load_run(tmp_path / "missing", SpecchaosConfig()).load_stats is None


def test_the_summary_line_names_the_lag_figures():
    from harness.checks.pacing import summarize
    (line,) = summarize(section(run_with(stats_with(BEHIND), None)))
    assert line.text.startswith("pacer: 5000 arrivals, 0 dropped; lag p50/p95/p99/max ") and "than 10 ms 2.0%" in line.text
    assert summarize(None) == []

"""Figures per load step (harness.metrics.steps, the report's ``steps`` section): windows
from the schedule recorded on ``load_started``, cut at the stop; a ramp cut into windows;
per-step latency, errors and acceptance computed from the requests sent in each step."""

from __future__ import annotations

import math

import pytest

from harness.checks.run import recorded_run
from harness.checks.steps import section
from harness.experiment.config import SpecchaosConfig
from harness.load.config import ProfileConfig
from harness.metrics.speculation import SpeculationSeries
from harness.metrics.steps import RAMP_WINDOWS, schedule_fields, step_metrics, step_windows
from harness.report.summary import render_summary
from tests.factories import fail, make_record
from tests.metrics.test_speculation import ok

T0 = 1000.0


def events(profile: ProfileConfig, stop_s: float, users: int = 2) -> list[dict]:
    return [{"t": T0, "source": "runner", "event": "load_started", **schedule_fields(profile, users)},
            {"t": T0 + 5, "source": "runner", "event": "phase_start", "phase": "baseline"},
            {"t": T0 + 20, "source": "runner", "event": "phase_start", "phase": "fault"},
            {"t": T0 + stop_s, "source": "runner", "event": "load_stopped"}]


def test_closed_steps_become_one_window_each_cut_at_the_stop():
    p = ProfileConfig(kind="closed", users=1, steps=[{"at_s": 10, "users": 4}, {"at_s": 20, "users": 8},
                                                     {"at_s": 60, "users": 16}])
    steps = step_windows(events(p, stop_s=30))
    assert [(s["kind"], s["level"], s["start"] - T0, s["end"] - T0) for s in steps] == [
        ("level", 1, 0, 10), ("level", 4, 10, 20), ("level", 8, 20, 30)]   # the 16-user step never ran
    assert all(s["unit"] == "users" for s in steps) and steps[1]["offset_s"] == 10


def test_a_ramp_is_cut_into_windows_labelled_by_their_level():
    p = ProfileConfig(kind="open", rate=10, ramp={"from_rate": 0, "duration_s": 10})
    steps = step_windows(events(p, stop_s=15))
    ramp = [s for s in steps if s["kind"] == "ramp"]
    assert len(ramp) == RAMP_WINDOWS and steps[-1]["kind"] == "level" and steps[-1]["level"] == 10
    assert ramp[0]["from"] == 0 and ramp[-1]["to"] == pytest.approx(10)
    assert [s["level"] for s in ramp] == pytest.approx([1, 3, 5, 7, 9])
    assert all(s["unit"] == "rate" for s in steps)
    # contiguous, no overlap, no hole
    assert all(a["end"] == pytest.approx(b["start"]) for a, b in zip(steps, steps[1:]))


def test_a_constant_profile_or_an_old_run_has_no_steps():
    assert step_windows(events(ProfileConfig(kind="closed", users=4), stop_s=30)) == []
    assert step_windows([{"t": T0, "source": "runner", "event": "load_started", "users": 4}]) == []
    assert step_windows([]) == []


def test_schedule_fields_are_json_and_end_open():
    f = schedule_fields(ProfileConfig(kind="closed", steps=[{"at_s": 5, "users": 3}]), 2)
    assert f == {"unit": "users", "schedule": [[0.0, 5, 2.0, 2.0], [5, None, 3.0, 3.0]]}
    assert not any(isinstance(v, float) and math.isinf(v) for piece in f["schedule"] for v in piece if v is not None)


def test_per_step_figures_follow_the_requests_sent_in_each_step():
    """Slower TTFT and a failure in the second step, better acceptance in the first: each
    step's figures show its own requests only."""
    p = ProfileConfig(kind="closed", users=1, steps=[{"at_s": 10, "users": 4}])
    evs = events(p, stop_s=20)
    fast = [make_record(send_time=T0 + 1 + i, ttft=0.1) for i in range(8)]
    slow = [make_record(send_time=T0 + 11 + i, ttft=0.5) for i in range(8)]
    failed = fail(send_time=T0 + 12.5)
    lines = [ok(T0 + t, d, 4 * d, a) for t, d, a in ((0, 0, 0), (9.5, 100, 360), (19.5, 200, 480))]
    steps = step_metrics(step_windows(evs), [*fast, *slow, failed], {"baseline": (T0 + 5, T0 + 20)},
                         SpeculationSeries(lines))
    one, four = steps
    assert (one["level"], one["requests"], one["errors"]) == (1, 8, 0)
    assert (four["level"], four["requests"], four["errors"]) == (4, 9, 1)
    assert one["ttft_s"]["p50"] == pytest.approx(0.1) and four["ttft_s"]["p50"] == pytest.approx(0.5)
    assert one["acceptance"]["acceptance_rate"] == pytest.approx(0.9)
    assert four["acceptance"]["acceptance_rate"] == pytest.approx(0.3)
    assert one["phases"] == ["warmup", "baseline"] and four["phases"] == ["baseline"]


def test_the_report_section_and_the_summary_table(tmp_path):
    cfg = SpecchaosConfig()
    p = ProfileConfig(kind="closed", users=1, steps=[{"at_s": 10, "users": 4}])
    recs = [make_record(send_time=T0 + 1 + i) for i in range(19)]
    run = recorded_run(recs, [], events(p, stop_s=20), cfg)
    sec = section(run)
    assert sec["unit"] == "users" and [s["requests"] for s in sec["steps"]] == [9, 10]
    assert sec["steps"][0]["acceptance"] is None   # no metrics.jsonl in memory
    from rich.console import Console
    console = Console(record=True, width=200)
    console.print(render_summary({"verdict": "pass", "checks": [], "phases": run.phases, "steps": sec}))
    text = console.export_text()
    assert "per load step (users)" in text and "0 level" in text and "1 level" in text
    flat = section(recorded_run(recs, [], events(ProfileConfig(kind="closed", users=2), stop_s=20), cfg))
    assert flat["steps"] == [] and "one load level" in flat["note"]


def test_the_schedule_starts_at_the_first_request_when_it_precedes_the_event():
    p = ProfileConfig(kind="closed", users=1, steps=[{"at_s": 10, "users": 4}])
    steps = step_windows(events(p, stop_s=20), first_send=T0 - 1.5)
    assert [(s["start"] - T0, s["end"] - T0) for s in steps] == [(-1.5, 8.5), (8.5, 20)]
    assert step_windows(events(p, stop_s=20), first_send=T0 + 3)[0]["start"] == T0   # a later first send: the event


def test_a_trace_replay_without_a_rate_has_no_schedule_and_no_steps():
    p = ProfileConfig.model_construct(kind="open", rate=None, burstiness=1.0, max_in_flight=64, ramp=None, steps=[])
    f = schedule_fields(p, 4)
    assert f == {"unit": "rate", "schedule": []}
    assert step_windows([{"t": T0, "source": "runner", "event": "load_started", **f}]) == []

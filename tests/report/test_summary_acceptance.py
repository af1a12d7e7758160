"""The summary shows tokens per engine step (mean acceptance length) per phase, and the
client-side acceptance per bucket × sampling class × phase with the floor's verdict."""

from harness.checks.run import recorded_run
from harness.experiment.config import SpecchaosConfig
from harness.report.judge import judge
from tests.factories import make_record, phase_events
from tests.report.test_summary import REPORT, render

STARTS = {"baseline": 1000.0, "fault": 1030.0, "recovery": 1050.0, "after": 1070.0}


def report_of(long_steps):
    recs = []
    for t0 in STARTS.values():
        for i in range(10):
            recs.append(make_record(send_time=t0 + i, chunk_tokens=[1, 5, 5, 5, 5, 5, 5, 1], prompt_class="short"))
            recs.append(make_record(send_time=t0 + i, chunk_tokens=long_steps, prompt_class="long"))
    run = recorded_run(recs, [], phase_events(STARTS, 1100.0), SpecchaosConfig.model_validate(
        {"integrity": {"min_compared": 0}, "stack": {"reference": False}}))
    return judge(run, {"experiment": "x", "stack": {}})


def test_tokens_per_step_not_per_chunk():
    rep = report_of([1, 5, 5, 5, 5, 5, 5, 1])
    # every chunk of these streams: 32 tokens in 8 chunks = 4.00 per chunk; per step 5
    assert rep["phases"]["baseline"]["mean_tokens_per_chunk"] == 4.0
    text = render(rep)
    assert "tok/step" in text and "tok/chunk" not in text
    base = next(line for line in text.splitlines() if line.lstrip("│ ").startswith("baseline"))
    assert base.rstrip(" │").endswith("5.00"), base


def test_acceptance_table_per_bucket_sampling_phase_with_floor_verdict():
    text = render(report_of([1, 2, 1, 1, 1, 1, 1, 1]))
    assert "speculation, client side" in text and "k=4" in text
    short = next(line for line in text.splitlines() if "│ short" in line and "greedy" in line)
    long = next(line for line in text.splitlines() if "│ long" in line and "greedy" in line)
    assert "greedy" in short and "1.00 / 5.00 ✓" in short
    assert "0.04 / 1.17 ✗" in long            # 1 of 24 drafted tokens accepted (6 steps x 4)
    assert "acceptance_floor.baseline.long.greedy" in text


def test_old_reports_without_the_section_still_render():
    text = render(REPORT)
    assert "speculation, client side: not measured" in text

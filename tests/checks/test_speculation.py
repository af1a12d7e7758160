"""The speculation canaries on recorded ``metrics.jsonl`` series: a collapsing and a
saturating series fail, a healthy one passes, a restart is not a collapse, a server
without speculation is not judged, too few samples say so; and the report section."""

from __future__ import annotations

import json

from harness.checks import speculation
from harness.checks.base import RecordedRun
from harness.experiment.config import SpecchaosConfig
from harness.metrics.speculation import ACCEPTED, DRAFT_TOKENS, DRAFTS
from tests.asserts import assert_failed

K = 4


def write_series(tmp_path, rates, *, server="spec", step_s=0.5, drafts_per_step=4, restart_at=None, gaps=(),
                 lines=None):
    """A server scraped every ``step_s`` s from t=0; ``rates[i]`` is the acceptance rate of
    the drafts made between scrape i-1 and i. ``restart_at``: scrape index where a new
    process (new pid, counters from 0) answers; ``gaps``: failed scrape indices."""
    lines = [] if lines is None else lines
    d = tok = acc = 0.0
    pos = [0.0] * K
    pid = 100
    for i, rate in enumerate(rates):
        if restart_at is not None and i == restart_at:
            d = tok = acc = 0.0
            pos = [0.0] * K
            pid = 200
        t = i * step_s
        if i in gaps:
            lines.append({"t": t, "server": server, "ok": False, "error": "ReadTimeout: timed out",
                          "rss_bytes": None, "pid": None})
            continue
        d += drafts_per_step
        tok += drafts_per_step * K
        acc += drafts_per_step * K * rate
        pos = [p + drafts_per_step * min(1.0, rate * K - j) if rate * K > j else p for j, p in enumerate(pos)]
        counters = {"vllm:generation_tokens_total": d * 5}
        if server == "spec":
            counters.update({DRAFTS: d, DRAFT_TOKENS: tok, ACCEPTED: acc})
        lines.append({"t": t, "server": server, "ok": True, "pid": pid, "rss_bytes": 1 << 30, "counters": counters,
                      "per_position": {str(j): p for j, p in enumerate(pos)} if server == "spec" else {},
                      "gauges": {"vllm:num_requests_running": 4.0}, "histograms": {}})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(ln) + "\n" for ln in lines))
    return lines


def run_of(tmp_path, end_s, **limits) -> RecordedRun:
    cfg = SpecchaosConfig.model_validate({"speculation": limits} if limits else {})
    third = end_s / 3
    windows = {"baseline": (0.0, third), "fault": (third, 2 * third), "after": (2 * third, end_s)}
    return RecordedRun(records=[], reference={}, events=[], limits=cfg, windows=windows, run_dir=tmp_path)


def by_name(results):
    return {r.name: r for r in results}


def test_healthy_steady_acceptance_passes_both_canaries(tmp_path):
    write_series(tmp_path, [0.8] * 60)
    res = by_name(speculation.check(run_of(tmp_path, 30.0)))
    assert set(res) == {"speculation.spec.collapse", "speculation.spec.saturation"}
    assert res["speculation.spec.collapse"].passed and res["speculation.spec.collapse"].observed == 0
    assert res["speculation.spec.saturation"].passed and res["speculation.spec.saturation"].observed == 0
    assert "5 pair(s)" in res["speculation.spec.collapse"].detail


def test_a_collapse_fails(tmp_path):
    write_series(tmp_path, [0.85] * 30 + [0.3] * 30)          # 0.85 → 0.3 at t = 15 s
    r = by_name(speculation.check(run_of(tmp_path, 30.0)))["speculation.spec.collapse"]
    assert r.passed is False and r.observed == 0.55 and r.limit == 0.3
    assert "0.850 → 0.300" in r.detail


def test_a_fall_within_the_limit_passes_and_the_limit_is_configurable(tmp_path):
    write_series(tmp_path, [0.85] * 30 + [0.65] * 30)
    assert by_name(speculation.check(run_of(tmp_path, 30.0)))["speculation.spec.collapse"].passed
    strict = by_name(speculation.check(run_of(tmp_path, 30.0, collapse_max_drop=0.1)))
    assert_failed(strict["speculation.spec.collapse"])


def test_a_saturation_fails(tmp_path):
    write_series(tmp_path, [0.5] * 30 + [1.0] * 30)
    res = by_name(speculation.check(run_of(tmp_path, 30.0)))
    r = res["speculation.spec.saturation"]
    assert r.passed is False and r.observed == 0.5 and "0.500 → 1.000" in r.detail
    assert res["speculation.spec.collapse"].passed


def test_always_saturated_is_not_a_jump(tmp_path):
    """draft-exact with greedy load sits at 1.0 from the first window: nothing jumped."""
    write_series(tmp_path, [1.0] * 60)
    assert all(r.passed for r in speculation.check(run_of(tmp_path, 30.0)))


def test_a_restart_to_a_worse_draft_is_not_a_collapse(tmp_path):
    """The pairs of windows around a restart (counters started over) are not compared."""
    write_series(tmp_path, [0.9] * 30 + [0.2] * 30, restart_at=30, gaps=range(26, 30))
    res = by_name(speculation.check(run_of(tmp_path, 30.0)))
    assert res["speculation.spec.collapse"].passed, res["speculation.spec.collapse"].detail
    sec = speculation.section(run_of(tmp_path, 30.0))["servers"]["spec"]
    assert sec["resets"] == 1 and sec["gaps"] == 4


def test_the_same_fall_without_a_restart_fails(tmp_path):
    write_series(tmp_path, [0.9] * 30 + [0.2] * 30, gaps=range(26, 30))
    assert_failed(by_name(speculation.check(run_of(tmp_path, 30.0)))["speculation.spec.collapse"])


def test_server_without_speculation_is_not_judged(tmp_path):
    lines = write_series(tmp_path, [0.8] * 60)
    write_series(tmp_path, [0.0] * 60, server="ref", lines=lines)
    res = by_name(speculation.check(run_of(tmp_path, 30.0)))
    assert not any(n.startswith("speculation.ref.") for n in res)
    sec = speculation.section(run_of(tmp_path, 30.0))
    assert sec["servers"]["ref"]["speculative"] is False
    assert sec["servers"]["ref"]["phases"]["baseline"]["acceptance_rate"] is None


def test_too_few_samples_are_not_judged_and_say_so(tmp_path):
    write_series(tmp_path, [0.9] * 6)                        # 3 s: one window
    res = speculation.check(run_of(tmp_path, 3.0))
    assert len(res) == 2 and all(r.passed is None and not r.judged and r.observed is None for r in res)
    assert all(r.detail.startswith("not judged: no two consecutive 5 s windows") for r in res)


def test_a_run_without_metrics_has_no_speculation_checks(tmp_path):
    assert speculation.check(run_of(tmp_path, 30.0)) == []
    assert speculation.section(run_of(tmp_path, 30.0))["note"] == "no metrics.jsonl recorded in this run"


def test_section_reports_vllm_fields_per_phase(tmp_path):
    write_series(tmp_path, [0.75] * 60)
    sec = speculation.section(run_of(tmp_path, 30.0))
    base = sec["servers"]["spec"]["phases"]["baseline"]
    assert base["acceptance_rate"] == 0.75
    assert base["mean_acceptance_length"] == 1 + 0.75 * K
    assert base["per_position_acceptance"] == [1.0, 1.0, 1.0, 0.0]
    assert base["num_requests_running_max"] == 4.0 and base["samples"] == 20
    assert sec["servers"]["spec"]["canaries"]["pairs_judged"] == 5
    json.dumps(sec)

"""The speculation canaries on recorded ``metrics.jsonl`` series: a collapsing and a
saturating series fail, a healthy one passes, a restart is not a collapse, a server
without speculation is not judged, too few samples say so; and the report section.
Known answers of the test (windows as clusters): the real set's thin window of 84 draft
tokens with none accepted is no collapse, a draft that stops being accepted is, an exact
draft falling to 0 is; counters reset by a restart make no collapse, whichever marker
tells the restart."""

from __future__ import annotations

import json
import random

import pytest

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
    assert res["speculation.spec.collapse"].passed is True and res["speculation.spec.collapse"].observed == 0
    assert res["speculation.spec.saturation"].passed is True and res["speculation.spec.saturation"].observed == 0
    assert "α = 0.01" in res["speculation.spec.collapse"].detail
    assert "Bonferroni over 2 span(s)" in res["speculation.spec.collapse"].detail   # 6 windows: 3 + 2, 4 + 2


def test_a_collapse_fails(tmp_path):
    write_series(tmp_path, [0.85] * 30 + [0.3] * 30)          # 0.85 → 0.3 at t = 15 s
    r = by_name(speculation.check(run_of(tmp_path, 30.0)))["speculation.spec.collapse"]
    assert r.passed is False and r.limit == 0.3
    assert 0.3 < r.observed < 0.55                          # the fall one can be confident of: below the point fall
    assert "0.850 over 3 window(s) → 0.300" in r.detail and "at 99% confidence" in r.detail


def test_a_fall_within_the_limit_passes_and_the_limit_is_configurable(tmp_path):
    write_series(tmp_path, [0.85] * 30 + [0.65] * 30)
    assert by_name(speculation.check(run_of(tmp_path, 30.0)))["speculation.spec.collapse"].passed is True
    strict = by_name(speculation.check(run_of(tmp_path, 30.0, collapse_max_drop=0.1)))
    assert strict["speculation.spec.collapse"].passed is False


def test_a_saturation_fails(tmp_path):
    write_series(tmp_path, [0.5] * 30 + [1.0] * 30)
    res = by_name(speculation.check(run_of(tmp_path, 30.0)))
    r = res["speculation.spec.saturation"]
    assert r.passed is False and 0.3 < r.observed <= 0.5 and "0.500 over 3 window(s) → 1.000" in r.detail
    assert res["speculation.spec.collapse"].passed is True


def test_always_saturated_is_not_a_jump(tmp_path):
    """draft-exact with greedy load sits at 1.0 from the first window: nothing jumped."""
    write_series(tmp_path, [1.0] * 60)
    assert all(r.passed is True for r in speculation.check(run_of(tmp_path, 30.0)))


def test_a_restart_to_a_worse_draft_is_not_a_collapse(tmp_path):
    """Each incarnation is judged apart: the windows before a restart (counters started
    over) are no reference for the windows after it."""
    write_series(tmp_path, [0.9] * 50 + [0.2] * 50, restart_at=50, gaps=range(46, 50))
    res = by_name(speculation.check(run_of(tmp_path, 50.0)))
    assert res["speculation.spec.collapse"].passed is True, res["speculation.spec.collapse"].detail
    assert "in 2 incarnation(s)" in res["speculation.spec.collapse"].detail
    sec = speculation.section(run_of(tmp_path, 50.0))["servers"]["spec"]
    assert sec["resets"] == 1 and sec["gaps"] == 4


def test_the_same_fall_without_a_restart_fails(tmp_path):
    write_series(tmp_path, [0.9] * 50 + [0.2] * 50, gaps=range(46, 50))
    assert by_name(speculation.check(run_of(tmp_path, 50.0)))["speculation.spec.collapse"].passed is False


# ---------------------------------------------------------------- known answers of the test
def write_windows(tmp_path, windows, *, scrapes=10, step_s=0.5, marker="pid", restart_at=None, carried=(0, 0)):
    """One server scraped every ``step_s`` s, ``scrapes`` scrapes a window; ``windows[i]`` =
    (draft tokens, accepted) of window i, spread evenly over its scrapes. ``restart_at``:
    the window from which a new incarnation answers, its counters from ``carried`` (what it
    counted before its first scrape); ``marker``: what tells the restart on the lines —
    ``pid`` (the scraper's API pid), ``incarnation`` (the supervisor's number, no pid),
    ``start`` (the page's process start time, no pid), None (nothing)."""
    lines, tok, acc, d, inc = [], 0.0, 0.0, 0.0, 0
    for w, (n, a) in enumerate(windows):
        if w == restart_at:
            tok, acc = map(float, carried)
            d = tok / K
            inc = 1
        for j in range(scrapes):
            tok, acc, d = tok + n / scrapes, acc + a / scrapes, d + n / scrapes / K
            ln = {"t": (w * scrapes + j) * step_s, "server": "spec", "ok": True, "rss_bytes": 1 << 30,
                  "counters": {DRAFTS: d, DRAFT_TOKENS: tok, ACCEPTED: acc}, "per_position": {},
                  "gauges": {"vllm:num_requests_running": 4.0}, "histograms": {}}
            if marker == "pid":
                ln["pid"] = 100 + inc
            elif marker == "incarnation":
                ln["incarnation"] = inc
            elif marker == "start":
                ln["gauges"]["process_start_time_seconds"] = 1.7e9 + inc
            lines.append(ln)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(ln) + "\n" for ln in lines))
    return len(windows) * scrapes * step_s


def real_draft_windows(n_windows, seed=34):
    """A draft like draft-l25 on SmolLM2 at 4 users: each 5 s window 60–140 draft tokens at
    an acceptance rate of 0.10–0.40 (the prompts in flight decide)."""
    rnd = random.Random(seed)
    out = []
    for _ in range(n_windows):
        n = rnd.randint(60, 140)
        out.append((n, round(n * rnd.uniform(0.10, 0.40))))
    return out


def test_the_real_sets_thin_window_of_no_accepted_tokens_is_no_collapse(tmp_path):
    """Known answer (a), the run of issue 34: in the after phase one 5 s window of 84 draft
    tokens with none accepted, next to one at 0.40, from a draft accepting 0.10–0.40 per
    window: ordinary for that draft, not a collapse (the pairwise canary called it one:
    0.400 → 0.000)."""
    ws = real_draft_windows(60)
    ws[49], ws[50] = (100, 40), (84, 0)
    end = write_windows(tmp_path, ws)
    res = by_name(speculation.check(run_of(tmp_path, end)))
    assert res["speculation.spec.collapse"].passed is True, res["speculation.spec.collapse"].detail
    c = speculation.section(run_of(tmp_path, end))["servers"]["spec"]["canaries"]
    assert c["collapse"]["bound"] < 0.1 and c["spans_tested"] == 60 - 3 - 2 + 1


def test_one_empty_window_is_no_collapse_even_judged_alone(tmp_path):
    """A better draft (0.4–0.7 a window) and spans of one window: the empty window falls
    0.55 from the mean, beyond the 0.3 limit, but not beyond it with 99% confidence given
    how much this draft's windows scatter."""
    rnd = random.Random(7)
    ws = [(n, round(n * rnd.uniform(0.4, 0.7))) for n in (rnd.randint(60, 140) for _ in range(60))]
    ws[50] = (84, 0)
    end = write_windows(tmp_path, ws)
    r = by_name(speculation.check(run_of(tmp_path, end, span_windows=1)))["speculation.spec.collapse"]
    assert r.passed is True and r.observed < 0.3, r.detail


def test_a_draft_that_stops_being_accepted_collapses(tmp_path):
    """Known answer (b): a draft at 0.85–0.95 whose acceptance falls to 0 for several
    windows with plenty of draft tokens (a wrong-vocabulary draft: no token it proposes is
    the target's) within one incarnation."""
    rnd = random.Random(3)
    ws = [(n, round(n * rnd.uniform(0.85, 0.95))) for n in (rnd.randint(150, 250) for _ in range(20))]
    ws += [(rnd.randint(150, 250), 0) for _ in range(6)]
    end = write_windows(tmp_path, ws)
    r = by_name(speculation.check(run_of(tmp_path, end)))["speculation.spec.collapse"]
    assert r.passed is False and r.observed > 0.8, r.detail
    assert "acceptance rate fell" in r.detail


def test_an_exact_draft_falling_to_zero_collapses(tmp_path):
    """Known answer (c): every token accepted (no spread at all between windows), then none."""
    end = write_windows(tmp_path, [(160, 160)] * 6 + [(160, 0)] * 3)
    r = by_name(speculation.check(run_of(tmp_path, end)))["speculation.spec.collapse"]
    assert r.passed is False and r.observed > 0.9, r.detail


@pytest.mark.parametrize("marker", ["pid", "incarnation", "start"])
def test_counters_reset_by_a_restart_make_no_collapse(tmp_path, marker):
    """A restart to a worse draft (0.9 → 0.2) whose new counters are already past the old
    ones at its first scrape (nothing went down): only the changed incarnation marker tells
    the restart, and each incarnation is judged apart — no collapse. Without any marker the
    same lines are one incarnation, and the fall is a collapse."""
    windows = [(20, 18)] * 8 + [(400, 80)] * 8
    end = write_windows(tmp_path, windows, restart_at=8, marker=marker, carried=(1000, 200))
    res = by_name(speculation.check(run_of(tmp_path, end)))
    assert all(r.passed is True for r in res.values()), {n: r.detail for n, r in res.items()}
    assert "in 2 incarnation(s)" in res["speculation.spec.collapse"].detail
    assert speculation.section(run_of(tmp_path, end))["servers"]["spec"]["resets"] == 1
    write_windows(tmp_path, windows, restart_at=8, marker=None, carried=(1000, 200))
    assert by_name(speculation.check(run_of(tmp_path, end)))["speculation.spec.collapse"].passed is False


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
    assert all(r.detail.startswith("not judged: no incarnation with 3 + 2 5 s windows") for r in res)


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
    assert sec["servers"]["spec"]["canaries"]["spans_tested"] == 2
    json.dumps(sec)


def test_any_incarnation_marker_that_differs_is_a_restart():
    """An external server's incarnation number stays 0: its page's start time still tells a
    restart; a marker only one line carries tells nothing."""
    from harness.metrics.speculation import incarnation, same_incarnation

    a = incarnation({"incarnation": 0, "pid": None, "gauges": {"process_start_time_seconds": 1.0}})
    b = incarnation({"incarnation": 0, "gauges": {"process_start_time_seconds": 2.0}})
    assert a == (("incarnation", 0), ("start", 1.0)) and not same_incarnation(a, b)
    assert same_incarnation(a, incarnation({"pid": 7})) and same_incarnation(a, ())
    assert not same_incarnation(incarnation({"incarnation": 1, "pid": 7}), incarnation({"incarnation": 2, "pid": 7}))

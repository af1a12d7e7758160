import io
import json

from rich.console import Console

from harness.checks import server_memory
from harness.checks.base import CheckResult, RecordedRun
from harness.checks.verdict import verdict
from harness.experiment.config import SpecchaosConfig
from harness.report.summary import print_summary, render_summary


def pct(a, b):
    return {"p50": a, "p95": b, "p99": b}


REPORT = {
    "experiment": "kill the draft worker",
    "verdict": "fail",
    "stack": {"launcher": "local", "vllm_version": "0.32.0",
              "speculative": {"method": "draft_model", "draft": "draft-exact", "num_speculative_tokens": 4}},
    "faults": [{"kind": "process-kill", "target": "spec/worker", "injected_at": 1.0, "cleared_at": 2.0, "acted": True}],
    "phases": {
        "baseline": {"requests": 120, "errors": 0, "ttft_s": pct(0.0421, 0.0876), "tpot_s": pct(0.012, 0.02),
                     "itl_s": pct(0.004, 0.009), "e2e_s": pct(0.51, 0.93), "output_tokens_per_s": 321.5},
        "fault": {"requests": 40, "errors": 38, "ttft_s": pct(None, None), "tpot_s": pct(None, None),
                  "itl_s": pct(None, None), "e2e_s": pct(None, None), "output_tokens_per_s": 0.0},
    },
    "checks": [
        {"name": "slo.baseline.ttft_p95_s", "category": "slo", "passed": True, "observed": 0.0876, "limit": 2.0,
         "detail": ""},
        {"name": "recovery.time_to_slo_s", "category": "recovery", "passed": False, "observed": None, "limit": 180.0,
         "detail": "never recovered (slo not reached)"},
    ],
    "requests": {"total": 300, "ok": 250, "failed": 50},
    "integrity": {"compared": 250, "mismatched": 0, "near_ties": 3, "malformed": 0, "false_success": 0,
                  "first_divergence": None},
    "recovery": {"time_to_healthy_s": 21.34, "time_to_first_success_s": 22.0, "time_to_slo_s": None},
    "restarts": 1,
    "errors": [],
}


def render(report):
    con = Console(file=io.StringIO(), width=200, record=True, color_system=None)
    con.print(render_summary(report))
    return con.export_text()


def test_summary_shows_verdict_phases_recovery_integrity_and_checks_failed_first():
    text = render(REPORT)
    assert text.startswith("FAIL  kill the draft worker")
    assert "process-kill on spec/worker (acted)" in text
    assert "restarts: 1" in text
    # a phase row of each table: requests/availability, latency in ms
    base = [line for line in text.splitlines() if line.strip().startswith("│ baseline")]
    assert "120" in base[0] and "321.5" in base[0]
    assert "42.1/87.6" in base[1]
    assert "recovery" in text and "after" in text  # absent phases still listed
    assert "21.34 s" in text and "never" in text
    assert "compared" in text and "250" in text
    assert [line for line in text.splitlines() if "near ties" in line and "3" in line]
    assert text.index("FAIL ") < text.index("PASS") and text.index("recovery.time_to_slo_s") < text.index(
        "slo.baseline.ttft_p95_s")


def test_summary_of_an_error_report_with_little_data():
    text = render({"verdict": "error", "errors": ["no fault was injected"], "interrupted": True})
    assert "ERROR" in text and "no fault was injected" in text and "interrupted" in text


def test_print_summary_to_a_console():
    buf = io.StringIO()
    print_summary(REPORT, Console(file=buf, width=160, color_system=None))
    assert "recovery.time_to_slo_s" in buf.getvalue()


def test_summary_shows_speculation_in_vllm_words_and_memory_swing():
    rep = dict(REPORT)
    rep["speculation"] = {"servers": {
        "spec": {"speculative": True, "phases": {"baseline": {
            "acceptance_rate": 0.994, "mean_acceptance_length": 4.976, "per_position_acceptance": [1.0, 0.99, 0.98, 0.97],
            "draft_tokens": 14852.0, "gaps": 0, "resets": 0}}},
        "ref": {"speculative": False, "phases": {"baseline": {"acceptance_rate": None, "gaps": 0, "resets": 0}}}}}
    rep["server_memory"] = {"gpu_note": "no NVIDIA GPU on this host (NVML: NVML Shared Library Not Found)",
                            "servers": {"spec": {"baseline": {"swing": 0.0675}}}}
    text = render(rep)
    for s in ("acceptance rate", "mean acceptance length", "per-position acceptance", "99.4%", "4.98",
              "1.00 0.99 0.98 0.97", "14852", "6.8%", "no speculation", "GPU memory swing",
              "not judged: no NVIDIA GPU on this host"):
        assert s in text, s
    assert "speculative decoding" not in render(REPORT)      # nothing scraped: no table


def test_summary_states_the_workload_in_one_line():
    from harness.load.config import LoadConfig
    from harness.load.profiles import load_section
    from harness.load.prompts import Prompt

    prompts = [Prompt(0, "short", "hello there", 4, 8)]
    closed = load_section(LoadConfig(users=4, seed=9), prompts)
    lines = [l for l in render({**REPORT, "load": closed}).splitlines() if l.startswith("workload:")]
    assert lines == [f"workload: closed loop 4 users; retry exponential 0.5..8 s x2, jitter openai; seed 9, "
                     f"plan {closed['plan_digest'][:16]}"]
    opened = load_section(LoadConfig(seed=9, retry={"max_retries": 0},
                                     profile={"kind": "open", "rate": 12.5, "burstiness": 0.5}), prompts)
    opened["open_loop"] = {"arrivals": 100, "dropped": 3}
    text = render({**REPORT, "load": opened})
    assert "workload: open loop 12.5 req/s, burstiness 0.5, max in flight 64; no retries; 3/100 arrivals dropped" in text
    assert "workload:" not in render(REPORT)


def phase_of(**kw):
    d = {"start": 130.0, "duration_s": 33.5, "requests": 7, "errors": 2, "tries": 1009, "unavailable_s": 20.25,
         "complete": 4, "enough_samples": False, "min_samples": 10, "output_tokens_per_s": 3.1,
         "ttft_s": pct(0.102, 0.104), "tpot_s": pct(0.01, 0.01), "itl_s": pct(0.02, 0.03),
         "itl_per_token_s": pct(0.005, 0.006), "e2e_s": pct(1.865, 1.865),
         "latency_window": {"first_send": 160.2, "last_send": 162.9, "outage_start": 131.3, "outage_end": 160.5,
                            "sent_after_outage_start": 4},
         "buckets": {"short": {"complete": 4, "enough_samples": False, "ttft_s": pct(0.1, 0.1)}}}
    d.update(kw)
    return d


def test_thin_phase_prints_n_and_where_its_figures_come_from():
    rep = {**REPORT, "phases": {**REPORT["phases"], "fault": phase_of()},
           "requests": {"total": 1300, "ok": 250, "failed": 1050, "logical": 298, "logical_failed": 48},
           "checks": REPORT["checks"] + [
               {"name": "slo.after.ttft_p95_s", "category": "slo", "passed": None, "judged": False, "observed": 1.865,
                "limit": 1.0, "detail": "not judged: after p95 TTFT (s) rests on 1 complete request"}]}
    text = render(rep)
    fault = [line for line in text.splitlines() if line.strip().startswith("│ fault")]
    # requests and availability: 7 logical requests, 2 failed, 1009 tries, 20.25 s unavailable
    assert "│        7 │" in fault[0] and "1009" in fault[0] and "20.25" in fault[0]
    # latency: n=4 instead of a percentile of 4 requests, and no 1865/1865
    assert fault[1].count("n=4") == 5 and "1865" not in fault[1]
    assert ("fault: 4 of the 4 complete requests were sent after the outage began (+1.3 s into the phase; ended "
            "+30.5 s): the figures describe the server after it came back") in " ".join(text.split())
    # per bucket, the same rule
    assert any("short" in line and "n=4" in line for line in text.splitlines())
    # the not-judged check: N/J, after the failures, before the passes
    assert "N/J" in text and "298 logical requests, 48 failed after retries" in text
    assert text.index("recovery.time_to_slo_s") < text.index("slo.after.ttft_p95_s") < text.index(
        "slo.baseline.ttft_p95_s")


def test_enough_samples_prints_percentiles():
    rep = {**REPORT, "phases": {"after": phase_of(complete=40, enough_samples=True, latency_window={})}}
    after = [line for line in render(rep).splitlines() if line.strip().startswith("│ after")]
    assert "102/104" in after[1] and "1865/1865" in after[1] and "n=" not in after[1]


def test_summary_of_an_aborted_run_says_why_and_how_fast():
    ab = {"safeguard": "error_rate", "detection_latency_s": 0.21, "fault_to_abort_s": 4.3,
          "reason": "aborted by safeguard error_rate: error_rate 1 over 16 requests > 0.5 for 2 s (window 2 s)"}
    text = render({**REPORT, "verdict": "aborted", "safeguards": {"abort": ab},
                   "recovery": {**REPORT["recovery"], "resolution_s": 0.031}})
    assert text.startswith("ABORTED  kill the draft worker")
    assert "aborted by safeguard error_rate: error_rate 1 over 16 requests > 0.5" in text
    assert "detection latency 0.21 s beyond for_s, 4.30 s after the fault; rollbacks ran" in text
    assert "recovery resolution" in text and "31 ms" in text



def test_a_swing_check_on_too_few_samples_shows_n_j_never_pass(tmp_path):
    """A server_memory swing with too few RSS samples, judged by the real check from a
    recorded metrics.jsonl, is N/J in the summary with its reason, never PASS; it leaves a
    healthy run's verdict pass (the judged checks make it)."""
    (tmp_path / "metrics.jsonl").write_text("".join(
        json.dumps({"t": t, "server": "spec", "ok": True, "pid": 100, "rss_bytes": v}) + "\n"
        for t, v in ((0.0, 1 << 30), (0.5, 2 << 30), (1.0, 1 << 30))))
    run = RecordedRun(records=[], reference={}, events=[], limits=SpecchaosConfig(),
                      windows={"baseline": (0.0, 10.0)}, run_dir=tmp_path)
    (swing,) = [c for c in server_memory.check(run) if c.name == "server_memory.spec.baseline.rss_swing"]
    assert swing.passed is None
    slo = CheckResult("slo.baseline.ttft_p95_s", "slo", True, 0.0876, 2.0)
    rep = {**REPORT, "verdict": verdict([slo, swing], fault_acted=True, errors=[]),
           "checks": [slo.to_dict(), swing.to_dict()]}
    assert rep["verdict"] == "pass"
    text = render(rep)
    rows = [line for line in text.splitlines() if "server_memory.spec.baseline.rss_swing" in line]
    assert len(rows) == 1 and rows[0].lstrip("│ ").startswith("N/J"), rows
    assert "PASS" not in rows[0] and "not judged: no RSS of one server process tree" in rows[0]
    assert text.startswith("PASS")


def test_the_summary_ends_with_the_failed_checks_the_required_count_and_the_verdict_with_its_exit_code():
    rep = {**REPORT, "required": {"judged": 2, "of": 3, "checks": [
        {"name": "recovery", "judged": True}, {"name": "fail_fast", "judged": True},
        {"name": "integrity", "judged": False, "reason": "no reference server"}]},
        "errors": ["required check integrity not judged: no reference server"], "verdict": "error"}
    lines = [ln for ln in render(rep).rstrip().splitlines() if ln.strip()]
    assert lines[-1].startswith("ERROR  kill the draft worker: 1 failed check(s), 0 not judged; exit code 2")
    assert lines[-2] == "FAIL recovery.time_to_slo_s: never recovered (slo not reached)"
    assert lines[-3] == "required: judged 2 of 3 (recovery, fail_fast, integrity)"
    assert lines[-4] == "error: required check integrity not judged: no reference server"
    assert render(REPORT).rstrip().splitlines()[-1].endswith("exit code 1")


def test_checks_not_judged_for_one_reason_collapse_into_one_row_per_category():
    why = "not judged: no NVIDIA GPU on this host (NVML: NVML Shared Library Not Found)"
    gpu = [{"name": f"gpu.{k}", "category": "gpu", "passed": None, "observed": None, "limit": 1.0, "detail": why}
           for k in ("temperature_c", "xid", "ecc", "throttle", "sm_clock_drop", "pcie")]
    text = render({**REPORT, "checks": [*REPORT["checks"], *gpu]})
    rows = [ln for ln in text.splitlines() if "gpu." in ln]
    assert len(rows) == 1 and "gpu.* (6 checks)" in rows[0]
    assert text.count("no NVIDIA GPU on this host") == 1
    # judged GPU checks, or fewer than three for one reason, stay one row each
    mixed = [gpu[0], gpu[1], {**gpu[2], "passed": True, "detail": "ok"}]
    assert len([ln for ln in render({**REPORT, "checks": mixed}).splitlines() if "gpu." in ln]) == 3


def test_a_registered_family_owns_its_section_view_and_phase_figures():
    """A family added with one registry call shows its section in the summary, its figures
    in the phase table and in Allure's per-phase CSV, without an edit to either renderer."""
    from harness.checks.registry import CheckFamily, register_check, unregister_check
    from harness.checks.view import Line, Table
    from harness.report.allure import phase_table_csv

    def summarize(sec):
        tab = Table("thermals", ["zone", "max °C"])
        for zone, t in (sec or {}).get("zones", {}).items():
            tab.add(zone, f"{t:.1f}")
        return [tab, Line("thermals: 2 zones", "note")] if sec else []

    def figures(sec):
        return {"zone max °C": {"baseline": 61.0, "fault": 88.5}} if sec else {}

    register_check(CheckFamily("thermals", lambda run: [], summarize=summarize, phase_figures=figures))
    try:
        rep = {**REPORT, "thermals": {"zones": {"cpu0": 88.5, "cpu1": 70.25}}}
        text = render(rep)
        assert "thermals" in text and "cpu0" in text and "88.5" in text and "thermals: 2 zones" in text
        base = next(ln for ln in text.splitlines() if ln.lstrip("│ ").startswith("baseline"))
        assert base.rstrip(" │").endswith("61.00"), base
        assert "zone max °C" in phase_table_csv(rep).splitlines()[0]
        assert "cpu0" not in render(REPORT)
    finally:
        unregister_check("thermals")

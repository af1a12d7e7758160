import io

from rich.console import Console

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
    "integrity": {"compared": 250, "mismatched": 0, "malformed": 0, "false_success": 0, "first_divergence": None},
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
    # phase rows in ms
    base = next(line for line in text.splitlines() if line.strip().startswith("│ baseline") or " baseline " in line)
    assert "42.1/87.6" in base and "321.5" in base
    assert "recovery" in text and "after" in text  # absent phases still listed
    assert "21.34 s" in text and "never" in text
    assert "compared" in text and "250" in text
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


def test_summary_of_an_aborted_run_says_why_and_how_fast():
    ab = {"safeguard": "error_rate", "detection_latency_s": 0.21, "fault_to_abort_s": 4.3,
          "reason": "aborted by safeguard error_rate: error_rate 1 over 16 requests > 0.5 for 2 s (window 2 s)"}
    text = render({**REPORT, "verdict": "aborted", "safeguards": {"abort": ab},
                   "recovery": {**REPORT["recovery"], "resolution_s": 0.031}})
    assert text.startswith("ABORTED  kill the draft worker")
    assert "aborted by safeguard error_rate: error_rate 1 over 16 requests > 0.5" in text
    assert "detection latency 0.21 s beyond for_s, 4.30 s after the fault; rollbacks ran" in text
    assert "recovery resolution" in text and "31 ms" in text

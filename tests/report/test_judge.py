"""judge_run over synthetic run directories: a kill of the speculative worker with a
supervised restart, and the defects that must turn it into fail or error."""

import dataclasses
import json
from pathlib import Path

import pytest

from harness.experiment.config import SpecchaosConfig
from harness.load.records import worker_records_path, write_records
from harness.report.json_report import read_report, write_report
from harness.checks.run import load_reference
from harness.report.judge import judge_run
from harness.timeline import count_restarts, fault_summary
from tests.asserts import assert_failed
from tests.factories import cut, ev, fail, make_record, phase_events

FAULT = 1030.5
STARTS = {"baseline": 1000.0, "fault": 1030.0, "recovery": 1050.0, "after": 1070.0}
STOP = 1100.0
META = {
    "experiment": "kill the draft worker",
    "stack": {"launcher": "local", "vllm_version": "0.32.0",
              "speculative": {"method": "draft_model", "draft": "draft-exact", "num_speculative_tokens": 4}},
    "errors": [],
    "interrupted": False,
    "journal_status": "completed",
    "steady_state": {"before": {"met": True}, "after": {"met": True}},
    "source": "experiments/kill-draft-worker.yaml",
}


def load_records(back_at=1045.0):
    recs = []
    t = 990.0  # warm-up before the baseline
    k = 0
    while t < STOP:
        pid = k % 5
        if 1030.2 <= t < FAULT:
            recs.append(fail(send_time=t, after_s=0.5, prompt_id=pid))  # in flight, fails fast
        elif FAULT <= t < back_at:
            recs.append(fail(send_time=t, after_s=0.01, status=None, error="connect", prompt_id=pid))
        else:
            recs.append(make_record(send_time=t, prompt_id=pid, chunk_tokens=[1, 5, 2]))   # k=4: one full step
        t = round(t + 0.25, 6)
        k += 1
    return recs


def timeline(back_at=1045.0, evidence=True, fault=True):
    evs = phase_events(STARTS, STOP)
    evs += [ev(990.0, "server_started", source="stack", server="spec", pid=1, incarnation=0),
            ev(990.0, "server_started", source="stack", server="ref", pid=2, incarnation=0)]
    t = 990.0
    while t < STOP:
        up = not (fault and FAULT < t < back_at)
        evs.append(ev(t, "health", source="health", server="spec", status=200 if up else None, latency_s=0.001))
        t += 0.5
    if fault:
        evs += [
            ev(FAULT, "fault_injected", source="fault", fault_id="f1", kind="process-kill", target="spec/worker"),
            ev(1030.8, "server_exited", source="stack", server="spec", pid=1, returncode=-9, incarnation=0,
               expected=False),
            ev(1031.0, "server_restarting", source="stack", server="spec", attempt=1, backoff_s=1.0),
            ev(1032.0, "server_started", source="stack", server="spec", pid=3, incarnation=1),
            ev(back_at - 0.5, "server_ready", source="stack", server="spec", pid=3, incarnation=1),
        ]
        if evidence:
            evs.append(ev(1031.0, "fault_evidence", source="fault", fault_id="f1", acted=True,
                          evidence={"acted": True, "observations": {"gone_after_s": 0.02}, "detail": "worker gone"}))
        evs.append(ev(back_at, "fault_cleared", source="fault", fault_id="f1"))
    return evs


def write_run(d: Path, records=None, events=None, reference=None):
    d.mkdir(parents=True, exist_ok=True)
    write_records(d / "records.jsonl", records if records is not None else load_records())
    ref = reference if reference is not None else [
        make_record(prompt_id=p, source="reference", chunk_tokens=[1, 1, 1, 1]) for p in range(5)]
    write_records(d / "reference.jsonl", ref)
    with (d / "timeline.jsonl").open("w") as fh:
        for e in events if events is not None else timeline():
            fh.write(json.dumps(e) + "\n")
    return d


def cfg(**blocks):
    return SpecchaosConfig.model_validate(blocks)


def by_name(report):
    return {c["name"]: c for c in report["checks"]}


def test_clean_kill_and_restart_passes_with_full_schema(tmp_path):
    d = write_run(tmp_path / "run")
    rep = judge_run(d, cfg(), META)
    failed = [c for c in rep["checks"] if not c["passed"]]
    assert rep["verdict"] == "pass", failed
    assert rep["errors"] == []

    # the schema of the brief
    assert rep["experiment"] == "kill the draft worker"
    assert rep["stack"]["speculative"] == {"method": "draft_model", "draft": "draft-exact", "num_speculative_tokens": 4}
    assert rep["stack"]["launcher"] == "local" and rep["stack"]["vllm_version"] == "0.32.0"
    (f,) = rep["faults"]
    assert f["kind"] == "process-kill" and f["target"] == "spec/worker"
    assert f["injected_at"] == FAULT and f["cleared_at"] == 1045.0 and f["acted"] is True
    assert set(rep["phases"]) == {"baseline", "fault", "recovery", "after"}
    for m in rep["phases"].values():
        for key in ("start", "end", "requests", "errors", "output_tokens_per_s"):
            assert key in m
        for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
            assert set(m[key]) == {"n", "mean", "p50", "p90", "p95", "p99", "p99.9"}
    assert rep["phases"]["baseline"]["start"] == 1000.0 and rep["phases"]["after"]["end"] == STOP
    for c in rep["checks"]:
        assert set(c) >= {"name", "passed", "observed", "limit"}
    assert rep["requests"]["total"] == rep["requests"]["ok"] + rep["requests"]["failed"]
    assert rep["requests"]["failed"] == len([r for r in load_records() if not r.ok])
    assert rep["integrity"]["compared"] == rep["requests"]["ok"]
    assert rep["integrity"]["mismatched"] == 0 and rep["integrity"]["malformed"] == 0
    assert rep["recovery"]["time_to_healthy_s"] == pytest.approx(14.5)
    assert rep["recovery"]["time_to_first_success_s"] == pytest.approx(14.5 + 0.201)
    assert 14.5 < rep["recovery"]["time_to_slo_s"] < 25
    assert rep["restarts"] == 1
    assert rep["fault_evidence"][0]["acted"] is True
    assert rep["fail_fast"]["in_flight"] >= 1
    assert rep["source"] == META["source"]  # other meta copied
    assert rep["steady_state"] == META["steady_state"]

    # groups of checks all present
    names = set(by_name(rep))
    for prefix in ("fault.", "slo.", "degradation.", "coverage.", "integrity.", "recovery.", "fail_fast."):
        assert any(n.startswith(prefix) for n in names), prefix

    # strict JSON round trip
    p = write_report(d / "report.json", rep)
    assert read_report(p).to_dict() == json.loads(json.dumps(rep))


def test_fault_without_evidence_is_error(tmp_path):
    d = write_run(tmp_path / "run", events=timeline(evidence=False))
    rep = judge_run(d, cfg(), META)
    assert rep["verdict"] == "error"
    assert any("no evidence" in e for e in rep["errors"])
    assert_failed(by_name(rep)["fault.f1.acted"])


def test_no_fault_is_error(tmp_path):
    d = write_run(tmp_path / "run", events=timeline(fault=False))
    rep = judge_run(d, cfg(), META)
    assert rep["verdict"] == "error"
    assert rep["faults"] == [] and by_name(rep)["fault.injected"]["passed"] is False
    assert rep["recovery"]["time_to_healthy_s"] is None


def test_no_fault_after_a_missed_pre_method_hypothesis_is_a_skipped_method_not_an_error(tmp_path):
    d = write_run(tmp_path / "run", events=timeline(fault=False))
    probe = {"activity": {"name": "health-is-200", "tolerance": 200}, "output": 503,
             "tolerance_met": False, "status": "succeeded"}
    journal = {"status": "failed", "deviated": False, "run": [], "rollbacks": [],
               "steady_states": {"before": {"steady_state_met": False, "probes": [probe]}}}
    rep = judge_run(d, cfg(), {**META, "steady_state": {"before": {"met": False}, "after": None}}, journal=journal)
    assert rep["method_skipped"] and rep["errors"] == []
    assert "fault.injected" not in by_name(rep)
    # The missed probe is a failed check: fail (exit 1), not error.
    assert rep["verdict"] == "fail"
    assert_failed(by_name(rep)["steady_state.before.health-is-200"])


def test_run_error_and_interruption_are_errors(tmp_path):
    d = write_run(tmp_path / "run")
    assert judge_run(d, cfg(), {**META, "errors": ["stack: spec failed to start"]})["verdict"] == "error"
    assert judge_run(d, cfg(), {**META, "interrupted": True})["verdict"] == "error"


def test_cut_stream_labelled_ok_fails(tmp_path):
    recs = load_records()
    i = next(i for i, r in enumerate(recs) if r.send_time == 1060.0)
    recs[i] = cut(recs[i], 1, labelled_ok=True)
    rep = judge_run(write_run(tmp_path / "run", records=recs), cfg(), META)
    assert rep["verdict"] == "fail"
    assert rep["integrity"]["false_success"] == 1
    assert_failed(by_name(rep)["integrity.false_success"])
    assert rep["requests"]["client_ok"] == rep["requests"]["ok"] + 1


def test_changed_token_fails(tmp_path):
    recs = load_records()
    i = next(i for i, r in enumerate(recs) if r.send_time == 1080.0)
    ids = list(recs[i].token_ids)
    ids[2] = 424242
    recs[i] = dataclasses.replace(recs[i], token_ids=ids)
    rep = judge_run(write_run(tmp_path / "run", records=recs), cfg(), META)
    assert rep["verdict"] == "fail"
    assert rep["integrity"]["mismatched"] == 1
    assert "token 2: got 424242" in rep["integrity"]["first_divergence"]


def test_server_that_never_comes_back_fails(tmp_path):
    back = 10_000.0
    d = write_run(tmp_path / "run", records=load_records(back_at=back), events=timeline(back_at=back))
    rep = judge_run(d, cfg(), META)
    assert rep["verdict"] == "fail"
    c = by_name(rep)
    for k in ("time_to_healthy_s", "time_to_first_success_s", "time_to_slo_s"):
        assert rep["recovery"][k] is None
        assert_failed(c[f"recovery.{k}"])
    assert_failed(c["slo.after.ttft_p95_s"])  # nothing complete in 'after'


def test_breached_slo_fails(tmp_path):
    recs = [dataclasses.replace(r, e2e_s=r.e2e_s + 20.0, chunk_offsets_s=[*r.chunk_offsets_s[:-1],
                                                                       r.chunk_offsets_s[-1] + 20.0])
            if r.ok and r.send_time >= STARTS["after"] else r for r in load_records()]
    rep = judge_run(write_run(tmp_path / "run", records=recs), cfg(), META)
    assert rep["verdict"] == "fail"
    c = by_name(rep)
    assert_failed(c["slo.after.e2e_p95_s"])
    assert_failed(c["degradation.after_vs_baseline.e2e_p95_ratio"])


def test_only_load_records_are_judged_and_missing_files_do_not_crash(tmp_path):
    recs = load_records() + [dataclasses.replace(fail(send_time=1010.0), source="probe")]
    rep = judge_run(write_run(tmp_path / "run", records=recs), cfg(), META)
    assert rep["verdict"] == "pass"
    empty = tmp_path / "empty"
    empty.mkdir()
    rep = judge_run(empty, cfg(), {})
    assert rep["verdict"] == "error" and rep["requests"]["total"] == 0
    assert rep["experiment"] == "empty"


def test_helpers():
    evs = timeline()
    assert count_restarts(evs) == 1
    assert count_restarts(evs, "ref") == 0
    assert count_restarts([ev(1, "server_started", source="stack", server="spec")]) == 0
    (f,) = fault_summary(evs)
    assert f["fault_id"] == "f1" and f["acted"]
    ref = load_reference([cut(make_record(prompt_id=1), 1), make_record(prompt_id=1)])
    assert ref[1].done


def test_the_verdict_is_computed_once_by_the_judge(tmp_path):
    rep = judge_run(write_run(tmp_path / "run"), cfg(), META)
    assert rep["verdict"] == "pass"
    rep = judge_run(write_run(tmp_path / "run2", events=timeline(evidence=False)), cfg(), META)
    assert rep["verdict"] == "error"


def test_a_record_that_cannot_be_read_is_a_run_error_not_a_silent_skip(tmp_path):
    d = write_run(tmp_path / "run")
    lines = (d / "records.jsonl").read_text().splitlines()
    lines[3] = '{"broken": '
    (d / "records.jsonl").write_text("\n".join(lines) + "\n" + '{"torn last li')   # a torn last line is fine
    rep = judge_run(d, cfg(), META)
    assert rep["verdict"] == "error"
    assert rep["errors"] == ["records.jsonl: 1 line(s) are not request records (line 4); they were not judged"]


def test_distributed_load_worker_files_are_judged_as_one_run(tmp_path):
    """The same records split over workers' files (load.workers) give the same verdict and
    counts; an unreadable line in a worker file is named with that file."""
    whole = judge_run(write_run(tmp_path / "one"), cfg(), META)
    d = write_run(tmp_path / "split", records=[])
    recs = load_records()
    for i in (0, 1):
        write_records(worker_records_path(d / "records.jsonl", i), recs[i::2])
    split = judge_run(d, cfg(), META)
    assert split["verdict"] == whole["verdict"] == "pass"
    assert split["requests"] == whole["requests"]
    with open(worker_records_path(d / "records.jsonl", 1), "a") as fh:
        fh.write('{"broken": \n' + recs[1].to_json() + "\n")   # not the last line: not a torn write
    rep = judge_run(d, cfg(), META)
    assert rep["errors"] == ["records.worker1.jsonl: 1 line(s) are not request records (line "
                             f"{len(recs[1::2]) + 1}); they were not judged"]


def test_a_thin_phase_is_reported_not_judged_and_leaves_the_verdict_alone(tmp_path):
    # the after phase keeps 5 requests (< metrics.min_samples 10), each with a 3 s TTFT
    # (SLO: 2 s): a p95 over 5 requests is not judged, so it neither fails the run nor
    # counts as a pass
    keep = [r for r in load_records() if r.send_time < STARTS["after"]]
    slow = [make_record(send_time=STARTS["after"] + 4 * i, ttft=3.0, prompt_id=i, chunk_tokens=[1, 5, 2])
            for i in range(5)]
    rep = judge_run(write_run(tmp_path / "run", records=keep + slow), cfg(), META)
    c = by_name(rep)
    after = c["slo.after.ttft_p95_s"]
    assert after["passed"] is None and after["judged"] is False and after["observed"] == pytest.approx(3.0)
    assert after["detail"].startswith("not judged: after p95 TTFT (s) rests on 5 complete requests")
    assert rep["phases"]["after"]["enough_samples"] is False and rep["phases"]["after"]["ttft_s"]["n"] == 5
    assert rep["verdict"] == "pass", [n for n, x in c.items() if x["passed"] is False]
    # with the minimum lowered to 5 the same data is judged, and the defect fails the run
    rep = judge_run(tmp_path / "run", cfg(metrics={"min_samples": 5}), META)
    assert rep["verdict"] == "fail" and by_name(rep)["slo.after.ttft_p95_s"]["passed"] is False


def test_report_counts_logical_requests_and_unavailable_seconds(tmp_path):
    rep = judge_run(write_run(tmp_path / "run"), cfg(), META)
    fault = rep["phases"]["fault"]
    # connect errors every 0.25 s from the kill (1030.5) until the server is back (1045.0):
    # down from the first failure (the connect error at 1030.51; the request in flight
    # since 1030.25 fails later, at 1030.75) to the first chunk of the first complete
    # request after it (sent 1045.0, first chunk +0.1 s)
    assert fault["unavailable_s"] == pytest.approx(1045.1 - 1030.51)
    assert rep["availability"]["servers"]["spec"]["phases"]["fault"]["unavailable_s"] == fault["unavailable_s"]
    assert rep["requests"]["logical"] == rep["requests"]["total"]     # old records: one try each
    assert fault["tries"] == fault["requests"]


def test_a_safeguard_abort_is_the_verdict_aborted_with_its_timing(tmp_path):
    sg = {"metric": "error_rate", "limit": 0.5, "window_s": 2, "for_s": 2, "min_requests": 3}
    evs = timeline(evidence=False) + [   # the abort cut the kill's evidence (waiting for the restart) short
        ev(1030.0, "safeguards_armed", source="safeguards"),
        ev(1033.7, "safeguard_breached", source="safeguards", safeguard="error_rate", metric="error_rate",
           observed=1.0, n=8, limit=0.5, window_s=2, for_s=2, breach_start=1031.5, due_at=1033.5),
        ev(1033.71, "safeguard_abort", source="safeguards", safeguard="error_rate", signal="SIGUSR1",
           reason="aborted by safeguard error_rate: error_rate 1 over 8 requests > 0.5 for 2 s (window 2 s)")]
    d = write_run(tmp_path / "run", events=evs)
    meta = dict(META, journal_status="interrupted",
                errors=["activity 'bg': harness.experiment.session.RunAborted: aborted by safeguard error_rate: ..."])
    rep = judge_run(d, SpecchaosConfig(safeguards=[sg]), meta)
    assert rep["verdict"] == "aborted" and rep["errors"] == []
    ab = rep["safeguards"]["abort"]
    assert ab["detection_latency_s"] == pytest.approx(0.21) and ab["fault_to_abort_s"] == pytest.approx(3.21)
    assert ab["breach_to_abort_s"] == pytest.approx(2.21) and ab["reason"].startswith("aborted by safeguard")
    c = by_name(rep)["safeguards.error_rate"]
    assert c["passed"] is False and "aborted" in c["detail"]
    # re-derived from the records: connect errors from 1030.5, every 0.25 s
    br = rep["safeguards"]["breaches"]["error_rate"]
    assert 1030.5 < br["breach_start"] < 1032.0 and br["due_at"] == pytest.approx(br["breach_start"] + 2)
    # a real run error still makes it an error
    rep = judge_run(d, SpecchaosConfig(safeguards=[sg]), dict(meta, errors=["cleanup: stop stack failed: x"]))
    assert rep["verdict"] == "error"


def test_a_quiet_safeguard_passes(tmp_path):
    sg = {"metric": "error_rate", "limit": 0.5, "window_s": 2, "for_s": 2, "phases": ["after"]}
    d = write_run(tmp_path / "run", events=timeline() + [ev(1030.0, "safeguards_armed", source="safeguards")])
    rep = judge_run(d, SpecchaosConfig(safeguards=[sg]), META)
    assert rep["verdict"] == "pass", [c for c in rep["checks"] if not c["passed"]]
    assert by_name(rep)["safeguards.error_rate"]["passed"] and rep["safeguards"]["abort"] is None


def test_a_required_check_that_was_not_judged_is_an_error_naming_it(tmp_path):
    d = write_run(tmp_path / "run")   # a clean kill, but judged without a reference server
    off = {"stack": {"reference": False}, "integrity": {"min_compared": 0}}
    rep = judge_run(d, cfg(**off, judge={"required": ["recovery", "fail_fast", "integrity"]}), META)
    assert rep["verdict"] == "error"
    assert rep["errors"] == ["required check integrity not judged: integrity.mismatched: no reference server "
                             "(stack.reference: false), so no output was compared"]
    assert (rep["required"]["judged"], rep["required"]["of"]) == (2, 3)
    assert rep["required"]["checks"][2]["judged"] is False


def test_the_same_run_with_integrity_optional_passes_and_lists_it_not_judged(tmp_path):
    d = write_run(tmp_path / "run")
    rep = judge_run(d, cfg(stack={"reference": False}, integrity={"min_compared": 0}), META)   # integrity optional
    assert rep["verdict"] == "pass", rep["errors"]
    assert [c["name"] for c in rep["required"]["checks"]] == ["recovery", "fail_fast"]
    assert (rep["required"]["judged"], rep["required"]["of"]) == (2, 2)
    assert by_name(rep)["integrity.compared"]["passed"] is None
    assert by_name(rep)["integrity.compared"]["detail"].startswith("not judged: no reference server")


def test_the_default_kill_run_judges_all_it_requires(tmp_path):
    rep = judge_run(write_run(tmp_path / "run"), cfg(), META)
    assert rep["verdict"] == "pass"
    assert [(c["name"], c["why"], c["judged"]) for c in rep["required"]["checks"]] == [
        ("recovery", "default for process-kill", True), ("fail_fast", "default for process-kill", True),
        ("integrity", "default for process-kill", True)]

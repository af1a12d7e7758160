"""The Allure results of a judged run and its timeline plot, on synthetic run directories
(the kill-and-restart run of :mod:`tests.report.test_judge`, judged by the real judge):
what a result holds, the status of each verdict, the history id, the result directories,
and that a plot failure never changes a verdict. The real run's results, the HTML report
and the browser check are in :mod:`tests.experiment.test_run_e2e` and
:mod:`tests.report.test_allure_report`."""

from __future__ import annotations

import csv
import dataclasses
import json
import re
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest

from harness.experiment.rejudge import rejudge
from harness.report import allure as allure_mod
from harness.report import timeline_plot
from harness.report.allure import ALLURE_DIR_ENV, RESULTS_DIR, history_id, publish_allure, write_allure_results
from harness.report.judge import judge_run
from harness.report.json_report import write_report
from harness.report.timeline_plot import bucket_width_s, plot_timeline, timeline_series
from tests.factories import ev, fail, make_record
from tests.report.test_judge import META, STARTS, cfg, load_records, timeline, write_run

TAGS = ["specchaos", "speculative-decoding", "process-kill", "gate"]


def journal(*, probe_ok: bool = True) -> dict:
    """A Chaos Toolkit journal of the default experiment's shape."""
    def act(kind, name, func, start, end, status="succeeded", **extra):
        return {"activity": {"type": kind, "name": name,
                             "provider": {"type": "python", "module": "harness.experiment.actions", "func": func,
                                          "arguments": {"server": "spec"}}},
                "status": status, "start": start, "end": end, **extra}
    t = "2026-12-02T08:00:{:02d}+00:00".format
    return {
        "status": "completed", "start": t(0), "end": t(59),
        "experiment": {"title": META["experiment"], "tags": TAGS,
                       "method": [{"type": "action", "name": "kill", "provider": {"func": "kill_process"}}]},
        "steady_states": {
            "before": {"steady_state_met": True, "probes": [act("probe", "health-is-200", "server_health", t(1), t(2),
                                                                 output=200, tolerance_met=True)]},
            "after": {"steady_state_met": probe_ok, "probes": [act("probe", "health-is-200", "server_health", t(50),
                                                                t(51), output=200 if probe_ok else 503,
                                                                tolerance_met=probe_ok)]},
        },
        "run": [act("action", "kill-draft-worker", "kill_process", t(30), t(31), output={"acted": True}),
                act("action", "await-recovery", "await_recovery", t(31), t(45))],
        "rollbacks": [act("action", "clear-all-faults", "clear_faults", t(58), t(59), status="failed",
                          exception=["Traceback ...", "RuntimeError: boom\n"])],
    }


def metrics_lines(d: Path) -> None:
    """A ``metrics.jsonl`` of the speculative server: 60 % acceptance, a restart at 1032 s."""
    with (d / "metrics.jsonl").open("w") as fh:
        drafted = accepted = 0.0
        t = 995.0
        while t < 1100.0:
            if t == 1032.0:
                drafted = accepted = 0.0
            drafted += 40
            accepted += 24
            fh.write(json.dumps({"t": t, "server": "spec", "ok": True, "pid": 1 if t < 1032 else 3, "counters": {
                "vllm:spec_decode_num_drafts_total": drafted / 4,
                "vllm:spec_decode_num_draft_tokens_total": drafted,
                "vllm:spec_decode_num_accepted_tokens_total": accepted}}) + "\n")
            t += 1.0


def events() -> list[dict]:
    """The kill-and-restart timeline with 10 s of warm-up before the baseline."""
    return [ev(990.0, "load_started")] + timeline()


@pytest.fixture
def run_dir(tmp_path):
    d = write_run(tmp_path / "run", events=events())
    metrics_lines(d)
    (d / "logs").mkdir()
    (d / "logs" / "spec-server.log").write_text("".join(f"line {i}\n" for i in range(1000)))
    exp = tmp_path / "kill.yaml"
    exp.write_text("title: kill\n")
    (d / "experiment.json").write_text(json.dumps({"title": META["experiment"], "tags": TAGS,
                                                   "description": "SIGKILL the worker under load."}))
    (d / "config.json").write_text(json.dumps({"stack": {"target": "target"}, "load": {"seed": 1234}}))
    return d


def judged(d: Path, *, meta: dict | None = None, limits=None, source: str | None = None) -> dict:
    m = dict(meta or META)
    m["source"] = source or str(d.parent / "kill.yaml")
    rep = judge_run(d, limits or cfg(), m)
    write_report(d / "report.json", rep)
    return rep


def result_of(directory: Path) -> dict:
    (f,) = directory.glob("*-result.json")
    return json.loads(f.read_text())


def flat_steps(steps: list[dict]) -> list[dict]:
    out = []
    for s in steps:
        out.append(s)
        out += flat_steps(s.get("steps") or [])
    return out


def test_a_passed_run_gives_one_result_with_steps_params_labels_link_and_attachments(run_dir, monkeypatch):
    monkeypatch.delenv(ALLURE_DIR_ENV, raising=False)
    rep = judged(run_dir)
    assert rep["verdict"] == "pass"
    write_allure_results(run_dir, rep, journal())
    res = result_of(run_dir / RESULTS_DIR)

    assert res["name"] == META["experiment"] and res["status"] == "passed" and "statusDetails" not in res
    assert res["historyId"] == res["testCaseId"] == history_id(str(run_dir.parent / "kill.yaml"), META["experiment"])
    top = [s["name"] for s in res["steps"]]
    assert top[:5] == ["phase warm-up", "phase baseline", "phase fault", "phase recovery", "phase after"]
    assert top[5] == "fault process-kill on spec/worker"
    assert top[6:10] == ["steady-state hypothesis before the method", "method",
                         "steady-state hypothesis after the method", "rollbacks"]
    assert top[10].startswith("checks (")
    fault = res["steps"][5]
    assert fault["status"] == "passed" and fault["start"] == 1030.5 * 1000 and fault["stop"] == 1045.0 * 1000
    assert {"name": "evidence", "value": "worker gone"} in fault["parameters"]
    base = res["steps"][1]
    assert base["start"] == STARTS["baseline"] * 1000 and base["stop"] == STARTS["fault"] * 1000
    assert {p["name"] for p in base["parameters"]} >= {"requests", "errors", "ttft_p95_s", "e2e_p95_s"}
    steps = {s["name"]: s for s in flat_steps(res["steps"])}
    assert steps["action kill-draft-worker"]["status"] == "passed"
    assert {"name": "arg server", "value": "spec"} in steps["action kill-draft-worker"]["parameters"]
    assert steps["action clear-all-faults"]["status"] == "broken"   # a rollback that raised
    assert "RuntimeError: boom" in steps["action clear-all-faults"]["statusDetails"]["message"]
    assert steps["rollbacks"]["status"] == "broken"
    assert steps["check integrity.mismatched"]["status"] == "passed"

    params = {p["name"]: p["value"] for p in res["parameters"]}
    assert params == {"launcher": "local", "target": "target", "draft": "draft-exact", "method": "draft_model",
                      "k": "4", "fault kinds": "process-kill", "seed": "1234", "vLLM": "0.32.0"}
    labels = {(lb["name"], lb["value"]) for lb in res["labels"]}
    assert {("epic", "specchaos"), ("feature", "process-kill"), ("story", META["experiment"]),
            ("suite", META["experiment"]), ("severity", "critical")} <= labels   # "gate" tag: critical
    assert {("tag", t) for t in TAGS} <= labels
    (link,) = res["links"]
    assert link["url"] == (run_dir.parent / "kill.yaml").resolve().as_uri()

    atts = {a["name"]: a for a in res["attachments"]}
    assert set(atts) == {"timeline plot", "per-phase table", "summary", "report.json", "journal.json",
                         "log tail: spec-server.log"}
    assert atts["timeline plot"]["type"] == "image/png" and atts["per-phase table"]["type"] == "text/csv"
    rows = list(csv.DictReader((run_dir / RESULTS_DIR / atts["per-phase table"]["source"]).open()))
    assert [r["phase"] for r in rows] == ["baseline", "fault", "recovery", "after"]
    assert float(rows[0]["ttft_p95_s"]) == rep["phases"]["baseline"]["ttft_s"]["p95"]
    assert float(rows[1]["error_rate"]) == pytest.approx(rep["phases"]["fault"]["error_rate"])
    assert float(rows[0]["acceptance_rate"]) == pytest.approx(0.6)   # vLLM's counters (metrics.jsonl)
    for a in atts.values():
        assert (run_dir / RESULTS_DIR / a["source"]).is_file(), a
    img = mpimg.imread(run_dir / RESULTS_DIR / atts["timeline plot"]["source"])
    assert img.shape[:2] == (1000, 1400) and float(np.std(img)) > 0.05   # a drawn picture, not a blank one
    summary = (run_dir / RESULTS_DIR / atts["summary"]["source"]).read_text()
    assert summary.startswith("PASS") and "\x1b[" not in summary   # plain text, no colour codes
    tail = (run_dir / RESULTS_DIR / atts["log tail: spec-server.log"]["source"]).read_text().splitlines()
    assert tail[0] == "line 800" and tail[-1] == "line 999"
    assert json.loads((run_dir / RESULTS_DIR / atts["report.json"]["source"]).read_text())["verdict"] == "pass"
    assert (run_dir / "timeline.png").is_file()
    env = (run_dir / RESULTS_DIR / "environment.properties").read_text().splitlines()
    assert "vLLM=0.32.0" in env and "launcher=local" in env and "k=4" in env
    cats = json.loads((run_dir / RESULTS_DIR / "categories.json").read_text())
    assert [c["name"] for c in cats] == ["SLO", "integrity", "recovery", "liveness and hang", "speculation",
                                         "memory and drift", "required check not judged", "harness error"]
    assert json.loads((run_dir / RESULTS_DIR / "executor.json").read_text())["reportName"] == "specchaos"


def properties(path: Path) -> dict[str, str]:
    """``environment.properties`` read as Allure reads it (Java's Properties: ISO-8859-1, escapes)."""
    out = {}
    for line in path.read_text(encoding="latin-1").splitlines():
        key, _, value = re.split(r"(?<!\\)(=)", line, maxsplit=1)
        out[unescape(key)] = unescape(value)
    return out


def unescape(text: str) -> str:
    return re.sub(r"\\u([0-9a-f]{4})|\\(.)", lambda m: chr(int(m[1], 16)) if m[1] else m[2], text)


def test_the_overview_says_the_verdict_the_failed_checks_the_required_and_the_timeline(run_dir, monkeypatch, tmp_path):
    """The Environment widget of the overview page: per experiment its verdict with the exit
    code and failed checks, the required checks judged, the timeline; runs gathered in one
    directory keep each other's lines."""
    shared = tmp_path / "shared"
    monkeypatch.setenv(ALLURE_DIR_ENV, str(shared))
    ok = judged(run_dir)
    write_allure_results(run_dir, ok, journal())
    env = properties(run_dir / RESULTS_DIR / "environment.properties")
    title = META["experiment"]
    assert env[f"{title}: verdict"] == "PASS (exit code 0); no check failed"
    assert env[f"{title}: required"] == "judged 3 of 3"
    assert env[f"{title}: timeline"].startswith("baseline +0.0 s for 30.0 s; fault +30.0 s for 20.0 s")
    assert "process-kill on spec/worker +30.5 s to +45.0 s" in env[f"{title}: timeline"]
    assert env["launcher"] == "local" and env["draft"] == "draft-exact"

    other = judged(run_dir, meta={**META, "experiment": "no reference"},
                   limits=cfg(stack={"reference": False}, integrity={"min_compared": 0},
                              judge={"required": ["recovery", "integrity"]}))
    assert other["verdict"] == "error"
    write_allure_results(run_dir, other, journal())
    env = properties(shared / "environment.properties")
    assert env[f"{title}: verdict"].startswith("PASS")   # the first run's lines kept
    assert env["no reference: verdict"] == "ERROR (exit code 2); no check failed"
    assert env["no reference: required"].startswith("judged 1 of 2; not judged: integrity (integrity.mismatched: no "
                                                    "reference server")
    assert env["no reference: errors"].startswith("required check integrity not judged: ")
    res = result_of(run_dir / RESULTS_DIR)
    assert res["status"] == "broken"
    (cat,) = [c for c in json.loads((shared / "categories.json").read_text()) if c["name"] == "required check not judged"]
    assert re.fullmatch(cat["messageRegex"].removeprefix("(?s)"), res["statusDetails"]["message"], re.S)


def test_a_failed_run_is_failed_with_the_failing_checks_as_message(run_dir):
    recs = [dataclasses.replace(r, e2e_s=r.e2e_s + 20.0, chunk_offsets_s=[*r.chunk_offsets_s[:-1],
                                                                       r.chunk_offsets_s[-1] + 20.0])
            if r.ok and r.send_time >= STARTS["after"] else r for r in load_records()]
    write_run(run_dir, records=recs, events=events())
    rep = judged(run_dir)
    assert rep["verdict"] == "fail"
    write_allure_results(run_dir, rep, journal(probe_ok=False))
    res = result_of(run_dir / RESULTS_DIR)
    assert res["status"] == "failed"
    message = res["statusDetails"]["message"]
    failing = [c["name"] for c in rep["checks"] if c["passed"] is False]
    assert failing and all(name in message for name in failing)
    assert "slo.after.e2e_p95_s" in message and "pass" not in message.split(":")[0]
    steps = {s["name"]: s for s in flat_steps(res["steps"])}
    assert steps["phase after"]["status"] == "failed" and steps["phase baseline"]["status"] == "passed"
    assert steps["steady-state hypothesis after the method"]["status"] == "failed"
    assert steps["check slo.after.e2e_p95_s"]["status"] == "failed"



def test_swing_checks_not_judged_are_skipped_never_passed(run_dir):
    """The run's metrics.jsonl has no RSS: every server_memory swing is not judged, so each
    is a skipped step (counted as not judged) with its reason, never a passed one, and the
    run still passes on its judged checks."""
    rep = judged(run_dir)
    assert rep["verdict"] == "pass"
    swings = [c for c in rep["checks"] if c["name"].startswith("server_memory.spec.")]
    assert swings and all(c["passed"] is None and not c["judged"] for c in swings)
    write_allure_results(run_dir, rep, journal())
    res = result_of(run_dir / RESULTS_DIR)
    assert res["status"] == "passed"
    steps = {s["name"]: s for s in flat_steps(res["steps"])}
    for c in swings:
        step = steps[f"check {c['name']}"]
        assert step["status"] == "skipped" and step["statusDetails"]["message"].startswith("not judged: "), step
    (checks,) = [s for s in res["steps"] if s["name"].startswith("checks (")]
    not_judged = sum(c["passed"] is None for c in rep["checks"])
    assert f"{not_judged} not judged" in checks["name"] and not_judged >= len(swings)

def test_an_error_is_broken_and_an_abort_failed(run_dir):
    rep = judged(run_dir, meta={**META, "errors": ["stack: spec failed to start"]})
    assert rep["verdict"] == "error"
    write_allure_results(run_dir, rep)
    res = result_of(run_dir / RESULTS_DIR)
    assert res["status"] == "broken" and "stack: spec failed to start" in res["statusDetails"]["message"]

    aborted = dict(rep, verdict="aborted", errors=[], safeguards={"abort": {"reason": "aborted by safeguard x"}})
    write_allure_results(run_dir, aborted)
    res = result_of(run_dir / RESULTS_DIR)   # the run's own directory holds this judgement only
    assert res["status"] == "failed" and res["statusDetails"]["message"].startswith("aborted by safeguard x")


def test_history_id_is_stable_per_experiment_file(run_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rep = judged(run_dir)
    write_allure_results(run_dir, rep)
    first = result_of(run_dir / RESULTS_DIR)
    write_allure_results(run_dir, rep)
    second = result_of(run_dir / RESULTS_DIR)
    assert first["uuid"] != second["uuid"] and first["historyId"] == second["historyId"]
    assert first["fullName"] == "kill.yaml"   # relative to the working directory
    other = tmp_path / "other.yaml"
    other.write_text("title: other\n")
    assert history_id(str(other), META["experiment"]) != first["historyId"]
    assert history_id(None, "a title") == history_id("chaos run", "a title") != history_id(None, "another")


def test_results_also_go_to_the_shared_directory_which_keeps_every_run(run_dir, tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    monkeypatch.setenv(ALLURE_DIR_ENV, str(shared))
    rep = judged(run_dir)
    files = write_allure_results(run_dir, rep)
    files += write_allure_results(run_dir, rep)
    assert len(files) == 4
    assert len(list((run_dir / RESULTS_DIR).glob("*-result.json"))) == 1
    results = [json.loads(f.read_text()) for f in shared.glob("*-result.json")]
    assert len(results) == 2
    for res in results:
        for a in res["attachments"]:
            assert (shared / a["source"]).is_file()


def test_a_plot_failure_is_reported_and_changes_nothing(run_dir, monkeypatch, caplog):
    rep = judged(run_dir)

    def broken(*a, **k):
        raise RuntimeError("no fonts")

    monkeypatch.setattr(timeline_plot, "plot_timeline", broken)
    (run_dir / "timeline.png").unlink(missing_ok=True)
    write_allure_results(run_dir, rep)
    res = result_of(run_dir / RESULTS_DIR)
    assert res["status"] == "passed"
    assert "timeline plot failed: RuntimeError: no fonts" in res["description"]
    assert "timeline plot" not in {a["name"] for a in res["attachments"]}
    assert "timeline plot" in caplog.text and "no fonts" in caplog.text


def test_publish_never_raises(tmp_path, caplog):
    msg = publish_allure(tmp_path / "not-a-run")
    assert msg is not None and msg.startswith("allure results not written: ") and "report.json" in msg


def test_rejudge_rewrites_the_results(run_dir, monkeypatch):
    monkeypatch.delenv(ALLURE_DIR_ENV, raising=False)
    (run_dir / "config.json").write_text(cfg().model_dump_json())
    (run_dir / "run.json").write_text(json.dumps({**META, "source": str(run_dir.parent / "kill.yaml")}))
    (run_dir / "journal.json").write_text(json.dumps(journal()))
    rep = rejudge(run_dir)
    res = result_of(run_dir / RESULTS_DIR)
    assert res["status"] == "passed" and rep["verdict"] == "pass"
    assert "journal.json" in {a["name"] for a in res["attachments"]}
    assert any(s["name"] == "method" for s in res["steps"])


# ------------------------------------------------------------------ the plot's numbers
def test_bucket_width_is_round_and_at_least_a_second():
    assert bucket_width_s(10) == 1.0
    assert bucket_width_s(300) == 5.0
    assert bucket_width_s(3600) == 60.0


def test_timeline_series_buckets_latency_tokens_and_errors():
    recs = [make_record(send_time=1000.0 + i * 0.5, ttft=0.1, chunk_tokens=[2, 2], gaps=[0.1]) for i in range(4)]
    recs += [fail(send_time=1002.0, after_s=0.2), fail(send_time=1002.5, after_s=0.2)]
    s = timeline_series(recs, 1000.0, 1004.0, 2.0)
    assert list(s["t"]) == [0.0, 2.0]
    assert s["ttft_p50"][0] == pytest.approx(0.1) and np.isnan(s["ttft_p50"][1])
    assert s["e2e_p95"][0] == pytest.approx(0.2)
    assert s["tokens_per_s"][0] == pytest.approx(16 / 2.0)   # 4 requests × 4 tokens arrived in [0, 2)
    assert s["error_rate"][0] == 0.0 and s["error_rate"][1] == 1.0   # both failures ended in [2, 4)


def test_plot_of_an_empty_directory_raises_and_try_reports(tmp_path):
    with pytest.raises(ValueError, match="nothing to plot"):
        plot_timeline(tmp_path)
    path, err = timeline_plot.try_plot_timeline(tmp_path)
    assert path is None and err.startswith("timeline plot failed: NothingToPlot: nothing to plot")


def test_plot_without_scraped_metrics_still_draws(run_dir):
    (run_dir / "metrics.jsonl").unlink()
    out = plot_timeline(run_dir, run_dir / "x.png")
    assert mpimg.imread(out).shape[:2] == (1000, 1400)


def test_the_module_keeps_its_public_names():
    assert allure_mod.ALLURE_DIR_ENV == "SPECCHAOS_ALLURE_DIR" and allure_mod.RESULTS_DIR == "allure-results"

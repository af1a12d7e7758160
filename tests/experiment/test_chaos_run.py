"""Plain Chaos Toolkit (``chaos validate`` / ``chaos run``, chaostoolkit's own CLI, run
in this process) on the experiment files: every file validates; a run's journal and
``chaos``'s exit code say the specchaos verdict (pass → completed, exit 0; fail →
deviated, exit 1; a refused experiment → one clear line, exit 1, nothing started), and
``specchaos report`` on the run directory gives the verdict ``chaos`` reported.

The runs here use the fake vLLM (:mod:`tests.experiment.fast_e2e`): they test the
control's plumbing between the harness and Chaos Toolkit. The real stack's plain ``chaos
run`` is in :mod:`tests.experiment.test_run_e2e`."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from chaoslib.configuration import load_configuration
from chaoslib.loader import load_experiment
from chaostoolkit.commands import cli
from click.testing import CliRunner

from harness.experiment import control
from harness.experiment import session as sess
from harness.experiment.control import VERDICT_JOURNAL, apply_verdict
from harness.experiment.rejudge import rejudge
from tests.experiment.fast_e2e import fast_experiment
from tests.experiment.files import (EXPERIMENTS, ROOT, experiment_doc, experiment_files, gpu_only, needs_real_models,
                                    skip_without_real_models, write)
from tests.experiment.test_safeguards import ERRORS_FORBIDDEN
from tests.procs import leaked_since, sut_pids

FILES = experiment_files()


@pytest.fixture(autouse=True)
def chaos_logger():
    """``chaos`` adds a handler to the ``chaostoolkit`` logger on every invocation: put it
    back (and forget a refused experiment)."""
    lg = logging.getLogger("chaostoolkit")
    saved = (list(lg.handlers), list(lg.filters), lg.level, lg.propagate)
    yield
    control._refused = None   # a refusal is the control's state until the next configure_control
    lg.handlers[:], lg.filters[:] = saved[0], saved[1]
    lg.setLevel(saved[2])
    lg.propagate = saved[3]


def chaos(tmp: Path, *args: str):
    """``chaos ARGS`` in this process (no version check, no log file, an empty settings file)."""
    settings = tmp / "settings.yaml"
    settings.touch()
    return CliRunner().invoke(cli, ["--no-version-check", "--no-log-file", "--settings", str(settings), *args])


def test_the_experiment_files_are_found():
    assert EXPERIMENTS / "kill-draft-worker.yaml" in FILES
    assert EXPERIMENTS / "selftest" / "corrupt-stream.yaml" in FILES


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(EXPERIMENTS)) for p in FILES])
def test_every_experiment_file_passes_chaos_validate(tmp_path, path):
    res = chaos(tmp_path, "validate", str(path))
    assert res.exit_code == 0, res.output
    assert "experiment syntax and semantic look valid" in res.output


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(EXPERIMENTS)) for p in FILES])
def test_the_control_accepts_every_experiment_file(tmp_path, monkeypatch, path):
    """What ``chaos run`` does before anything starts, on each file as Chaos Toolkit
    loads it: the control validates it (as ``specchaos validate``) and opens a session
    whose run directory holds what ``specchaos report`` needs. Nothing is started."""
    skip_without_real_models(needs_real_models(path))
    monkeypatch.chdir(ROOT)   # the files name models_dir relative to the working directory
    monkeypatch.setenv("SPECCHAOS_OUT", str(tmp_path / "out"))
    doc = load_experiment(str(path))
    before = sess.peek()
    control.configure_control(configuration=load_configuration(doc.get("configuration") or {}), experiment=doc)
    why = gpu_only(path)
    if why is not None:   # for GPU hosts, on a host without one: refused in one line, nothing opened
        assert control._refused is not None and control._refused.endswith(
            f"configuration.specchaos.gpu.require: {why} (run it on a host with an NVIDIA GPU and its driver "
            f"(nvidia-smi lists it), or set gpu.require: false to have the GPU checks reported not judged)"), \
            control._refused
        assert sess.peek() is before   # no session opened by the refusal
        return
    try:
        assert control._refused is None, control._refused
        s = sess.peek()
        assert s is not None and s.info.source == control.CHAOS_RUN and s.out_dir == tmp_path / "out"
        soak = s.info.cfg.soak.enabled   # a soak declares no fault: the sustained load is its experiment
        assert s.faults_active() == 0 and (s.info.faults or soak), "the method's faults are declared"
        for f in ("config.json", "experiment.json", "run.json"):
            assert (tmp_path / "out" / f).is_file(), f
    finally:
        s = sess.peek()
        if s is not None:
            s.close()


def test_chaos_validate_refuses_a_broken_experiment(tmp_path):
    """``chaos validate`` is Chaos Toolkit's check only (the document and the activities'
    signatures): it can fail — an action that does not exist."""
    d = experiment_doc("kill-draft-worker.yaml")
    d["method"][0]["provider"]["func"] = "no_such_action"
    res = chaos(tmp_path, "validate", str(write(tmp_path, d)))
    assert res.exit_code == 1
    assert "no_such_action" in res.output


@pytest.mark.parametrize("verdict,status,deviated", [
    ("pass", "completed", False), ("fail", "completed", True), ("aborted", "aborted", False),
    ("error", "failed", False)])
def test_apply_verdict_maps_every_verdict(verdict, status, deviated):
    journal = {"status": "completed", "deviated": False}
    checks = [{"name": "slo.after.ttft_p95_s", "passed": verdict != "pass"}, {"name": "x", "passed": True}]
    checks[0]["passed"] = verdict == "pass"
    apply_verdict(journal, {"verdict": verdict, "checks": checks, "errors": []}, report_path=Path("r/report.json"))
    assert (journal["status"], journal["deviated"]) == (status, deviated)
    exits_nonzero = journal["status"] != "completed" or journal["deviated"]   # chaostoolkit/commands/run.py
    assert exits_nonzero == (verdict != "pass")
    assert journal["specchaos"]["verdict"] == verdict and journal["specchaos"]["report"] == "r/report.json"
    assert journal["specchaos"]["failed_checks"] == ([] if verdict == "pass" else ["slo.after.ttft_p95_s"])
    assert journal["specchaos"]["chaostoolkit_status"] == "completed"
    assert set(VERDICT_JOURNAL) == {"pass", "fail", "aborted", "error"}


def test_apply_verdict_keeps_chaos_toolkits_failure_and_interruption():
    j = {"status": "failed", "deviated": False}      # hypothesis missed before the method
    apply_verdict(j, {"verdict": "fail", "checks": []})
    assert (j["status"], j["deviated"]) == ("failed", True)
    j = {"status": "interrupted", "deviated": False}   # a signal: an error, still "interrupted"
    apply_verdict(j, {"verdict": "error", "checks": [], "errors": ["interrupted by SIGINT"]})
    assert j["status"] == "interrupted" and j["specchaos"]["errors"] == ["interrupted by SIGINT"]
    j = {"status": "completed", "deviated": True}
    apply_verdict(j, {"verdict": "pass", "checks": []})   # (the judge never passes a deviation)
    assert (j["status"], j["deviated"]) == ("completed", False)


def test_chaos_run_refuses_a_bad_experiment_in_one_line(tmp_path, monkeypatch):
    """What ``specchaos validate`` refuses, plain ``chaos run`` refuses too, before
    anything starts: one line naming the field, the journal ``interrupted`` with the
    verdict ``error``, exit 1 (``chaos`` has no exit 2)."""
    d = experiment_doc("kill-draft-worker.yaml")
    d["method"][0]["provider"]["arguments"]["role"] = "wroker"
    monkeypatch.setenv("SPECCHAOS_OUT", str(tmp_path / "out"))
    before = sut_pids()
    res = chaos(tmp_path, "run", "--journal-path", str(tmp_path / "journal.json"), str(write(tmp_path, d)))
    assert res.exit_code == 1, res.output
    lines = [ln for ln in res.output.splitlines() if "method[0].provider.arguments.role" in ln]
    assert len(lines) == 1 and "Input should be 'api', 'engine', 'worker' or 'container'" in lines[0], res.output
    journal = json.loads((tmp_path / "journal.json").read_text())
    assert journal["status"] == "interrupted" and journal["specchaos"]["verdict"] == "error"
    assert "method[0].provider.arguments.role" in journal["specchaos"]["errors"][0]
    assert journal["steady_states"]["before"] is None and not journal["run"], "nothing may start"
    assert not (tmp_path / "out").exists()
    assert leaked_since(before) == []


def test_chaos_run_refuses_an_override_of_an_unknown_field_in_one_line(tmp_path, monkeypatch):
    """``chaos run --var specchaos_set=...`` is checked like ``specchaos run --set``: an
    unknown field is one line naming the override, before anything starts."""
    monkeypatch.setenv("SPECCHAOS_OUT", str(tmp_path / "out"))
    exp = write(tmp_path, experiment_doc("kill-draft-worker.yaml"))
    res = chaos(tmp_path, "run", "--journal-path", str(tmp_path / "journal.json"), "--var",
                "specchaos_set=load.userz=3", str(exp))
    assert res.exit_code == 1, res.output
    lines = [ln for ln in res.output.splitlines() if "load.userz=3" in ln]
    assert len(lines) == 1 and "unknown field 'userz' in configuration.specchaos.load" in lines[0], res.output
    assert "did you mean users?" in lines[0]
    journal = json.loads((tmp_path / "journal.json").read_text())
    assert journal["specchaos"]["verdict"] == "error" and not journal["run"]
    assert not (tmp_path / "out").exists()


def _fake_chaos_run(tmp: Path, monkeypatch, name: str, *chaos_args: str, **config) -> tuple[int, str, dict, Path]:
    exp = fast_experiment(tmp, name, **config)
    out = tmp / f"{name}-out"
    monkeypatch.setenv("SPECCHAOS_OUT", str(out))
    res = chaos(tmp, "run", "--journal-path", str(tmp / f"{name}-journal.json"), *chaos_args, str(exp))
    print(res.output[-3000:])
    return res.exit_code, res.output, json.loads((tmp / f"{name}-journal.json").read_text()), out


@pytest.mark.nightly   # plain chaos run: the failing and aborted runs below stay in make test; the real-stack pass is nightly
@pytest.mark.timeout(240)
def test_chaos_run_passes_with_exit_0_and_a_completed_journal(tmp_path, monkeypatch):
    before = sut_pids()
    code, output, journal, out = _fake_chaos_run(tmp_path, monkeypatch, "pass")
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "pass", ([c for c in report["checks"] if not c["passed"]], report["errors"])
    assert code == 0, output[-3000:]
    assert journal["status"] == "completed" and journal["deviated"] is False
    assert journal["specchaos"]["verdict"] == "pass" and journal["specchaos"]["report"] == str(out / "report.json")
    assert report["source"] == "chaos run"
    assert "specchaos verdict: pass" in output
    for f in ("journal.json", "config.json", "experiment.json", "run.json", "records.jsonl", "timeline.jsonl",
              "timeline.png"):
        assert (out / f).is_file(), f
    (allure,) = (out / "allure-results").glob("*-result.json")   # harness.report.allure, under chaos run too
    assert json.loads(allure.read_text())["status"] == "passed"
    assert rejudge(out)["verdict"] == "pass"   # `specchaos report DIR` agrees
    assert leaked_since(before) == []


@pytest.mark.timeout(240)
def test_chaos_run_fails_with_exit_1_and_a_deviated_journal(tmp_path, monkeypatch):
    """An impossible recovery limit (healthy 1 ms after the kill), given on the command line
    (``--var specchaos_set=...`` reaches ``configuration.specchaos``): the specchaos verdict
    is fail while every steady-state probe meets its tolerance, so Chaos Toolkit alone
    would say ``completed`` and exit 0; the journal now says deviated and ``chaos`` exits 1."""
    code, output, journal, out = _fake_chaos_run(tmp_path, monkeypatch, "fail", "--var",
                                                 "specchaos_set=recovery.time_to_healthy_s=0.001;load.seed=77")
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "fail", report["errors"]
    assert [o["path"] for o in report["overrides"]] == ["recovery.time_to_healthy_s", "load.seed"]
    assert json.loads((out / "config.json").read_text())["recovery"]["time_to_healthy_s"] == 0.001
    assert code == 1
    assert journal["specchaos"]["chaostoolkit_status"] == "completed", "chaos alone would have passed it"
    assert journal["specchaos"]["chaostoolkit_deviated"] is False
    assert journal["status"] == "completed" and journal["deviated"] is True
    assert journal["specchaos"]["verdict"] == "fail"
    assert journal["specchaos"]["failed_checks"] == ["recovery.time_to_healthy_s"], journal["specchaos"]
    assert "specchaos verdict: fail" in output and "recovery.time_to_healthy_s" in output
    again = rejudge(out)   # from the journal as judged, not the one chaos saved
    assert again["verdict"] == "fail"
    assert [c["name"] for c in again["checks"]] == [c["name"] for c in report["checks"]]
    saved = json.loads((out / "journal.json").read_text())
    assert "specchaos" not in saved and saved["deviated"] is False


@pytest.mark.timeout(240)
def test_chaos_run_aborted_by_a_safeguard_exits_1_with_an_aborted_journal(tmp_path, monkeypatch):
    """A safeguard that forbids the kill's errors aborts the method with Chaos Toolkit's
    graceful exit (SIGUSR1) under ``chaos``'s own signal handlers: verdict aborted, the
    journal ``aborted`` (Chaos Toolkit alone: ``interrupted``), exit 1."""
    before = sut_pids()
    code, output, journal, out = _fake_chaos_run(
        tmp_path, monkeypatch, "abort", safeguards=[ERRORS_FORBIDDEN],
        stack={"restart": {"backoff_s": 5.0, "backoff_max_s": 5.0}})
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "aborted", (report["errors"], report.get("safeguards"))
    assert code == 1
    assert journal["status"] == "aborted" and journal["specchaos"]["chaostoolkit_status"] == "interrupted"
    assert "safeguards.error_rate" in journal["specchaos"]["failed_checks"]
    assert rejudge(out)["verdict"] == "aborted"
    assert not leaked_since(before, wait_s=10)

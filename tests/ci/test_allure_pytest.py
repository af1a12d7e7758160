"""The plugin under allure-pytest (``--alluredir``): one Allure result per experiment, with
the phases and faults as steps and the timeline plot and per-phase table attached, broken
for a run that could not be judged; ``categories.json`` and ``executor.json`` beside the
results, their categories matching the project's real failure messages (checked by the
Allure command line itself), and a trend across two generations of the report.

The experiment is the fast kill-the-worker run on the fake vLLM (:mod:`tests.experiment.fast_e2e`),
made to fail by an impossible recovery limit given as an override."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import time

import pytest

from harness.pytest_plugin import ExperimentFailed, failure_message
from harness.report.allure import CATEGORIES, _status_details, executor
from harness.report.schema import Report
from tests.ci.helpers import PLUGIN, ROOT, env
from tests.experiment.fast_e2e import fast_experiment
from tests.report.allure_tools import generate, need


def _matching(message: str, status: str) -> list[str]:
    """The categories a result with ``message`` and ``status`` lands in (Allure: the regex
    matches the whole message)."""
    return [c["name"] for c in CATEGORIES if status in c["matchedStatuses"]
            and ("messageRegex" not in c or re.fullmatch(c["messageRegex"], message))]


def _report(*failing: str) -> dict:
    checks = [{"name": n, "passed": False, "observed": 2.0, "limit": 1.0, "detail": f"{n} over its limit"}
              for n in failing] + [{"name": "integrity.mismatched", "passed": True, "observed": 0, "limit": 0}]
    return {"schema_version": 1, "experiment": "x", "verdict": "fail", "stack": {}, "faults": [], "phases": {},
            "requests": {"total": 0, "ok": 0, "failed": 0}, "restarts": 0, "errors": [], "checks": checks}


@pytest.mark.parametrize("failing, categories", [
    (["slo.fault.ttft_p95_s"], ["SLO"]),
    (["degradation.after.e2e_p95_ratio", "safeguards.error_rate"], ["SLO"]),
    (["integrity.mismatched"], ["integrity"]),
    (["recovery.time_to_slo_s"], ["recovery"]),
    (["steady_state.after.current-phase-within-slo"], ["recovery"]),
    (["liveness.health_lie_s"], ["liveness and hang"]),
    (["hang.longest_stall_s", "fail_fast.hung"], ["liveness and hang"]),
    (["speculation.spec.collapse", "acceptance_floor.short.greedy"], ["speculation"]),
    (["mirror.fault.greedy.tpot_ratio"], ["speculation"]),
    (["slo.after.e2e_p95_s", "integrity.malformed"], ["SLO", "integrity"]),
    (["server_memory.spec.fault.rss_swing"], ["memory and drift"]),
    (["soak.spec.rss_growth_per_30min"], ["memory and drift"]),
])
def test_categories_match_both_failure_messages(failing, categories):
    rep = _report(*failing)
    pytest_message = f"{ExperimentFailed.__module__}.ExperimentFailed: {failure_message(rep)}"   # exconly()
    assert _matching(pytest_message, "failed") == categories, pytest_message
    assert _matching(_status_details(Report.model_validate(rep)).message, "failed") == categories
    assert _matching(pytest_message, "broken") == ["harness error"]


def test_executor_names_the_github_run_or_this_host():
    gh = executor({"GITHUB_RUN_ID": "77", "GITHUB_RUN_NUMBER": "12", "GITHUB_WORKFLOW": "chaos-nightly",
                   "GITHUB_REPOSITORY": "o/r", "GITHUB_SERVER_URL": "https://github.com"})
    assert gh == {"name": "GitHub Actions", "type": "github", "reportName": "specchaos", "buildName": "chaos-nightly #12",
                  "buildOrder": 12, "buildUrl": "https://github.com/o/r/actions/runs/77"}
    local = executor({})
    assert local["type"] == "local" and abs(local["buildOrder"] - time.time()) < 60


def _results(d):
    return [json.loads(p.read_text()) for p in sorted(d.glob("*-result.json"))]


def _flat(steps):
    return [n for s in steps for n in [s["name"], *_flat(s.get("steps") or [])]]


@pytest.mark.timeout(300)
def test_one_result_per_experiment_with_steps_attachments_categories_and_trend(tmp_path):
    need(importlib.util.find_spec("allure_pytest") is not None, "allure-pytest is not installed (the test extra)")
    failing = fast_experiment(tmp_path, "fast-allure")
    broken = fast_experiment(tmp_path, "fast-allure-broken", stack={"draft": "no-such-draft"})
    results = tmp_path / "allure-results"
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *PLUGIN, "-p", "allure_pytest", "-q", "--alluredir", str(results),
         "--specchaos-out", str(tmp_path / "out"), "--specchaos-allure-dir", str(results),   # the same: ignored
         "--specchaos-set", "recovery.time_to_healthy_s=0.001", "--specchaos-set", "phases.after_s=2",
         str(failing), str(broken)],
        cwd=ROOT, env=env(SPECCHAOS_STATE_DIR=str(tmp_path / "state"),
                          SPECCHAOS_LAUNCHERS="fake=tests.fakes.stack:FakeStack"),
        capture_output=True, text=True, timeout=280)
    print(proc.stdout[-3000:], proc.stderr[-2000:], f"pytest: {time.monotonic() - t0:.0f} s", sep="\n")
    assert proc.returncode == 1, proc.stdout[-3000:]   # a failure and an error

    res = _results(results)
    assert len(res) == 2, [r["name"] for r in res]   # one per experiment: no second result from the runs
    by_status = {r["status"]: r for r in res}
    assert set(by_status) == {"failed", "broken"}
    fail = by_status["failed"]
    assert fail["name"] == "Kill the drafting worker under load"
    assert "recovery.time_to_healthy_s" in fail["statusDetails"]["message"]
    names = _flat(fail["steps"])
    assert names[:5] == ["phase warm-up", "phase baseline", "phase fault", "phase recovery", "phase after"]
    assert "fault process-kill on spec/worker" in names and "check recovery.time_to_healthy_s" in names
    atts = {a["name"]: a for a in fail["attachments"]}
    assert atts["timeline plot"]["type"] == "image/png" and atts["per-phase table"]["type"] == "text/csv"
    assert (results / atts["timeline plot"]["source"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (results / atts["per-phase table"]["source"]).read_text().startswith("phase,start,end,")
    params = {p["name"]: p["value"] for p in fail["parameters"]}
    assert params["launcher"] == "fake" and params["fault kinds"] == "process-kill"
    labels = {(lb["name"], lb["value"]) for lb in fail["labels"]}
    assert ("suite", fail["name"]) in labels and ("feature", "process-kill") in labels
    assert ("framework", "pytest") in labels and ("framework", "specchaos") not in labels
    assert "no-such-draft" in by_status["broken"]["statusDetails"]["message"]
    assert {c["name"] for c in json.loads((results / "categories.json").read_text())} >= {"recovery", "harness error"}
    assert json.loads((results / "executor.json").read_text())["reportName"] == "specchaos"

    report = tmp_path / "report"
    generate(results, report)
    cats = {c["name"]: c for c in json.loads((report / "data" / "categories.json").read_text())["children"]}
    assert {"recovery", "harness error"} <= set(cats), list(cats)
    (group,) = cats["recovery"]["children"]   # a category → its failure messages → their results
    assert "recovery.time_to_healthy_s" in group["name"] and [t["name"] for t in group["children"]] == [fail["name"]]
    assert len(list((report / "data" / "test-cases").glob("*.json"))) == 2
    generate(results, report)   # the next generation: history copied in, a trend of two points
    trend = json.loads((report / "widgets" / "history-trend.json").read_text())
    assert len(trend) == 2 and all(point["data"]["failed"] == 1 and point["data"]["broken"] == 1 for point in trend)

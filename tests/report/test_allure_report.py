"""The HTML report of synthetic Allure results: ``ci/allure-report.sh`` keeps history
across generations (trend), ``ci/check_report.py`` passes in headless Chromium on a
report with plots and fails on one without, and both refuse bad input with one line and
exit 2. (The real run's report is checked in :mod:`tests.experiment.test_run_e2e`.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.report import timeline_plot
from harness.report.allure import ALLURE_DIR_ENV, RESULTS_DIR, write_allure_results
from tests.report.allure_tools import ALLURE_REPORT, CHECK_REPORT, check, generate
from tests.report.test_allure import META, judged, run_dir  # noqa: F401  (run_dir: a fixture)


def test_history_gives_a_trend_when_runs_are_generated_into_one_report(run_dir, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.delenv(ALLURE_DIR_ENV, raising=False)
    rep = judged(run_dir)
    report = tmp_path / "report"
    first, second = tmp_path / "results-1", tmp_path / "results-2"
    write_allure_results(run_dir, rep, extra_dirs=[first])
    generate(first, report)
    assert not (first / "history").exists()   # nothing to carry on the first generation
    write_allure_results(run_dir, dict(rep, verdict="fail"), extra_dirs=[second])   # a later run of one experiment
    generate(second, report)
    assert (second / "history" / "history-trend.json").is_file()   # REPORT/history carried into the results
    trend = json.loads((report / "history" / "history-trend.json").read_text())
    assert len(trend) == 2, trend
    assert trend[0]["data"]["failed"] == 1 and trend[1]["data"]["passed"] == 1   # newest first
    history = json.loads((report / "history" / "history.json").read_text())
    (entry,) = history.values()   # one experiment file (keyed by Allure from our testCaseId and parameters)
    assert [i["status"] for i in entry["items"]] == ["failed", "passed"]


def test_the_browser_check_passes_with_plots(run_dir, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.delenv(ALLURE_DIR_ENV, raising=False)
    rep = judged(run_dir)
    write_allure_results(run_dir, rep)
    report = tmp_path / "report"
    generate(run_dir / RESULTS_DIR, report)
    res = check(report, tmp_path / "shots")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "plot shown at 1400x1000 px" in res.stdout
    for shot in ("overview.png", "test-1.png"):
        assert (tmp_path / "shots" / shot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.nightly   # make test judges the failing pages with a stub browser (test_check_report_fails_on_each_missing_piece)
def test_the_browser_check_fails_without_plots(run_dir, tmp_path, monkeypatch):  # noqa: F811
    """The same run without its plot, in real Chromium: the check must fail, naming it."""
    monkeypatch.delenv(ALLURE_DIR_ENV, raising=False)
    rep = judged(run_dir)
    monkeypatch.setattr(timeline_plot, "plot_timeline", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("x")))
    write_allure_results(run_dir, rep)
    bare = tmp_path / "bare"
    generate(run_dir / RESULTS_DIR, bare)
    res = check(bare, tmp_path / "shots-bare")
    assert res.returncode == 1
    assert "check_report: FAIL: " in res.stderr and "no 'timeline plot' attachment" in res.stderr


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    res = subprocess.run([str(ALLURE_REPORT), str(tmp_path / "nope"), str(tmp_path / "r")], capture_output=True,
                         text=True)
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0 and "does not exist" in res.stderr
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "x-result.json").write_text("{}")
    res = subprocess.run([str(ALLURE_REPORT), str(tmp_path / "results"), str(tmp_path / "r")], capture_output=True,
                         text=True, env={"PATH": "/usr/bin:/bin", "ALLURE": str(tmp_path / "no-allure")})
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0
    assert "not an executable Allure command line" in res.stderr
    res = subprocess.run([sys.executable, str(CHECK_REPORT), str(tmp_path), str(tmp_path / "shots")],
                         capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0 and "check_report: error: " in res.stderr


# ------------------------------------------------------------------ check_report's checks, without a browser
def _check_report_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_report", CHECK_REPORT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class StubBrowser:
    """Answers --dump-dom with fixed pages; screenshots are tiny PNGs."""

    def __init__(self, overview: str, page: str):
        self.overview, self.page = overview, page

    def dom(self, url: str) -> str:
        return self.page if "#testresult/" in url else self.overview

    def screenshot(self, url: str, path) -> bool:
        path.write_bytes(b"\x89PNG\r\n\x1a\n")
        return True


def _fake_report(d, png: bytes = b"\x89PNG\r\n\x1a\nrest"):
    (d / "data" / "test-cases").mkdir(parents=True)
    (d / "data" / "attachments").mkdir()
    (d / "index.html").write_text("<html><body></body></html>")
    (d / "data" / "attachments" / "a1.png").write_bytes(png)
    (d / "data" / "test-cases" / "u1.json").write_text(json.dumps({
        "uid": "u1", "name": "Kill it", "testStage": {"attachments": [{"name": "timeline plot", "source": "a1.png"}]}}))
    return d


def test_check_report_fails_on_each_missing_piece(tmp_path):
    cr = _check_report_module()
    d = _fake_report(tmp_path / "rep")
    server = cr.serve(d)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    good_page = '<html data-specchaos-plot="1400x1000"><body>Kill it attachments/a1.png</body></html>'
    try:
        ok = cr.check(d, tmp_path / "s1", StubBrowser("<body>Allure Kill it</body>", good_page), base)
        assert ok == []
        missing = cr.check(d, tmp_path / "s2", StubBrowser("<body>Allure</body>", good_page), base)
        assert missing == ["the overview does not list the experiment 'Kill it'"]
        no_plot = cr.check(d, tmp_path / "s3", StubBrowser("<body>Allure Kill it</body>",
                                                          "<body>Kill it attachments/a1.png</body>"), base)
        assert len(no_plot) == 1 and "the timeline plot is not shown" in no_plot[0]
        tiny = cr.check(d, tmp_path / "s4", StubBrowser("<body>Allure Kill it</body>",
                                                       good_page.replace("1400x1000", "20x10")), base)
        assert len(tiny) == 1 and "too small" in tiny[0]
        (d / "data" / "attachments" / "a1.png").write_bytes(b"GIF89a")
        not_png = cr.check(d, tmp_path / "s5", StubBrowser("<body>Allure Kill it</body>", good_page), base)
        assert len(not_png) == 1 and "is not a PNG" in not_png[0]
    finally:
        server.shutdown()
        server.server_close()

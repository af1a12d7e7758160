"""The Prometheus export of a judged run (:mod:`harness.report.prometheus`): the metrics
of a report judged by the real judge, the text file (linted by ``promtool``), a push to a
real Pushgateway scraped by a real Prometheus and queried back through its HTTP API, the
loopback rule for the Pushgateway, and the Grafana dashboard's queries.

The servers are Debian's ``prometheus`` and ``prometheus-pushgateway`` packages (``.ci/run``
installs them), started here on free loopback ports with temporary storage and stopped at
the end; without them the test is skipped, and fails under ``SPECCHAOS_REQUIRE_REPORT_TOOLS=1``."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.errors import ExperimentError
from harness.experiment.config import SpecchaosConfig, parse_config
from harness.experiment.overrides import apply_overrides, parse_set
from harness.report.config import PrometheusConfig
from harness.report.judge import judge_run
from harness.report.prometheus import RUN_LABELS, TEXTFILE, publish_prometheus, write_textfile
from tests.report.allure_tools import need
from tests.report.test_allure import metrics_lines
from tests.report.test_judge import META, STARTS, cfg, load_records, timeline, write_run

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "specchaos.json"


def judged(tmp: Path, **kw) -> dict:
    rep = judge_run(write_run(tmp / "run", **kw), cfg(), META)
    return json.loads(json.dumps(rep))   # as report.json holds it


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """``(name, sorted labels without the run labels) → value`` of a text exposition."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            extra = tuple(sorted((k, v) for k, v in s.labels.items() if k not in RUN_LABELS))
            out[(s.name, extra)] = s.value
    return out


def test_the_text_file_holds_the_headline_results(tmp_path):
    rep = judged(tmp_path)
    path = write_textfile(tmp_path / "run", rep)
    assert path == tmp_path / "run" / TEXTFILE
    text = path.read_text()
    got = samples(text)
    assert got[("specchaos_passed", ())] == 1.0
    assert got[("specchaos_verdict", (("verdict", "pass"),))] == 1.0
    assert got[("specchaos_verdict", (("verdict", "fail"),))] == 0.0
    assert got[("specchaos_recovery_seconds", (("stage", "healthy"),))] == rep["recovery"]["time_to_healthy_s"]
    base = rep["phases"]["baseline"]
    for metric, field in (("ttft", "ttft_s"), ("tpot", "tpot_s"), ("itl", "itl_s"), ("e2e", "e2e_s")):
        for stat in ("p50", "p95", "p99"):
            key = ("specchaos_latency_seconds", (("metric", metric), ("phase", "baseline"), ("stat", stat)))
            assert got[key] == base[field][stat], key
    fault = rep["phases"]["fault"]
    assert got[("specchaos_phase_error_ratio", (("phase", "fault"),))] == fault["error_rate"] > 0
    assert got[("specchaos_phase_requests", (("phase", "fault"),))] == fault["requests"]
    assert got[("specchaos_phase_start_timestamp_seconds", (("phase", "fault"),))] == STARTS["fault"]
    bucket = next(iter(rep["acceptance_floor"]["buckets"]))
    sampling = next(iter(rep["acceptance_floor"]["buckets"][bucket]))
    assert got[("specchaos_acceptance_rate", (("bucket", bucket), ("phase", "all"), ("sampling", sampling)))] == \
        rep["acceptance_floor"]["buckets"][bucket][sampling]["acceptance_rate"]
    (f,) = rep["faults"]
    keys = (("fault_id", "f1"), ("kind", "process-kill"), ("target", "spec/worker"))
    assert got[("specchaos_fault_start_timestamp_seconds", keys)] == f["injected_at"]
    assert got[("specchaos_fault_end_timestamp_seconds", keys)] == f["cleared_at"]
    labels = next(s.labels for fam in text_string_to_metric_families(text) for s in fam.samples)
    assert {k: labels[k] for k in RUN_LABELS} == {"experiment": "kill the draft worker", "launcher": "local",
                                                 "method": "draft_model", "draft": "draft-exact", "k": "4",
                                                 "vllm_version": "0.32.0"}
    assert "NaN" not in text


def test_a_failed_run_says_so_and_names_its_failing_checks(tmp_path):
    """A server that never came back: the verdict is fail, recovery to SLO was never reached
    (left out, not NaN), and each failing check is a series."""
    rep = judged(tmp_path, records=load_records(back_at=1200.0), events=timeline(back_at=1200.0))
    assert rep["verdict"] == "fail"
    got = samples(write_textfile(tmp_path / "run", rep).read_text())
    assert got[("specchaos_passed", ())] == 0.0 and got[("specchaos_verdict", (("verdict", "fail"),))] == 1.0
    failing = {dict(k[1])["check"] for k in got if k[0] == "specchaos_check_failed"}
    assert failing == {c["name"] for c in rep["checks"] if c["passed"] is False} and failing
    assert got[("specchaos_checks", (("result", "failed"),))] == len(failing)
    assert ("specchaos_recovery_seconds", (("stage", "slo"),)) not in got


def test_required_checks_and_the_draft_model_name(tmp_path):
    """The required checks judged of required, each one not judged as a series; the ``draft``
    label is the model's name even when the report holds its path."""
    off = cfg(stack={"reference": False}, integrity={"min_compared": 0},
              judge={"required": ["recovery", "integrity"]})
    spec = {**META["stack"]["speculative"], "draft": "/home/me/specchaos/models/draft-exact/"}
    rep = judge_run(write_run(tmp_path / "run"), off, {**META, "stack": {**META["stack"], "speculative": spec}})
    rep = json.loads(json.dumps(rep))
    text = write_textfile(tmp_path / "run", rep).read_text()
    got = samples(text)
    assert got[("specchaos_required_checks", (("result", "required"),))] == 2.0
    assert got[("specchaos_required_checks", (("result", "judged"),))] == 1.0
    assert got[("specchaos_required_not_judged", (("check", "integrity"),))] == 1.0
    assert ("specchaos_required_not_judged", (("check", "recovery"),)) not in got
    labels = next(s.labels for fam in text_string_to_metric_families(text) for s in fam.samples)
    assert labels["draft"] == "draft-exact"


def test_publishing_never_raises_and_says_what_failed(tmp_path):
    rep = judged(tmp_path)
    closed = _free_port()   # nothing listens there
    err = publish_prometheus(tmp_path / "run", rep, PrometheusConfig(pushgateway_url=f"http://127.0.0.1:{closed}",
                                                                     timeout_s=2))
    assert err is not None and err.startswith(f"prometheus push to http://127.0.0.1:{closed} failed: ")
    assert (tmp_path / "run" / TEXTFILE).is_file()   # the text file is written before the push
    bad = publish_prometheus(tmp_path / "run", {"verdict": "pass"})
    assert bad is not None and bad.startswith("prometheus text file not written: ValidationError")


@pytest.mark.parametrize("url, needle", [
    ("http://10.1.2.3:9091", "the Pushgateway must be on a loopback address (127.0.0.0/8, ::1 or localhost), not 10.1.2.3"),
    ("http://pushgateway.example.com", "must be on a loopback address"),
    ("ftp://127.0.0.1:9091", "not an http(s) URL"),
    ("127.0.0.1:9091", "not an http(s) URL"),
])
def test_a_pushgateway_off_loopback_is_refused(url, needle):
    ovs = parse_set(f"prometheus.pushgateway_url={url}")
    with pytest.raises(ExperimentError) as ei:
        parse_config(apply_overrides({}, ovs, SpecchaosConfig), overrides=ovs)
    assert needle in ei.value.one_line() and ei.value.one_line().startswith("--set prometheus.pushgateway_url=")
    ok = parse_config({"prometheus": {"pushgateway_url": "http://[::1]:9091/"}})
    assert ok.prometheus.pushgateway_url == "http://[::1]:9091"


# ---------------------------------------------------------------------- real servers
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, deadline: float, proc: subprocess.Popen) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args[0]} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} not ready")


def _query(prom: str, q: str) -> list[dict]:
    r = httpx.get(f"{prom}/api/v1/query", params={"query": q}, timeout=5)
    r.raise_for_status()
    return r.json()["data"]["result"]


@pytest.fixture
def prometheus_servers(tmp_path):
    """A Pushgateway and a Prometheus scraping it every second, on loopback: yields
    ``(pushgateway URL, Prometheus URL)``."""
    for binary in ("prometheus", "prometheus-pushgateway", "promtool"):
        need(shutil.which(binary) is not None,
             f"{binary} is not installed (apt-get install -y prometheus prometheus-pushgateway)")
    pg_port, prom_port = _free_port(), _free_port()
    (tmp_path / "prometheus.yml").write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "pushgateway", "honor_labels": True,
                            "static_configs": [{"targets": [f"127.0.0.1:{pg_port}"]}]}]}))
    procs = []
    try:
        procs.append(subprocess.Popen(
            ["prometheus-pushgateway", f"--web.listen-address=127.0.0.1:{pg_port}",
             f"--persistence.file={tmp_path / 'pushgateway.data'}"],
            stdout=subprocess.DEVNULL, stderr=(tmp_path / "pushgateway.log").open("w"), start_new_session=True))
        procs.append(subprocess.Popen(
            ["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"), start_new_session=True))
        deadline = time.monotonic() + 20
        pg, prom = f"http://127.0.0.1:{pg_port}", f"http://127.0.0.1:{prom_port}"
        _wait(f"{pg}/-/ready", deadline, procs[0])
        _wait(f"{prom}/-/ready", deadline, procs[1])
        yield pg, prom
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)


@pytest.mark.timeout(60)
def test_pushed_scraped_and_queried_back_through_prometheus(tmp_path, prometheus_servers):
    pg, prom = prometheus_servers
    rep = judged(tmp_path)
    assert publish_prometheus(tmp_path / "run", rep, PrometheusConfig(pushgateway_url=pg)) is None
    lint = subprocess.run(["promtool", "check", "metrics"], input=(tmp_path / "run" / TEXTFILE).read_bytes(),
                          capture_output=True, timeout=30)
    assert lint.returncode == 0, lint.stdout + lint.stderr   # names, units, label conventions

    exp = 'experiment="kill the draft worker"'
    deadline = time.monotonic() + 15
    while not (got := _query(prom, f'specchaos_passed{{{exp}}}')) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert got, "the pushed metric never reached Prometheus"
    (series,) = got
    assert series["value"][1] == "1"
    assert series["metric"]["job"] == "specchaos" and series["metric"]["method"] == "draft_model"
    assert series["metric"]["k"] == "4" and series["metric"]["vllm_version"] == "0.32.0"
    (p95,) = _query(prom, f'specchaos_latency_seconds{{{exp},phase="baseline",metric="e2e",stat="p95"}}')
    assert float(p95["value"][1]) == pytest.approx(rep["phases"]["baseline"]["e2e_s"]["p95"])
    (start,) = _query(prom, f'specchaos_fault_start_timestamp_seconds{{{exp},kind="process-kill"}}')
    assert float(start["value"][1]) == rep["faults"][0]["injected_at"]
    # a later run of the same experiment replaces the group: the verdict follows
    failed = dict(rep, verdict="fail")
    assert publish_prometheus(tmp_path / "run", failed, PrometheusConfig(pushgateway_url=pg)) is None
    deadline = time.monotonic() + 15
    while _query(prom, f'specchaos_passed{{{exp}}}')[0]["value"][1] != "0":
        assert time.monotonic() < deadline, "the second push never reached Prometheus"
        time.sleep(0.3)


# ---------------------------------------------------------------------- the Grafana dashboard
def _exprs(node) -> list[str]:
    if isinstance(node, dict):
        found = [node[k] for k in ("expr", "query") if isinstance(node.get(k), str)]
        return found + [e for v in node.values() for e in _exprs(v)]
    if isinstance(node, list):
        return [e for v in node for e in _exprs(v)]
    return []


def test_the_grafana_dashboard_queries_metrics_the_export_writes(tmp_path):
    """Against a passed run, and a failed one with vLLM's counters recorded: every family
    the dashboard reads is one the export writes."""
    board = json.loads(DASHBOARD.read_text())
    d = write_run(tmp_path / "failed", records=load_records(back_at=1200.0), events=timeline(back_at=1200.0))
    metrics_lines(d)
    failed = json.loads(json.dumps(judge_run(d, cfg(), META)))
    assert failed["verdict"] == "fail"
    written = {fam.name for run_dir, rep in ((d, failed), (tmp_path / "run", judged(tmp_path)))
               for fam in text_string_to_metric_families(write_textfile(run_dir, rep).read_text())}
    exprs = _exprs(board)
    used = {m for e in exprs for m in re.findall(r"\bspecchaos_[a-z_]+", e)}
    assert used and used <= written, used - written
    assert {"specchaos_passed", "specchaos_latency_seconds", "specchaos_recovery_seconds",
            "specchaos_acceptance_rate"} <= used
    notes = board["annotations"]["list"]
    faults = [a for a in notes if "specchaos_fault_" in a.get("expr", "")]
    assert {("start" in a["expr"], a.get("useValueForTime")) for a in faults} == {(True, True), (False, True)}
    assert all("* 1000" in a["expr"] for a in faults)   # Grafana wants milliseconds
    assert [v["name"] for v in board["templating"]["list"]][:2] == ["datasource", "experiment"]

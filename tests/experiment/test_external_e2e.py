"""The external launcher against a real vLLM server that the test starts itself as a plain
subprocess (tests/experiment/plain_server.py: ``python -m vllm.entrypoints.openai.api_server``,
speculative, ``draft-exact`` with k = 4 on the tiny target, and a served model name of its
own, which the harness must discover from ``/v1/models``).

* ``experiments/external-endpoint.yaml`` in its CI form, its file naming launcher ``local``
  and the command line giving ``--launcher external --set stack.spec_url=URL``: pass, the
  jitter measured by the proxy in front of the external URL, speculation read from the
  server's own ``/metrics``, integrity not judged without a reference (with the reason),
  ``report.json`` and the Allure environment naming the launcher;
* ``specchaos cleanup`` after that run, and after a run SIGKILLed mid-way (its proxy and
  locust left behind), ends what the harness started and never the server it attached to.

The server is booted by the session fixture ``plain_vllm_server`` (the Docker module, just
before, boots it while its own container boots) and stopped at this module's end, before
the shared stack pool starts its two servers (the machine holds at most two); the tests run
first in the stack group (``own_stack``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.experiment.files import ROOT, ci_form, experiment_doc, write
from tests.experiment.plain_server import SERVED, generates
from tests.procs import leaked_since, phase_started, sut_pids, wait_for

pytestmark = [pytest.mark.stack, pytest.mark.own_stack, pytest.mark.timeout(600)]

@pytest.fixture(scope="module")
def external_server(plain_vllm_server):
    """The plain server, ready; stopped (its process group) at the end of the module."""
    try:
        yield plain_vllm_server.ready()
    finally:
        plain_vllm_server.stop()


def harness(server, *args: str, **kw) -> subprocess.Popen:
    """``specchaos ARGS`` in its own process, with the module's own state directory."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", SPECCHAOS_STATE_DIR=str(server.state))
    return subprocess.Popen([sys.executable, "-m", "harness.cli", *args], cwd=ROOT, env=env, text=True, **kw)


def cleanup(server) -> dict:
    proc = harness(server, "cleanup", stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    return {"output": out}


def experiment(tmp: Path, **phases) -> Path:
    """external-endpoint.yaml in its CI form, its file naming launcher local (the command
    line must switch it) and a port where nothing listens (the command line gives the URL)."""
    d = ci_form(experiment_doc("external-endpoint.yaml"), duration_s=8)
    d["configuration"]["specchaos"]["stack"].update(launcher="local", spec_url="http://127.0.0.1:9")
    d["configuration"]["specchaos"]["phases"].update(phases)
    return write(tmp, d)


@pytest.fixture(scope="module")
def external_run(external_server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("external-run")
    out = tmp / "out"
    before = sut_pids()
    t0 = time.monotonic()
    proc = harness(external_server, "run", str(experiment(tmp)), "--out", str(out), "--launcher", "external",
                   "--set", f"stack.spec_url={external_server.url}", stdout=subprocess.PIPE,
                   stderr=subprocess.STDOUT)
    output, _ = proc.communicate(timeout=540)
    print(output[-6000:], f"\nexternal run wall time: {time.monotonic() - t0:.0f} s")
    return {"code": proc.returncode, "output": output, "out": out, "before": before,
            "report": json.loads((out / "report.json").read_text())}


def test_a_network_fault_in_front_of_an_external_server(external_run, external_server):
    rep = external_run["report"]
    checks = {c["name"]: c for c in rep["checks"]}
    failed = [n for n, c in checks.items() if c["passed"] is False]
    assert external_run["code"] == 0 and rep["verdict"] == "pass", (rep["errors"], failed)
    assert rep["stack"]["launcher"] == "external" and rep["stack"]["servers"] == {"spec": external_server.url}
    # the fault acted on the external URL's path: the proxy measured the delay it added
    (fault,) = rep["faults"]
    ev = fault["evidence"]["observations"]
    assert fault["kind"] == "network" and fault["acted"] and ev["added_latency_ms"]["mean"] >= 25, ev
    assert checks["degradation.fault.error_rate"]["observed"] == 0
    # speculation from the external server's own /metrics
    spec = rep["speculation"]["servers"]["spec"]["phases"]
    assert spec["baseline"]["acceptance_rate"] >= 0.9 and spec["after"]["acceptance_rate"] >= 0.9, spec
    # no reference server: the comparison is not judged, with the reason; the streams are
    for name in ("integrity.mismatched", "integrity.compared"):
        assert checks[name]["passed"] is None and "without stack.reference_url" in checks[name]["detail"], checks[name]
    assert checks["integrity.malformed"]["passed"] and checks["integrity.false_success"]["passed"]
    # attached, never started: the model name discovered, nothing of the server's in the run state
    events = [json.loads(l) for l in (external_run["out"] / "timeline.jsonl").read_text().splitlines()]
    (attached,) = [e for e in events if e.get("event") == "server_attached"]
    assert attached["model"] == SERVED and attached["metrics"] is True
    assert not [e for e in events if e.get("event") in ("server_started", "server_exited")]
    env = (external_run["out"] / "allure-results" / "environment.properties").read_text().splitlines()
    assert "launcher=external" in env, env
    assert leaked_since(external_run["before"]) == []   # its proxy and locust are gone
    assert external_server.proc.poll() is None and generates(external_server.url)


def test_cleanup_never_touches_the_external_server(external_run, external_server, tmp_path):
    """After the run above, and after a run SIGKILLed while its proxy and load run:
    ``specchaos cleanup`` cleans the crashed run (nothing of the harness's is left), and the
    server the harness attached to keeps running and generating."""
    cleanup(external_server)
    assert external_server.proc.poll() is None and generates(external_server.url)

    out = tmp_path / "out"
    before = sut_pids()
    proc = harness(external_server, "run", str(experiment(tmp_path, baseline_s=60)), "--out", str(out),
                   "--launcher", "external", "--set", f"stack.spec_url={external_server.url}",
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: phase_started(out, "baseline"), 180, "the baseline phase of the run to be killed")
        left = sut_pids() - before
        assert left, "the load should be running"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    started = [json.loads(l) for l in (out / "timeline.jsonl").read_text().splitlines() if '"proxy_started"' in l]
    res = cleanup(external_server)
    # the run's state was there to clean (its proxy and locust die with the harness:
    # PR_SET_PDEATHSIG; cleanup ends whatever is left of what it registered)
    assert "1 crashed run(s) cleaned" in res["output"], res["output"]
    assert leaked_since(before, wait_s=10) == []
    for s in started:
        pid = s["pid"]
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not list((external_server.state / "runs").glob("*.json"))
    assert external_server.proc.poll() is None and generates(external_server.url)

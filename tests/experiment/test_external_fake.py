"""The external launcher on the fast path: the fake vLLM started by the test as a plain
subprocess (not supervised by the harness), attached to by URL. While a latency toxic acts
in front of it, someone else restarts it (the process exits, a new one comes up on the same
port two seconds after the toxic's removal): the run measures that as an outage and a
recovery, as it measures any other, and counts no restart of its own. The same launcher
against a real vLLM server: tests/experiment/test_external_e2e.py."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from harness.experiment.runner import run
from tests.experiment.fast_e2e import fast_experiment
from tests.experiment.test_network import toxic_action
from tests.fakes.launch import FakeProcess
from tests.procs import leaked_since, phase_started, sut_pids

TOXIC_S = 3.0
GONE_AT_S = 1.0        # into the fault phase, the server exits
BACK_AFTER_CLEAR_S = 2.0


@pytest.mark.timeout(240)
def test_a_restart_by_someone_else_is_an_outage_and_a_recovery(tmp_path):
    first = FakeProcess(num_speculative_tokens=4, served_model_name="ext-fake").start()
    servers = [first]
    exp = fast_experiment(tmp_path, "external", method=toxic_action(TOXIC_S, toxic="latency",
                                                                   attributes={"latency": 20}),
                          stack={"launcher": "external", "spec_url": first.base_url, "reference": False},
                          degradation={"fault_max_error_rate": 1.0})
    out = tmp_path / "external-out"
    before = sut_pids() - {first.pid}
    restarted, done = threading.Event(), threading.Event()

    def someone_else() -> None:
        deadline = time.monotonic() + 120
        while not phase_started(out, "fault"):
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        time.sleep(GONE_AT_S)
        httpx.post(f"{first.base_url}/exit?code=0", timeout=5, trust_env=False)   # the server goes away
        first.popen.wait(10)
        time.sleep(TOXIC_S - GONE_AT_S + BACK_AFTER_CLEAR_S)
        servers.append(FakeProcess(num_speculative_tokens=4, served_model_name="ext-fake", port=first.port).start())
        restarted.set()
        done.wait(180)   # the fake dies with the thread that started it (PR_SET_PDEATHSIG): live until the end

    helper = threading.Thread(target=someone_else, daemon=True)
    helper.start()
    try:
        code, rep = run(exp, out)
        assert restarted.is_set(), "the server was not restarted by the test"
        assert rep["stack"]["launcher"] == "external" and rep["stack"]["servers"] == {"spec": first.base_url}
        avail = rep["availability"]["servers"]["spec"]
        assert avail["unavailable_s"] > 1.0 and avail["intervals"], avail       # the outage, seen by the load
        rec = rep["recovery"]
        assert rec["time_to_healthy_s"] is not None and rec["time_to_healthy_s"] >= 1.0, rec   # and its end
        assert rec["time_to_first_success_s"] is not None, rec
        (fault,) = rep["faults"]
        assert fault["kind"] == "network" and fault["acted"], fault
        assert servers[-1].popen.poll() is None   # the harness stopped nothing it did not start
    finally:
        done.set()
        helper.join(30)
        for s in servers:
            s.stop()
    assert leaked_since(before, wait_s=10) == []

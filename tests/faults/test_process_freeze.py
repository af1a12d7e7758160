"""process-freeze against fake vLLM servers (tests/fakes) under the harness's own supervisor,
with real SIGSTOP/SIGCONT: a stopped engine or worker really stops the tokens while
``/health`` stays 200, as on vLLM. Evidence, clear, duty cycle, recover() after a crash,
pid-reuse safety, and a SIGKILL of the whole harness (the CLI, mid-freeze) followed by
``specchaos cleanup``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
from pydantic import ValidationError

from faults.ledger import Ledger
from faults.mechanisms.duty_cycle import process_state
from faults.process_freeze import ProcessFreeze, ProcessFreezeParams
from harness.stack.procs import same_process
from harness.errors import FaultError
from harness.stack.config import RestartPolicy
from harness.timeline import read_timeline
from tests.experiment.fast_e2e import ROOT, fast_experiment
from tests.fakes.launch import http_client
from tests.procs import wait_for

from .conftest import ServersStack, wait_until

pytestmark = pytest.mark.timeout(120)

NO_RESTART = RestartPolicy(max_restarts=0)
STOPPED = psutil.STATUS_STOPPED


class Stream(threading.Thread):
    """One long greedy streaming completion to a server; arrival time of every chunk."""

    def __init__(self, server, max_tokens: int = 1000):
        super().__init__(daemon=True)
        self.server, self.max_tokens = server, max_tokens
        self.arrivals: list[float] = []
        self.done = False
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with http_client(60) as c, c.stream("POST", f"{self.server.base_url}/v1/completions", json={
                    "model": self.server.model, "prompt": "a long one", "max_tokens": self.max_tokens,
                    "temperature": 0, "ignore_eos": True, "stream": True}) as r:
                for line in r.iter_lines():
                    if line == "data: [DONE]":
                        self.done = True
                    elif line:
                        self.arrivals.append(time.monotonic())
        except BaseException as exc:   # noqa: BLE001 - reported by the test
            self.error = exc

    def wait_chunks(self, n: int, timeout_s: float = 10) -> None:
        assert wait_until(lambda: len(self.arrivals) >= n, timeout_s), "the stream did not flow"


def health(server) -> int | None:
    try:
        with http_client(1) as c:
            return c.get(f"{server.base_url}/health").status_code
    except Exception:   # noqa: BLE001 - no answer
        return None


@pytest.fixture
def spec(fake_server):
    server = fake_server("spec", ["--step-delay-s", "0.02"], restart=NO_RESTART)
    server.start()
    server.wait_ready(30)
    return server


@pytest.mark.parametrize("role", ["engine", "worker"])
def test_freeze_stops_tokens_health_lies_and_clear_resumes(spec, make_injector, tmp_path, role):
    s = Stream(spec)
    s.start()
    s.wait_chunks(5)
    victim = spec.roles()[role][0]
    others = [p for r in ("api", "engine", "worker") if r != role for p in spec.roles()[r]]
    inj = make_injector(ServersStack(spec=spec))

    h = inj.inject("process-freeze", {"role": role})
    assert h.target == f"spec/{role}" and h.facts["pids"] == [victim.pid]
    assert h.facts["create_times"] == [victim.create_time()] and h.facts["role"] == role
    ev = inj.collect_evidence(h, timeout_s=20)
    assert ev.acted, ev.detail
    o = ev.observations
    assert o["stopped"] is True and o["states"] == {str(victim.pid): STOPPED}
    assert o["tokens_while_frozen"] == 0 and o["tokens_before"] > 0 and o["window_s"] >= 1.5
    assert o["requests_running"] >= 1 and "generation_tokens_total" in o["measured_by"]
    assert "0 output tokens" in ev.detail
    # still frozen after the evidence: no chunk, /health 200, the rest of the tree running
    n = len(s.arrivals)
    assert health(spec) == 200
    time.sleep(0.3)
    assert len(s.arrivals) == n and not s.done
    assert all(p.status() != STOPPED for p in others)

    inj.clear(h)
    assert victim.status() != STOPPED
    inj.clear(h)   # idempotent
    s.wait_chunks(n + 3)
    entry, = Ledger(tmp_path / "ledger.jsonl").entries()
    assert entry["state"] == "cleared" and entry["evidence"]["acted"] is True
    assert [e["event"] for e in read_timeline(tmp_path / "timeline.jsonl")] == [
        "fault_injected", "fault_evidence", "fault_cleared"]


def test_freeze_api_evidence_is_its_silence(spec, make_injector):
    api = spec.api_process()
    inj = make_injector(ServersStack(spec=spec))
    h = inj.inject("process-freeze", {"role": "api"})
    ev = inj.collect_evidence(h, timeout_s=20)
    assert ev.acted, ev.detail
    assert ev.observations["metrics_answered"] is False and "unanswered" in ev.observations["measured_by"]
    assert health(spec) is None
    inj.clear(h)
    assert api.status() != STOPPED and health(spec) == 200


def test_duty_cycle_alternates_and_clear_ends_it(spec, make_injector):
    s = Stream(spec)
    s.start()
    s.wait_chunks(3)
    engine = spec.roles()["engine"][0]
    inj = make_injector(ServersStack(spec=spec))
    h = inj.inject("process-freeze", {"role": "engine", "duty_cycle": 0.5, "period_s": 0.6})
    assert h.facts["duty_cycle"] == 0.5 and h.facts["period_s"] == 0.6
    ev = inj.collect_evidence(h, timeout_s=10)
    assert ev.acted, ev.detail
    assert ev.observations["tokens_while_frozen"] == 0 and 0.05 < ev.observations["window_s"] < 0.3
    samples, chunks_before = [], len(s.arrivals)
    t_end = time.monotonic() + 2.4            # four periods
    while time.monotonic() < t_end:
        samples.append(engine.status() == STOPPED)
        time.sleep(0.01)
    stopped = sum(samples) / len(samples)
    assert 0.3 < stopped < 0.7, stopped        # stopped about half of the time
    assert len(s.arrivals) > chunks_before     # tokens still flow in the running slices
    inj.clear(h)
    for _ in range(40):                         # the cycle is over: never stopped again
        assert engine.status() != STOPPED
        time.sleep(0.02)


def test_recover_after_a_crash_resumes_from_the_ledger(spec, make_injector, tmp_path):
    s = Stream(spec)
    s.start()
    s.wait_chunks(3)
    worker = spec.roles()["worker"][0]
    inj = make_injector(ServersStack(spec=spec))
    inj.inject("process-freeze", {"role": "worker", "duty_cycle": 0.9, "period_s": 5})
    assert wait_until(lambda: worker.status() == STOPPED, 2)
    # the harness "crashed": only the ledger is left, and the cleanup reverts from it
    ledger = Ledger(tmp_path / "ledger.jsonl")
    (entry,) = ledger.open_faults()
    ProcessFreeze.recover(entry)
    assert worker.status() != STOPPED
    n = len(s.arrivals)
    s.wait_chunks(n + 3)
    ProcessFreeze.recover(entry)   # idempotent
    inj.clear_all()


def test_recover_never_signals_a_reused_pid(started):
    p = started.popen(["sleep", "30"])
    proc = psutil.Process(p.pid)
    assert wait_until(lambda: proc.cmdline() == ["sleep", "30"], 5)
    os.kill(p.pid, signal.SIGSTOP)
    assert wait_until(lambda: proc.status() == STOPPED, 2)
    entry = {"facts": {"pids": [p.pid], "create_times": [proc.create_time() - 50], "cmdlines": [["sleep", "30"]]}}
    ProcessFreeze.recover(entry)          # another process now, as far as the ledger knows
    assert proc.status() == STOPPED
    entry["facts"]["create_times"] = [proc.create_time()]
    ProcessFreeze.recover(entry)
    assert proc.status() != STOPPED
    ProcessFreeze.recover({"facts": {}})   # a crash before the facts were written: nothing to do


def test_server_down_or_unknown(spec, make_injector, tmp_path):
    inj = make_injector(ServersStack(spec=spec))
    with pytest.raises(FaultError, match="no server 'ref'"):
        inj.inject("process-freeze", {"server": "ref"})
    spec.stop()
    with pytest.raises(FaultError) as ei:
        inj.inject("process-freeze", {})
    assert ei.value.message == "no engine process found in server spec (is it up?)"
    assert Ledger(tmp_path / "ledger.jsonl").open_faults() == []


@pytest.mark.parametrize("args, field", [
    ({"duty_cycle": 0}, "duty_cycle"), ({"duty_cycle": 1}, "duty_cycle"), ({"duty_cycle": 1.5}, "duty_cycle"),
    ({"duty_cycle": -0.2}, "duty_cycle"), ({"period_s": 0}, "period_s"), ({"period_s": -1}, "period_s"),
    ({"duty_cycle": 0.5, "period_s": 0.01}, "period_s"), ({"role": "drafter"}, "role"),
])
def test_bad_parameters_name_the_field(args, field):
    with pytest.raises(ValidationError) as ei:
        ProcessFreezeParams(**args)
    assert ei.value.errors()[0]["loc"] == (field,)


# ------------------------------------------------------------------ SIGKILL of the harness, then cleanup

@pytest.mark.parametrize("killed", ["harness", "harness-and-reaper"])
def test_sigkill_of_the_harness_mid_freeze_then_cleanup_leaves_nothing_stopped(tmp_path, killed):
    """The whole harness (``specchaos run`` on the fake stack) SIGKILLed while the engine is
    frozen. Its watchdog (:mod:`harness.stack.reaper`) then kills the servers' process
    groups, stopped members included; if the watchdog died too, the stopped engine lives
    on, stopped, as an orphan. Either way ``specchaos cleanup`` reverts the open freeze from
    the ledger (SIGCONT) and ends the registered processes: nothing stopped, nothing left."""
    state_dir = tmp_path / "state"
    env = dict(os.environ, PYTHONUNBUFFERED="1", SPECCHAOS_STATE_DIR=str(state_dir),
               SPECCHAOS_LAUNCHERS="fake=tests.fakes.stack:FakeStack")
    method = [{"type": "action", "name": "freeze-engine",
               "provider": {"type": "python", "module": "harness.experiment.actions", "func": "freeze_process",
                            "arguments": {"role": "engine", "duration_s": 120}}}]
    exp = fast_experiment(tmp_path, "frozen", method=method, integrity={"min_compared": 0},
                          stack={"reference": False})
    out = tmp_path / "out"
    harness = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", str(exp), "--out", str(out)], cwd=ROOT,
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ledger = Ledger(out / "ledger.jsonl")
        wait_for(lambda: any(e["state"] == "injected" for e in ledger.entries()), 90, "the freeze")
        (entry,) = ledger.entries()
        frozen = list(zip(entry["facts"]["pids"], entry["facts"]["create_times"]))
        assert all(process_state(pid, ct) == STOPPED for pid, ct in frozen)
        (state_file,) = (state_dir / "runs").glob("*.json")
        registered = [(r["pid"], r["create_time"]) for r in json.loads(state_file.read_text())["processes"]]
        if killed == "harness-and-reaper":
            for p in psutil.Process(harness.pid).children(recursive=True):
                if "harness.stack.reaper" in " ".join(p.cmdline()):
                    p.kill()
        harness.send_signal(signal.SIGKILL)
        harness.wait(10)
    finally:
        if harness.poll() is None:
            harness.kill()
    if killed == "harness":
        assert wait_until(lambda: not any(same_process(pid, ct) for pid, ct in frozen), 10), "the reaper left it"
    else:
        time.sleep(1.0)
        assert all(process_state(pid, ct) == STOPPED for pid, ct in frozen), "the frozen orphan is expected"
    assert [e["state"] for e in Ledger(out / "ledger.jsonl").entries()] == ["injected"]

    res = subprocess.run([sys.executable, "-m", "harness.cli", "cleanup"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "reverted 1 fault(s)" in res.stdout
    assert wait_until(lambda: not any(same_process(pid, ct) for pid, ct in frozen + registered), 5), \
        "cleanup left a process"
    assert Ledger(out / "ledger.jsonl").open_faults() == []
    assert not list((state_dir / "runs").glob("*.json"))

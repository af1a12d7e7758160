"""process-kill against fake vLLM servers (tests/fakes) under the harness's own supervisor,
with real signals: roles come from ``LocalServer.roles()``, restarts are supervised restarts."""

import signal
import time

import psutil
import pytest

from faults.ledger import Ledger
from harness.stack.procs import cmdline_of, send_signal_exact
from harness.errors import FaultError
from harness.stack.config import RestartPolicy
from harness.timeline import read_timeline

from .conftest import ServersStack, alive, wait_until

pytestmark = pytest.mark.timeout(90)

#: A server that is not restarted (the supervisor gives up at its first exit).
NO_RESTART = RestartPolicy(max_restarts=0)


def up(fake_server, *names, fake_args=(), restart=NO_RESTART):
    """Start the named FakeServers together and wait until each is ready."""
    servers = [fake_server(n, fake_args, restart=restart) for n in names]
    for s in servers:
        s.start()
    for s in servers:
        s.wait_ready(30)
    return servers


def test_kill_worker_kills_it_and_sees_the_restart(fake_server, make_injector, tmp_path):
    (spec,) = up(fake_server, "spec", restart=RestartPolicy(max_restarts=1, backoff_s=0.1, backoff_max_s=0.1))
    stack = ServersStack(spec=spec)
    victim = spec.roles()["worker"][0]
    vpid, vct = victim.pid, victim.create_time()
    engine = spec.roles()["engine"][0]
    inj = make_injector(stack)

    h = inj.inject("process-kill", {"server": "spec", "role": "worker", "signal": "SIGKILL"})
    assert h.target == "spec/worker"
    assert h.facts["pids"] == [vpid] and h.facts["signal"] == "SIGKILL"
    assert h.facts["create_times"] == [vct] and h.facts["cmdlines"] == [["VLLM::Worker"]]
    assert h.facts["incarnation_before"] == 0

    ev = inj.collect_evidence(h, timeout_s=30)
    assert ev.acted, ev.detail
    assert not alive(vpid, vct) and not alive(engine.pid, engine.create_time())
    o = ev.observations
    assert o["gone"] and 0 <= o["gone_after_s"] < 5 and o["still_running"] == []
    assert o["restart_seen_after_s"] is not None and o["restart_seen_after_s"] >= o["gone_after_s"]
    assert spec.incarnation == 1 and spec.roles()["worker"][0].pid != vpid
    assert "restarted server ready" in ev.detail

    inj.clear(h)
    inj.clear(h)  # idempotent
    (entry,) = Ledger(tmp_path / "ledger.jsonl").entries()
    assert entry["state"] == "cleared" and entry["facts"]["pids"] == [vpid] and entry["evidence"]["acted"]
    events = [(e["source"], e["event"]) for e in read_timeline(tmp_path / "timeline.jsonl")]
    assert events == [("fault", "fault_injected"), ("fault", "fault_evidence"), ("fault", "fault_cleared")]
    injected = read_timeline(tmp_path / "timeline.jsonl")[0]
    assert injected["fault_id"] == h.fault_id and injected["kind"] == "process-kill" and injected["pids"] == [vpid]
    (s,) = inj.summary()
    assert s["acted"] is True and s["cleared_at"] >= s["injected_at"] and s["target"] == "spec/worker"


def test_kill_engine_role_of_named_server(fake_server, make_injector):
    spec, ref = up(fake_server, "spec", "ref")
    inj = make_injector(ServersStack(spec=spec, ref=ref))
    eng = ref.roles()["engine"][0]
    h = inj.inject("process-kill", {"server": "ref", "role": "engine", "signal": "TERM", "expect_restart": False})
    ev = inj.collect_evidence(h, timeout_s=10)
    assert ev.acted and ev.observations["pids"] == [eng.pid] and "no restart expected" in ev.detail
    assert spec.roles()["worker"], "the other server is untouched"


def test_process_ignoring_sigterm_gives_no_evidence(fake_server, make_injector):
    (spec,) = up(fake_server, "spec", fake_args=["--ignore-sigterm", "worker"])
    w = spec.roles()["worker"][0]
    inj = make_injector(ServersStack(spec=spec))
    h = inj.inject("process-kill", {"signal": "SIGTERM", "expect_restart": False, "gone_timeout_s": 1})
    ev = inj.collect_evidence(h, timeout_s=10)
    assert ev.acted is False
    assert ev.observations["gone"] is False and ev.observations["still_running"] == [w.pid]
    assert "still running" in ev.detail
    assert alive(w.pid, w.create_time())
    assert inj.summary()[0]["acted"] is False


def test_expected_restart_that_never_comes_still_acted_and_says_so(fake_server, make_injector):
    (spec,) = up(fake_server, "spec")  # the supervisor gives up at the first exit
    inj = make_injector(ServersStack(spec=spec))
    h = inj.inject("process-kill", {"role": "worker"})
    ev = inj.collect_evidence(h, timeout_s=1.5)
    assert ev.observations["gone"] is True
    assert ev.acted is True and ev.observations["restart_ready_at"] is None   # the kill happened
    assert "NO restarted server" in ev.detail   # the recovery checks judge the rest


class _Stale:
    """A process handle as a stale cache would give it: same pid, other identity."""

    def __init__(self, proc, ct_shift=0.0, cmdline=None):
        self.pid, self._p, self._shift, self._cmd = proc.pid, proc, ct_shift, cmdline

    def create_time(self):
        return self._p.create_time() + self._shift

    def cmdline(self):
        return self._cmd if self._cmd is not None else self._p.cmdline()


class _StaleServer:
    def __init__(self, real, **stale):
        self.real, self.stale, self.incarnation = real, stale, 0

    def roles(self):
        r = self.real.roles()
        return {**r, "worker": [_Stale(p, **self.stale) for p in r["worker"]]}


@pytest.mark.parametrize("stale", [{"ct_shift": -50.0}, {"cmdline": ["python", "something-else.py"]}])
def test_pid_reuse_refuses_to_signal(fake_server, make_injector, tmp_path, stale):
    (real,) = up(fake_server, "spec")
    w = real.roles()["worker"][0]
    inj = make_injector(ServersStack(spec=_StaleServer(real, **stale)))
    with pytest.raises(FaultError, match="refusing to signal"):
        inj.inject("process-kill", {"expect_restart": False})
    assert alive(w.pid, w.create_time())
    (entry,) = Ledger(tmp_path / "ledger.jsonl").entries()
    assert entry["error"] and "refusing" in entry["error"]
    assert entry["injected_at"] is None and entry["state"] == "cleared"  # rolled back: nothing to revert


def test_send_signal_exact_checks_identity(started):
    p = started.popen(["sleep", "30"])
    proc = psutil.Process(p.pid)
    deadline = time.monotonic() + 5   # right after exec, /proc/PID/cmdline can still read empty
    while cmdline_of(proc) != ["sleep", "30"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert send_signal_exact(p.pid, proc.create_time() - 30, signal.SIGKILL) is False
    assert send_signal_exact(p.pid, proc.create_time(), signal.SIGKILL, ["sleep", "31"]) is False
    assert p.poll() is None
    assert send_signal_exact(p.pid, proc.create_time(), signal.SIGKILL, ["sleep", "30"]) is True
    assert p.wait(5) == -signal.SIGKILL
    assert send_signal_exact(p.pid, proc.create_time(), signal.SIGKILL) is False  # reaped: gone


def test_server_down_or_unknown(fake_server, make_injector, tmp_path):
    (spec,) = up(fake_server, "spec")
    inj = make_injector(ServersStack(spec=spec))
    spec.stop()
    with pytest.raises(FaultError) as ei:
        inj.inject("process-kill", {})
    assert ei.value.message == "no worker process found in server spec (is it up?)"
    with pytest.raises(FaultError) as ei:
        inj.inject("process-kill", {"server": "ref"})
    assert "no server 'ref'" in ei.value.message and "spec" in ei.value.hint
    led = Ledger(tmp_path / "ledger.jsonl")
    assert [e["state"] for e in led.entries()] == ["cleared", "cleared"] and led.open_faults() == []


def test_a_second_tree_is_not_touched(fake_server, fake_vllm, make_injector):
    (spec,) = up(fake_server, "spec")
    other = fake_vllm()  # same titles, not part of the stack
    ow = other.tree()
    assert len(ow) == 3
    inj = make_injector(ServersStack(spec=spec))
    h = inj.inject("process-kill", {"expect_restart": False})
    assert inj.collect_evidence(h, 10).acted
    assert wait_until(lambda: spec.api_process() is None)   # the spec server went down
    assert all(alive(p.pid, p.create_time()) for p in ow) and other.popen.poll() is None

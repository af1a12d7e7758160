"""Rollback after the worst crash, and after a SIGTERM, for every fault family: the whole harness
(``specchaos run`` on the fake stack, in its own process) is SIGKILLed — its watchdog
too — while the fault is active; ``specchaos cleanup`` then reverts the open fault from
the ledger and ends what the run registered. Afterwards nothing of the run is left: no
registered process, no open fault, no state file, and nothing the family itself made
(checked by the family's own probe over the ledger facts).

(``process-freeze`` has its own version of this test, with and without the watchdog, in
``test_process_freeze.py``; the cgroup families ``cpu-throttle`` and ``memory-limit``
theirs in ``test_cgroup.py`` / ``test_cpu_throttle.py`` / ``test_memory_limit.py``, which
also check the pids are back in their cgroups; the network families in
``test_network*.py``.) A family added to :data:`FAMILIES` is covered.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any, Callable

import psutil
import pytest

from faults.ledger import Ledger
from harness.stack.procs import same_process
from tests.experiment.fast_e2e import ROOT, fast_experiment
from tests.procs import wait_for

from .conftest import wait_until

pytestmark = pytest.mark.timeout(180)


def _hog_gone(facts: dict[str, Any]) -> bool:
    return not same_process(facts["pid"], facts["create_time"])


#: family → (the action, a probe over the injected facts: True when what the fault made is gone)
FAMILIES: dict[str, tuple[dict[str, Any], Callable[[dict[str, Any]], bool]]] = {
    "process-kill": ({"func": "kill_process", "arguments": {"role": "worker", "duration_s": 120}},
                     lambda facts: True),
    "memory-hog": ({"func": "hog_memory", "arguments": {"size_gib": 0.25, "duration_s": 120}}, _hog_gone),
    # pressure clients are threads of the harness: nothing of theirs can outlive it
    "kv-pressure": ({"func": "pressure_kv_cache", "arguments": {"concurrency": 2, "prompt_tokens": 64,
                                                                "duration_s": 120}}, lambda facts: True),
    # a restart with other speculative settings: the servers die with the harness, nothing else is made
    "draft-swap": ({"func": "swap_draft", "arguments": {"draft": "draft-noisy", "duration_s": 120}},
                   lambda facts: True),
}


def start_harness(tmp_path, family):
    """``specchaos run`` (fake stack, own process) of a fast experiment whose method is the
    family's action; returns (process, out dir, env) once the fault is injected."""
    action, _ = FAMILIES[family]
    state_dir = tmp_path / "state"
    env = dict(os.environ, PYTHONUNBUFFERED="1", SPECCHAOS_STATE_DIR=str(state_dir),
               SPECCHAOS_LAUNCHERS="fake=tests.fakes.stack:FakeStack")
    method = [{"type": "action", "name": f"inject-{family}",
               "provider": {"type": "python", "module": "harness.experiment.actions", **action}}]
    exp = fast_experiment(tmp_path, family, method=method, integrity={"min_compared": 0},
                          stack={"reference": False})
    out = tmp_path / "out"
    harness = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", str(exp), "--out", str(out)], cwd=ROOT,
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ledger = Ledger(out / "ledger.jsonl")
        wait_for(lambda: any(e["state"] == "injected" for e in ledger.entries()), 90, f"the {family} fault")
    except BaseException:
        harness.kill()
        raise
    return harness, out, env


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_sigkill_of_the_harness_mid_fault_then_cleanup_leaves_nothing(tmp_path, family):
    _, made_gone = FAMILIES[family]
    state_dir = tmp_path / "state"
    harness, out, env = start_harness(tmp_path, family)
    try:
        (entry,) = Ledger(out / "ledger.jsonl").entries()
        (state_file,) = (state_dir / "runs").glob("*.json")
        registered = [(r["pid"], r["create_time"]) for r in json.loads(state_file.read_text())["processes"]]
        assert registered
        for p in psutil.Process(harness.pid).children(recursive=True):   # the watchdog dies too: worst case
            try:
                if "harness.stack.reaper" in " ".join(p.cmdline()):
                    p.kill()
            except psutil.Error:   # a child that ended meanwhile (a zombie of a restarted server)
                pass
        harness.send_signal(signal.SIGKILL)
        harness.wait(10)
    finally:
        if harness.poll() is None:
            harness.kill()
    assert Ledger(out / "ledger.jsonl").open_faults(), "the fault must still be open after the crash"

    res = subprocess.run([sys.executable, "-m", "harness.cli", "cleanup"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "reverted 1 fault(s)" in res.stdout
    assert wait_until(lambda: not any(same_process(pid, ct) for pid, ct in registered), 5), "cleanup left a process"
    assert wait_until(lambda: made_gone(entry["facts"]), 5), f"what {family} made is still there"
    assert Ledger(out / "ledger.jsonl").open_faults() == []
    assert not list((state_dir / "runs").glob("*.json"))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_sigterm_mid_fault_rolls_the_fault_back(tmp_path, family):
    """SIGTERM (as from a scheduler stopping the job) while the fault acts: the harness
    itself clears the fault, stops everything, writes its partial report, exits 2."""
    _, made_gone = FAMILIES[family]
    harness, out, env = start_harness(tmp_path, family)
    try:
        (entry,) = Ledger(out / "ledger.jsonl").entries()
        state_file = next((tmp_path / "state" / "runs").glob("*.json"))
        registered = [(r["pid"], r["create_time"]) for r in json.loads(state_file.read_text())["processes"]]
        harness.send_signal(signal.SIGTERM)
        assert harness.wait(60) == 2
    finally:
        if harness.poll() is None:
            harness.kill()
    assert Ledger(out / "ledger.jsonl").open_faults() == []
    assert wait_until(lambda: made_gone(entry["facts"]), 5), f"what {family} made is still there"
    assert wait_until(lambda: not any(same_process(pid, ct) for pid, ct in registered), 10)
    rep = json.loads((out / "report.json").read_text())
    assert rep["verdict"] == "error" and rep["interrupted"] is True
    assert not list((tmp_path / "state" / "runs").glob("*.json"))

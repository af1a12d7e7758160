"""Interruptions through the real CLI, on the fast path (the fake vLLM under the real
supervisor, registered for the CLI process with ``$SPECCHAOS_LAUNCHERS``): SIGINT or
SIGTERM in the middle of a run tears everything down, writes the partial report, names
the signal and the phase, and the saved data re-judges to the same result."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.experiment.fast_e2e import ROOT, fast_experiment
from tests.procs import leaked_since, phase_started, sut_pids, wait_for

pytestmark = pytest.mark.timeout(180)

ENV = dict(os.environ, PYTHONUNBUFFERED="1", SPECCHAOS_LAUNCHERS="fake=tests.fakes.stack:FakeStack")


def cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "harness.cli", *args], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


# make test sends each signal once over these two tests (SIGINT here, SIGTERM below); the nightly tier both to both
@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.nightly)],
                         ids=["SIGINT", "SIGTERM"])
def test_signal_mid_run_tears_down_and_writes_partial_report(tmp_path, sig):
    out = tmp_path / "out"
    exp = fast_experiment(tmp_path, "interrupted", phases={"baseline_s": 60})
    before = sut_pids()
    proc = cli("run", str(exp), "--out", str(out))
    try:
        wait_for(lambda: phase_started(out, "baseline") and (out / "records.jsonl").exists(), 120, "the baseline")
        time.sleep(2)
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, output[-3000:]
    rep = json.loads((out / "report.json").read_text())
    assert rep["verdict"] == "error" and rep["interrupted"] is True
    assert rep["requests"]["total"] > 0, "partial results already measured must be written"
    assert rep["errors"][0] == f"interrupted by {sig.name} during the baseline phase", rep["errors"]
    assert leaked_since(before, wait_s=10) == []
    # Re-judging the saved data is idempotent: same verdict, same errors, every time.
    for _ in range(2):
        again = subprocess.run([sys.executable, "-m", "harness.cli", "report", str(out)], cwd=ROOT, env=ENV,
                               capture_output=True, text=True, timeout=120)
        assert again.returncode == 2, again.stderr
        assert f"report rewritten: {out / 'report.json'}" in again.stdout
        rep2 = json.loads((out / "report.json").read_text())
        assert (rep2["verdict"], rep2["errors"], rep2["experiment"]) == (rep["verdict"], rep["errors"], rep["experiment"])


@pytest.mark.parametrize("sig", [pytest.param(signal.SIGINT, marks=pytest.mark.nightly), signal.SIGTERM],
                         ids=["SIGINT", "SIGTERM"])
def test_a_signal_ends_overlapping_faults_at_once(tmp_path, sig):
    """A memory hog in the background (60 s) and a foreground freeze (60 s): a signal 2 s
    into the fault phase must end both faults and the run within seconds, not when the
    background fault's duration runs out."""
    from faults.ledger import Ledger
    from harness.stack.procs import same_process

    method = [
        {"type": "action", "name": "hog", "background": True,
         "provider": {"type": "python", "module": "harness.experiment.actions", "func": "hog_memory",
                      "arguments": {"size_gib": 0.2, "duration_s": 60}}},
        {"type": "action", "name": "freeze",
         "provider": {"type": "python", "module": "harness.experiment.actions", "func": "freeze_process",
                      "arguments": {"role": "engine", "duty_cycle": 0.5, "period_s": 1, "duration_s": 60}}},
    ]
    out = tmp_path / "out"
    exp = fast_experiment(tmp_path, "overlap", method=method, stack={"reference": False},
                          integrity={"min_compared": 0})
    before = sut_pids()
    proc = cli("run", str(exp), "--out", str(out))
    try:
        ledger = Ledger(out / "ledger.jsonl")
        wait_for(lambda: sum(e["state"] == "injected" for e in ledger.entries()) == 2, 90, "both faults")
        time.sleep(2)
        hog = next(e for e in ledger.entries() if e["kind"] == "memory-hog")["facts"]
        t0 = time.monotonic()
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, output[-3000:]
    assert took < 20, f"the run took {took:.0f} s to end after {sig.name}"
    assert Ledger(out / "ledger.jsonl").open_faults() == []
    assert not same_process(hog["pid"], hog["create_time"])
    assert leaked_since(before, wait_s=10) == []


def test_a_malformed_launcher_variable_is_one_line_and_exit_2(tmp_path):
    exp = fast_experiment(tmp_path, "bad-env")
    env = dict(ENV, SPECCHAOS_LAUNCHERS="fake")
    res = subprocess.run([sys.executable, "-m", "harness.cli", "validate", str(exp)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == ["specchaos: error: $SPECCHAOS_LAUNCHERS: malformed entry 'fake' "
                                               "(use name=module:attribute, comma-separated)"]

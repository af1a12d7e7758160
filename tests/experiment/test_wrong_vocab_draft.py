"""A draft whose vocabulary is not the target's (``draft-wrongvocab``) on real vLLM: the
run ends in vLLM's startup refusal, its reason in report.json and on stderr; exit 2,
nothing left running, never a hang and never a crash later."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from harness.stack.vllm import vllm_distribution
from tests.experiment.files import ROOT, experiment_doc, write
from tests.procs import sut_pids

pytestmark = [pytest.mark.stack, pytest.mark.nightly, pytest.mark.own_stack, pytest.mark.timeout(600)]

VLLM_REASON = "Target and draft model should have the same vocabulary size"


def test_a_wrong_vocabulary_draft_is_refused_at_start_with_vllms_reason(tmp_path, models_built):
    if vllm_distribution() is None:
        pytest.skip("vLLM is not installed")
    d = experiment_doc("kill-draft-worker.yaml")
    d["configuration"]["specchaos"]["stack"]["draft"] = "draft-wrongvocab"
    out = tmp_path / "out"
    before = sut_pids()
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "harness.cli", "run", str(write(tmp_path, d)), "--out", str(out)],
                         cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"), capture_output=True, text=True,
                         timeout=540)
    took = time.monotonic() - t0
    report = json.loads((out / "report.json").read_text())
    print(f"\n[measure] draft-wrongvocab refused, run ended after {took:.1f} s: {report['errors']}")
    assert res.returncode == 2, (res.returncode, res.stdout[-3000:], res.stderr[-3000:])
    assert report["verdict"] == "error"
    assert any(VLLM_REASON in e and "vocab_size=1024" in e and "exited during startup" in e
               for e in report["errors"]), report["errors"]
    assert not any("pydantic.dev" in e for e in report["errors"])
    assert report["requests"]["total"] == 0
    assert sut_pids() - before == set(), "a refused start must leave nothing running"

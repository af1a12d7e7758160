"""The default experiment with the noisy draft (acceptance ~0) fails on the acceptance
floor, end to end on the real stack: outputs stay identical to the reference, only the
draft stopped helping, and the floor is what catches it. (The same floor passes the
default experiment's exact draft: tests/experiment/test_run_e2e.py.)"""

from __future__ import annotations

import pytest

from harness.metrics.speculation import SpeculationSeries, acceptance, read_series, server_lines
from tests.experiment.files import experiment_doc, run_cli, write

# A stack of its own (the noisy draft): nightly; the floor's defect tests on recorded data run
# in make test (tests/checks/test_acceptance_floor.py).
pytestmark = [pytest.mark.stack, pytest.mark.nightly, pytest.mark.own_stack]

def test_default_experiment_with_the_noisy_draft_fails_on_the_floor(tmp_path):
    d = experiment_doc("kill-draft-worker.yaml")
    spec = d["configuration"]["specchaos"]
    spec["stack"]["draft"] = "draft-noisy"
    spec["phases"].update(warmup_s=1, baseline_s=6, after_s=6)
    proc, rep = run_cli(write(tmp_path, d), tmp_path / "out")
    floor = [c for c in rep["checks"] if c["name"].startswith("acceptance_floor.")]
    others = [c["name"] for c in rep["checks"] if c["passed"] is False and not c["name"].startswith("acceptance_floor.")]
    print("failed besides the floor:", others)
    assert {c["name"].split(".")[1] for c in floor} == {"baseline", "after"}, floor
    assert floor and all(c["passed"] is False for c in floor), floor
    assert all(c["observed"] < 0.1 for c in floor), floor
    assert rep["verdict"] == "fail" and proc.returncode == 1, (rep["verdict"], rep.get("errors"))
    assert rep["integrity"]["mismatched"] == 0   # the draft is bad, the outputs are not
    # The client-side figure agrees with the server's own counters over the whole run (the
    # scraper's metrics.jsonl; absolute 0.10 on a rate near 0, as the cross-check with ngram).
    series = SpeculationSeries(server_lines(read_series(tmp_path / "out" / "metrics.jsonl"), "spec"))
    server = acceptance(series, float("-inf"), float("inf"))["acceptance_rate"]
    client = rep["acceptance_floor"]["total"]["acceptance_rate"]
    print(f"noisy draft over the run: client-side acceptance rate {client:.4f}, server {server}")
    assert server is not None and abs(client - server) <= 0.10

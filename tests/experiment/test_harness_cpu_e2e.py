"""report.json's ``harness_cpu``: the load process's and the controller's CPU while the load
ran, measured on a whole experiment run on the fake vLLM (the session's hook)."""

from __future__ import annotations

import json

import pytest

from harness.load.records import read_records
from tests.experiment.fast_e2e import run_fast

pytestmark = pytest.mark.timeout(180)


def test_report_carries_the_harness_cpu_use(tmp_path):
    code, rep, _, out = run_fast(tmp_path)
    assert code == 0, rep["errors"]
    cpu = rep["harness_cpu"]
    load = sum(1 for r in read_records(out / "records.jsonl") if r.source == "load")
    assert cpu["requests"] == load > 0
    assert cpu["locust_cpu_s"] > 0 and cpu["controller_cpu_s"] > 0
    # the window is the load's life: at least FAST's warm-up, baseline and after phases (1 + 4 + 4 s)
    assert cpu["wall_s"] >= 9
    assert cpu["percent_of_core"] == pytest.approx(
        (cpu["locust_cpu_s"] + cpu["controller_cpu_s"]) / cpu["wall_s"] * 100, abs=0.05)
    assert 0 < cpu["percent_of_core"] < 200
    assert json.loads((out / "run.json").read_text())["harness_cpu"] == cpu   # re-judging keeps it

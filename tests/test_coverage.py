"""The real-stack coverage line (tests/coverage.py) over hand-written ledgers: a fault counts
only when it acted (evidence) against a real vLLM (the ledger's system), and a missing
family is reported."""

from __future__ import annotations

import json

from faults.base import Evidence
from faults.inject import system_of
from faults.ledger import Ledger
from tests.coverage import coverage_line, families_acted, ledgers_under, real_vllm

REAL = {"launcher": "local", "vllm_version": "0.32.0"}


def write(path, faults):
    """faults: (kind, system, acted or None for no evidence)."""
    led = Ledger(path)
    for kind, system, acted in faults:
        fid = led.intend(kind, "spec", {}, system=system)
        led.injected(fid, {})
        if acted is not None:
            led.evidence(fid, Evidence(acted=acted, observations={}, detail=""))
        led.cleared(fid)
    return path


def test_only_faults_that_acted_against_a_real_vllm_count(tmp_path):
    a = write(tmp_path / "a" / "ledger.jsonl", [("process-kill", REAL, True), ("process-freeze", REAL, False),
                                                 ("network", {"launcher": "fake", "vllm_version": "0.32.0"}, True),
                                                 ("memory-hog", REAL, None)])
    b = write(tmp_path / "b" / "c" / "ledger.jsonl", [("process-kill", REAL, True), ("client-abort", {}, True)])
    (tmp_path / "b" / "ledger.jsonl").write_text('{"event": "intended", "fault_id": "x", "kind": "network", '
                                                 f'"system": {json.dumps(REAL)}}}\n{{not json\n')
    found = ledgers_under(tmp_path, tmp_path / "missing", None)
    assert found == sorted([a.resolve(), b.resolve(), (tmp_path / "b" / "ledger.jsonl").resolve()])
    acted = families_acted(found)
    assert dict(acted) == {"process-kill": 2}
    line, missing = coverage_line(acted, ["process-kill", "process-freeze", "network"])
    assert line == "real-stack coverage: process-kill"
    assert missing == ["network", "process-freeze"]
    assert coverage_line(acted, ["network"]) == ("real-stack coverage: (none)", ["network"])


def test_what_counts_as_a_real_vllm():
    assert real_vllm(REAL)
    for system in ({}, None, {"launcher": "local"}, {"launcher": "fake-mismatch", "vllm_version": "0.32.0"},
                   {"launcher": "local", "vllm_version": "fake"}, {"launcher": "stub", "vllm_version": "1"}):
        assert not real_vllm(system), system


def test_the_injector_records_the_stack_it_targets():
    class Stack:
        launcher, vllm_version = "local", "0.32.0"

    assert system_of(Stack()) == REAL and system_of(None) == {}
    assert system_of(type("S", (), {"launcher": "docker"})()) == {"launcher": "docker"}


def test_families_for_gpu_hosts_are_named_apart_on_a_host_without_one(monkeypatch):
    from faults.cuda_error import CudaError
    from faults.process_kill import ProcessKill
    from tests.coverage import gpu_only_families
    from tests.fakes.fake_nvml import install

    install(monkeypatch, {"gpus": [], "init_error": "library_not_found"})
    assert gpu_only_families({"cuda-error": CudaError, "process-kill": ProcessKill}) == {
        "cuda-error": "no NVIDIA GPU on this host (NVML: NVML Shared Library Not Found)"}
    from faults.registry import REGISTRY
    assert set(gpu_only_families(REGISTRY)) == {"cuda-error"}   # every other family is covered here
    install(monkeypatch, {"gpus": [{}]})   # a GPU: the family is covered like any other (here it lacks libcuda)
    assert "cuda-error" not in gpu_only_families({"cuda-error": CudaError})

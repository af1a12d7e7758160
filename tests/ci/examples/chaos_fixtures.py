"""A hand-written chaos test with the plugin's fixtures (``specchaos_stack``,
``specchaos_load``, ``specchaos_fault``). Not collected by the test suite (the name does not
match ``test_*.py``): tests/ci/test_gate.py runs it through ci/gate.sh beside the fixture
experiments, on the stack they share (same stack block as short-freeze.yaml)."""

from __future__ import annotations

import time

import pytest
import yaml

from harness.load.records import is_complete
from harness.stack.config import StackConfig
from tests.ci.helpers import SHORT


@pytest.fixture
def specchaos_stack_config() -> StackConfig:
    """The stack of tests/ci/experiments/short-freeze.yaml, so the pool shares it."""
    return StackConfig(**yaml.safe_load(SHORT.read_text())["configuration"]["specchaos"]["stack"])


@pytest.mark.gate
@pytest.mark.chaos
def test_a_frozen_engine_produces_nothing_and_every_request_completes(specchaos_stack, specchaos_load,
                                                                      specchaos_fault):
    specchaos_load.start(users=2, max_tokens=16, seed=3)
    time.sleep(3)
    handle = specchaos_fault("process-freeze", server="spec", role="engine")
    evidence = specchaos_fault.evidence(handle, timeout_s=20)
    specchaos_fault.clear(handle)
    time.sleep(3)
    records = specchaos_load.stop()
    assert evidence.acted, evidence.detail
    assert records, "the load recorded nothing"
    incomplete = [(r.request_id, why) for r in records for ok, why in [is_complete(r)] if not ok]
    assert not incomplete, incomplete[:3]

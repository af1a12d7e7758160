"""``chaos discover`` (Chaos Toolkit's own command) on the installed package lists each
fault family's typed action with its arguments, plus the phase actions and the probes."""

from __future__ import annotations

import inspect
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from faults.registry import REGISTRY

CHAOS = Path(shutil.which("chaos") or Path(__file__).resolve().parents[1] / ".venv" / "bin" / "chaos")


@pytest.fixture(scope="module")
def discovery(tmp_path_factory) -> dict:
    if not CHAOS.exists():
        pytest.skip("the chaos command (chaostoolkit) is not installed")
    d = tmp_path_factory.mktemp("discover")
    res = subprocess.run([str(CHAOS), "discover", "specchaos", "--no-install", "--no-system-info"],
                         cwd=d, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert (d / "discovery.json").exists(), res.stdout + res.stderr
    return json.loads((d / "discovery.json").read_text())


def test_each_fault_family_has_a_typed_action(discovery):
    acts = {a["name"]: a for a in discovery["activities"] if a["type"] == "action"}
    for kind, cls in REGISTRY.items():
        assert cls.activity in acts, f"{kind}: action {cls.activity} not discovered"
        act = acts[cls.activity]
        assert act["mod"] == "harness.experiment.actions"
        args = [a["name"] for a in act["arguments"]]
        assert args[: len(cls.Params.model_fields)] == list(cls.Params.model_fields), (kind, args)
        assert args[-2:] == ["duration_s", "evidence_timeout_s"]
        for a in act["arguments"]:
            field = cls.Params.model_fields.get(a["name"])
            if field is not None and not field.is_required():
                assert a["default"] == field.get_default(call_default_factory=True)


def test_phase_actions_and_probes_are_listed(discovery):
    names = {(a["type"], a["name"]) for a in discovery["activities"]}
    assert {("action", "await_recovery"), ("action", "hold_phase"), ("action", "clear_faults"),
            ("action", "inject_fault"), ("probe", "server_health"), ("probe", "generation_succeeds"),
            ("probe", "within_slo")} <= names
    assert discovery["extension"]["name"] == "specchaos"


def test_typed_action_signature_matches_the_parameter_model():
    from harness.experiment import actions

    for cls in REGISTRY.values():
        sig = inspect.signature(getattr(actions, cls.activity))
        for name, field in cls.Params.model_fields.items():
            p = sig.parameters[name]
            assert p.annotation == field.annotation
            if not field.is_required():
                assert p.default == field.get_default(call_default_factory=True)

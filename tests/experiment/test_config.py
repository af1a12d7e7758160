"""The configuration: each layer's block validates on its own, the experiment config only
composes them and adds the rules that span blocks; renamed fields keep old files working."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from harness.checks.config import RecoveryConfig, SloConfig
from harness.errors import ExperimentError
from harness.experiment.config import SpecchaosConfig, parse_config
from harness.load.config import LoadConfig
from harness.stack.config import StackConfig, needs_draft
from harness.stack.launchers import register_launcher, LAUNCHERS


def test_blocks_belong_to_their_layers():
    cfg = SpecchaosConfig()
    assert type(cfg.stack) is StackConfig and type(cfg.load) is LoadConfig
    assert type(cfg.slo) is SloConfig and type(cfg.recovery) is RecoveryConfig


@pytest.mark.parametrize("method,needs", [("draft_model", True), ("eagle", True), ("eagle3", True),
                                          ("ngram", False), ("mtp", False)])
def test_one_draft_rule(method, needs):
    assert needs_draft(method) is needs
    if needs:
        with pytest.raises(ValidationError, match=f"method {method} needs a draft model"):
            StackConfig(method=method, draft=None)
    else:
        assert StackConfig(method=method, draft=None).draft is None


def test_unknown_launcher_is_refused_and_a_registered_one_accepted():
    with pytest.raises(ValidationError, match="unknown launcher 'kubernetes'"):
        StackConfig(launcher="kubernetes")
    register_launcher("docker-test", "harness.stack.local:LocalStack")
    register_launcher("ghost-test", "nowhere:Nothing")
    try:
        assert StackConfig(launcher="docker-test").launcher == "docker-test"
        with pytest.raises(ValidationError, match="cannot be loaded from 'nowhere:Nothing'"):
            StackConfig(launcher="ghost-test")   # validation loads it: run cannot fail later
        # Re-judging saved data starts nothing, so a launcher unknown here is fine there.
        assert StackConfig.model_validate({"launcher": "gone"}, context={"recorded": True}).launcher == "gone"
    finally:
        LAUNCHERS.pop("docker-test")
        LAUNCHERS.pop("ghost-test")


@pytest.mark.parametrize("args", [["--host", "0.0.0.0"], ["--port=9999"], ["--model", "/x"],
                                  ["--speculative-config", "{}"], ["--served-model-name", "y"]])
def test_extra_args_cannot_override_what_the_harness_sets(args):
    with pytest.raises(ValidationError, match="set by the harness"):
        StackConfig(extra_args=["--max-num-batched-tokens", "512", *args])


def test_extra_args_that_the_harness_does_not_set_pass():
    assert StackConfig(extra_args=["--max-num-batched-tokens", "512"]).extra_args[0] == "--max-num-batched-tokens"


def test_dtype_is_one_of_vllms():
    with pytest.raises(ValidationError):
        StackConfig(dtype="float33")


def test_non_loopback_host_is_refused():
    with pytest.raises(ValidationError, match="loopback"):
        StackConfig(host="10.0.0.1")


def test_recovery_factor_accepts_its_former_name():
    assert RecoveryConfig.model_validate({"slo_tolerance": 3.0}).baseline_p95_factor == 3.0
    assert RecoveryConfig.model_validate({"baseline_p95_factor": 4.0}).baseline_p95_factor == 4.0
    dumped = RecoveryConfig(baseline_p95_factor=5.0).model_dump()
    assert dumped["baseline_p95_factor"] == 5.0 and "slo_tolerance" not in dumped


def test_goodput_has_its_own_limits():
    slo = SloConfig.model_validate({"goodput": {"ttft_s": 0.5}})
    assert slo.goodput.enabled and slo.goodput.ttft_s == 0.5 and slo.goodput.e2e_s is None
    assert not SloConfig().goodput.enabled
    with pytest.raises(ValidationError):
        SloConfig.model_validate({"goodput": {"ttft_ms": 500}})


def test_cross_block_rule_lives_in_the_composition():
    with pytest.raises(ExperimentError, match="needs the reference server"):
        parse_config({"stack": {"reference": False}, "integrity": {"min_compared": 5}})
    assert parse_config({"stack": {"reference": False}, "integrity": {"min_compared": 0}}).stack.reference is False


def test_errors_name_the_field_path():
    with pytest.raises(ExperimentError) as ei:
        parse_config({"load": {"users": 0}}, where="x.yaml: configuration.specchaos")
    assert ei.value.where == "x.yaml: configuration.specchaos.load.users"

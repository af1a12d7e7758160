"""The ``metrics`` block (``min_samples``, ``itl_group_gap_s``) and the unavailability limit:
defaults, and bad values as one line naming the field, exit 2."""

from __future__ import annotations

import pytest

from harness.errors import ExperimentError
from harness.experiment.config import parse_config
from tests.experiment.test_bad_input import assert_one_line_error, cli, doc
from tests.experiment.files import write


def test_defaults():
    cfg = parse_config({})
    assert cfg.metrics.min_samples == 10 and cfg.metrics.itl_group_gap_s == 0.001
    assert cfg.degradation.max_unavailable_s is None
    cfg = parse_config({"metrics": {"min_samples": 3, "itl_group_gap_s": 0}, "degradation": {"max_unavailable_s": 45}})
    assert cfg.metrics.min_samples == 3 and cfg.metrics.itl_group_gap_s == 0
    assert cfg.degradation.max_unavailable_s == 45


@pytest.mark.parametrize("block,field,value", [
    ("metrics", "min_samples", 0),
    ("metrics", "itl_group_gap_s", -0.001),
    ("metrics", "min_sample", 5),
    ("degradation", "max_unavailable_s", 0),
])
def test_bad_values_name_the_field(block, field, value):
    with pytest.raises(ExperimentError) as exc:
        parse_config({block: {field: value}})
    assert f"configuration.specchaos.{block}.{field}" in exc.value.one_line()


def test_bad_value_on_the_command_line_is_one_line_exit_2(tmp_path):
    d = doc()
    d["configuration"]["specchaos"]["metrics"] = {"min_samples": 0}
    res = cli("validate", str(write(tmp_path, d)))
    assert_one_line_error(res, "configuration.specchaos.metrics.min_samples")

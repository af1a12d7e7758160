"""A bad acceptance floor is one clear line naming the field, exit 2, nothing started."""

from __future__ import annotations

import pytest

from tests.experiment.files import write
from tests.experiment.test_bad_input import assert_one_line_error, cli, doc, no_new_processes  # noqa: F401


@pytest.mark.parametrize("block, needles", [
    ({"floor": 1.5}, ("configuration.specchaos.acceptance_floor.floor", "less than or equal to 1")),
    ({"floor": -0.1}, ("configuration.specchaos.acceptance_floor.floor", "greater than or equal to 0")),
    ({"buckets": {"long": 2}}, ("configuration.specchaos.acceptance_floor.buckets.long", "less than or equal to 1")),
    ({"sampling": {"greedy": 0.5}}, ("configuration.specchaos.acceptance_floor.sampling", "sampled classes only")),
    ({"phases": ["warmup"]}, ("configuration.specchaos.acceptance_floor.phases.0",)),
])
def test_a_bad_floor_is_one_line_exit_2_nothing_started(tmp_path, no_new_processes, models_built, block, needles):
    d = doc()
    d["configuration"]["specchaos"]["acceptance_floor"] = block
    res = cli("run", str(write(tmp_path, d)), "--out", str(tmp_path / "out"))
    assert_one_line_error(res, *needles)
    assert not (tmp_path / "out" / "records.jsonl").exists()

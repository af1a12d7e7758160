"""``specchaos run --repeat N`` and ``specchaos compare A B`` end to end on the fake vLLM
(real supervisor, real locust): repeats share one stack and land in OUT/repeat-<i>; a
candidate whose engine steps are three times slower (two repeats a side) is a regression
with confidence (exit 1) once the launcher it changes is allowed to differ, and refused
(exit 2, naming ``stack.launcher``) before; a side compared with itself is not a
regression (exit 0), one run against one is no verdict (exit 0); bad input is one line
(exit 2)."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest

from harness.stack.launchers import register_launcher
from tests.experiment.fast_e2e import fast_experiment
from tests.experiment.test_bad_input import assert_one_line_error, cli
from tests.fakes.stack import FakeStack

pytestmark = pytest.mark.timeout(300)


class SlowFakeStack(FakeStack):
    """The speculative server with 90 ms engine steps (the fake's default is 30 ms)."""

    launcher = "fake-slow-steps"
    fake_args: ClassVar[dict[str, list[str]]] = {"spec": ["--step-delay-s", "0.09"]}


@pytest.fixture(scope="module")
def sides(tmp_path_factory):
    """Base: two repeats on the fake (one stack); candidate: two repeats with slow steps."""
    register_launcher(SlowFakeStack.launcher, SlowFakeStack)
    tmp = tmp_path_factory.mktemp("compare")
    base = fast_experiment(tmp, "base")
    res = cli("run", str(base), "--out", str(tmp / "A"), "--repeat", "2", "--no-progress")
    assert res.returncode in (0, 1), res.stdout[-3000:] + res.stderr[-3000:]
    slow = fast_experiment(tmp, "slow", stack={"launcher": SlowFakeStack.launcher})
    res_b = cli("run", str(slow), "--out", str(tmp / "B"), "--repeat", "2", "--no-progress")
    assert res_b.returncode in (0, 1), res_b.stdout[-3000:] + res_b.stderr[-3000:]
    return tmp, res


def test_repeats_land_in_their_own_directories_on_one_stack(sides):
    tmp, res = sides
    assert [p.name for p in sorted((tmp / "A").glob("repeat-*"))] == ["repeat-1", "repeat-2"]
    assert all((tmp / "A" / f"repeat-{i}" / "report.json").is_file() for i in (1, 2))
    assert "repeat 2/2" in res.stdout and "stacks started 1, reused 1" in res.stdout


def test_slower_steps_are_a_regression_with_confidence(sides):
    tmp, _ = sides
    refused = cli("compare", str(tmp / "A"), str(tmp / "B"))
    assert refused.returncode == 2 and "stack.launcher: A \"fake\", B \"fake-slow-steps\"" in refused.stderr
    res = cli("compare", str(tmp / "A"), str(tmp / "B"), "--json", str(tmp / "cmp.json"),
              "--allure-dir", str(tmp / "allure"), "--resamples", "200", "--allow-different-in", "stack.launcher")
    assert res.returncode == 1, res.stdout[-4000:] + res.stderr
    result = json.loads((tmp / "cmp.json").read_text())
    tpot = next(r for r in result["rows"] if (r["phase"], r["bucket"], r["figure"]) == ("baseline", "all", "tpot_s p50"))
    assert tpot["verdict"] == "regression" and tpot["change"] > 1.0 and tpot["low"] > 0.1, tpot
    assert tpot["runs_a"] == 2 and tpot["runs_b"] == 2 and tpot["p_regression_adj"] <= 0.05
    assert "REGRESSION" in res.stdout
    (allure,) = (tmp / "allure").glob("*-result.json")
    assert json.loads(allure.read_text())["status"] == "failed"


def test_a_side_compared_with_itself_has_no_regression(sides):
    tmp, _ = sides
    res = cli("compare", str(tmp / "A"), str(tmp / "A"), "--resamples", "50")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr
    assert "no regression with confidence" in res.stdout


def test_one_repeat_against_another_is_no_verdict(sides):
    tmp, _ = sides
    res = cli("compare", str(tmp / "A" / "repeat-1"), str(tmp / "A" / "repeat-2"), "--resamples", "50")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr
    assert "no verdict" in res.stdout


@pytest.mark.parametrize("args, needles", [
    (["nowhere-a", "nowhere-b"], ["nowhere-a", "no such run directory"]),
    (["{A}", "{A}", "--tolerance", "latency=x"], ["--tolerance", "latency must be a number"]),
    (["{A}", "{A}", "--tolerance", "speed=0.1"], ["unknown tolerance 'speed'"]),
    (["{A}", "{A}", "--confidence", "1.5"], ["--confidence", "must be in (0, 1)"]),
])
def test_bad_input_is_one_line(tmp_path, args, needles):
    (tmp_path / "A").mkdir()
    (tmp_path / "A" / "report.json").write_text("{}")
    (tmp_path / "A" / "config.json").write_text("{}")
    res = cli("compare", *(a.replace("{A}", str(tmp_path / "A")) for a in args), cwd=tmp_path)
    assert_one_line_error(res, *needles)

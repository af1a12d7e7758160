"""``specchaos sweep`` end to end on the fake vLLM (real supervisor, real locust): a 2×2
matrix (k × concurrency) in A/B block mode runs four cells on two started stacks, each cell
two blocks of the speculative and the plain server alone, writes policy.json, the table and
a plot; a rerun with the same --out resumes (finished runs kept, a crashed one run again);
bad sweep files are one line, exit 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from harness.experiment.sweep import RESULT_FILE, plan_sweep, run_sweep
from harness.metrics.policy import FIGURES
from tests.experiment.fast_e2e import FAST, MODELS, ROOT, _merge
from tests.experiment.test_bad_input import assert_one_line_error, cli
from tests.fakes.stack import QuickFakeStack, register_fake_launchers

pytestmark = pytest.mark.timeout(300)


def write_base(tmp: Path) -> Path:
    """The soak experiment (a sustained load, no fault) with the fast path's settings on the
    fake with 10 ms engine steps (enough requests per cell in short phases), short phases and
    two sampling classes."""
    register_fake_launchers()
    doc = yaml.safe_load((ROOT / "experiments" / "soak.yaml").read_text())
    spec = _merge(doc["configuration"]["specchaos"], FAST)
    spec["stack"]["models_dir"] = str(MODELS)
    spec["stack"]["launcher"] = QuickFakeStack.launcher
    spec["phases"] = {"warmup_s": 0.5, "baseline_s": 1.5, "after_s": 1.5}
    spec["load"]["sampling"] = [{"name": "greedy"}, {"name": "sampled", "temperature": 0.7, "top_p": 0.9}]
    doc["configuration"]["specchaos"] = spec
    path = tmp / "base.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def write_sweep(tmp: Path, **matrix) -> Path:
    write_base(tmp)
    m = {"speculators": [{"name": "exact", "draft": "draft-exact"}], "k": [2, 4], "concurrency": [1, 2],
         "buckets": ["short"], "sampling": ["greedy"], **matrix}
    path = tmp / "sweep.yaml"
    path.write_text(yaml.safe_dump({"title": "tiny sweep", "base": "base.yaml", "matrix": m, "blocks": 2,
                                    "policy": {"resamples": 200}}))
    return path


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweep")
    sweep = write_sweep(tmp, k=[4])   # one stack: a second k's stack start is the sweep's other cost, not its logic
    res = cli("sweep", str(sweep), "--out", str(tmp / "out"), "--no-progress")
    return tmp, res


def test_a_two_level_sweep_writes_its_policy_on_one_reused_stack(swept, models_built):
    """The fake's speculative server emits k + 1 tokens per step for greedy requests at
    the plain server's step time: the blocks recover a TPOT speedup near the bound, every
    cell plausible, its draft cost measured."""
    tmp, res = swept
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    pol = json.loads((tmp / "out" / "policy.json").read_text())
    # 2 runs x 2 blocks x 2 sides = 8 experiment runs on one started stack
    assert pol["sweep"]["stack_starts"] == 1 and pol["sweep"]["stack_reuses"] == 7, pol["sweep"]
    assert pol["sweep"]["ran"] == 2 and pol["missing"] == []
    assert sorted(c["id"] for c in pol["cells"]) == ["exact-k4-c1-short-greedy", "exact-k4-c2-short-greedy"]
    for c in pol["cells"]:
        assert c["pairing"] == "blocks" and c["blocks"] == 2
        assert c["complete"]["spec"] >= 10 and c["complete"]["plain"] >= 10, c["complete"]
        assert {"throughput", "tpot_p50", "itl_p50", "ttft_p50", "goodput"} <= set(c["speedup"])
        t = c["speedup"]["throughput"]
        assert t["low"] <= t["speedup"] <= t["high"] and len(t["blocks"]) == 2 and t["spread"] is not None
        assert c["speedup"]["tpot_p50"]["speedup"] > 1.5   # the fake: k+1 tokens per step for greedy requests
        assert c["acceptance_rate"] == pytest.approx(1.0)
        assert c["draft_cost"]["measured"] is True
        assert c["plausibility"]["state"] == "plausible", c["plausibility"]
        assert c["verdict"] == "gain", c["reason"]
    run = json.loads((tmp / "out" / "runs" / "exact-k4-c1-short-greedy" / RESULT_FILE).read_text())
    assert sorted(run["blocks"]) == ["1-plain", "1-spec", "2-plain", "2-spec"]
    p = pol["policy"]
    assert p["enabled"] and p["speculator"] == "exact" and p["method"] == "draft_model"
    assert p["enable"]["min_prompt_tokens"] == 16 and p["enable"]["max_concurrency"] == 2
    assert [(r["bucket"], r["k"]) for r in p["k_by_bucket"]] == [("short", 4)]
    assert p["k_by_bucket"][0]["rests_on"] and set(p["k_by_bucket"][0]["rests_on"]) <= {c["id"] for c in pol["cells"]}
    assert {b["figure"] for b in pol["break_even"]} == set(FIGURES)
    assert {(b["level"], b["k"]) for b in pol["best_k"]} == {(1, 4), (2, 4)}
    assert (tmp / "out" / "plots" / "speedup-exact.png").stat().st_size > 1000
    assert "policy: exact (draft_model, draft-exact); enable above 16 prompt tokens" in res.stdout
    assert "stacks started 1, reused 7" in res.stdout
    # each run's line says what it measured, not the base experiment's verdict
    line = next(ln for ln in res.stdout.splitlines() if "exact-k4-c1-short-greedy (" in ln)
    assert "short/greedy α 1.00, 2 block(s), throughput " in line and "PASS" not in line and "FAIL" not in line


def test_a_rerun_keeps_finished_runs_and_reruns_a_crashed_one(swept, models_built, tmp_path):
    """Resume, with a stand-in for the experiment run that replays a finished run's files
    (seconds): the runs with a complete result are kept, a run directory without one (a
    crash) is removed and run again, a torn result file counts as not done."""
    src, _ = swept
    out = tmp_path / "out"
    shutil.copytree(src / "out", out)
    crashed = out / "runs" / "exact-k4-c2-short-greedy"
    (crashed / RESULT_FILE).unlink()          # crashed before its result was written
    (crashed / "leftover").write_text("x")
    torn = out / "runs" / "exact-k4-c1-short-greedy" / RESULT_FILE
    torn.write_text(torn.read_text()[:100])   # a torn write
    calls: list[str] = []

    def replay(base: Path, run_dir: Path, overrides) -> tuple[int, dict]:
        calls.append(run_dir.parent.parent.name)   # runs/<run>/blocks/<block>
        assert not run_dir.exists(), "a crashed run's directory is removed before it runs again"
        plain = run_dir.name.endswith("-plain")
        assert any(o.path == "load.target" and o.value == "ref" for o in overrides) == plain
        shutil.copytree(src / "out" / run_dir.relative_to(out), run_dir)
        return 0, {"verdict": "pass"}

    plan = plan_sweep(src / "sweep.yaml")
    summary = run_sweep(plan, out, execute=replay, reuse=False)
    assert sorted(set(calls)) == ["exact-k4-c1-short-greedy", "exact-k4-c2-short-greedy"] and len(calls) == 8
    assert summary["sweep"]["kept"] == 0 and summary["sweep"]["ran"] == 2 and summary["missing"] == []
    assert not (crashed / "leftover").exists()
    # and once more: everything is done, nothing runs
    calls.clear()
    assert run_sweep(plan, out, execute=replay, reuse=False)["sweep"]["kept"] == 2 and calls == []


def test_an_interrupted_run_stops_the_sweep_and_keeps_what_finished(swept, models_built, tmp_path):
    src, _ = swept
    plan = plan_sweep(src / "sweep.yaml")
    calls: list[str] = []

    def interrupted(base: Path, run_dir: Path, overrides) -> tuple[int, dict]:
        calls.append(run_dir.parent.parent.name)
        if len(calls) <= 4:   # the first run's four blocks
            shutil.copytree(src / "out" / run_dir.relative_to(tmp_path / "out"), run_dir)
            return 0, {"verdict": "pass"}
        run_dir.mkdir(parents=True)
        return 2, {"verdict": "error", "errors": ["interrupted by SIGINT"]}

    s = run_sweep(plan, tmp_path / "out", execute=interrupted, reuse=False)
    assert len(calls) == 5 and s["sweep"]["interrupted"] and s["sweep"]["ran"] == 1
    assert len(s["missing"]) == 1 and len(s["cells"]) == 1
    assert not (tmp_path / "out" / "runs" / calls[4] / RESULT_FILE).exists()


def test_the_plan_of_a_mixed_workload_splits_runs_into_cells(tmp_path, models_built):
    sweep = write_sweep(tmp_path, buckets=["short", "long"], sampling=["greedy", "sampled"],
                        speculators=[{"name": "exact"}, {"name": "ngram", "method": "ngram"}], k=[4])
    doc = yaml.safe_load(sweep.read_text())
    plan = plan_sweep(sweep)
    assert len(plan.runs) == 2 * 2 * 4 and plan.stacks == 2
    assert plan.runs[0].id == "exact-k4-c1-short-greedy"
    ngram = next(r for r in plan.runs if r.speculator.name == "ngram")
    assert {o.path: o.value for o in ngram.overrides}["stack.draft"] is None
    doc["mix"] = ["buckets", "sampling"]
    sweep.write_text(yaml.safe_dump(doc))
    plan = plan_sweep(sweep)
    assert [r.id for r in plan.runs] == ["exact-k4-c1", "exact-k4-c2", "ngram-k4-c1", "ngram-k4-c2"]
    first = plan.runs[0]
    assert [first.cell_id(b, s) for b in first.buckets for s in first.sampling] == [
        "exact-k4-c1-short-greedy", "exact-k4-c1-short-sampled", "exact-k4-c1-long-greedy", "exact-k4-c1-long-sampled"]
    ovs = {o.path: o.value for o in plan.runs[0].overrides}
    # block mode: each server alone holds the C = 1 requests; no mirror
    assert ovs["load.users"] == 1 and ovs["load.mirror"] is False and ovs["load.medium_prompts"] == 0
    assert len(first.blocks) == 4 and sorted(first.blocks) == ["1-plain", "1-spec", "2-plain", "2-spec"]
    doc["pairing"] = "mirror"
    sweep.write_text(yaml.safe_dump(doc))
    mirrored = plan_sweep(sweep).runs[0]
    ovs = {o.path: o.value for o in mirrored.overrides}
    assert ovs["load.users"] == 2 and ovs["load.mirror"] is True and mirrored.blocks == []
    del doc["pairing"]
    # buckets mixed, sampling classes apart; a speculator with its own k values
    doc["mix"] = ["buckets"]
    doc["matrix"]["speculators"][0]["k"] = [2, 4]
    sweep.write_text(yaml.safe_dump(doc))
    plan = plan_sweep(sweep)
    assert [r.id for r in plan.runs][:3] == ["exact-k2-c1-greedy", "exact-k2-c1-sampled", "exact-k2-c2-greedy"]
    assert len(plan.runs) == (2 + 1) * 2 * 2 and plan.stacks == 3
    assert plan.runs[0].buckets == ["short", "long"] and plan.runs[0].sampling == ["greedy"]
    # an open loop: a rate per level, each arrival sent to both servers
    del doc["matrix"]["concurrency"]
    doc["matrix"]["rate"] = [2.5]
    sweep.write_text(yaml.safe_dump(doc))
    plan = plan_sweep(sweep)
    ovs = {o.path: o.value for o in plan.runs[0].overrides}
    assert plan.runs[0].id == "exact-k2-r2.5-greedy" and plan.runs[0].level_kind == "rate"
    assert ovs["load.profile.kind"] == "open" and ovs["load.profile.rate"] == 2.5 and "load.users" not in ovs


@pytest.mark.parametrize("change, needles", [
    ({"matrix": {"k": [4], "concurrency": [1], "speculators": [{"name": "a"}], "speed": 1}}, ["matrix.speed", "unknown field"]),
    ({"matrix": {"k": [4], "concurrency": [1], "rate": [2], "speculators": [{"name": "a"}]}}, ["exactly one of concurrency"]),
    ({"matrix": {"k": [4], "concurrency": [1], "speculators": [{"name": "a"}], "buckets": ["huge"]}},
     ["matrix.buckets", "unknown bucket 'huge'"]),
    ({"matrix": {"k": [4], "concurrency": [1], "speculators": [{"name": "a"}], "sampling": ["hot"]}},
     ["matrix.sampling", "unknown sampling class 'hot'"]),
    ({"matrix": {"k": [4], "concurrency": [1], "speculators": [{"name": "n", "method": "ngram", "draft": "d"}]}},
     ["method ngram takes no draft"]),
    ({"matrix": {"k": [4], "concurrency": [1], "speculators": [{"name": "a", "draft": "draft-missing"}]}},
     ["run a-k4-c1", "draft-missing"]),
    ({"base": "nowhere.yaml"}, ["base", "does not exist"]),
    ({"mix": ["levels"]}, ["mix.0"]),
    ({"set": {"load.long_prompts": 0}, "matrix": {"k": [4], "concurrency": [1], "speculators": [{"name": "a"}],
                                                  "buckets": ["long"]}}, ["bucket 'long' has no prompts"]),
    ({"matrix": {"k": [4], "concurrency": [1], "speculators": [{"name": "a", "k": [0]}]}}, ["k must be distinct values"]),
    ({"set": {"load.userz": 3}}, ["set.load.userz"]),
])
def test_bad_sweep_files_are_one_line(tmp_path, models_built, change, needles):
    sweep = write_sweep(tmp_path)
    doc = yaml.safe_load(sweep.read_text())
    doc.update(change)
    sweep.write_text(yaml.safe_dump(doc))
    assert_one_line_error(cli("sweep", str(sweep), "--out", str(tmp_path / "out")), *needles)
    assert not (tmp_path / "out").exists()


def test_a_missing_sweep_file_is_one_line(tmp_path):
    assert_one_line_error(cli("sweep", str(tmp_path / "none.yaml")), "no such sweep file")


def test_validate_of_a_sweep_file_says_it_is_one(tmp_path):
    """A sweep file given to ``validate`` (or ``run``) is named as one, with the command that
    runs it: one line, exit 2."""
    sweep = ROOT / "experiments" / "sweep-speculation.yaml"
    assert_one_line_error(cli("validate", str(sweep)), "this is a sweep file", "specchaos sweep")


def test_load_on_the_plain_server_alone_needs_it(tmp_path, models_built):
    """A block's plain side (``load.target: ref``) needs the reference server and no mirror:
    one line naming the field, exit 2."""
    base = write_base(tmp_path)
    assert_one_line_error(cli("validate", str(base), "--set", "load.target=ref", "--set", "stack.reference=false",
                              "--set", "integrity.min_compared=0"), "load.target: ref needs the reference server")
    assert_one_line_error(cli("validate", str(base), "--set", "load.target=ref", "--set", "load.mirror=true"),
                          "load.target: ref needs the reference server and no mirror")
    ok = cli("validate", str(base), "--set", "load.target=ref")
    assert ok.returncode == 0, ok.stdout + ok.stderr

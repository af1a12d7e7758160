"""The lines a user meets while writing an experiment, each pinned: a missing traffic source
names the experiment and the field, a misspelt action argument gets the closest accepted
name, the accepted names include the action's own ``duration_s`` and ``evidence_timeout_s``,
and ``validate`` says what it is doing before each slow step."""

from __future__ import annotations

import shutil

import pytest

from harness.experiment.validate import load_experiment
from tests.experiment.files import EXPERIMENTS, experiment_doc, write
from tests.experiment.test_bad_input import assert_one_line_error, cli

ARGS = "method[0].provider.arguments"


def test_a_missing_source_file_names_the_experiment_and_the_field(tmp_path, models_built):
    d = experiment_doc("trace-replay.yaml")
    d["configuration"]["specchaos"]["load"]["source"]["path"] = "nowhere.jsonl"
    exp = write(tmp_path, d)
    line = assert_one_line_error(cli("validate", str(exp), cwd=tmp_path))
    assert line == (f"specchaos: error: {exp}: configuration.specchaos.load.source.path: {tmp_path / 'nowhere.jsonl'}: "
                    f"no such file (give the path of the traffic source file)")


def test_a_misspelt_action_argument_gets_the_closest_name_and_the_whole_list(tmp_path, models_built):
    d = experiment_doc("network-jitter.yaml")
    args = d["method"][0]["provider"]["arguments"]
    args["toxik"] = args.pop("toxic")
    exp = write(tmp_path, d)
    line = assert_one_line_error(cli("validate", str(exp)))
    assert line.startswith(f"specchaos: error: {exp}: {ARGS}.toxik: unknown argument of network "
                           f"(did you mean 'toxic'? network takes: ")
    assert line.endswith(", duration_s, evidence_timeout_s)")   # the action's own, accepted beside the family's


def test_an_argument_with_nothing_close_gets_the_list_only(tmp_path, models_built):
    d = experiment_doc("network-jitter.yaml")
    d["method"][0]["provider"]["arguments"]["colour"] = "red"
    line = assert_one_line_error(cli("validate", str(write(tmp_path, d))))
    assert f"{ARGS}.colour: unknown argument of network (network takes: " in line and "did you mean" not in line


def test_validate_says_what_it_is_doing_before_each_slow_step(tmp_path, models_built, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copyfile(EXPERIMENTS / "sources" / "requests.jsonl", tmp_path / "src.jsonl")
    d = experiment_doc("trace-replay.yaml")
    d["configuration"]["specchaos"]["load"]["source"] = {"format": "openai", "path": "src.jsonl"}
    seen: list[str] = []
    load_experiment(write(tmp_path, d), progress=seen.append)
    assert seen == [
        "checking the stack before anything starts (the local launcher, which starts vLLM as local processes: "
        "models, ports and what it needs of the host or its engine)",
        "measuring the prompts of load.source (src.jsonl) with the target's tokenizer",
    ]


@pytest.mark.parametrize("name", ["network-jitter.yaml", "kill-draft-worker.yaml"])
def test_validate_prints_only_its_result_on_a_pipe(tmp_path, models_built, name):
    """The status line is for a terminal: on a pipe stdout has the result and stderr nothing."""
    res = cli("validate", str(write(tmp_path, experiment_doc(name))))
    assert (res.returncode, res.stderr) == (0, "") and ": valid (" in res.stdout

"""Overrides of ``configuration.specchaos`` (:mod:`harness.experiment.overrides`): values
parsed as YAML, paths checked against the config models, errors in one line naming the
override, and the precedence file < var file < environment < ``specchaos_set`` < ``--set``,
through the one validation path and at the command line (nothing started)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from harness.errors import ExperimentError
from harness.experiment.config import SpecchaosConfig
from harness.experiment.overrides import (ENV, SET, VAR_FILE, Override, apply_overrides, collect_overrides,
                                          config_var_overrides, env_overrides, parse_set, read_var_file)
from harness.experiment.validate import load_experiment
from tests.experiment.files import ROOT, experiment_doc, write


def one(text: str) -> Override:
    (ov,) = parse_set(text)
    return ov


@pytest.mark.parametrize("text, value", [
    ("load.users=8", 8), ("phases.baseline_s=60.5", 60.5), ("load.mirror=true", True), ("stack.draft=null", None),
    ("stack.draft=", None), ("stack.target=/models/x", "/models/x"), ("stack.extra_args=[--a, '1']", ["--a", "1"]),
    ("stack.target='8'", "8"), ("stack.target=a: b: c", "a: b: c"), ("load.seed = 7", 7)])
def test_values_are_yaml(text, value):
    ov = one(text)
    assert ov.value == value and ov.source == f"--set {text}" and ov.rank == SET


def test_a_mapping_value_sets_each_leaf():
    ovs = parse_set("stack={target: t, restart: {max_restarts: 0}}")
    assert [(o.path, o.value) for o in ovs] == [("stack.target", "t"), ("stack.restart.max_restarts", 0)]
    block = apply_overrides({"stack": {"draft": "d", "restart": {"backoff_s": 2}}}, ovs, SpecchaosConfig)
    assert block == {"stack": {"draft": "d", "target": "t", "restart": {"backoff_s": 2, "max_restarts": 0}}}


@pytest.mark.parametrize("text, needle", [
    ("load.userz=8", "unknown field 'userz' in configuration.specchaos.load (did you mean users?"),
    ("lod.users=8", "unknown field 'lod' in configuration.specchaos (did you mean load?"),
    ("load.users.x=1", "configuration.specchaos.load.users is a single value (int); it has no field 'x'"),
    ("load.sampling.first=1", "configuration.specchaos.load.sampling is a list: the next part of the path is an index"),
    ("load..users=1", "not a dotted path"),
    ("load", "an override is PATH=VALUE"),
    ("=3", "an override is PATH=VALUE"),
])
def test_a_bad_path_is_one_line_naming_the_override(text, needle):
    with pytest.raises(ExperimentError) as ei:
        apply_overrides({}, parse_set(text), SpecchaosConfig)
    line = ei.value.one_line()
    assert "\n" not in line and needle in line and line.startswith(f"--set {text}"), line


def test_paths_into_lists_and_mappings():
    block = {"safeguards": [{"metric": "error_rate", "limit": 0.5}]}
    out = apply_overrides(block, parse_set("safeguards.0.limit=0.1") + parse_set("acceptance_floor.buckets.short=0.4"),
                          SpecchaosConfig)
    assert out["safeguards"][0] == {"metric": "error_rate", "limit": 0.1}
    assert out["acceptance_floor"] == {"buckets": {"short": 0.4}}
    assert block["safeguards"][0]["limit"] == 0.5   # the file's block is not changed
    with pytest.raises(ExperimentError, match="has 1 item"):
        apply_overrides(block, parse_set("safeguards.3.limit=1"), SpecchaosConfig)
    with pytest.raises(ExperimentError, match="not set in the experiment"):
        apply_overrides({}, parse_set("safeguards.0.limit=1"), SpecchaosConfig)


def test_environment_names(monkeypatch):
    env = {"SPECCHAOS_SET_STACK__MODELS_DIR": "/m", "SPECCHAOS_SET_STACK": "{target: t, models_dir: /x}",
           "SPECCHAOS_STATE_DIR": "/s", "SPECCHAOS_SET_": "ignored", "SPECCHAOS_SET_LOAD__USERS": "3"}
    ovs = env_overrides(env)
    # shortest path first: the specific variable wins over a leaf of the mapping one
    assert [(o.path, o.value) for o in ovs] == [("stack.target", "t"), ("stack.models_dir", "/x"),
                                                ("load.users", 3), ("stack.models_dir", "/m")]
    assert all(o.rank == ENV for o in ovs) and ovs[-1].source == "$SPECCHAOS_SET_STACK__MODELS_DIR=/m"
    assert apply_overrides({}, ovs, SpecchaosConfig)["stack"] == {"target": "t", "models_dir": "/m"}


def test_var_files(tmp_path):
    f = tmp_path / "v.yaml"
    f.write_text("load.users: 5\nphases:\n  baseline_s: 9\n")
    ovs = read_var_file(f)
    assert [(o.path, o.value, o.rank) for o in ovs] == [("load.users", 5, VAR_FILE), ("phases.baseline_s", 9, VAR_FILE)]
    j = tmp_path / "v.json"
    j.write_text('{"load.users": 6}')
    assert read_var_file(j)[0].value == 6
    for text, needle in [("[1, 2]", "a var file is a mapping"), ("a: [", "not valid YAML")]:
        f.write_text(text)
        with pytest.raises(ExperimentError, match=needle):
            read_var_file(f)
    with pytest.raises(ExperimentError, match="cannot read the var file"):
        read_var_file(tmp_path / "none.yaml")


def test_configuration_specchaos_set_forms():
    assert config_var_overrides("") == [] and config_var_overrides(None) == []
    assert [(o.path, o.value) for o in config_var_overrides("load.users=2; phases.after_s=3\nload.seed=1")] == [
        ("load.users", 2), ("phases.after_s", 3), ("load.seed", 1)]
    assert [(o.path, o.value) for o in config_var_overrides(["load.users=2"])] == [("load.users", 2)]
    assert [(o.path, o.value) for o in config_var_overrides({"load.users": 2})] == [("load.users", 2)]
    with pytest.raises(ExperimentError, match="must be 'PATH=VALUE"):
        config_var_overrides(3)


def test_precedence_file_var_file_env_config_var_set(tmp_path, monkeypatch):
    """Each source set to a different ``load.users``; the strongest present wins."""
    monkeypatch.chdir(ROOT)
    doc = experiment_doc("kill-draft-worker.yaml")
    file_users = doc["configuration"]["specchaos"]["load"]["users"]
    var_file = tmp_path / "v.yaml"
    var_file.write_text("load.users: 5\n")

    def users(sets=(), var_files=(), env=None, config_var="") -> int:
        d = dict(doc, configuration=dict(doc["configuration"], specchaos_set=config_var))
        ovs = collect_overrides(sets, var_files, environ=env or {})
        return load_experiment(write(tmp_path, d), overrides=ovs).cfg.load.users

    env = {"SPECCHAOS_SET_LOAD__USERS": "6"}
    assert users() == file_users and file_users not in (5, 6, 7, 8)
    assert users(var_files=[var_file]) == 5
    assert users(var_files=[var_file], env=env) == 6
    assert users(var_files=[var_file], env=env, config_var="load.users=7") == 7
    assert users(sets=["load.users=8"], var_files=[var_file], env=env, config_var="load.users=7") == 8
    assert users(sets=["load.users=8", "load.users=3"]) == 3   # the last --set wins


def test_the_experiment_carries_the_applied_block_and_the_list(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    exp = load_experiment(ROOT / "experiments" / "kill-draft-worker.yaml",
                          overrides=parse_set("phases.baseline_s=11") + parse_set("load.users=2"))
    assert exp.cfg.phases.baseline_s == 11 and exp.cfg.load.users == 2
    assert exp.doc["configuration"]["specchaos"]["phases"]["baseline_s"] == 11
    assert [o.path for o in exp.overrides] == ["phases.baseline_s", "load.users"]


def test_an_invalid_value_names_its_override_and_a_cross_field_rule_lists_the_overrides(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    path = ROOT / "experiments" / "kill-draft-worker.yaml"
    with pytest.raises(ExperimentError) as ei:
        load_experiment(path, overrides=parse_set("load.users=0"))
    assert ei.value.one_line() == "--set load.users=0: Input should be greater than or equal to 1"
    with pytest.raises(ExperimentError) as ei:
        load_experiment(path, overrides=parse_set("stack={restart: {max_restarts: -1}}"))
    assert ei.value.one_line().startswith("--set stack={restart: {max_restarts: -1}}: Input should be greater")
    with pytest.raises(ExperimentError) as ei:   # the draft the file names does not fit the overridden method
        load_experiment(path, overrides=parse_set("stack.method=ngram"))
    line = ei.value.one_line()
    assert "configuration.specchaos.stack.draft" in line and "(overrides applied: --set stack.method=ngram)" in line
    assert load_experiment(path, overrides=parse_set("stack.method=ngram") + parse_set("stack.draft=null")
                           ).cfg.stack.draft is None
    with pytest.raises(ExperimentError) as ei:
        load_experiment(path, overrides=collect_overrides(environ={"SPECCHAOS_SET_LOAD__USERS": "many"}))
    assert ei.value.one_line() == ("$SPECCHAOS_SET_LOAD__USERS=many: Input should be a valid integer, unable to parse "
                                   "string as an integer")


def cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith("SPECCHAOS_SET_")}
    e.update(env, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=e)


def test_the_command_line_applies_set_var_file_and_environment(tmp_path):
    exp = "experiments/kill-draft-worker.yaml"
    var_file = tmp_path / "v.yaml"
    var_file.write_text("load.users: 5\n")
    ok = cli("validate", exp, "--var-file", str(var_file), "--set", "phases.baseline_s=60",
             SPECCHAOS_SET_LOAD__SEED="9")
    assert ok.returncode == 0, ok.stderr
    assert "valid (Kill the drafting worker under load); 3 override(s) applied\nrequires: " in ok.stdout
    out = tmp_path / "out"
    run = cli("run", exp, "--out", str(out), "--set", "load.userz=8")   # refused before anything starts
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert run.stderr.startswith("specchaos: error: --set load.userz=8: unknown field 'userz'")
    assert not out.exists()

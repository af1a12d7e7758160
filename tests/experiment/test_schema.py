"""The published JSON Schemas (``schemas/``, :mod:`harness.experiment.schema`): the
committed files are what the code generates, every shipped experiment validates against
them with the ``jsonschema`` library and broken ones do not, and a report judged by the
real judge validates against the report schema while a broken one does not."""

from __future__ import annotations

import copy
import functools
import json
import subprocess
import sys

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.experiment.schema import SCHEMA_NAMES, schema_file
from harness.report.judge import judge_run
from tests.experiment.files import EXPERIMENTS, ROOT, is_sweep
from tests.report.test_judge import META, cfg, write_run

SCHEMAS = ROOT / "schemas"
ALL_YAML = sorted(EXPERIMENTS.rglob("*.yaml")) + sorted((ROOT / "tests" / "ci" / "experiments").glob("*.yaml"))
#: Sweep files (``specchaos sweep``) sit beside the experiments; they validate against the sweep schema.
SWEEPS = [p for p in ALL_YAML if is_sweep(p)]
SHIPPED = [p for p in ALL_YAML if p not in SWEEPS]


@functools.cache
def validator(name: str) -> jsonschema.Draft202012Validator:
    s = json.loads((SCHEMAS / schema_file(name)).read_text())
    jsonschema.Draft202012Validator.check_schema(s)
    return jsonschema.Draft202012Validator(s)


def errors(name: str, doc: object) -> list[str]:
    return ["/".join(map(str, e.absolute_path)) + ": " + e.message for e in validator(name).iter_errors(doc)]


def test_the_committed_schemas_are_what_the_code_generates(tmp_path):
    """In a fresh process (a test may have registered a fault family in this one)."""
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "schema", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(schema_file(n) for n in SCHEMA_NAMES)
    for name in SCHEMA_NAMES:
        committed = (SCHEMAS / schema_file(name)).read_text()
        assert (tmp_path / schema_file(name)).read_text() == committed, \
            f"schemas/{schema_file(name)} is stale: run `specchaos schema` and commit schemas/"
    printed = CliRunner().invoke(app, ["schema", "report"])   # one schema to stdout, as plain JSON
    assert printed.exit_code == 0 and json.loads(printed.stdout) == json.loads((SCHEMAS / schema_file("report")).read_text())
    bad = CliRunner().invoke(app, ["schema", "reprot"])
    assert bad.exit_code == 2 and "unknown schema 'reprot' (known: experiment, config, report, sweep)" in bad.output


def test_versions_and_ids():
    exp, conf, rep, sweep = (json.loads((SCHEMAS / schema_file(n)).read_text()) for n in SCHEMA_NAMES)
    assert sweep["$id"] == "urn:specchaos:schema:sweep:v1"
    assert exp["$id"] == "urn:specchaos:schema:experiment:v1" and conf["$id"] == "urn:specchaos:schema:config:v1"
    assert rep["$id"] == "urn:specchaos:schema:report:v1"
    assert rep["properties"]["schema_version"]["const"] == 1


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_experiment_validates(path):
    doc = yaml.safe_load(path.read_text())
    assert errors("experiment", doc) == []
    assert errors("config", doc["configuration"]["specchaos"]) == []


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_every_shipped_sweep_file_validates(path):
    doc = yaml.safe_load(path.read_text())
    assert errors("sweep", doc) == []
    assert errors("sweep", {**doc, "matrix": {**doc["matrix"], "k": "four"}}) != []


def _kill() -> dict:
    return yaml.safe_load((EXPERIMENTS / "kill-draft-worker.yaml").read_text())


def _set(doc: dict, path: str, value: object) -> dict:
    d = copy.deepcopy(doc)
    *parents, last = path.split(".")
    cur = d
    for p in parents:
        cur = cur[int(p)] if isinstance(cur, list) else cur[p]
    if value is KeyError:
        del cur[last]
    else:
        cur[last] = value
    return d


@pytest.mark.parametrize("path, value, where", [
    ("configuration.specchaos.load.users", 0, "configuration/specchaos/load/users: 0 is less than the minimum"),
    ("configuration.specchaos.load.userz", 4, "configuration/specchaos/load: Additional properties"),
    ("configuration.specchaos.stack.method", "medusa", "configuration/specchaos/stack/method"),
    ("method.0.provider.arguments.role", "wroker", "method/0/provider/arguments/role"),
    ("method.0.provider.arguments.duration_s", -1, "method/0/provider/arguments/duration_s"),
    ("method.0.provider.arguments.sginal", "KILL", "method/0/provider/arguments: Additional properties"),
    ("method.0.provider.func", "kill_proces", "method/0/provider/func: 'kill_proces' is not one of"),
    ("controls", [], "controls: [] does not contain"),
    ("configuration.specchaos", KeyError, "configuration: 'specchaos' is a required property"),
    ("method", [], "method: [] should be non-empty"),
])
def test_a_broken_experiment_does_not_validate(path, value, where):
    errs = errors("experiment", _set(_kill(), path, value))
    assert any(e.startswith(where) for e in errs), errs


def test_a_broken_configuration_block_does_not_validate_against_the_config_schema():
    spec = _kill()["configuration"]["specchaos"]
    assert errors("config", spec) == []
    assert errors("config", _set(spec, "phases.baseline_s", 0))
    assert errors("config", _set(spec, "phases.after_s", "long"))


def test_a_judged_report_validates_and_a_broken_one_does_not(tmp_path):
    rep = judge_run(write_run(tmp_path / "run"), cfg(), META)
    rep = json.loads(json.dumps(rep))   # as report.json holds it
    assert rep["verdict"] == "pass"
    assert errors("report", rep) == []
    assert any(e.startswith("verdict: 'maybe' is not one of") for e in errors("report", dict(rep, verdict="maybe")))
    assert any(e.startswith("schema_version: 1 was expected") for e in errors("report", dict(rep, schema_version=2)))
    assert errors("report", _set(rep, "phases.baseline.ttft_s.p95", "slow"))
    assert errors("report", {k: v for k, v in rep.items() if k != "checks"}) == [": 'checks' is a required property"]

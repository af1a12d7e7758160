"""Bad input: one clear line naming what and where, exit 2, nothing started or injected.
These run the real CLI in a subprocess; none of them may start a server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.procs import sut_pids

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENT = ROOT / "experiments" / "kill-draft-worker.yaml"


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def doc() -> dict:
    d = yaml.safe_load(EXPERIMENT.read_text())
    d["configuration"]["specchaos"]["stack"]["models_dir"] = str(ROOT / "models")
    return d


def write(tmp: Path, d: dict | str, name="exp.yaml") -> Path:
    p = tmp / name
    p.write_text(d if isinstance(d, str) else yaml.safe_dump(d, sort_keys=False))
    return p


def assert_one_line_error(res: subprocess.CompletedProcess, *needles: str) -> str:
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    lines = [l for l in res.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("specchaos: error: "), lines[0]
    assert "Traceback" not in res.stderr + res.stdout
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


@pytest.fixture
def no_new_processes():
    before = sut_pids()
    yield
    assert sut_pids() - before == set(), "bad input must not start anything"


@pytest.fixture
def models_built():
    if not (ROOT / "models" / "manifest.json").exists():
        pytest.skip("models not built (make test builds them)")


def test_missing_file(tmp_path, no_new_processes):
    res = cli("run", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "o"))
    assert_one_line_error(res, "nope.yaml", "no such experiment file")


def test_yaml_syntax_error_names_line(tmp_path, no_new_processes):
    p = write(tmp_path, "title: x\ndescription: y\nmethod: [\n  - {type: action\n")
    res = cli("run", str(p), "--out", str(tmp_path / "o"))
    line = assert_one_line_error(res, "invalid YAML")
    assert f"{p}:" in line


def test_not_a_chaos_toolkit_experiment(tmp_path, no_new_processes):
    d = doc()
    del d["description"]
    res = cli("validate", str(write(tmp_path, d)))
    assert_one_line_error(res, "description")


def generic(d: dict, kind: str = "process-kill", **arguments) -> dict:
    """The experiment with its fault action written with the generic ``inject_fault`` alias."""
    prov = d["method"][0]["provider"]
    prov["func"] = "inject_fault"
    prov["arguments"] = {"kind": kind, "arguments": {"server": "spec", "role": "worker", **arguments}}
    return d


def test_unknown_fault(tmp_path, no_new_processes, models_built):
    d = generic(doc(), kind="process-explode")
    res = cli("run", str(write(tmp_path, d)), "--out", str(tmp_path / "o"))
    assert_one_line_error(res, "process-explode", "method[0].provider.arguments.kind", "process-kill")
    assert not (tmp_path / "o" / "ledger.jsonl").exists()


def test_unknown_fault_action(tmp_path, no_new_processes, models_built):
    d = doc()
    d["method"][0]["provider"]["func"] = "explode_process"
    assert_one_line_error(cli("validate", str(write(tmp_path, d))), "explode_process")


def test_unknown_role(tmp_path, no_new_processes, models_built):
    d = doc()
    d["method"][0]["provider"]["arguments"]["role"] = "drafter"
    res = cli("run", str(write(tmp_path, d)), "--out", str(tmp_path / "o"))
    assert_one_line_error(res, "method[0].provider.arguments.role", "'api', 'engine' or 'worker'")


def test_unknown_role_through_the_generic_alias(tmp_path, no_new_processes, models_built):
    d = generic(doc(), role="drafter")
    res = cli("run", str(write(tmp_path, d)), "--out", str(tmp_path / "o"))
    assert_one_line_error(res, "method[0].provider.arguments.arguments.role")


def test_unknown_argument_of_a_typed_fault_action(tmp_path, no_new_processes, models_built):
    d = doc()
    d["method"][0]["provider"]["arguments"]["sigkill"] = True
    assert_one_line_error(cli("validate", str(write(tmp_path, d))), "method[0].provider.arguments.sigkill",
                          "unknown argument of process-kill")


def test_a_method_that_needs_a_draft_without_one_fails_validation_not_start(tmp_path, no_new_processes,
                                                                           models_built):
    d = doc()
    d["configuration"]["specchaos"]["stack"].update(method="eagle", draft=None)
    assert_one_line_error(cli("validate", str(write(tmp_path, d))), "configuration.specchaos.stack",
                          "method eagle needs a draft model")


def test_unknown_launcher(tmp_path, no_new_processes):
    d = doc()
    d["configuration"]["specchaos"]["stack"]["launcher"] = "kubernetes"
    assert_one_line_error(cli("validate", str(write(tmp_path, d))), "configuration.specchaos.stack.launcher",
                          "unknown launcher 'kubernetes'", "local")


def test_unknown_config_field(tmp_path, no_new_processes, models_built):
    d = doc()
    d["configuration"]["specchaos"]["load"]["userz"] = 3
    res = cli("validate", str(write(tmp_path, d)))
    assert_one_line_error(res, "configuration.specchaos.load.userz")


def test_non_loopback_host_refused(tmp_path, no_new_processes):
    d = doc()
    d["configuration"]["specchaos"]["stack"]["host"] = "192.168.1.10"
    res = cli("validate", str(write(tmp_path, d)))
    assert_one_line_error(res, "configuration.specchaos.stack.host", "loopback")


def test_missing_models(tmp_path, no_new_processes):
    d = doc()
    d["configuration"]["specchaos"]["stack"]["models_dir"] = str(tmp_path / "no-models")
    res = cli("run", str(write(tmp_path, d)), "--out", str(tmp_path / "o"))
    assert_one_line_error(res, "no-models", "models build", f"{tmp_path}/exp.yaml: configuration.specchaos.stack.target")


def test_missing_draft_names_the_draft_field(tmp_path, no_new_processes, models_built):
    d = doc()
    d["configuration"]["specchaos"]["stack"]["draft"] = "draft-nothere"
    res = cli("validate", str(write(tmp_path, d)))
    assert_one_line_error(res, "configuration.specchaos.stack.draft", "draft-nothere")


def test_same_port_for_both_servers(tmp_path, no_new_processes, models_built):
    d = doc()
    d["configuration"]["specchaos"]["stack"].update(spec_port=45999, ref_port=45999)
    res = cli("validate", str(write(tmp_path, d)))
    assert_one_line_error(res, "configuration.specchaos.stack", "both 45999")


def test_output_path_that_is_a_file(tmp_path, no_new_processes, models_built):
    (tmp_path / "afile").write_text("x")
    res = cli("run", str(write(tmp_path, doc())), "--out", str(tmp_path / "afile"))
    assert_one_line_error(res, "--out", "not a directory")
    assert (tmp_path / "afile").read_text() == "x"


def test_report_on_a_bad_run_directory(tmp_path):
    assert_one_line_error(cli("report", str(tmp_path)), "not a specchaos run directory")
    (tmp_path / "timeline.jsonl").write_text("")
    (tmp_path / "config.json").write_text('{"slo": {"ttft_p95_s": "fast"}}')
    assert_one_line_error(cli("report", str(tmp_path)), "config.json: slo.ttft_p95_s")
    (tmp_path / "config.json").write_text('{"slo": ')
    assert_one_line_error(cli("report", str(tmp_path)), "config.json", "unreadable")


def test_port_in_use(tmp_path, no_new_processes, models_built):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        d = doc()
        d["configuration"]["specchaos"]["stack"]["spec_port"] = port
        res = cli("run", str(write(tmp_path, d)), "--out", str(tmp_path / "o"))
    assert_one_line_error(res, f"port {port}", "spec_port", "in use")


def test_missing_control(tmp_path, no_new_processes, models_built):
    d = doc()
    d["controls"] = []
    res = cli("validate", str(write(tmp_path, d)))
    assert_one_line_error(res, "controls", "harness.experiment.control")


def test_default_experiment_validates(models_built):
    res = cli("validate", str(EXPERIMENT))
    assert res.returncode == 0, res.stderr
    assert "valid" in res.stdout


def test_directory_instead_of_a_file(tmp_path, no_new_processes):
    assert_one_line_error(cli("validate", str(tmp_path)), str(tmp_path), "is a directory")


def test_method_without_a_fault(tmp_path, no_new_processes, models_built):
    d = doc()
    d["method"] = [a for a in d["method"] if a["provider"]["func"] != "kill_process"]
    assert_one_line_error(cli("validate", str(write(tmp_path, d))), "method", "injects no fault")


def test_integrity_without_reference_server(tmp_path, no_new_processes, models_built):
    d = doc()
    d["configuration"]["specchaos"]["stack"]["reference"] = False
    assert_one_line_error(cli("validate", str(write(tmp_path, d))), "configuration.specchaos", "stack.reference")


def test_a_probe_naming_an_unknown_server(tmp_path, no_new_processes, models_built):
    d = doc()
    d["steady-state-hypothesis"]["probes"][0]["provider"]["arguments"] = {"server": "nope"}
    assert_one_line_error(cli("validate", str(write(tmp_path, d))),
                          "steady-state-hypothesis.probes[0].provider.arguments.server", "unknown server 'nope'")


def test_hold_phase_with_an_unknown_phase(tmp_path, no_new_processes, models_built):
    d = doc()
    d["method"][-1]["provider"]["arguments"] = {"phase": "nonsense"}
    assert_one_line_error(cli("validate", str(write(tmp_path, d))), "method[2].provider.arguments.phase",
                          "unknown phase 'nonsense'")


def test_extra_args_may_not_move_the_server_off_loopback(tmp_path, no_new_processes):
    d = doc()
    d["configuration"]["specchaos"]["stack"]["extra_args"] = ["--host", "0.0.0.0"]
    assert_one_line_error(cli("validate", str(write(tmp_path, d))), "configuration.specchaos.stack.extra_args",
                          "--host is set by the harness")

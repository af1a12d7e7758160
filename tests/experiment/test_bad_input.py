"""Bad input: one clear line naming what and where, exit 2, nothing started or injected.
These run the real CLI's commands in this process (:func:`cli`: typer's runner, stdout and
stderr captured apart); none of them may start a server. The CLI's own process, exit code
and signals are tested through a subprocess in tests/test_cli.py and the real-stack run of
tests/experiment/test_memory_pressure.py."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.experiment.files import experiment_doc, write
from tests.procs import sut_pids

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENT = ROOT / "experiments" / "kill-draft-worker.yaml"


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``specchaos ARGS`` in this process, from ``cwd``: its exit code and what it wrote to
    stdout and stderr, apart (as a subprocess would give them; a validation error costs no
    interpreter start). An exception the command did not turn into an exit code (a bug) is
    raised."""
    from typer.testing import CliRunner

    from harness.cli import app

    with contextlib.chdir(cwd):
        res = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return subprocess.CompletedProcess(["specchaos", *args], res.exit_code, res.stdout, res.stderr)


def doc() -> dict:
    return experiment_doc(EXPERIMENT.name)


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
    assert_one_line_error(res, "method[0].provider.arguments.role", "'api', 'engine', 'worker' or 'container'")


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


@pytest.mark.parametrize("mangle, needles", [
    (lambda d: d["configuration"].update(specchoas=d["configuration"].pop("specchaos")),
     ["configuration.specchaos", "missing", "configuration.specchoas a misspelling"]),
    (lambda d: d.pop("configuration"), ["configuration.specchaos", "missing"]),
])
def test_a_missing_or_misspelled_specchaos_block_is_refused(tmp_path, models_built, mangle, needles):
    """Without configuration.specchaos every limit would silently be a built-in default."""
    d = doc()
    mangle(d)
    res = cli("validate", str(write(tmp_path, d)))
    assert_one_line_error(res, *needles)


@pytest.mark.parametrize("duration, needle", [
    (float("inf"), "finite number"), (True, "valid number"), ("10", "valid number"), (-1, "greater than or equal to 0"),
])
def test_a_fault_duration_must_be_a_finite_number(tmp_path, models_built, duration, needle):
    d = doc()
    d["method"][0]["provider"]["arguments"]["duration_s"] = duration
    res = cli("validate", str(write(tmp_path, d)))
    assert_one_line_error(res, "method[0].provider.arguments.duration_s", needle)


def test_the_load_outlasts_the_method():
    from harness.experiment.validate import method_hold_s

    d = doc()
    d["method"][0]["provider"]["arguments"]["duration_s"] = 600
    d["method"][0]["pauses"] = {"before": 5, "after": 2.5}
    assert method_hold_s(d) == 607.5


def test_buckets_out_of_order(tmp_path, no_new_processes):
    d = doc()
    load = d["configuration"]["specchaos"]["load"]
    for k in ("short_prompts", "medium_prompts", "long_prompts"):
        load.pop(k)
    load["buckets"] = [{"name": "long", "min_prompt_tokens": 400, "max_prompt_tokens": 500, "count": 2},
                       {"name": "short", "min_prompt_tokens": 16, "max_prompt_tokens": 60, "count": 4}]
    res = cli("run", str(write(tmp_path, d)), "--out", str(tmp_path / "o"))
    assert_one_line_error(res, "configuration.specchaos.load.buckets", "increasing order without overlap",
                          "[1] short (16..60 tokens)")
    assert not (tmp_path / "o" / "records.jsonl").exists()


def test_mirror_without_the_reference_server(tmp_path, no_new_processes):
    d = doc()
    spec = d["configuration"]["specchaos"]
    spec["stack"]["reference"] = False
    spec["integrity"]["min_compared"] = 0
    spec["load"]["mirror"] = True
    res = cli("validate", str(write(tmp_path, d)))
    assert_one_line_error(res, "configuration.specchaos", "load.mirror needs the reference server")


def test_sampling_class_with_top_p_out_of_range(tmp_path, no_new_processes):
    d = doc()
    d["configuration"]["specchaos"]["load"]["sampling"] = [{"name": "greedy"}, {"name": "hot", "temperature": 1.0,
                                                                                 "top_p": 1.5}]
    res = cli("validate", str(write(tmp_path, d)))
    assert_one_line_error(res, "configuration.specchaos.load.sampling.1.top_p")


@pytest.mark.parametrize("request_class, needles", [
    ({"name": "tools", "body": {"tools": [{"type": "function", "function": {"name": "f"}}]}},
     ("configuration.specchaos.load.request_classes.0", "request class 'tools' (completions): body.tools: belongs "
                                                        "to /v1/chat/completions, not /v1/completions")),
    ({"name": "lp", "endpoint": "chat", "body": {"logprobs": 2}}, ("request class 'lp' (chat): body.logprobs",)),
])
def test_request_class_body_the_endpoint_would_refuse(tmp_path, no_new_processes, request_class, needles):
    d = doc()
    d["configuration"]["specchaos"]["load"]["request_classes"] = [request_class]
    assert_one_line_error(cli("validate", str(write(tmp_path, d))), *needles)


@pytest.mark.parametrize("workers, needles", [
    (3, ("configuration.specchaos.load", "workers (3) exceeds users (2)")),
    (-1, ("configuration.specchaos.load.workers",)),
])
def test_bad_load_workers(tmp_path, no_new_processes, workers, needles):
    d = doc()
    d["configuration"]["specchaos"]["load"].update(users=2, workers=workers)
    res = cli("validate", str(write(tmp_path, d)))
    assert_one_line_error(res, *needles)


@pytest.mark.parametrize("profile, needle", [
    ({"kind": "open", "rate": 4, "max_in_flight": 2}, "workers (3) exceeds profile.max_in_flight (2)"),
    ({"steps": [{"at_s": 5, "users": 2}]}, "workers (3) exceeds the profile's most users (2)"),
])
def test_more_workers_than_an_open_loop_or_shape_can_use_are_refused(tmp_path, no_new_processes, profile, needle):
    d = doc()
    d["configuration"]["specchaos"]["load"].update(users=1, workers=3, profile=profile)
    res = cli("validate", str(write(tmp_path, d)))
    assert_one_line_error(res, "configuration.specchaos.load", needle)


@pytest.mark.parametrize("block,field,value", [
    ("speculation", "collapse_max_drop", 1.5),
    ("speculation", "window_s", 0),
    ("server_memory", "max_rss_swing", -0.1),
    ("scrape", "interval_s", 0),
])
def test_bad_speculation_memory_and_scrape_limits(tmp_path, no_new_processes, models_built, block, field, value):
    d = doc()
    d["configuration"]["specchaos"][block] = {field: value}
    res = cli("run", str(write(tmp_path, d)), "--out", str(tmp_path / "o"))
    assert_one_line_error(res, f"configuration.specchaos.{block}.{field}")


@pytest.mark.parametrize("profile, field, needle", [
    ({"kind": "open", "rate": 5, "burst": 2}, "load.profile.burst", "unknown field 'burst' (did you mean burstiness?"),
    ({"kind": "open", "rate": 0}, "load.profile.rate", "greater than 0"),
    ({"kind": "open", "rate": -2}, "load.profile.rate", "greater than 0"),
    ({"kind": "open", "rate": 4, "burstiness": 0}, "load.profile.burstiness", "greater than 0"),
    ({"kind": "open", "rate": 4, "steps": [{"at_s": 5, "users": 3}]}, "load.profile",
     "steps[0] of a open-loop profile needs rate"),
])
def test_bad_workload_profile(tmp_path, no_new_processes, profile, field, needle):
    d = doc()
    d["configuration"]["specchaos"]["load"]["profile"] = profile
    res = cli("run", str(write(tmp_path, d)), "--out", str(tmp_path / "o"))
    assert_one_line_error(res, f"configuration.specchaos.{field}", needle)
    assert not (tmp_path / "o" / "records.jsonl").exists()


def test_bad_retry_policy(tmp_path, no_new_processes):
    d = doc()
    d["configuration"]["specchaos"]["load"]["retry"] = {"max_retries": 2, "jitter": "sometimes"}
    assert_one_line_error(cli("validate", str(write(tmp_path, d))), "configuration.specchaos.load.retry.jitter")


def test_bucket_longer_than_the_context(tmp_path, no_new_processes):
    d = doc()
    load = d["configuration"]["specchaos"]["load"]
    for k in ("short_prompts", "medium_prompts", "long_prompts"):
        load.pop(k)
    load["buckets"] = [{"name": "short", "min_prompt_tokens": 16, "max_prompt_tokens": 60, "count": 4},
                       {"name": "huge", "min_prompt_tokens": 900, "max_prompt_tokens": 1000, "count": 1,
                        "max_tokens": 64}]
    res = cli("run", str(write(tmp_path, d)), "--out", str(tmp_path / "o"))
    assert_one_line_error(res, "configuration.specchaos", "the longest prompts (1000 tokens) plus its max_tokens (64)",
                          "stack.max_model_len (1024) in bucket huge")


def test_max_model_len_longer_than_the_models_context(tmp_path, no_new_processes, models_built):
    d = doc()
    d["configuration"]["specchaos"]["stack"]["max_model_len"] = 4096
    res = cli("validate", str(write(tmp_path, d)))
    assert_one_line_error(res, "configuration.specchaos.stack.max_model_len", "exceeds the target model's context",
                          "2048 tokens")


@pytest.mark.parametrize("typo, needles", [
    (("rollbacks:", "rollback:"), [": rollback: unknown key 'rollback'", "did you mean rollbacks?"]),
    (("steady-state-hypothesis:", "steady-state-hypothesys:"),
     [": steady-state-hypothesys: unknown key", "did you mean steady-state-hypothesis?"]),
    (("arguments: {role: worker}", "argument: {role: worker}"),
     ["method[0].provider.argument: unknown key 'argument'", "did you mean arguments?"]),
    (("- type: action\n    name: kill-worker", "- type: action\n    nam: kill-worker"),
     ["method[0].nam: unknown key 'nam'", "did you mean name?"]),
], ids=["rollback", "hypothesis", "argument", "activity-name"])
def test_a_key_chaos_toolkit_would_ignore_is_refused(tmp_path, no_new_processes, typo, needles):
    """Chaos Toolkit ignores keys it does not read: a misspelt ``rollbacks``, hypothesis or
    ``arguments`` would drop what it holds (a kill of the default role instead of the one
    written). Refused at validate, one line naming the key and the nearest known one."""
    text = (ROOT / "experiments" / "minimal.yaml").read_text()
    assert typo[0] in text
    res = cli("validate", str(write(tmp_path, text.replace(typo[0], typo[1], 1))))
    assert_one_line_error(res, *needles)


def test_a_misspelt_field_of_the_specchaos_block_names_the_known_ones(tmp_path, no_new_processes):
    text = (ROOT / "experiments" / "minimal.yaml").read_text().replace("baseline_s: 20", "baselin_s: 20")
    res = cli("validate", str(write(tmp_path, text)))
    assert_one_line_error(res, "configuration.specchaos.phases.baselin_s: unknown field 'baselin_s'",
                          "did you mean baseline_s?", "known: warmup_s, baseline_s")

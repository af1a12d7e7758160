"""vLLM's quirks written once (exit codes, command line) and the launcher factory."""

from __future__ import annotations

import pytest

from harness.errors import SpecchaosError
from harness.stack import launchers
from harness.stack.config import StackConfig
from harness.stack.local import LocalStack
from harness.stack.vllm import API_SERVER_MODULE, api_server_argv, describe_exit


def test_describe_exit_explains_vllms_code_0():
    assert "EngineDeadError" in describe_exit(0) and "not a clean stop" in describe_exit(0)
    assert describe_exit(0, expected=True) == "code 0"
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(1) == "code 1"
    assert describe_exit(None) == "still running"


def test_api_server_argv_has_no_shell_and_keeps_extra_args_whole():
    argv = api_server_argv("/m/t", served_model_name="t", host="127.0.0.1", port=8000,
                           speculative_config={"method": "ngram", "num_speculative_tokens": 3},
                           extra_args=["--foo", "a b; rm -rf /"])
    assert argv[1:3] == ["-m", API_SERVER_MODULE]
    assert argv[-2:] == ["--foo", "a b; rm -rf /"]
    assert argv[argv.index("--speculative-config") + 1] == '{"method": "ngram", "num_speculative_tokens": 3}'


def test_make_stack_builds_the_named_launcher(tmp_path, monkeypatch):
    stack = launchers.make_stack(StackConfig(), tmp_path)
    assert isinstance(stack, LocalStack) and stack.launcher == "local" and stack.servers == {}

    class Custom(LocalStack):
        launcher = "custom"

    monkeypatch.setitem(launchers.LAUNCHERS, "custom", Custom)
    assert isinstance(launchers.make_stack(StackConfig(launcher="custom"), tmp_path), Custom)


def test_launchers_from_the_environment(monkeypatch):
    monkeypatch.setenv(launchers.ENV_VAR, "mine=harness.stack.local:LocalStack")
    monkeypatch.setattr(launchers, "LAUNCHERS", dict(launchers.LAUNCHERS))
    assert "mine" in launchers.launcher_names()
    assert launchers.launcher_class("mine") is LocalStack
    monkeypatch.setenv(launchers.ENV_VAR, "broken")
    with pytest.raises(SpecchaosError, match="malformed"):
        launchers.launcher_names()


def test_a_launcher_that_cannot_be_imported_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(launchers.LAUNCHERS, "ghost", "no_such_module:Stack")
    with pytest.raises(SpecchaosError, match="cannot be loaded"):
        launchers.launcher_class("ghost")
    with pytest.raises(SpecchaosError, match="unknown launcher"):
        launchers.launcher_class("never-registered")

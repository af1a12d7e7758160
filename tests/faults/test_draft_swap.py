"""``draft-swap``: parameters, the validate-time model check, and inject → evidence → clear
through the generic injector against the harness's supervisor around the fake vLLM under
greedy load (the fake accepts each draft position of ``draft-acc20`` with probability 0.2,
of ``draft-exact`` always), plus bad input through the real CLI."""

from __future__ import annotations

import threading

import httpx
import pytest

import faults.draft_swap as ds
from faults.draft_swap import DraftSwap, DraftSwapParams, acceptance
from faults.registry import REGISTRY, make_fault
from harness.errors import ExperimentError, ModelError
from harness.stack.breaker import BreakerConfig, SpeculationBreaker
from harness.stack.config import StackConfig
from harness.stack.vllm import speculative_config
from tests.experiment.test_bad_input import EXPERIMENT, assert_one_line_error, cli
from tests.experiment.files import experiment_doc, write
from tests.stack.test_breaker import feed_breaker

from .conftest import ServersStack


#: Bounds of draft-acc20's acceptance rate on the fake: it accepts each of k = 4 draft
#: positions with p = 0.2 up to the first rejection, so Δaccepted ÷ Δdraft tokens is about
#: (p + p² + p³ + p⁴) ÷ 4 ≈ 0.06 (measured 0.04–0.07 over a 2 s window), and draft-exact's 1.
ACC20_RATE = (0.01, 0.4)


class GreedyLoad:
    """Two threads sending greedy 24-token completions until stopped (errors ignored:
    the server restarts under them)."""

    def __init__(self, base_url: str, model: str):
        self.base_url, self.model = base_url, model
        self.stop_ = threading.Event()
        self.ok = 0
        self.threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(2)]

    def _loop(self, i: int) -> None:
        with httpx.Client(trust_env=False, timeout=10) as c:
            n = 0
            while not self.stop_.is_set():
                n += 1
                try:
                    r = c.post(self.base_url + "/v1/completions", json={
                        "model": self.model, "prompt": f"prompt {i} {n}", "max_tokens": 24, "temperature": 0,
                        "ignore_eos": True})
                    self.ok += r.status_code == 200
                except httpx.HTTPError:
                    self.stop_.wait(0.1)

    def __enter__(self) -> "GreedyLoad":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_.set()
        for t in self.threads:
            t.join(15)


def test_registered_with_a_typed_action():
    assert REGISTRY["draft-swap"] is DraftSwap and DraftSwap.activity == "swap_draft"


@pytest.mark.parametrize("params, needle", [
    ({}, "changes nothing"),
    ({"method": "ngram", "draft": "draft-exact"}, "uses no draft model"),
    ({"method": "none", "draft": "draft-exact"}, "uses no draft model"),
    ({"method": "none", "num_speculative_tokens": 2}, "plain decoding"),
    ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"method": "medusa"}, "method"),
    ({"draft": "x", "colour": "red"}, "unknown argument"),
])
def test_bad_params(params, needle):
    with pytest.raises(ExperimentError) as ei:
        make_fault("draft-swap", params, where="exp.yaml: method[0].provider")
    assert needle in ei.value.one_line()


def test_check_stack_refuses_a_missing_draft(models):
    f = DraftSwap(DraftSwapParams(draft="draft-nope"))
    with pytest.raises(ModelError) as ei:
        f.check_stack(StackConfig(models_dir=str(models)))
    assert ei.value.where == "draft" and "draft-nope" in ei.value.message
    DraftSwap(DraftSwapParams(draft="draft-acc20")).check_stack(StackConfig(models_dir=str(models)))
    DraftSwap(DraftSwapParams(draft=str(models / "draft-acc20"))).check_stack(StackConfig(models_dir="elsewhere"))


def test_acceptance_of_counter_deltas():
    names = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
             "vllm:spec_decode_num_accepted_tokens_total")
    a = acceptance(dict(zip(names, (10, 40, 30))), dict(zip(names, (20, 80, 40))))
    assert a == {"drafts": 10, "draft_tokens": 40, "accepted_tokens": 10, "acceptance_rate": 0.25,
                 "mean_acceptance_length": 2.0}
    assert acceptance(None, None)["acceptance_rate"] is None


def test_swap_to_a_bad_draft_under_load_then_restore(fake_server, models, make_injector):
    exact = (models / "draft-exact").resolve()
    srv = fake_server(model_dir=models / "target", ready=True, speculative_config=speculative_config("draft_model", exact, 4),
                      fake_args=["--step-delay-s", "0.01"])
    inj = make_injector(ServersStack(spec=srv))
    with GreedyLoad(srv.base_url, srv.model) as load:
        while load.ok < 10:
            load.stop_.wait(0.1)
        h = inj.inject("draft-swap", {"draft": "draft-acc20", "measure_s": 2.0})
        assert h.facts["old"]["draft"] == str(exact) and h.facts["incarnation"] == 1
        ev = inj.collect_evidence(h, 30)
        assert ev.acted, ev.detail
        assert ev.observations["new"]["draft"].endswith("draft-acc20")
        assert ACC20_RATE[0] < ev.observations["after"]["acceptance_rate"] < ACC20_RATE[1], ev.observations
        assert ev.observations["before"]["acceptance_rate"] > 0.8
        inj.clear(h)
        assert srv.wait_for_incarnation(2, 30) is not None
    assert srv.speculative["draft"] == str(exact)
    inj.clear(h)   # idempotent: no third restart
    assert srv.incarnation == 2 and srv.restarts == []
    events = srv.respeculations
    assert [e["new"]["draft"].rsplit("/", 1)[-1] for e in events] == ["draft-acc20", "draft-exact"]
    assert "cleared" in events[1]["reason"]


def test_swap_to_plain_decoding_is_evidenced_by_no_spec_counters(fake_server, models, make_injector):
    srv = fake_server(model_dir=models / "target", ready=True,
                      speculative_config=speculative_config("draft_model", models / "draft-exact", 4))
    inj = make_injector(ServersStack(spec=srv))
    h = inj.inject("draft-swap", {"method": "none", "measure_s": 1.0})
    ev = inj.collect_evidence(h, 30)
    assert ev.acted and ev.observations["spec_metrics"] is False and ev.observations["new"]["method"] is None
    inj.clear_all()


def test_a_swap_without_load_is_no_evidence(fake_server, models, make_injector):
    srv = fake_server(model_dir=models / "target", ready=True,
                      speculative_config=speculative_config("draft_model", models / "draft-exact", 4))
    inj = make_injector(ServersStack(spec=srv))
    h = inj.inject("draft-swap", {"num_speculative_tokens": 2, "measure_s": 1.0})
    ev = inj.collect_evidence(h, 30)
    assert not ev.acted and "no draft tokens" in ev.detail
    inj.clear_all()


def test_validate_refuses_a_swap_to_a_missing_model(tmp_path):
    d = experiment_doc(EXPERIMENT.name)
    d["method"][0]["provider"] = {"type": "python", "module": "harness.experiment.actions", "func": "swap_draft",
                                  "arguments": {"draft": "draft-missing", "duration_s": 10}}
    res = cli("validate", str(write(tmp_path, d)))
    assert_one_line_error(res, "method[0].provider.arguments.draft", "draft-missing")


def test_restore_false_leaves_the_settings_in_force(fake_server, models, make_injector):
    srv = fake_server(model_dir=models / "target", ready=True,
                      speculative_config=speculative_config("draft_model", models / "draft-exact", 4))
    inj = make_injector(ServersStack(spec=srv))
    h = inj.inject("draft-swap", {"method": "none", "restore": False, "measure_s": 1.0})
    assert inj.collect_evidence(h, 30).acted
    inj.clear(h)
    assert srv.incarnation == 1 and srv.speculative["method"] is None and len(srv.respeculations) == 1


def test_evidence_cut_short_by_another_restart_uses_the_counters_from_zero(fake_server, models, make_injector,
                                                                           monkeypatch):
    """A breaker restarting the server right after the swap leaves one read of /metrics: the
    new incarnation's counters started at 0, so that read alone is the measurement."""
    import faults.draft_swap as ds

    srv = fake_server(model_dir=models / "target", ready=True, fake_args=["--step-delay-s", "0.005"],
                      speculative_config=speculative_config("draft_model", models / "draft-exact", 4))
    inj = make_injector(ServersStack(spec=srv))
    real_read = ds.read_metrics

    def read_then_restart(*a, **kw):
        m = real_read(*a, **kw)
        if srv.incarnation == 1 and not srv.respeculations[1:]:
            srv.respeculate(None, reason="test: another restart")
        return m

    with GreedyLoad(srv.base_url, srv.model) as load:
        h = inj.inject("draft-swap", {"draft": "draft-acc20", "measure_s": 2.0})
        srv.wait_for_incarnation(1, 30)
        while load.ok < 20:
            load.stop_.wait(0.1)
        monkeypatch.setattr(ds, "read_metrics", read_then_restart)
        ev = inj.collect_evidence(h, 30)
    assert ev.acted, ev.detail
    assert ev.observations["after"]["draft_tokens"] > 0 and 0 < ev.observations["window_s"] < 2.0
    assert srv.incarnation == 2
    inj.clear_all()


# A loaded host (issue 17): the swap's new incarnation is slow to start and slow to answer
# /metrics. The delays are scaled to the windows the test configures, so it takes seconds.

def test_a_restart_slower_than_the_evidence_timeout_still_gets_its_evidence(fake_server, models, make_injector):
    """The new incarnation is ready only after twice the evidence timeout: the wait for it is
    the stack's limit for a start, the evidence timeout counts from readiness."""
    timeout_s = 1.0
    srv = fake_server(model_dir=models / "target", ready=True, fake_args=["--step-delay-s", "0.01"],
                      speculative_config=speculative_config("draft_model", models / "draft-exact", 4))
    srv.fake_args += ["--ready-after", str(2 * timeout_s)]   # every later incarnation starts slowly
    inj = make_injector(ServersStack(spec=srv))
    with GreedyLoad(srv.base_url, srv.model) as load:
        while load.ok < 10:
            load.stop_.wait(0.1)
        h = inj.inject("draft-swap", {"draft": "draft-acc20", "measure_s": 1.0})
        ev = inj.collect_evidence(h, timeout_s)
    assert ev.acted, ev.detail
    assert ev.observations["ready_after_s"] > 2 * timeout_s
    assert ACC20_RATE[0] < ev.observations["after"]["acceptance_rate"] < ACC20_RATE[1], ev.observations
    inj.clear_all()


def test_metrics_answering_late_on_the_new_incarnation_are_read_again(fake_server, models, make_injector,
                                                                      monkeypatch):
    """/metrics of the new incarnation answers only after the window the evidence used to read
    in (``measure_s`` + one read's timeout from readiness) has passed: the reads are retried
    within the evidence timeout, and the window is measured from the first one that answered."""
    import faults.draft_swap as ds

    monkeypatch.setattr(ds, "METRICS_TIMEOUT_S", 0.5)   # one read's bound, scaled with the stall below
    measure_s = 1.0
    srv = fake_server(model_dir=models / "target", ready=True, fake_args=["--step-delay-s", "0.01"],
                      speculative_config=speculative_config("draft_model", models / "draft-exact", 4))
    srv.fake_args += ["--metrics-stall-s", str(measure_s + ds.METRICS_TIMEOUT_S + 2.0)]
    inj = make_injector(ServersStack(spec=srv))
    with GreedyLoad(srv.base_url, srv.model) as load:
        while load.ok < 10:
            load.stop_.wait(0.1)
        h = inj.inject("draft-swap", {"draft": "draft-acc20", "measure_s": measure_s})
        ev = inj.collect_evidence(h, 30)
    assert ev.acted, ev.detail
    assert ev.observations["window_s"] >= measure_s
    assert ACC20_RATE[0] < ev.observations["after"]["acceptance_rate"] < ACC20_RATE[1], ev.observations
    inj.clear_all()


def test_a_new_incarnation_that_never_becomes_ready_is_a_judged_outage(fake_server, models, make_injector):
    """The swapped server never becomes ready within the stack's startup timeout: the swap
    acted (the old incarnation is gone) and the server did not come back, which the recovery
    checks judge; it is not a fault without evidence (a run error)."""
    srv = fake_server(model_dir=models / "target", ready=True,
                      speculative_config=speculative_config("draft_model", models / "draft-exact", 4))
    old_api = srv.api_process()
    srv.startup_timeout_s = 1.0                     # the stack's limit for a start, scaled down
    srv.fake_args += ["--ready-after", "600"]       # later incarnations never become ready
    inj = make_injector(ServersStack(spec=srv))
    h = inj.inject("draft-swap", {"draft": "draft-acc20", "measure_s": 1.0})
    ev = inj.collect_evidence(h, 30)
    assert ev.acted, ev.detail
    assert ev.observations["ready_after_s"] is None and ev.observations["after"] is None
    assert "not ready within the stack's startup timeout" in ev.detail and "recovery" in ev.detail
    assert srv.incarnation >= 1 and old_api.pid not in {p.pid for p in srv.roles()["api"]}
    inj.clear_all()


def test_a_breaker_replacing_the_new_incarnation_before_a_read_supplies_the_acceptance(
        fake_server, models, make_injector, monkeypatch):
    """The fault's reads of /metrics fail on the new incarnation (a loaded host) while the
    circuit breaker, fed by its own poller, trips on the bad draft and restarts the server
    plain: the acceptance is the breaker's measurement of that incarnation."""
    srv = fake_server(model_dir=models / "target", ready=True, fake_args=["--step-delay-s", "0.01"],
                      speculative_config=speculative_config("draft_model", models / "draft-exact", 4))
    inj = make_injector(ServersStack(spec=srv))
    breaker = SpeculationBreaker(BreakerConfig(enabled=True, window_s=1.0, min_draft_tokens=20), srv,
                                 inj.ctx.timeline)
    real_read = ds.read_metrics
    monkeypatch.setattr(ds, "read_metrics", lambda *a, **kw: real_read(*a, **kw) if srv.incarnation == 0 else None)

    def poll() -> None:   # the run's metrics scraper, in small
        feed_breaker(breaker, srv.base_url, load.stop_)

    with GreedyLoad(srv.base_url, srv.model) as load:
        while load.ok < 10:
            load.stop_.wait(0.1)
        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        h = inj.inject("draft-swap", {"draft": "draft-acc20", "measure_s": 1.0, "restore": False})
        ev = inj.collect_evidence(h, 30)
    poller.join(10)
    breaker.stop()
    assert ev.acted, ev.detail
    (trip,) = inj.ctx.timeline.select(event="breaker_tripped")
    assert trip["incarnation"] == 2 and "circuit breaker" in ev.observations["measured_by"]
    assert ev.observations["after"]["acceptance_rate"] == pytest.approx(1 - trip["rejection_rate"], abs=1e-3)
    assert ev.observations["after"]["acceptance_rate"] < 0.5
    inj.clear_all()

"""A state machine over the running stack: greedy requests interleaved with faults that
need no restart, injected and cleared through the harness's own fault driver
(:class:`faults.inject.FaultInjector`, the ledger, the families' evidence), on the
speculative server only (the reference stays the oracle):

* ``process-freeze`` of the engine core (SIGSTOP; requests sent meanwhile wait, in
  threads, and must complete after SIGCONT with the reference's output); its evidence
  (0 tokens while stopped) must show it acted;
* ``network`` latency on the load path, through the fault proxy (prepared once per
  test, transparent while no toxic is on); its evidence (delay measured by the proxy)
  must show it acted whenever a request crossed it;
* ``cpu-throttle`` of the server's process tree (a CFS quota through a cgroup where
  cgroups are writable, else a SIGSTOP/SIGCONT duty cycle); the quota read back (or the
  duty cycle's facts) must show it acted.

After every step with no fault active: no request pending, no fault open in the
ledger, both servers answer ``/health`` and are still the incarnation they were (no
restart), and a canary greedy request still returns the reference's output. A run's
teardown clears whatever is still active; the test clears and releases everything in
``finally`` and asserts the ledger holds no open fault.
"""

from __future__ import annotations

import json
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from faults.inject import FaultHandle, FaultInjector, InjectionContext
from faults.ledger import Ledger
from faults.registry import make_fault
from harness.timeline import Timeline
from tests.property.invariants import response_problems, same_output, settled_problems
from tests.property.profiles import stack_settings
from tests.property.strategies import requests
from tests.property.wire import Completion, expect

# nightly only: make test's real-stack experiments apply the same three families, each judged whole
pytestmark = [pytest.mark.stack, pytest.mark.nightly, pytest.mark.budget, pytest.mark.timeout(1800)]

#: The network fault's arguments: prepared once (its proxy), injected as often as drawn.
LATENCY = {"server": "spec", "toxic": "latency", "attributes": {"latency": 40, "jitter": 10}}
FREEZE = {"server": "spec", "role": "engine"}
THROTTLE = {"server": "spec", "cpu_fraction": 0.3}
#: The canary asked after every step (short, greedy, 24 tokens).
CANARY = {"prompt": "The bridge over the river", "max_tokens": 24, "temperature": 0, "return_token_ids": True}
#: Seconds a request sent while the engine is stopped may take once it is resumed.
PENDING_TIMEOUT_S = 120.0


class FaultyStack(RuleBasedStateMachine):
    """See the module doc. ``env``: ``api`` (:class:`tests.property.conftest.Api`),
    ``stack``, ``injector`` (prepared with :data:`LATENCY`), ``ledger``."""

    def __init__(self, env: Any):
        super().__init__()
        self.env = env
        self.api = env.api
        self.inj: FaultInjector = env.injector
        self.active: FaultHandle | None = None
        self.crossed = 0                 # requests sent through the proxy while the toxic was on
        self.pending: list[tuple[dict[str, Any], Future]] = []
        self.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="frozen-request")
        self.incarnations = {name: s.incarnation for name, s in env.stack.servers.items()}

    # ------------------------------------------------------------------ helpers
    def spec_url(self) -> str:
        return self.inj.ctx.load_urls["spec"]        # the proxy once the network fault is prepared

    def reference(self, body: dict[str, Any]) -> Completion:
        key = json.dumps(body, sort_keys=True)
        if key not in self.env.refs:
            self.env.refs[key] = self.api.ask("ref", body)
        return self.env.refs[key]

    def judge(self, got: Completion, body: dict[str, Any]) -> None:
        ref = self.reference(body)
        problems = ([f"spec: {p}" for p in response_problems(got, self.api.decode, self.api.eos_id)]
                    + same_output(got, ref))
        if problems:
            problems.append(f"(fault active: {self.active.kind if self.active else 'none'}; "
                            f"faults so far: {[h.kind for h in self.inj.handles]})")
        expect(problems, got, ref)

    # ------------------------------------------------------------------ rules
    @rule(body=requests(long=False))
    def request(self, body: dict[str, Any]) -> None:
        """A greedy request to the speculative server (through the proxy): judged at once,
        or — the engine being stopped — sent from a thread and judged after the clear."""
        if self.active is not None and self.active.kind == "process-freeze":
            self.pending.append((body, self.pool.submit(self.api.ask, "spec", body, self.spec_url())))
            return
        if self.active is not None and self.active.kind == "network":
            self.crossed += 1
        self.judge(self.api.ask("spec", body, self.spec_url()), body)

    @precondition(lambda self: self.active is None)
    @rule()
    def freeze_engine(self) -> None:
        self.active = self.inj.inject("process-freeze", FREEZE, where="stateful: freeze_engine")
        ev = self.inj.collect_evidence(self.active, timeout_s=15)
        assert ev.acted, f"process-freeze did not act: {ev.detail}"

    @precondition(lambda self: self.active is None)
    @rule()
    def add_latency(self) -> None:
        self.active = self.inj.inject("network", LATENCY, where="stateful: add_latency")
        self.crossed = 0

    @precondition(lambda self: self.active is None)
    @rule()
    def throttle_cpu(self) -> None:
        self.active = h = self.inj.inject("cpu-throttle", THROTTLE, where="stateful: throttle_cpu")
        f = h.facts
        acted = (f.get("mechanism") == "cgroup" and bool(f.get("read_back")) and bool(f.get("pids"))) \
            or (f.get("mechanism") == "duty_cycle" and bool(f.get("freezes")))
        assert acted, f"cpu-throttle left no trace of acting: {f}"

    @precondition(lambda self: self.active is not None)
    @rule()
    def clear_fault(self) -> None:
        """Clear the active fault; the requests it held must now complete like the reference's."""
        h, self.active = self.active, None
        if h.kind == "network" and self.crossed:
            ev = self.inj.collect_evidence(h, timeout_s=5)
            assert ev.acted, f"latency toxic on {self.crossed} requests, no delay measured: {ev.detail}"
        self.inj.clear(h)
        pending, self.pending = self.pending, []
        for body, fut in pending:
            self.judge(fut.result(timeout=PENDING_TIMEOUT_S), body)

    # ------------------------------------------------------------------ invariants
    @invariant()
    def healthy_when_no_fault(self) -> None:
        if self.active is not None:
            return
        health: dict[str, int | None] = {}
        for name, server in self.env.stack.servers.items():
            try:
                health[name] = httpx.get(f"{server.base_url}/health", timeout=10, trust_env=False).status_code
            except httpx.HTTPError:
                health[name] = None
        now = {name: (self.incarnations[name], s.incarnation) for name, s in self.env.stack.servers.items()}
        expect(settled_problems(self.env.ledger.open_faults(), health, now, len(self.pending)))
        self.judge(self.api.ask("spec", CANARY, self.spec_url()), CANARY)

    def teardown(self) -> None:
        try:
            failures = self.inj.clear_all()
            assert not failures, f"faults not cleared: {failures}"
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)


def test_faults_without_restart_keep_greedy_output_and_health(api, real_stack, tmp_path):
    """Runs :class:`FaultyStack` (``ci``: 2 runs of up to 6 steps; ``nightly``: 10 of up to 25)."""
    stack = real_stack.stack
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ctx = InjectionContext(stack, Timeline(tmp_path / "timeline.jsonl"), ledger,
                           load_urls={name: s.base_url for name, s in stack.servers.items()})
    inj = FaultInjector(ctx)
    env = type("Env", (), {})()
    env.api, env.stack, env.injector, env.ledger, env.refs = api, stack, inj, ledger, {}
    try:
        inj.prepare([make_fault("network", LATENCY)])
        run_state_machine_as_test(lambda: FaultyStack(env), settings=stack_settings(2, 10))
    finally:
        left = inj.clear_all()
        inj.release_all()
    assert not left and not ledger.open_faults(), (left, ledger.open_faults())
    kinds = sorted({e["kind"] for e in ledger.entries()})
    print(f"\n[measure] stateful: {len(ledger.entries())} faults injected and cleared ({', '.join(kinds)})")

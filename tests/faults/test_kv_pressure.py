"""``kv-pressure`` against the fake vLLM under the harness's supervisor: the fake emulates a
KV cache of ``--num-gpu-blocks-override`` blocks (a step needing more counts a
preemption), so the fault's clients, evidence and clear are exercised in seconds. On real
vLLM the same fault is judged by ``experiments/memory-pressure.yaml``
(tests/experiment/test_memory_pressure.py)."""

import threading

import pytest
from pydantic import ValidationError

from faults.kv_pressure import KvPressureParams, pressure_prompt, read_kv_metrics
from harness.errors import FaultError

from .conftest import ServersStack

pytestmark = pytest.mark.timeout(60)


def pressure_threads():
    return [t for t in threading.enumerate() if t.name.startswith("kv-pressure-")]


def test_a_small_cache_preempts_and_the_evidence_counts_it(fake_server, make_injector):
    spec = fake_server(ready=True, kv_cache_blocks=2)           # 256 tokens of cache
    inj = make_injector(ServersStack(spec=spec))
    h = inj.inject("kv-pressure", {"concurrency": 4, "prompt_tokens": 200, "max_tokens": 64})
    assert h.facts["preemptions_before"] == 0
    ev = inj.collect_evidence(h, 10)
    o = ev.observations
    assert ev.acted, ev.detail
    assert o["preemptions"] >= 1 and o["kv_usage_max"] > 0.5 and o["requests_sent"] >= 4
    assert "preemption(s)" in ev.detail
    inj.clear(h)
    assert pressure_threads() == []
    sent = o["requests_sent"]
    assert read_kv_metrics(spec.base_url) is not None          # the server is fine
    assert h.fault._counts["sent"] >= sent


def test_a_cache_large_enough_is_no_evidence(fake_server, make_injector):
    spec = fake_server(ready=True)                              # no emulated limit: never preempts
    inj = make_injector(ServersStack(spec=spec))
    h = inj.inject("kv-pressure", {"concurrency": 2, "prompt_tokens": 64, "max_tokens": 8})
    ev = inj.collect_evidence(h, 1.5)
    assert not ev.acted and ev.observations["preemptions"] == 0
    assert "no preemption" in ev.detail and "kv_cache_blocks" in ev.detail
    inj.clear(h)
    assert pressure_threads() == []


def test_requests_are_bounded(fake_server, make_injector):
    spec = fake_server(ready=True)
    inj = make_injector(ServersStack(spec=spec))
    h = inj.inject("kv-pressure", {"concurrency": 3, "prompt_tokens": 16, "max_tokens": 2, "max_requests": 5})
    for t in list(h.fault._threads):
        t.join(10)
    assert h.fault._counts["sent"] == 5 and h.fault._counts["completed"] == 5
    inj.clear(h)


def test_a_server_that_does_not_answer_is_refused_before_anything_starts(fake_server, make_injector):
    spec = fake_server()                                        # never started: nothing listens
    inj = make_injector(ServersStack(spec=spec))
    with pytest.raises(FaultError, match="/metrics did not answer"):
        inj.inject("kv-pressure", {})
    assert pressure_threads() == []
    assert [e["state"] for e in inj.ctx.ledger.entries()] == ["cleared"]


def test_prompt_length_is_about_what_was_asked():
    assert len(pressure_prompt(512).split()) == 256


@pytest.mark.parametrize("args, field", [
    ({"concurrency": 0}, "concurrency"), ({"concurrency": 65}, "concurrency"), ({"prompt_tokens": 8}, "prompt_tokens"),
    ({"max_tokens": 0}, "max_tokens"), ({"max_requests": 0}, "max_requests"), ({"request_timeout_s": 0}, "request_timeout_s"),
])
def test_bad_parameters_name_the_field(args, field):
    with pytest.raises(ValidationError) as ei:
        KvPressureParams(**args)
    assert ei.value.errors()[0]["loc"] == (field,)

"""The network fault's evidence says how much of the traffic its toxic reached: the chunks
and connections on the toxic's stream while it was there, and those it acted on — on
recorded counters (pure) and through the real proxy process, with the whole fault's
figures recorded at clear."""

from __future__ import annotations

import types

from faults.base import Evidence
from faults.network import Network, NetworkParams, reach
from faults.toxics import affected, connection_rng
from harness.timeline import Timeline
from tests.faults.test_proxy import connect, echo, proxy, roundtrip  # noqa: F401 - echo, proxy: its fixtures

STATS = {"connections_seen": 185, "connections_affected": 41, "chunks_seen": 3020, "chunks": 412,
         "added_ms": {"count": 412, "mean": 51.2, "p50": 50.9, "p99": 74.0, "max": 80.1}}


def test_the_detail_says_what_share_of_chunks_and_connections_the_toxic_reached():
    fault = Network(NetworkParams(toxic="latency", toxicity=0.25, attributes={"latency": 50, "jitter": 25}))
    ev = fault._judge(STATS)
    assert ev.acted is True
    assert "delayed 412 of 3,020 chunks (13.6%) on 41 of 185 connections so far" in ev.detail, ev.detail
    assert (ev.observations["chunks_seen"], ev.observations["connections_seen"]) == (3020, 185)


def test_a_toxic_that_met_no_traffic_has_not_acted_and_says_so():
    ev = Network(NetworkParams(toxic="latency", attributes={"latency": 50}))._judge({})
    assert ev.acted is False
    assert "delayed 0 of 0 chunks on 0 of 0 connections" in ev.detail, ev.detail
    assert reach({"chunks": 0, "chunks_seen": 5}) == "0 of 5 chunks (0.0%) on 0 of 0 connections"


def test_through_the_proxy_the_share_follows_the_toxicity_and_the_whole_fault_is_recorded_at_clear(request):
    p = request.getfixturevalue("proxy")(seed=7)
    fault = Network(NetworkParams(server="echo", toxic="latency", toxicity=0.5, seed=7,
                                  attributes={"latency": 5, "jitter": 0}))
    fault.client, fault.fault_id = p.client, "f1"
    fault.facts = fault.proxy_facts(p.client.add_toxic("echo", fault.params.toxic_json(fault.toxic_name)))
    for _ in range(10):
        with connect(p) as s:
            for _ in range(3):
                roundtrip(s, b"ping")
    picked = sum(affected(connection_rng(7, fault.toxic_name, i), 0.5) for i in range(10))
    assert 0 < picked < 10
    fault.first = ev = fault.evidence(types.SimpleNamespace(), timeout_s=5)
    obs = ev.observations
    assert ev.acted is True and (obs["connections_seen"], obs["connections_affected"]) == (10, picked)
    assert (obs["chunks_seen"], obs["chunks"]) == (30, 3 * picked)
    assert f"delayed {3 * picked} of 30 chunks ({picked / 10:.1%}) on {picked} of 10 connections" in ev.detail

    timeline = Timeline()
    fault.clear(types.SimpleNamespace(timeline=timeline))
    final = [e for e in timeline.events if e["event"] == "fault_evidence"]
    assert len(final) == 1 and final[0]["fault_id"] == "f1" and final[0]["acted"] is True
    assert final[0]["evidence"]["observations"]["over"] == "the whole fault"
    assert "over the whole fault" in final[0]["evidence"]["detail"]
    assert p.client.toxics("echo") == []                   # and the toxic is gone
    fault.clear(types.SimpleNamespace(timeline=timeline))   # idempotent: recorded once
    assert len([e for e in timeline.events if e["event"] == "fault_evidence"]) == 1


def test_no_whole_fault_evidence_is_recorded_for_a_toxic_that_never_acted(request):
    p = request.getfixturevalue("proxy")()
    fault = Network(NetworkParams(server="echo", toxic="latency", attributes={"latency": 5}))
    fault.client, fault.fault_id = p.client, "f1"
    fault.facts = fault.proxy_facts(p.client.add_toxic("echo", fault.params.toxic_json(fault.toxic_name)))
    fault.first = Evidence(False)
    timeline = Timeline()
    fault.clear(types.SimpleNamespace(timeline=timeline))
    assert [e for e in timeline.events if e["event"] == "fault_evidence"] == []

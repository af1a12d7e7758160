"""Request classes through the whole experiment path on the fake vLLM (see
:mod:`tests.experiment.fast_e2e`): plain, stop-string, chat JSON-object, logprobs and chat
requests and 3-turn conversations drawn per request under mirror mode and a kill; each class is judged by its
invariants (``integrity.classes``), its greedy responses against the reference server's."""

from __future__ import annotations

import pytest

from harness.load.records import read_records
from tests.experiment.fast_e2e import run_fast

pytestmark = pytest.mark.timeout(180)

CLASSES = [
    {"name": "plain", "weight": 2},
    {"name": "stop", "body": {"stop": [" w1"], "ignore_eos": True}},
    {"name": "json", "endpoint": "chat", "body": {"response_format": {"type": "json_object"}}},
    {"name": "lp", "body": {"logprobs": 1}},
    {"name": "chat", "endpoint": "chat", "body": {"logprobs": True,
                                                  "messages": [{"role": "system", "content": "be brief"}]}},
    {"name": "talk", "endpoint": "chat", "turns": 3, "body": {"max_tokens": 8}},
]
#: 8 users alternating between the servers (mirror mode), as tests/experiment/test_mirror_e2e.py.
LOAD = {"users": 8, "spawn_rate": 8, "mirror": True, "request_classes": CLASSES}


def test_request_classes_are_sent_and_judged_end_to_end(tmp_path):
    code, rep, seconds, out = run_fast(tmp_path, "classes", load=LOAD, mirror={"min_requests": 3})
    print(f"fast request-class run: {seconds:.1f} s, verdict {rep['verdict']}")
    failed = [c for c in rep["checks"] if c["passed"] is False]
    assert code == 0 and rep["verdict"] == "pass", (rep["errors"], failed)
    recs = [r for r in read_records(out / "records.jsonl") if r.source == "load"]
    assert {r.request_class for r in recs} == {c["name"] for c in CLASSES}
    assert {r.endpoint for r in recs if r.request_class in ("json", "chat", "talk")} == {"chat"}
    talk = [r for r in recs if r.request_class == "talk" and r.ok]
    assert {r.turn for r in talk} == {1, 2, 3} and {r.turn for r in recs if r.request_class != "talk"} == {1}
    first = min(r.prompt_tokens for r in talk if r.turn == 1)
    assert min(r.prompt_tokens for r in talk if r.turn == 3) > first   # each turn carries the earlier ones
    classes = rep["integrity"]["classes"]
    assert list(classes) == [c["name"] for c in CLASSES]
    judged = {name: {inv for inv, e in section["invariants"].items() if e["judged"]}
              for name, section in classes.items()}
    assert judged["stop"] >= {"stop", "usage"} and judged["json"] >= {"structured", "usage"}
    assert judged["lp"] >= {"logprobs", "usage"} and judged["chat"] >= {"logprobs", "usage"}
    assert any(section["compared"] for section in classes.values())   # mirror mode's reference
    names = {c["name"] for c in rep["checks"]}
    assert {"integrity.classes.stop.stop", "integrity.classes.json.structured",
            "integrity.classes.chat.logprobs"} <= names
    # the plain reference compares only the classes it predicts; the others are not_comparable
    assert rep["integrity"]["compared"] >= 10 and rep["integrity"]["mismatched"] == 0
    assert rep["integrity"]["not_comparable"] > 0
    # acceptance per request class, beside per bucket and sampling class (the fake: greedy steps of k+1)
    per_class = rep["acceptance_floor"]["request_classes"]
    assert set(per_class) == {c["name"] for c in CLASSES} and per_class["plain"]["acceptance_rate"] > 0.5
    # and latency per request class, per phase
    assert set(rep["phases"]["baseline"]["request_classes"]) == {c["name"] for c in CLASSES}

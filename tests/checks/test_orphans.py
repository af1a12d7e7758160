"""The orphans check over recorded ``server_orphans`` events (pure), and the supervisor
that records them, against the fake vLLM whose engine and worker outlive their parent."""

import time

import psutil
import pytest

from harness.checks import orphans
from harness.checks.run import recorded_run
from harness.experiment.config import SpecchaosConfig
from harness.stack import procs
from tests.factories import ev

EXIT = ev(1010.0, "server_exited", source="stack", server="spec", pid=10, incarnation=0, expected=False)
STOP = ev(1050.0, "server_exited", source="stack", server="spec", pid=20, incarnation=1, expected=True)
ORPHAN = ev(1015.0, "server_orphans", source="stack", server="spec", pid=10, incarnation=0, expected=False,
            grace_s=5.0, orphans=[{"pid": 11, "title": "VLLM::EngineCore", "role": "engine", "rss_bytes": 2**30},
                                  {"pid": 12, "title": "VLLM::Worker", "role": "worker", "rss_bytes": None}])


def judged(events):
    return orphans.check(recorded_run([], [], events, SpecchaosConfig()))


def test_trees_that_followed_their_api_process_pass():
    (c,) = judged([EXIT, STOP])
    assert c.passed and c.name == "orphans.left" and c.category == "orphans"
    assert c.observed == 0 and c.limit == 0 and "2 server exit(s)" in c.detail


def test_an_orphan_fails_with_what_was_left():
    (c,) = judged([EXIT, ORPHAN, STOP])
    assert c.passed is False and c.observed == 2
    assert "VLLM::EngineCore pid 11 (1024 MiB)" in c.detail and "VLLM::Worker pid 12" in c.detail
    sec = orphans.findings([EXIT, ORPHAN, STOP])
    assert sec["server_exits"] == 2 and [o["pid"] for o in sec["orphans"]] == [11, 12]
    assert sec["orphans"][0]["incarnation"] == 0 and sec["orphans"][0]["expected"] is False


def test_no_server_exit_gives_no_result():
    assert judged([]) == []


def _tree(server):
    api = server.api_process()
    return [api] + procs.descendants(api)


def test_supervisor_reports_orphans_of_a_killed_api_and_kills_them(fake_server):
    """The fake's engine and worker ignore their parent's death (``--orphans``), as
    vLLM's did before the reaper: the supervisor reports them, then kills them."""
    s = fake_server(fake_args=["--orphans"], ready=True, orphan_grace_s=0.5)
    tree = _tree(s)
    assert len(tree) == 3
    tree[0].kill()
    assert s.wait_for_incarnation(1, 20) is not None
    (found,) = s.timeline.select(event="server_orphans")
    assert found["incarnation"] == 0 and found["expected"] is False and found["grace_s"] == 0.5
    assert sorted(o["pid"] for o in found["orphans"]) == sorted(p.pid for p in tree[1:])
    assert {o["role"] for o in found["orphans"]} == {"engine", "worker"}
    assert procs.wait_gone(tree[1:], 10) == []          # reported, then killed
    exited = s.timeline.select(event="server_exited")[0]
    assert exited["t"] <= found["t"]


def test_a_tree_that_follows_its_api_process_is_no_finding(fake_server):
    s = fake_server(ready=True)
    tree = _tree(s)
    tree[0].kill()
    assert s.wait_for_incarnation(1, 20) is not None
    s.stop(5)
    assert s.timeline.select(event="server_orphans") == []
    assert len(s.timeline.select(event="server_exited")) == 2
    assert procs.wait_gone(tree, 5) == []

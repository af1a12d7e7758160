"""Planned restarts with other speculative settings (``LocalServer.respeculate``): the
harness's real supervisor around the fake vLLM. The fake reports what it was started with
on its ``/metrics`` (no ``spec_decode`` counters without speculation), so every assertion
is about the process that really serves."""

from __future__ import annotations

import json

import psutil
import pytest

from harness.errors import ModelError, StackError
from harness.stack.vllm import speculative_config
from harness.timeline import Timeline
from tests.fakes import http_client


def _cmdline_config(server) -> dict | None:
    args = psutil.Process(server.api_process().pid).cmdline()
    return json.loads(args[args.index("--speculative-config") + 1]) if "--speculative-config" in args else None


def _spec_metrics(server) -> bool:
    with http_client() as c:
        return "vllm:spec_decode_num_drafts_total" in c.get(server.base_url + "/metrics").text


def test_respeculate_to_plain_and_back_is_a_planned_restart(fake_server, models):
    tl = Timeline()
    exact = models / "draft-exact"
    srv = fake_server(model_dir=models / "target", timeline=tl, ready=True,
                      speculative_config=speculative_config("draft_model", exact, 4))
    old_api = srv.api_process()
    assert srv.speculative == {"method": "draft_model", "draft": str(exact), "num_speculative_tokens": 4}

    inc = srv.respeculate(None, reason="test: plain")
    assert inc == 1
    assert srv.wait_for_incarnation(inc, 30) is not None
    assert not psutil.pid_exists(old_api.pid) or old_api.status() == psutil.STATUS_ZOMBIE
    assert _cmdline_config(srv) is None and not _spec_metrics(srv)
    assert srv.speculative == {"method": None, "draft": None, "num_speculative_tokens": None}

    inc = srv.respeculate("draft_model", "draft-acc20", 2, reason="test: other draft")
    assert srv.wait_for_incarnation(inc, 30) is not None
    assert _cmdline_config(srv) == speculative_config("draft_model", (models / "draft-acc20").resolve(), 2)
    assert _spec_metrics(srv)

    # planned restarts are not crashes: no restart counted, every exit expected
    assert srv.restarts == [] and srv.incarnation == 2
    assert [r["incarnation"] for r in srv.respeculations] == [1, 2]
    exits = tl.select(event="server_exited")
    assert [e["incarnation"] for e in exits] == [0, 1]
    assert all(e["expected"] and e["reason"] == "respeculate" for e in exits)
    assert not tl.select(event="server_restarting")
    (first, second) = tl.select(event="server_respeculating")
    assert first["old"]["method"] == "draft_model" and first["new"]["method"] is None
    assert first["reason"] == "test: plain" and first["incarnation"] == 1
    assert second["new"] == {"method": "draft_model", "draft": str((models / "draft-acc20").resolve()),
                             "num_speculative_tokens": 2}


def test_respeculate_keeps_draft_and_k_when_not_given(fake_server, models):
    srv = fake_server(model_dir=models / "target", ready=True,
                      speculative_config=speculative_config("draft_model", models / "draft-exact", 4))
    inc = srv.respeculate("draft_model", num_speculative_tokens=1)
    assert srv.wait_for_incarnation(inc, 30) is not None
    assert srv.speculative == {"method": "draft_model", "draft": str((models / "draft-exact").resolve()),
                               "num_speculative_tokens": 1}
    inc = srv.respeculate("ngram")
    assert srv.wait_for_incarnation(inc, 30) is not None
    assert srv.speculative["method"] == "ngram" and srv.speculative["num_speculative_tokens"] == 1


def test_respeculate_refuses_a_missing_draft_and_a_stopped_server(fake_server, models):
    srv = fake_server(model_dir=models / "target", ready=True,
                      speculative_config=speculative_config("draft_model", models / "draft-exact", 4))
    with pytest.raises(ModelError):
        srv.respeculate("draft_model", "draft-nope")
    assert srv.incarnation == 0 and srv.is_up()   # nothing restarted
    srv.stop()
    with pytest.raises(StackError, match="stopped"):
        srv.respeculate(None)


def test_a_crash_after_a_respeculation_restarts_with_the_new_settings(fake_server, models):
    srv = fake_server(model_dir=models / "target", ready=True,
                      speculative_config=speculative_config("draft_model", models / "draft-exact", 4))
    srv.wait_for_incarnation(srv.respeculate(None), 30)
    srv.roles()["worker"][0].kill()
    assert srv.wait_for_incarnation(2, 30) is not None
    assert len(srv.restarts) == 1 and _cmdline_config(srv) is None


def _environ(server) -> dict:
    return psutil.Process(server.api_process().pid).environ()


def test_an_environment_restart_holds_for_one_incarnation_only(fake_server, models):
    """``restart_with_env``: the new incarnation runs with the variables added (read from its
    API process: its forked engine and worker inherit it, but setproctitle reuses their
    environ area for the title); the supervisor's restart after a crash runs with the stack's
    own environment again; the speculative settings stay."""
    tl = Timeline()
    srv = fake_server(model_dir=models / "target", timeline=tl, ready=True,
                      speculative_config=speculative_config("draft_model", models / "draft-exact", 4))
    assert "SPECCHAOS_TEST_MARK" not in _environ(srv)
    inc = srv.restart_with_env({"SPECCHAOS_TEST_MARK": "on"}, reason="test: mark")
    assert inc == 1 and srv.wait_for_incarnation(inc, 30) is not None
    assert srv.incarnation_env == {"SPECCHAOS_TEST_MARK": "on"}
    assert _environ(srv)["SPECCHAOS_TEST_MARK"] == "on"
    assert srv.speculative["method"] == "draft_model" and srv.respeculations == [] and srv.restarts == []
    (ev,) = tl.select(event="server_environment")
    assert ev["incarnation"] == 1 and ev["env"] == ["SPECCHAOS_TEST_MARK"] and ev["reason"] == "test: mark"
    assert [(e["reason"], e["expected"]) for e in tl.select(event="server_exited")] == [("environment", True)]

    srv.roles()["worker"][0].kill()
    assert srv.wait_for_incarnation(2, 30) is not None
    assert srv.incarnation_env == {} and "SPECCHAOS_TEST_MARK" not in _environ(srv) and len(srv.restarts) == 1
    srv.stop()
    with pytest.raises(StackError, match="stopped"):
        srv.restart_with_env({"X": "1"})

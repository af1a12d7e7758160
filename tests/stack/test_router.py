"""The load router (:mod:`harness.stack.router`) as a real process in front of two fake vLLM
servers (the harness's supervised LocalServer around the fake): the load client records who
served each request; a switch moves new requests only (one in flight finishes where it
started); an unreachable upstream is a 502 naming it; bad arguments are one error line."""

from __future__ import annotations

import json
import threading

import psutil
import pytest

from harness.errors import StackError
from harness.load.client import make_client, stream_completion
from harness.load.prompts import Prompt
from harness.ports import free_ports
from harness.stack import router as router_mod
from harness.stack.router import RouterProcess


def prompt(max_tokens: int = 8) -> Prompt:
    return Prompt(prompt_id=1, prompt_class="short", text="route me", max_tokens=max_tokens, prompt_tokens=3)


@pytest.fixture
def two_servers(fake_server):
    """The fake's speculative server (steps of 50 ms, so a 40-token stream lasts ~2 s) and a
    plain one."""
    spec = fake_server("spec", ["--step-delay-s", "0.05"], ready=True)
    plain = fake_server("ref", ready=True)
    return spec, plain


def test_a_switch_moves_new_requests_and_lets_one_in_flight_finish(two_servers):
    spec, plain = two_servers
    r = RouterProcess.start({"spec": spec.base_url, "ref": plain.base_url}, active="spec")
    try:
        client = make_client()
        first = stream_completion(client, r.url, spec.model, prompt(), timeout_s=10)
        assert first.ok and first.served_by == "spec" and first.served == "spec"
        slow: dict = {}
        th = threading.Thread(target=lambda: slow.update(rec=stream_completion(client, r.url, spec.model, prompt(40),
                                                                                timeout_s=20)))
        th.start()
        for _ in range(100):   # the slow stream is under way on spec
            if r.state()["requests"]["spec"]["forwarded"] == 2:
                break
            threading.Event().wait(0.02)
        ans = r.route("ref")
        assert ans["active"] == "ref" and ans["switched_at"] is not None
        new = stream_completion(client, r.url, spec.model, prompt(), timeout_s=10)
        th.join(20)
        assert new.ok and new.served_by == "ref" and new.token_ids == first.token_ids   # same target, greedy
        rec = slow["rec"]
        assert rec.ok and rec.served_by == "spec" and rec.send_time < ans["switched_at"] < rec.end_time
        counts = r.state()["requests"]
        assert counts["spec"] == {"forwarded": 2, "finished": 2, "failed": 0}
        assert counts["ref"] == {"forwarded": 1, "finished": 1, "failed": 0}
        r.route("spec")
        assert stream_completion(client, r.url, spec.model, prompt(), timeout_s=10).served_by == "spec"
        with pytest.raises(StackError, match="unknown upstream 'nowhere'"):
            r.route("nowhere")
    finally:
        r.stop()
    assert not psutil.pid_exists(r.pid) or psutil.Process(r.pid).status() == psutil.STATUS_ZOMBIE


def test_an_unreachable_upstream_is_a_502_that_names_it(two_servers):
    spec, _plain = two_servers
    (dead_port,) = free_ports("127.0.0.1", 1)
    r = RouterProcess.start({"spec": spec.base_url, "standby": f"http://127.0.0.1:{dead_port}"}, active="standby")
    try:
        rec = stream_completion(make_client(), r.url, spec.model, prompt(), timeout_s=10)
        assert rec.status == 502 and rec.error == "http_502" and rec.served_by == "standby"
        assert "upstream standby unreachable" in rec.error_detail
        assert r.state()["requests"]["standby"]["failed"] == 1
    finally:
        r.stop()


def test_an_upstream_that_dies_mid_stream_cuts_the_clients_stream(two_servers):
    """"In flight requests finish or fail as they would": the speculative server exits while
    it streams; through the router the client sees its stream cut, never a finished response."""
    spec, _plain = two_servers
    r = RouterProcess.start({"spec": spec.base_url}, active="spec")
    try:
        client = make_client()
        out: dict = {}
        th = threading.Thread(target=lambda: out.update(rec=stream_completion(client, r.url, spec.model, prompt(60),
                                                                               timeout_s=20)))
        th.start()
        for _ in range(200):   # wait until it streams
            if r.state()["requests"]["spec"]["forwarded"] == 1:
                break
            threading.Event().wait(0.02)
        threading.Event().wait(0.3)
        client.post(spec.base_url + "/exit?code=1")
        th.join(20)
        rec = out["rec"]
        assert not rec.ok and rec.error == "stream_cut" and rec.served_by == "spec" and rec.chunk_tokens, rec
        assert r.state()["requests"]["spec"]["failed"] == 1
    finally:
        r.stop()


@pytest.mark.parametrize("args, words", [
    (["--upstream", "spec=http://10.1.2.3:8000", "--active", "spec"], "not a loopback http URL"),
    (["--upstream", "spec=http://127.0.0.1:8000", "--active", "ref"], "--active 'ref' is not an upstream"),
    (["--upstream", "spec", "--active", "spec"], "expected NAME=URL"),
    (["--listen", "0.0.0.0:0", "--upstream", "spec=http://127.0.0.1:8000", "--active", "spec"], "not a loopback"),
])
def test_bad_arguments_are_one_error_line(capsys, args, words):
    assert router_mod.main(args) == 2
    (line,) = capsys.readouterr().out.splitlines()
    assert words in json.loads(line)["error"]


def test_a_router_that_cannot_start_is_a_stack_error():
    with pytest.raises(StackError, match="the load router did not start: --upstream spec"):
        RouterProcess.start({"spec": "http://192.0.2.1:80"}, active="spec")

"""The local launcher against real vLLM servers (tiny models, CPU), on the session's shared
stack (``real_stack``, borrowed from the pool for this module).

The worker-kill test (nightly) restarts the spec server (the pool reuses it afterwards: a
healthy supervised restart); the stop test stops the stack and runs last of all real-stack tests
(marker ``stops_stack``). The start refusals (a port taken after the check, a KV cache too
small) start servers of their own and run in the nightly tier. Run with ``-s`` to see the
measured startup and restart times.
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import psutil
import pytest

from harness.errors import StackError
from harness.stack.config import StackConfig
from harness.stack import procs
from harness.stack.local import LocalServer, LocalStack
from harness.stack.vllm_server import VllmSpec
from harness.ports import free_ports
from harness.stack.vllm import vllm_distribution
from tests.conftest import REAL_STACK

pytestmark = [pytest.mark.stack, pytest.mark.timeout(900)]

PROMPTS = ["The quick server", "Once upon a time the captain", "Numbers like 42 and 7", "Hello",
           "A quiet river runs past the old mill and", "What is the reason"]


def stream_completion(server, prompt: str, max_tokens: int = 16) -> dict:
    """Greedy streaming completion; ``{"text", "token_ids", "completion_tokens", "finish_reason"}``."""
    body = {"model": server.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
            "return_token_ids": True}
    text, ids, usage, finish = "", [], None, None
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for ch in chunk.get("choices") or []:
                text += ch.get("text") or ""
                ids += ch.get("token_ids") or []
                finish = ch.get("finish_reason") or finish
            usage = chunk.get("usage") or usage
    return {"text": text, "token_ids": ids, "completion_tokens": (usage or {}).get("completion_tokens"),
            "finish_reason": finish}


def spec_counter(server, name: str = "vllm:spec_decode_num_accepted_tokens_total") -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                total += s.value
    return total


def tree_of(server) -> list[psutil.Process]:
    api = server.api_process()
    return ([api] + procs.descendants(api) if api else []) + list(server._snapshot)


def test_ready_means_generation(real_stack):
    st = real_stack.stack
    assert set(st.servers) == {"spec", "ref"}
    if real_stack.startup_s:   # this module started the shared stack: its start events are in this timeline
        ready = real_stack.timeline.select(source="stack", event="server_ready")
        per = ", ".join(f"{e['server']}={e['startup_s']:.1f} s" for e in ready)
        print(f"\n[measure] both servers started together: {real_stack.startup_s:.1f} s (per server: {per})")
        assert {e["server"] for e in ready} == {"spec", "ref"}
    for s in st.servers.values():   # ready (a generation succeeded) and no restart pending, however it started
        assert s.is_up() and s.settled_at is not None
        out = stream_completion(s, "The quick server")
        assert out["completion_tokens"] == 16 == len(out["token_ids"])
        assert out["finish_reason"] == "length" and out["text"]
    before = spec_counter(st.servers["spec"])
    stream_completion(st.servers["spec"], "Once upon a time")
    assert spec_counter(st.servers["spec"]) > before, "speculative decoding accepted no token"
    assert spec_counter(st.servers["ref"]) == 0
    assert st.speculative["method"] == "draft_model" and st.speculative["draft"].endswith("draft-exact")
    assert st.launcher == "local" and st.vllm_version != "unknown"


@pytest.mark.nightly   # make test: tests/property/test_stack_properties.py (greedy equality on random requests)
def test_greedy_spec_equals_reference(real_stack):
    """The tiny models make exact greedy equality a usable integrity check."""
    spec, ref = real_stack.stack.servers["spec"], real_stack.stack.servers["ref"]
    for p in PROMPTS:
        a, b = stream_completion(spec, p, 32), stream_completion(ref, p, 32)
        assert a["token_ids"] == b["token_ids"], p


def test_roles_found_and_distinct(real_stack):
    seen = set()
    for s in real_stack.stack.servers.values():
        roles = s.roles()
        assert {k: len(v) for k, v in roles.items()} == {"api": 1, "engine": 1, "worker": 1}, roles
        api, eng, wrk = roles["api"][0], roles["engine"][0], roles["worker"][0]
        assert eng.ppid() == api.pid and wrk.ppid() == eng.pid
        assert "vllm.entrypoints.openai.api_server" in procs.title_of(api)
        assert procs.title_of(eng).startswith("VLLM::EngineCore")
        assert procs.title_of(wrk).startswith("VLLM::Worker")
        pids = {api.pid, eng.pid, wrk.pid}
        assert len(pids) == 3 and not (pids & seen)
        seen |= pids


def test_configured_port_in_use_starts_nothing(real_stack, tmp_path):
    spec = real_stack.stack.servers["spec"]
    cfg = StackConfig(models_dir=real_stack.stack.cfg.models_dir, spec_port=spec.port)
    other = LocalStack(cfg, tmp_path)
    with pytest.raises(StackError) as ei:
        other.start()
    assert ei.value.message == f"port {spec.port} on 127.0.0.1 is in use"
    assert ei.value.where == "configuration.specchaos.stack.spec_port"
    assert other.servers == {}


@pytest.mark.nightly
@pytest.mark.own_stack
def test_bind_failure_is_a_start_error_and_leaves_nothing(real_stack, tmp_path):
    """A port taken after the check: vLLM fails to bind; the error names server, log and cause."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        ref = real_stack.stack.servers["ref"]
        s = LocalServer("busy", VllmSpec(ref.model_dir), port=port, log_path=tmp_path / "busy-server.log",
                        startup_timeout_s=300)
        try:
            s.start()
            pgid = s._inc.pid
            with pytest.raises(StackError) as ei:
                s.wait_ready()
        finally:
            s.stop()
    msg = ei.value.message
    assert msg.startswith("server busy exited during startup"), msg
    assert "Address already in use" in msg, msg
    assert ei.value.where == str(tmp_path / "busy-server.log")
    assert procs.group_members(pgid) == []
    assert s.restarts == []


@pytest.mark.nightly
@pytest.mark.own_stack
def test_a_kv_cache_too_small_is_refused_at_start_with_vllms_error(real_stack, tmp_path):
    """Starting under memory pressure ends started or refused, never hung: a KV cache of 4
    blocks (512 tokens) cannot hold one 1,024-token sequence, and vLLM refuses to start;
    the start error carries vLLM's own reason, within the startup time of a server."""
    ref = real_stack.stack.servers["ref"]
    s = LocalServer("small-kv", VllmSpec(ref.model_dir, kv_cache_blocks=4, max_model_len=1024, dtype="float32"),
                    port=free_ports("127.0.0.1", 1)[0], log_path=tmp_path / "small-kv-server.log",
                    startup_timeout_s=300)
    t0 = time.monotonic()
    try:
        s.start()
        pgid = s._inc.pid
        with pytest.raises(StackError) as ei:
            s.wait_ready()
    finally:
        s.stop()
    took = time.monotonic() - t0
    msg = ei.value.message
    print(f"\n[measure] a 4-block KV cache was refused after {took:.1f} s: {msg}")
    assert msg.startswith("server small-kv exited during startup"), msg
    assert "max seq len (1024)" in msg and "KV cache" in msg, msg     # vLLM's own reason, not "see above"
    assert took < 240
    assert procs.group_members(pgid) == [] and s.restarts == []


@pytest.mark.nightly   # a restart (~40 s); in make test the kill experiments restart the shared stack's worker
def test_worker_kill_is_restarted_by_the_supervisor(real_stack):
    st, tl = real_stack.stack, real_stack.timeline
    spec, ref = st.servers["spec"], st.servers["ref"]
    inc0, ref_inc0 = spec.incarnation, ref.incarnation   # a pooled stack may have been restarted before
    ref_api = ref.api_process().pid
    old_tree = tree_of(spec)
    worker = spec.roles()["worker"][0]
    t_kill = time.time()
    worker.kill()
    ready_at = spec.wait_for_incarnation(inc0 + 1, 600)
    assert ready_at is not None, "no restarted spec server"
    startup1 = [e for e in tl.select(event="server_ready", server="spec")
                if e["incarnation"] == inc0 + 1][0]["startup_s"]
    print(f"\n[measure] spec ready again {ready_at - t_kill:.1f} s after SIGKILL of its worker "
          f"(exit seen {spec.restarts[0]['exited_at'] - t_kill:.1f} s after the kill, "
          f"startup of the new incarnation {startup1:.1f} s)")
    assert spec.incarnation == inc0 + 1 and len(spec.restarts) == 1   # the pool gave it a whole budget
    assert spec.restarts[0]["incarnation"] == inc0 + 1 and spec.restarts[0]["t"] >= t_kill
    assert spec.is_up()
    out = stream_completion(spec, "Hello again", 8)
    assert out["completion_tokens"] == 8
    assert procs.wait_gone(old_tree, 30) == []
    evs = [(e["event"], e.get("incarnation")) for e in tl.select(source="stack", server="spec") if e["t"] >= t_kill]
    assert evs == [("server_exited", inc0), ("server_restarting", None), ("server_started", inc0 + 1),
                   ("server_ready", inc0 + 1)]
    ex = [e for e in tl.select(event="server_exited", server="spec") if e["t"] >= t_kill][0]
    assert ex["expected"] is False and ex["incarnation"] == inc0
    assert ref.api_process().pid == ref_api and ref.incarnation == ref_inc0, "the reference was untouched"
    new = spec.roles()
    assert new["worker"] and new["worker"][0].pid != worker.pid


@pytest.fixture
def detached_stack(request, stack_home):
    """``(stack, timeline)``: the session's shared stack taken out of the pool as it is (a run
    before may have left it on plain decoding: stopping does not care, and no restart is paid
    to restore it), its events on the session's stack timeline. The test stops it."""
    if vllm_distribution() is None:
        pytest.skip("vLLM is not installed")
    pool = request.getfixturevalue("specchaos_pool")
    run_dir, timeline = stack_home
    stack = pool.detach(REAL_STACK, timeline)
    if stack is None:   # nothing pooled yet (this test alone): start one
        pool.release(pool.acquire(REAL_STACK, run_dir, timeline), run_dir, clean=True)
        stack = pool.detach(REAL_STACK, timeline)
    try:
        yield stack, timeline
    finally:
        stack.stop()


@pytest.mark.stops_stack
def test_stop_leaves_no_process(detached_stack):
    """Runs last (``stops_stack``): stop the shared stack and check every process of both trees is gone."""
    st, tl = detached_stack
    trees = {name: tree_of(s) for name, s in st.servers.items()}
    pgids = {name: s._inc.pid for name, s in st.servers.items()}
    assert all(len(t) >= 3 for t in trees.values())
    t_stop = time.time()
    t0 = time.monotonic()
    st.stop()
    print(f"\n[measure] stack stop took {time.monotonic() - t0:.1f} s")
    for name, tree in trees.items():
        assert procs.wait_gone(tree, 10) == [], name
        assert procs.wait_group_gone(pgids[name], 10) == [], name
        assert not st.servers[name].is_up()
    exits = [e for e in tl.select(event="server_exited", expected=True) if e["t"] >= t_stop]
    assert {e["server"] for e in exits} == {"spec", "ref"}
    st.stop()   # idempotent
    assert len([e for e in tl.select(event="server_exited", expected=True) if e["t"] >= t_stop]) == 2

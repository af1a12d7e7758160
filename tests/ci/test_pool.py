"""The stack pool behind the plugin's stack reuse, with stand-in stacks (no process): the
key, reuse only when fit, log slices per run, run state for ``specchaos cleanup``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from harness.stack import pool as pool_mod
from harness.stack.config import StackConfig
from harness.stack.launchers import register_launcher
from harness.stack.pool import StackPool, stack_key
from harness.state import state_dir
from harness.timeline import Timeline, read_timeline


class StubServer:
    def __init__(self, name: str, log_path: Path):
        self.name, self.log_path = name, log_path
        self.base_url, self.model = "http://127.0.0.1:9", "target"
        self.incarnation, self.timeline, self.up = 0, None, True
        self.configured_speculative = self.speculative = {"method": "draft_model"}
        self.state = "ready"
        self.run_settings: list = []
        self.looks = 0

    @property
    def settled_at(self):   # a restart under way finishes at the second look (LocalServer: a property)
        self.looks += 1
        if self.state == "restarting" and self.looks > 1:
            self.state = "ready"
        return 1.0 if self.state == "ready" else None

    def take_run_settings(self, restart, startup_timeout_s) -> None:
        self.run_settings.append((restart, startup_timeout_s))

    def is_up(self) -> bool:
        return self.up

    def roles(self) -> dict:
        return {"api": [], "engine": [], "worker": []}

    # the rest of the capabilities the pool asks for (harness.stack.capabilities)
    def api_process(self):
        return None

    def log_file(self) -> Path:
        return self.log_path

    def wait_ready(self, timeout_s=None) -> float:
        return 1.0

    def wait_for_incarnation(self, n, timeout_s=None):
        return 1.0 if self.incarnation >= n else None

    def restart_with_env(self, env, *, reason=""):
        raise NotImplementedError


class StubStack:
    """Implements the Stack protocol's surface the pool uses; counts starts and stops."""

    launcher = "stub"
    started: list["StubStack"] = []

    def __init__(self, cfg, run_dir, timeline=None):
        self.cfg, self.run_dir, self.timeline = cfg, Path(run_dir), timeline
        self.servers: dict = {}
        self.stopped = False

    def start(self) -> None:
        logs = self.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.servers = {n: StubServer(n, logs / f"{n}-server.log") for n in ("spec", "ref")}
        for s in self.servers.values():
            s.timeline = self.timeline
            s.log_path.write_text(f"{s.name} started\n")
            if self.timeline is not None:   # as the supervisor records a start
                self.timeline.emit("stack", "server_ready", server=s.name, incarnation=0,
                                   startup_s={"spec": 12.5, "ref": 9.0}[s.name])
        StubStack.started.append(self)

    def stop(self) -> None:
        self.stopped = True


@pytest.fixture
def pool(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAOS_STATE_DIR", str(tmp_path / "state"))
    register_launcher("stub", StubStack)
    StubStack.started = []
    probed: list[str] = []
    monkeypatch.setattr(pool_mod, "_probe", lambda server: probed.append(server.name) or None)
    p = StackPool(tmp_path / "stacks")
    p.probed = probed
    yield p
    p.close()


def cfg(**kw) -> StackConfig:
    return StackConfig(launcher="stub", **kw)


def run(pool: StackPool, tmp: Path, name: str, c: StackConfig, clean: bool = True, log: str = "") -> tuple:
    run_dir = tmp / name
    run_dir.mkdir(parents=True, exist_ok=True)
    tl = Timeline(run_dir / "timeline.jsonl")
    stack = pool.acquire(c, run_dir, tl)
    for s in stack.servers.values():
        with open(s.log_path, "a") as fh:
            fh.write(log or f"{name} ran\n")
        s.timeline.emit("stack", "server_note", server=s.name)   # rebound to this run's timeline
    pool.release(stack, run_dir, clean=clean)
    return stack, run_dir


def test_same_stack_block_starts_once_and_each_run_gets_its_log_slice(pool, tmp_path):
    a, dir_a = run(pool, tmp_path, "a", cfg())
    b, dir_b = run(pool, tmp_path, "b", cfg())
    assert a is b and (pool.starts, pool.reuses) == (1, 1) and len(StubStack.started) == 1
    assert pool.probed == ["spec", "ref"]   # both servers probed before the reuse
    pooled = [e for e in read_timeline(dir_b / "timeline.jsonl") if e["event"] == "stack_pooled"]
    assert pooled and pooled[0]["uses"] == 2 and pooled[0]["starts"] == 1
    assert pooled[0]["startup_s"] == {"spec": 12.5, "ref": 9.0}   # the start-up the first run measured
    assert [e["event"] for e in read_timeline(dir_b / "timeline.jsonl")].count("server_note") == 2
    log_a = (dir_a / "logs" / "spec-server.log").read_text()
    log_b = (dir_b / "logs" / "spec-server.log").read_text()
    assert "spec started" in log_a and "a ran" in log_a and "b ran" not in log_a
    assert "b ran" in log_b and "a ran" not in log_b and "spec started" not in log_b
    assert not a.stopped
    pool.close()
    assert a.stopped


def test_another_stack_block_gets_its_own_stack_and_the_idle_one_is_stopped_first(pool, tmp_path):
    a, _ = run(pool, tmp_path, "a", cfg())
    b, dir_b = run(pool, tmp_path, "b", cfg(num_speculative_tokens=2))
    assert a is not b and pool.starts == 2
    assert a.stopped and not b.stopped   # one idle stack at most: no other configuration's servers beside a run
    replaced = [e for e in read_timeline(dir_b / "timeline.jsonl") if e["event"] == "stack_replaced"]
    assert replaced and "another configuration" in replaced[0]["reason"]


def test_a_stack_left_on_other_speculative_settings_it_cannot_restore_is_stopped_at_release(pool, tmp_path):
    run_dir = tmp_path / "a"
    run_dir.mkdir()
    a = pool.acquire(cfg(), run_dir, Timeline(run_dir / "timeline.jsonl"))
    a.servers["spec"].incarnation = 1   # the breaker restarted it on plain decoding
    a.servers["spec"].speculative = {"method": None}
    pool.release(a, run_dir, clean=True)
    assert a.stopped   # never kept idle when it cannot be reused


def test_a_server_still_restarting_at_release_is_waited_for_and_kept(pool, tmp_path):
    """A run aborted right after a kill ends while the supervisor restarts the server: the
    pool waits for the restart (one server's start) instead of starting a whole stack later;
    a draft swap rolled back (the configured settings again) is reusable too."""
    a, _ = run(pool, tmp_path, "a", cfg())
    spec = a.servers["spec"]
    assert not a.stopped
    run_dir = tmp_path / "b"
    run_dir.mkdir()
    assert pool.acquire(cfg(), run_dir, Timeline(run_dir / "timeline.jsonl")) is a
    spec.incarnation, spec.state, spec.looks = 2, "restarting", 0   # swapped and back, then killed
    pool.release(a, run_dir, clean=True)
    assert spec.looks == 2 and spec.state == "ready" and not a.stopped   # not settled, then settled
    c, _ = run(pool, tmp_path, "c", cfg())
    assert c is a and pool.starts == 1


def test_a_healthy_supervised_restart_is_reused_with_the_next_runs_settings(pool, tmp_path):
    """A kill experiment's restarted server runs the configured settings: the next run gets
    it, with its own restart policy and startup wait (a whole budget), and so does a block
    that differs only in run-level fields (restart policy, startup wait, breaker)."""
    a, _ = run(pool, tmp_path, "a", cfg())
    a.servers["spec"].incarnation = 1   # the supervisor restarted it (a kill experiment)
    other = cfg(restart={"max_restarts": 1, "backoff_s": 0.1, "backoff_max_s": 0.2}, startup_timeout_s=42,
                breaker={"enabled": True})
    assert stack_key(other) == stack_key(cfg())
    b, _ = run(pool, tmp_path, "b", other)
    assert b is a and pool.starts == 1 and pool.reuses == 1
    restart, startup_s = a.servers["spec"].run_settings[-1]
    assert restart.max_restarts == 1 and startup_s == 42 and a.cfg is other


def test_key_names_one_models_directory_however_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert stack_key(cfg(models_dir="models")) == stack_key(cfg(models_dir=str(tmp_path / "models")))
    assert stack_key(cfg()) != stack_key(cfg(dtype="bfloat16")) != stack_key(cfg(reference=False))


@pytest.mark.parametrize("spoil, reason", [
    (lambda stack: None, "its last run did not end clean"),
    (lambda stack: (setattr(stack.servers["spec"], "incarnation", 1),
                    setattr(stack.servers["spec"], "speculative", {"method": None})),
     "server spec runs other speculative settings than it was started with ({'method': None}, incarnation 1)"),
    (lambda stack: (setattr(stack.servers["ref"], "up", False), setattr(stack.servers["ref"], "state", "gave_up")),
     "server ref is gave_up"),
    (lambda stack: (setattr(stack.servers["spec"], "incarnation", 1),
                    setattr(stack.servers["spec"], "incarnation_env", {"LD_PRELOAD": "/x/shim.so"})),
     "server spec runs with a fault's environment (LD_PRELOAD, incarnation 1)"),
])
def test_an_unfit_stack_is_stopped_and_replaced(pool, tmp_path, spoil, reason):
    clean = "clean" not in reason
    a, _ = run(pool, tmp_path, "a", cfg(), clean=clean)
    if not clean:
        assert a.stopped   # an unclean release stops at once
    spoil(a)
    b, dir_b = run(pool, tmp_path, "b", cfg())
    assert b is not a and a.stopped and pool.starts == 2
    if clean:
        replaced = [e for e in read_timeline(dir_b / "timeline.jsonl") if e["event"] == "stack_replaced"]
        assert replaced and replaced[0]["reason"] == reason


def test_a_server_failing_the_probe_is_not_reused(pool, tmp_path, monkeypatch):
    a, _ = run(pool, tmp_path, "a", cfg())
    monkeypatch.setattr(pool_mod, "_probe", lambda server: "/health answered 503")
    b, dir_b = run(pool, tmp_path, "b", cfg())
    assert b is not a and a.stopped
    replaced = [e for e in read_timeline(dir_b / "timeline.jsonl") if e["event"] == "stack_replaced"]
    assert replaced[0]["reason"] == "server spec: /health answered 503"


def test_a_pooled_stack_has_a_run_state_until_the_pool_closes(pool, tmp_path):
    run(pool, tmp_path, "a", cfg())
    files = list((state_dir() / "runs").glob("*.json"))
    assert len(files) == 1
    data = json.loads(files[0].read_text())
    assert data["out_dir"].endswith("-1") and "stacks" in data["out_dir"]
    pool.close()
    assert not list((state_dir() / "runs").glob("*.json"))


def test_the_real_probe_says_why_a_server_is_unfit():
    server = StubServer("spec", Path("/nonexistent"))
    server.base_url = "http://127.0.0.1:1"   # nothing listens on port 1
    assert pool_mod._probe(server).startswith("probe failed: ConnectError")


@pytest.mark.timeout(120)
def test_the_real_supervisor_is_kept_after_a_kill_and_its_restart(tmp_path, monkeypatch, models):
    """The pool with the harness's own LocalServer (the fake vLLM under the real supervisor):
    a worker killed near the end of a run is still restarting at release; the pool waits for
    the restart and the next run gets the same stack, its restart budget whole again."""
    from tests.experiment.fast_e2e import MODELS
    from tests.fakes.stack import register_fake_launchers

    monkeypatch.setenv("SPECCHAOS_STATE_DIR", str(tmp_path / "state"))
    register_fake_launchers()
    c = StackConfig(launcher="fake", models_dir=str(MODELS), reference=False, startup_timeout_s=60,
                    restart={"max_restarts": 1, "backoff_s": 0.2, "backoff_max_s": 0.2})
    with StackPool(tmp_path / "stacks") as pool:
        run_dir = tmp_path / "a"
        run_dir.mkdir()
        a = pool.acquire(c, run_dir, Timeline(run_dir / "timeline.jsonl"))
        spec = a.servers["spec"]
        spec.roles()["worker"][0].kill()                       # the run ends right after its kill
        deadline = time.monotonic() + 20
        while spec.state != "restarting":                      # the supervisor saw the exit
            assert time.monotonic() < deadline, spec.state
            time.sleep(0.02)
        pool.release(a, run_dir, clean=True)
        assert spec.settled_at is not None and spec.incarnation == 1 and len(spec.restarts) == 1
        run_dir = tmp_path / "b"
        run_dir.mkdir()
        b = pool.acquire(c, run_dir, Timeline(run_dir / "timeline.jsonl"))
        assert b is a and pool.starts == 1 and spec.restarts == []   # a whole budget for the next run
        pool.release(b, run_dir, clean=True)


def test_a_server_left_on_plain_decoding_is_restored_at_the_next_acquire_and_reused(pool, tmp_path):
    """A breaker left the speculative server on plain decoding: the pool keeps the stack and,
    when it is next acquired, asks the server back onto its configured settings (one
    server's restart), waits for it, hands it out (``restored: true`` on the run's timeline)."""
    asked = []

    def respeculate(method, draft=None, num_speculative_tokens=None, *, reason=""):
        asked.append((method, draft, num_speculative_tokens, reason))
        spec.speculative, spec.state, spec.looks = {"method": method}, "restarting", 0

    a, _ = run(pool, tmp_path, "a", cfg())
    spec = a.servers["spec"]
    spec.respeculate = respeculate
    run_dir = tmp_path / "b"
    run_dir.mkdir()
    assert pool.acquire(cfg(), run_dir, Timeline(run_dir / "timeline.jsonl")) is a
    spec.speculative = {"method": None}   # the breaker's hard trip
    pool.release(a, run_dir, clean=True)
    assert asked == [] and not a.stopped   # nothing restarts until someone borrows it again
    c, dir_c = run(pool, tmp_path, "c", cfg())
    assert asked == [("draft_model", None, None, "the stack pool restores the configured settings for the next run")]
    assert c is a and pool.starts == 1
    assert spec.speculative == spec.configured_speculative and spec.state == "ready"
    (pooled,) = [e for e in read_timeline(dir_c / "timeline.jsonl") if e["event"] == "stack_pooled"]
    assert pooled["restored"] is True


def test_a_stack_nobody_borrows_again_is_stopped_as_it_is(pool, tmp_path):
    """A run left the server on plain decoding and no run borrows the stack again: closing the
    pool stops it without a restart on the configured settings first."""
    asked = []
    a, _ = run(pool, tmp_path, "a", cfg())
    spec = a.servers["spec"]
    spec.respeculate = lambda *a, **kw: asked.append(a)
    run_dir = tmp_path / "b"
    run_dir.mkdir()
    assert pool.acquire(cfg(), run_dir, Timeline(run_dir / "timeline.jsonl")) is a
    spec.speculative = {"method": None}
    pool.release(a, run_dir, clean=True)
    pool.close()
    assert a.stopped and asked == []


def test_detach_hands_out_the_idle_stack_as_it_is(pool, tmp_path):
    """``detach``: the idle stack of a key leaves the pool unchanged (no restore, no probe),
    the caller stops it; the pool no longer holds or stops it; no idle stack gives None."""
    assert pool.detach(cfg()) is None
    a, _ = run(pool, tmp_path, "a", cfg())
    a.servers["spec"].speculative = {"method": None}
    assert pool.detach(cfg(num_speculative_tokens=2)) is None   # another key
    assert pool.detach(cfg()) is a and not a.stopped
    assert pool.detach(cfg()) is None and pool.pids() == set()
    pool.close()
    assert not a.stopped   # the caller's now

"""Started stacks kept for reuse across experiment runs of one process (the pytest plugin).

A *stack provider* is the seam :class:`harness.experiment.session.Session` asks for its
stack: ``acquire(cfg, run_dir, timeline)`` returns a started stack, ``release(stack,
run_dir, clean)`` takes it back when the run closes. Without a provider (the CLI, plain
``chaos run``) a session builds its stack with :func:`harness.stack.launchers.make_stack`
and stops it, exactly as before. :class:`StackPool` is the provider of the pytest plugin:

* **key**: the ``stack`` block as validated, less the run-level fields (:data:`RUN_FIELDS`:
  the supervisor's restart policy and startup wait, the session's speculation breaker), which
  change nothing the launcher starts (:func:`stack_key`): runs whose keys are equal share one
  started stack, each run's own run-level fields applied to it at acquire (its restart budget
  whole again); a different key gets its own stack.
* **where a pooled stack writes**: its servers' logs go to ``<base>/stack-<key12>-<n>/logs/``;
  at release, the bytes each log gained during the run are copied to the run's
  ``logs/<name>-server.log`` (the first run's copy includes the startup). Its ``stack``
  events go to the timeline of the run that holds it (rebound at acquire), and between runs
  to ``<base>/stack-<key12>-<n>/timeline.jsonl``. Each run's timeline gets one
  ``stack_pooled`` event (``key``, ``uses``: 1 when this run started it, ``starts``: stacks
  this pool started so far, ``stack_dir``) before anything else of the run acts.
* **reuse only when fit**: the previous run released it *clean* (its fault ledger had no
  open fault, no cleanup step failed, no signal interrupted it), every server is up and runs
  the speculative settings it was started with (a server a run left on others — a breaker's
  plain decoding, a swap not rolled back — is restarted on them when the stack is next
  acquired, not at release: a stack nobody borrows again costs no restart; the run's
  ``stack_pooled`` event then says ``restored: true``; it carries each server's start-up as
  ``startup_s``, measured when the pool started the stack), and each server answers
  ``GET /health`` 200 and a 1-token greedy completion within :data:`PROBE_TIMEOUT_S`. A healthy supervised restart
  is fine: the next run gets the whole ``restart.max_restarts`` budget again; a server still
  restarting when its run ends clean is waited for at release (its startup wait at most: a
  restart costs one server's start, a fresh stack both). Otherwise the stack is stopped and
  a fresh one started (``stack_replaced`` on the run's timeline, with the ``reason``).
* **crash safety**: each pooled stack has its own run state file (:mod:`harness.state`),
  rewritten with its live process trees at start and at every release, so ``specchaos
  cleanup`` finds it after a crash between runs; :meth:`StackPool.close` stops every stack
  (the plugin calls it at the end of the pytest session, on SIGINT/SIGTERM too).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from harness.clock import now
from harness.net import is_loopback_host
from harness.stack.capabilities import Logs, ProcessRoles, Readiness, Respeculating, Supervised
from harness.state import RunState
from harness.stack.launchers import make_stack
from harness.timeline import Timeline

log = logging.getLogger(__name__)

__all__ = ["StackProvider", "StackPool", "stack_key", "PROBE_TIMEOUT_S", "RUN_FIELDS"]

#: Seconds each server gets to answer the health probe and the 1-token completion before reuse.
PROBE_TIMEOUT_S = 10.0


class StackProvider(Protocol):
    """Where a session gets its started stack and returns it (see module doc)."""

    def acquire(self, cfg: Any, run_dir: Path, timeline: Timeline) -> Any:
        """A started stack for ``cfg`` (a StackConfig) whose ``stack`` events go to ``timeline``.

        Raises:
            SpecchaosError: as :meth:`harness.stack.base.Stack.start` (nothing is left running).
        """

    def release(self, stack: Any, run_dir: Path, clean: bool) -> None:
        """The run is over; ``clean``: no fault left open, no cleanup failure, no interruption."""


#: Fields of the ``stack`` block that are not part of the pool key: they change nothing the
#: launcher starts, and a reused stack takes them from each run (:func:`_take_run_settings`).
RUN_FIELDS = ("restart", "startup_timeout_s", "breaker")


def stack_key(cfg: Any) -> str:
    """The pool key of a validated ``stack`` block: sha256 (hex) of its JSON with sorted keys,
    less :data:`RUN_FIELDS`, ``models_dir`` made absolute (``models`` and ``/repo/models``
    name one directory)."""
    data = cfg.model_dump(mode="json")
    for name in RUN_FIELDS:
        data.pop(name, None)
    if data.get("models_dir"):
        data["models_dir"] = str(Path(data["models_dir"]).resolve())
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


@dataclass
class _Pooled:
    key: str
    stack: Any
    stack_dir: Path
    state: RunState
    idle_timeline: Timeline
    busy: bool = True
    clean: bool = True
    uses: int = 1
    log_offsets: dict[str, tuple[Path, int]] = field(default_factory=dict)
    #: each server's start-up (s) when the pool started the stack: a reusing run's
    #: ``stack_pooled`` event carries it (start-up-relative recovery limits resolve against it)
    startup_s: dict[str, float] = field(default_factory=dict)


class StackPool:
    """A :class:`StackProvider` that keeps started stacks for reuse (see module doc).

    Args:
        base_dir: where pooled stacks write their logs and idle timeline.

    Attributes ``starts`` (stacks started) and ``reuses`` (runs given an already started
    stack) count over the pool's life.
    """

    def __init__(self, base_dir: str | os.PathLike):
        self.base_dir = Path(base_dir)
        self.starts = 0
        self.reuses = 0
        self._pooled: list[_Pooled] = []
        self._lock = threading.RLock()
        self._closed = False

    # ------------------------------------------------------------------ provider
    def acquire(self, cfg: Any, run_dir: Path, timeline: Timeline) -> Any:
        key = stack_key(cfg)
        with self._lock:
            for p in [p for p in self._pooled if p.key == key and not p.busy]:
                restored = bool(_off_configured(p.stack))   # left so by its last run: restored now
                why = (self._restore_settings(p) if restored else None) or self._unfit(p)
                if why is None:
                    p.busy, p.uses = True, p.uses + 1
                    self.reuses += 1
                    _rebind(p.stack, timeline)
                    _take_run_settings(p.stack, cfg)
                    p.log_offsets = _log_offsets(p.stack)
                    timeline.emit("stack", "stack_pooled", key=key[:12], uses=p.uses, starts=self.starts,
                                  stack_dir=str(p.stack_dir), restored=restored, startup_s=p.startup_s)
                    log.info("reusing the started stack %s (use %d)", p.stack_dir.name, p.uses)
                    return p.stack
                log.info("not reusing the stack %s: %s; starting a fresh one", p.stack_dir.name, why)
                timeline.emit("stack", "stack_replaced", key=key[:12], reason=why, stack_dir=str(p.stack_dir))
                self._stop(p)
            for p in [p for p in self._pooled if p.key != key and not p.busy]:
                # one idle stack at most: another configuration's servers would skew this run's
                # measurements (memory, CPU) and may not fit beside it (GPU memory)
                log.info("stopping the idle stack %s before starting another configuration", p.stack_dir.name)
                timeline.emit("stack", "stack_replaced", key=key[:12], stack_dir=str(p.stack_dir),
                              reason="an idle stack of another configuration is stopped first")
                self._stop(p)
            stack_dir = self.base_dir / f"stack-{key[:12]}-{self.starts + 1}"
            stack_dir.mkdir(parents=True, exist_ok=True)
            stack = make_stack(cfg, stack_dir, timeline=timeline)
            log.info("starting a pooled stack in %s (launcher=%s)", stack_dir, stack.launcher)
            stack.start()   # stops what it started on failure
            self.starts += 1
            p = _Pooled(key, stack, stack_dir, RunState(stack_dir), Timeline(stack_dir / "timeline.jsonl"))
            p.log_offsets = {name: (path, 0) for name, (path, _) in _log_offsets(stack).items()}
            p.startup_s = {e["server"]: e["startup_s"] for e in timeline.select("stack", "server_ready", incarnation=0)
                           if e.get("server") and e.get("startup_s") is not None}
            _sync_state(p)
            self._pooled.append(p)
            timeline.emit("stack", "stack_pooled", key=key[:12], uses=1, starts=self.starts, stack_dir=str(stack_dir))
            return stack

    def release(self, stack: Any, run_dir: Path, clean: bool) -> None:
        with self._lock:
            p = next((p for p in self._pooled if p.stack is stack), None)
            if p is None:   # not ours: stop it as a session without provider would
                stack.stop()
                return
            _copy_log_slices(p, Path(run_dir) / "logs")
            p.busy, p.clean = False, clean
            _rebind(stack, p.idle_timeline)
            why = ("its run did not end clean" if not clean else "the pool is closed" if self._closed
                   else _settle(p.stack) or _unfit_state(p.stack, speculative=False))
            if why is not None:   # never kept idle when it cannot be reused
                log.info("stopping the stack %s: %s", p.stack_dir.name, why)
                self._stop(p)
                return
            if not all(isinstance(server, Respeculating) for _, server in _off_configured(p.stack)):
                log.info("stopping the stack %s: a server left on other speculative settings cannot restart "
                         "on its configured ones", p.stack_dir.name)
                self._stop(p)
                return
            _sync_state(p)

    def detach(self, cfg: Any, timeline: Timeline | None = None) -> Any | None:
        """Hand an idle started stack of ``cfg``'s key out of the pool, as it is (no restore
        of its speculative settings, no probe), its ``stack`` events sent to ``timeline``
        when given: the caller owns it from now on and stops it (a test of stopping). None
        when the pool holds no idle stack of that key."""
        key = stack_key(cfg)
        with self._lock:
            p = next((p for p in self._pooled if p.key == key and not p.busy), None)
            if p is None:
                return None
            self._pooled.remove(p)
            p.state.close()
            if timeline is not None:
                _rebind(p.stack, timeline)
            return p.stack

    def pids(self) -> set[int]:
        """Pids of the processes of every stack the pool holds now (each server's roles:
        API server, engine, worker), busy or idle."""
        with self._lock:
            stacks = [p.stack for p in self._pooled]
        out: set[int] = set()
        for stack in stacks:
            for server in stack.servers.values():
                roles = server.roles() if isinstance(server, ProcessRoles) else {}
                out.update(proc.pid for members in roles.values() for proc in members)
        return out

    # ------------------------------------------------------------------ life
    def close(self) -> None:
        """Stop every pooled stack (idempotent; safe in a signal handler's aftermath)."""
        with self._lock:
            self._closed = True
            for p in list(self._pooled):
                self._stop(p)

    def __enter__(self) -> "StackPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _stop(self, p: _Pooled) -> None:
        try:
            p.stack.stop()
        finally:
            p.state.close()
            with contextlib.suppress(ValueError):
                self._pooled.remove(p)

    def _restore_settings(self, p: _Pooled) -> str | None:
        """Restore the speculative settings its last run left a server of ``p`` on
        (:func:`_restore`) and wait for it (:func:`_settle`). None, or why that failed (the
        stack is then replaced)."""
        why = _restore(p.stack) or _settle(p.stack)
        if why is None:
            _sync_state(p)
        return why

    def _unfit(self, p: _Pooled) -> str | None:
        """Why ``p`` must not be reused, or None."""
        if not p.clean:
            return "its last run did not end clean"
        why = _unfit_state(p.stack)
        if why is not None:
            return why
        for name, server in p.stack.servers.items():
            problem = _probe(server)
            if problem:
                return f"server {name}: {problem}"
        return None


def _restore(stack: Any) -> str | None:
    """Ask every server left on other speculative settings than it was started with (a
    breaker that fell back to plain decoding, a swap that was not rolled back) to restart on
    its configured ones (:meth:`LocalServer.respeculate`: one server's restart, cheaper than a
    fresh stack); :func:`_settle` then waits for it. None, or why it could not be asked (the
    stack is then not kept)."""
    for name, server in _off_configured(stack):
        if not isinstance(server, Respeculating):
            continue
        configured = server.configured_speculative
        log.info("server %s runs %s: restoring %s for the next run", name, server.speculative, configured)
        try:
            server.respeculate(configured.get("method"), configured.get("draft"),
                               configured.get("num_speculative_tokens"),
                               reason="the stack pool restores the configured settings for the next run")
        except Exception as exc:  # noqa: BLE001 - the stack is then replaced, never reused half-restored
            return f"server {name}: restoring its speculative settings failed: {exc}"
    return None


def _off_configured(stack: Any) -> list[tuple[str, Any]]:
    """``(name, server)`` of every server that runs other speculative settings than it was
    started with (``configured_speculative``; servers without it are taken as they are)."""
    return [(name, server) for name, server in stack.servers.items()
            if getattr(server, "configured_speculative", None) not in (None, server.speculative)]


#: Seconds between two looks at a server that is settling (:func:`_settle`).
SETTLE_POLL_S = 0.2


def _settle(stack: Any) -> str | None:
    """Wait until every server has settled: ready, with no planned restart asked for and not
    yet done (its ``settled_at`` property not None: a supervised restart after a kill, or a
    draft swap's rollback, still under way when the run ended), each within its startup wait
    (seconds). None when all settled; else why not (the stack is then not kept). Servers
    without ``settled_at`` are taken as they are."""
    for name, server in stack.servers.items():
        if not isinstance(server, Supervised) or server.settled_at is not None:
            continue
        log.info("waiting for server %s to settle (a restart under way) before keeping the stack", name)
        deadline = time.monotonic() + float(getattr(server, "startup_timeout_s", 300.0))
        while server.settled_at is None:
            state = server.state
            if state in ("failed", "gave_up", "stopped"):
                return f"server {name} is {state}"
            if time.monotonic() > deadline:
                return f"server {name} did not settle within its startup wait"
            time.sleep(SETTLE_POLL_S)
    return None


def _unfit_state(stack: Any, speculative: bool = True) -> str | None:
    """Why ``stack`` cannot be reused from its servers' state alone (other speculative
    settings than it was started with — only when ``speculative`` —, a fault's environment,
    a server not up), or None; no request is sent. A supervised restart alone does not make
    it unfit: the restarted server runs them."""
    off = _off_configured(stack) if speculative else []
    if off:
        name, server = off[0]
        return (f"server {name} runs other speculative settings than it was started with "
                f"({server.speculative}, incarnation {server.incarnation})")
    for name, server in stack.servers.items():
        if getattr(server, "incarnation_env", None):
            return (f"server {name} runs with a fault's environment ({', '.join(sorted(server.incarnation_env))}, "
                    f"incarnation {server.incarnation})")
        if isinstance(server, Readiness) and not server.is_up():
            return f"server {name} is {server.state if isinstance(server, Supervised) else 'down'}"
    return None


def _probe(server: Any) -> str | None:
    """None when ``server`` answers /health 200 and a 1-token greedy completion; else why not."""
    try:
        host = httpx.URL(server.base_url).host
        if not is_loopback_host(host):   # the pool probes only what it started, on loopback
            return f"not a loopback server: {server.base_url}"
        with httpx.Client(timeout=PROBE_TIMEOUT_S, trust_env=False) as client:
            r = client.get(f"{server.base_url}/health")
            if r.status_code != 200:
                return f"/health answered {r.status_code}"
            r = client.post(f"{server.base_url}/v1/completions",
                            json={"model": server.model, "prompt": "ping", "max_tokens": 1, "temperature": 0})
            if r.status_code != 200 or not r.json().get("choices"):
                return f"a 1-token completion answered {r.status_code}"
    except (httpx.HTTPError, ValueError) as exc:
        return f"probe failed: {type(exc).__name__}: {exc}"
    return None


def _take_run_settings(stack: Any, cfg: Any) -> None:
    """A reused stack serves a new run: the run's ``stack`` block becomes its configuration
    and each server takes the run's restart policy and startup wait with a whole restart
    budget (servers without :meth:`take_run_settings` keep theirs)."""
    if hasattr(stack, "cfg"):
        stack.cfg = cfg
    for server in stack.servers.values():
        take = getattr(server, "take_run_settings", None)
        if take is not None:
            take(cfg.restart, cfg.startup_timeout_s)


def _rebind(stack: Any, timeline: Timeline) -> None:
    """Send the stack's (and its servers') ``stack`` events to ``timeline`` from now on."""
    if hasattr(stack, "timeline"):
        stack.timeline = timeline
    for server in stack.servers.values():
        if hasattr(server, "timeline"):
            server.timeline = timeline


def _log_offsets(stack: Any) -> dict[str, tuple[Path, int]]:
    """Server name → (its log file, current size in bytes) for servers that log to a file."""
    out = {}
    for name, server in stack.servers.items():
        path = server.log_file() if isinstance(server, Logs) else None
        if path is not None:
            path = Path(path)
            out[name] = (path, path.stat().st_size if path.exists() else 0)
    return out


def _copy_log_slices(p: _Pooled, logs_dir: Path) -> None:
    """Copy what each server log gained since the run acquired the stack into ``logs_dir``."""
    logs_dir.mkdir(parents=True, exist_ok=True)
    for _name, (path, offset) in p.log_offsets.items():
        if not path.exists():
            continue
        with open(path, "rb") as src, open(logs_dir / path.name, "wb") as dst:
            src.seek(offset)
            dst.write(f"# specchaos: pooled stack {p.stack_dir} (use {p.uses}), log from byte {offset} at "
                      f"{now():.3f}\n".encode())
            shutil.copyfileobj(src, dst)


def _sync_state(p: _Pooled) -> None:
    """Rewrite the pooled stack's run state with its live processes (for ``specchaos cleanup``)."""
    procs: list[dict[str, Any]] = []
    for name, server in p.stack.servers.items():
        roles = server.roles() if isinstance(server, ProcessRoles) else {}
        for role, members in roles.items():
            for proc in members:
                with contextlib.suppress(Exception):
                    procs.append({"pid": proc.pid, "create_time": proc.create_time(),
                                  "role": f"server:{name}" + ("" if role == "api" else f":{role}")})
    p.state.set_processes(procs)

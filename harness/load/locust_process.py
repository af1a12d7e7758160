"""Locust run headless as its own process, owned by the harness.

The process runs :mod:`harness.load.locustfile` against one loopback host and appends one
record per request to ``records_path``. It is started in its own session, dies with the
harness (``PR_SET_PDEATHSIG``: SIGTERM when the thread that started it exits) and is
registered in the run state so ``specchaos cleanup`` can find it after a crash.

Stopping is graceful first: SIGTERM makes locust stop its users, giving each up to
``stop_timeout_s`` to finish its request in flight (the record is written either way; a
request still running then is recorded as an error), print its summary and exit. SIGKILL
follows if it is still alive after ``stop(timeout_s)``.

Distributed load (``cfg.workers = N > 0``): locust's own master/worker mode, all on
127.0.0.1. One master (``--master``, bound to loopback, ``--expect-workers N``: it holds
the run time and quits the run) and ``N`` worker processes (``--worker``), each started
and registered like the single process, each writing its own records file
(:func:`harness.load.records.worker_records_path`; readers merge them) and log
(``locust.worker<i>.log``), and each allowed its share of ``max_requests`` (the shares sum
to it). A ramp or steps run on the master (locust's shape), which spreads the users over
the workers; an open loop runs one arrival scheduler on each worker, each sending its
share of the one arrival sequence (see the locustfile). Stopping SIGTERMs the master (which tells the workers to quit, each finishing its
request in flight), then waits for the workers, SIGTERMs and at last SIGKILLs any left.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness import state
from harness.errors import LoadError
from harness.load.config import LoadConfig
from harness.load.client import check_loopback_url
from harness.load.profiles import share
from harness.load.records import worker_records_path
from harness.ports import free_ports
from harness.proc import die_with_parent

log = logging.getLogger(__name__)

#: The locustfile, by path: never import it here (importing locust monkey-patches gevent).
LOCUSTFILE = Path(__file__).resolve().with_name("locustfile.py")
#: Locust's log line once its locustfile (and with it the prompt set) loaded.
_STARTED_LINE = "Starting Locust"
#: Longest wait for that line in :meth:`LocustProcess.start` (seconds).
STARTUP_LIMIT_S = 60.0



def _log_since(path: Path, offset: int) -> str:
    """The locust log from byte ``offset`` on (``""`` if unreadable)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return ""


def _tail(path: Path, chars: int = 2000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - chars))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return "(no log)"


def exit_reason(path: Path) -> str:
    """Why locust ended, from its log: the request bound, or its last meaningful line."""
    tail = _tail(path, 20000)   # locust's final summary (a table per request name) follows the line
    if "SPECCHAOS_MAX_REQUESTS" in tail and "reached" in tail:
        return "load.max_requests was reached (raise it, or shorten the phases)"
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "no log"


def _describe(cfg: LoadConfig) -> str:
    p = cfg.profile
    if p.kind == "open" and p.rate is None:
        return f"open loop at the trace's timestamps (speedup {cfg.source.speedup:g})" if cfg.source else "open loop"
    if p.kind == "open":
        return f"open loop {p.rate:g} req/s (burstiness {p.burstiness:g})"
    return f"{cfg.closed_users()} users"


class LocustProcess:
    """One headless locust run (see module doc).

    Args:
        host_url: the speculative server, e.g. ``"http://127.0.0.1:41234"``; loopback only.
        prompts_path: prompts.json (:func:`harness.load.prompts.save_prompt_set`).
        records_path: records.jsonl to append to.
        model: served model name.
        cfg: users, spawn rate, timeouts, think time, backoff, seed, max requests.
        run_time_s: locust's ``--run-time`` (whole seconds, at least 1).
        log_path: locust's stdout and stderr (its log and final summary).
        stop_timeout_s: locust's ``--stop-timeout``: how long a stopping user may finish
            its request in flight. Keep it below :meth:`stop`'s ``timeout_s``.
        startup_check_s: :meth:`start` waits this long after locust printed "Starting
            Locust" (its locustfile loaded; at most :data:`STARTUP_LIMIT_S` s) to catch an
            early exit, or until its first request is recorded, whichever comes first (a
            process that recorded a response loaded its prompt set and reaches the server).
        mirror_url: the reference (plain) server for mirror mode (``cfg.mirror``): every
            request is also sent there, interleaved (see :mod:`harness.load.locustfile`);
            None: no mirror. Loopback only.
        mirror_model: the reference server's served model name (default ``model``).

    Raises:
        LoadError: ``host_url`` or ``mirror_url`` is not a loopback http(s) URL.
    """

    def __init__(
        self,
        host_url: str,
        *,
        prompts_path: str | os.PathLike,
        records_path: str | os.PathLike,
        model: str,
        cfg: LoadConfig,
        run_time_s: float,
        log_path: str | os.PathLike,
        stop_timeout_s: float = 10.0,
        startup_check_s: float = 2.0,
        mirror_url: str | None = None,
        mirror_model: str | None = None,
    ):
        check_loopback_url(host_url, where="load host")
        if mirror_url is not None:
            check_loopback_url(mirror_url, where="mirror host")
        self.mirror_url = None if mirror_url is None else mirror_url.rstrip("/")
        self.mirror_model = mirror_model
        self.host_url = host_url.rstrip("/")
        self.prompts_path = Path(prompts_path).resolve()
        self.records_path = Path(records_path).resolve()
        self.model = model
        self.cfg = cfg
        self.run_time_s = max(1, int(run_time_s))
        self.log_path = Path(log_path).resolve()
        self.stop_timeout_s = stop_timeout_s
        self.startup_check_s = startup_check_s
        self._proc: subprocess.Popen | None = None
        self._stopped = False
        self.workers = cfg.workers
        self._worker_procs: list[subprocess.Popen] = []
        self.master_port: int | None = None

    def command(self) -> list[str]:
        """The locust argv (no shell)."""
        return [
            sys.executable, "-m", "locust",
            "-f", str(LOCUSTFILE),
            "--headless",
            "-u", str(self.locust_users()),
            "-r", f"{self.spawn_rate():g}",
            "--host", self.host_url,
            "--run-time", f"{self.run_time_s}s",
            "--stop-timeout", f"{self.stop_timeout_s:g}",
            "--only-summary",
            "--exit-code-on-error", "0",  # failed requests are data; exit != 0 means locust broke
            "--loglevel", "INFO",
            *self._master_args(),
        ]

    def locust_users(self) -> int:
        """Locust's ``-u``: the closed loop's users (a shape overrides it when the profile
        ramps or steps), or for the open loop one arrival scheduler per locust process that
        sends (1, or ``workers``: locust gives each worker one, all at once, see
        :meth:`spawn_rate`)."""
        if self.cfg.profile.kind == "open":
            return max(1, self.workers)
        return self.cfg.closed_users()

    def spawn_rate(self) -> float:
        """Locust's ``-r``: ``cfg.spawn_rate``, but for an open loop over workers at least
        ``workers``, so the master hands every worker its scheduler in one batch and the
        workers' arrival clocks start together (locust dispatches ``-r`` users a second: at
        ``-r 1`` worker 1's clock would start a second after worker 0's)."""
        if self.cfg.profile.kind == "open" and self.workers:
            return max(self.cfg.spawn_rate, float(self.workers))
        return self.cfg.spawn_rate

    def profile_json(self) -> str:
        """``SPECCHAOS_PROFILE``: the profile, a closed loop's ``users`` resolved."""
        p = self.cfg.profile
        if p.kind == "closed":
            p = p.model_copy(update={"users": self.cfg.closed_users()})
        return p.model_dump_json()

    def environment(self) -> dict[str, str]:
        """The child's environment: ours without ``LOCUST_*`` (no stray locust settings),
        plus the ``SPECCHAOS_*`` settings of :mod:`harness.load.locustfile`, and
        ``GEVENT_RESOLVER=block`` unless set: the load only reaches loopback (an IP literal or
        ``localhost``, never a DNS query), so gevent's default resolver, which hands every
        ``getaddrinfo`` of a new connection to a native thread pool, only costs CPU (each
        retry into a dead server's port opens a new connection)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOCUST_")}
        env.setdefault("GEVENT_RESOLVER", "block")
        c = self.cfg
        env.update({
            "PYTHONUNBUFFERED": "1",
            "SPECCHAOS_PROMPTS": str(self.prompts_path),
            "SPECCHAOS_RECORDS": str(self.records_path),
            "SPECCHAOS_MODEL": self.model,
            "SPECCHAOS_REQUEST_TIMEOUT_S": repr(float(c.request_timeout_s)),
            "SPECCHAOS_MAX_REQUESTS": str(c.max_requests),
            "SPECCHAOS_THINK_TIME_S": repr(float(c.think_time_s)),
            "SPECCHAOS_ERROR_BACKOFF_S": repr(float(c.error_backoff_s)),
            "SPECCHAOS_SEED": str(c.seed),
            "SPECCHAOS_IGNORE_EOS": "1" if c.ignore_eos else "0",
            "SPECCHAOS_READ_STAMPS": "1" if c.read_stamps else "0",
            "SPECCHAOS_SAMPLING": json.dumps([s.model_dump() for s in c.sampling]),
            "SPECCHAOS_REQUEST_CLASSES": json.dumps([k.model_dump() for k in c.request_classes or []]),
            "SPECCHAOS_MIRROR_HOST": self.mirror_url or "",
            "SPECCHAOS_MIRROR_MODEL": self.mirror_model or "",
            "SPECCHAOS_PROFILE": self.profile_json(),
            "SPECCHAOS_RETRY": c.retry.model_dump_json(),
        })
        return env

    # ------------------------------------------------------------ distributed load
    def _master_args(self) -> list[str]:
        if not self.workers:
            return []
        if self.master_port is None:
            self.master_port = _free_loopback_port()
        return ["--master", "--master-bind-host", "127.0.0.1", "--master-bind-port", str(self.master_port),
                "--expect-workers", str(self.workers), "--expect-workers-max-wait", str(int(STARTUP_LIMIT_S))]

    def max_requests_share(self, index: int) -> int:
        """Worker ``index``'s share of ``cfg.max_requests``: an even split, the first
        ``max_requests % workers`` workers one more (the shares sum to the bound)."""
        return share(self.cfg.max_requests, self.workers, index)

    def worker_command(self, index: int) -> list[str]:
        """The argv of worker ``index`` (no shell); it connects to the master on loopback."""
        del index   # every worker runs the same command; its environment differs
        return [
            sys.executable, "-m", "locust",
            "-f", str(LOCUSTFILE),
            "--worker", "--master-host", "127.0.0.1", "--master-port", str(self.master_port),
            "--exit-code-on-error", "0",  # as the master: failed requests are data
            "--loglevel", "INFO",
        ]

    def worker_environment(self, index: int) -> dict[str, str]:
        """Worker ``index``'s environment: the master's, with its own records file, its
        share of the request bound, and its index (run-wide user ids, see the locustfile)."""
        env = self.environment()
        env.update({
            "SPECCHAOS_RECORDS": str(worker_records_path(self.records_path, index)),
            "SPECCHAOS_MAX_REQUESTS": str(self.max_requests_share(index)),
            "SPECCHAOS_WORKER_INDEX": str(index),
            "SPECCHAOS_WORKER_COUNT": str(self.workers),
        })
        return env

    def worker_log_path(self, index: int) -> Path:
        """Worker ``index``'s log: ``locust.log`` → ``locust.worker<i>.log``."""
        return worker_records_path(self.log_path, index)

    @property
    def pids(self) -> list[int]:
        """The pids of every locust process started (master or single process first)."""
        return [p.pid for p in ([self._proc] if self._proc else []) + self._worker_procs]

    def _spawn(self, cmd: list[str], env: dict[str, str], log_path: Path, role: str) -> subprocess.Popen:
        with open(log_path, "ab") as logf:
            try:
                proc = subprocess.Popen(
                    cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                    env=env, cwd=str(self.records_path.parent),  # no stray locust.conf
                    start_new_session=True, preexec_fn=die_with_parent(signal.SIGTERM), close_fds=True,
                )
            except OSError as exc:
                raise LoadError(f"cannot start locust: {exc}", where=str(log_path)) from None
        state.register_process(proc.pid, role)
        return proc

    def _failed_worker(self) -> tuple[int, subprocess.Popen] | None:
        for i, w in enumerate(self._worker_procs):
            if w.poll() is not None and w.returncode != 0:
                return i, w
        return None

    def lost_worker_error(self) -> LoadError | None:
        """A :class:`LoadError` naming the first worker that exited with a non-zero code
        (negative: killed by that signal) while the master still runs, else None. Locust's
        master only marks such a worker "missing" after its heartbeat stops; it does not
        give the worker's users to the others for about a minute, until it declares it dead
        (measured with locust 2.47: 4 users over two workers, one SIGKILLed, ran on with 2
        users), so the load is no longer the one configured. A worker that quits with code 0
        (the master told it to, or a SIGTERM not from the harness) is not reported."""
        if self._stopped or not self.is_running():
            return None
        failed = self._failed_worker()
        if failed is None:
            return None
        i, w = failed
        return LoadError(f"locust worker {i} exited with code {w.returncode} while the load ran; locust does not "
                         f"give its users to the other workers, so the load is smaller than configured",
                         where=str(self.worker_log_path(i)), hint="read the worker's locust log; the run is judged "
                                                                  "on what was recorded")

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def returncode(self) -> int | None:
        """Exit status once exited (negative: killed by that signal), else None."""
        return None if self._proc is None else self._proc.poll()

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start locust and check it survives its first ``startup_check_s`` seconds.

        Raises:
            LoadError: already started, the prompt set is missing, locust cannot be
                started, or it exited at once with a non-zero code (the message carries
                the log tail). A run that finished with code 0 within the check is fine.
        """
        if self._proc is not None:
            raise LoadError("locust was already started", where=str(self.log_path))
        if not self.prompts_path.is_file():
            raise LoadError("prompt set not found", where=str(self.prompts_path),
                            hint="save it with harness.load.prompts.save_prompt_set first")
        self.records_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = self.command()
        log.info("starting locust: %s -> %s%s for %d s", _describe(self.cfg), self.host_url,
                 f" and (mirror) {self.mirror_url}" if self.mirror_url else "", self.run_time_s)
        log.debug("locust argv: %s", cmd)
        log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        sizes = self._record_sizes()
        self._proc = self._spawn(cmd, self.environment(), self.log_path, "locust-master" if self.workers else "locust")
        try:
            for i in range(self.workers):
                self._worker_procs.append(self._spawn(self.worker_command(i), self.worker_environment(i),
                                                      self.worker_log_path(i), f"locust-worker{i}"))
        except LoadError:
            self.stop(timeout_s=5.0)
            raise
        # The survival window counts from locust's own "Starting Locust" line, printed once
        # the locustfile (and the prompt set) loaded: on a busy host the import alone can
        # outlast a fixed window, and a bad prompt set would then pass the check.
        deadline = time.monotonic() + STARTUP_LIMIT_S
        started = False
        while time.monotonic() < deadline:
            if not started and _STARTED_LINE in _log_since(self.log_path, log_offset):
                started = True
                deadline = time.monotonic() + self.startup_check_s
            failed = self._failed_worker()
            if failed is not None:
                i, w = failed
                self.stop(timeout_s=5.0)
                raise LoadError(f"locust worker {i} exited at start with code {w.returncode}: "
                                f"{_tail(self.worker_log_path(i))}", where=str(self.worker_log_path(i)),
                                hint="read the worker's locust log")
            if self._proc.poll() is not None:
                if self._worker_procs:   # the master is gone: its workers go too
                    self.stop(timeout_s=self.stop_timeout_s + 5.0)
                self._forget()
                if self._proc.returncode == 0:  # e.g. SPECCHAOS_MAX_REQUESTS already reached
                    return
                raise LoadError(
                    f"locust exited at start with code {self._proc.returncode}: {_tail(self.log_path)}",
                    where=str(self.log_path), hint="read the locust log",
                )
            if started and self._record_sizes() != sizes:
                return   # a request recorded: the prompt set loaded and the server is reached
            time.sleep(0.1)
        if not started:
            log.warning("locust printed no %r within %.0f s; going on", _STARTED_LINE, STARTUP_LIMIT_S)

    def _record_sizes(self) -> list[int]:
        """The sizes in bytes of the records file and of each worker's (0 when absent)."""
        paths = [self.records_path] + [worker_records_path(self.records_path, i) for i in range(self.workers)]
        return [p.stat().st_size if p.exists() else 0 for p in paths]

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """Stop locust: SIGTERM (graceful, see module doc), then SIGKILL of its process
        group after ``timeout_s``. Idempotent; a no-op if never started.

        Returns:
            The exit status (None if it was never started).
        """
        proc = self._proc
        if proc is None:
            return None
        if self._stopped:
            return proc.poll()
        self._stopped = True
        deadline = time.monotonic() + timeout_s
        _terminate(proc, timeout_s, "locust")
        # Workers: the master told them to quit (each finishes its request in flight);
        # wait for them within the same bound, then SIGTERM, then SIGKILL what is left.
        for i, w in enumerate(self._worker_procs):
            try:
                w.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _terminate(w, max(5.0, self.stop_timeout_s + 2.0), f"locust worker {i}")
        self._forget()
        log.info("locust stopped (exit code %s%s)", proc.returncode,
                 f"; workers {[w.returncode for w in self._worker_procs]}" if self._worker_procs else "")
        return proc.returncode

    def _forget(self) -> None:
        for p in ([self._proc] if self._proc is not None else []) + self._worker_procs:
            if p.poll() is not None:   # a live worker stays registered for `specchaos cleanup`
                state.unregister_process(p.pid)

    def __enter__(self) -> "LocustProcess":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _terminate(proc: subprocess.Popen, timeout_s: float, what: str) -> None:
    """SIGTERM ``proc``, wait up to ``timeout_s``, then SIGKILL its process group."""
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        log.warning("%s did not stop within %.0f s of SIGTERM; killing it", what, timeout_s)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
        proc.wait(timeout=10)


def _free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for the locust master), outside the
    ephemeral range (:func:`harness.ports.free_ports`)."""
    return free_ports("127.0.0.1", 1)[0]

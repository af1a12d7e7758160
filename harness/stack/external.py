"""The external launcher: attach to vLLM OpenAI-compatible servers the harness did not start.

``stack: {launcher: external, spec_url: URL, reference_url: URL}`` (``reference_url``
optional: without it integrity is reported not judged). The URLs are loopback unless their
host is in ``stack.allow_hosts`` (:class:`harness.stack.config.StackConfig`); a run that
allows hosts makes every traffic path accept them (:func:`harness.net.allow_hosts`).

Attaching (:meth:`ExternalStack.start`), per server, within ``stack.startup_timeout_s``:

1. the served model's name from ``GET /v1/models`` (the first model listed);
2. ready by a **real generation** (``POST /v1/completions``, greedy, ``max_tokens`` 2, at
   least one token), never by ``/health`` alone;
3. ``GET /metrics`` answering 200 makes the capability ``metrics``
   (:meth:`ExternalServer.metrics_url`); the scraper records gaps otherwise;
4. the vLLM version from ``GET /version`` (``"unknown"`` when it does not answer).

What it offers: readiness and, when present, the metrics endpoint
(:mod:`harness.stack.capabilities`). What it does not: process ids, supervision,
respeculation, logs: faults that need them are refused at ``specchaos validate``. Network
faults work (the fault proxy goes in front of the URL), as do client-side faults.

A restart done by someone else (the server goes away and comes back) is not this
launcher's business: the health sampler, the recovery probes and the load see the outage
and the recovery as they see any other. :meth:`ExternalStack.stop` detaches: it sends no
signal and stops nothing (``specchaos cleanup`` has nothing of it either: it registers no
process in the run state).

The speculative settings in the report are those the configuration declares
(``stack.method``, ``stack.draft``, ``stack.num_speculative_tokens``): an external server
does not say how it was started.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from harness.clock import now
from harness.errors import StackError
from harness.stack.config import StackConfig
from harness.timeline import Timeline

__all__ = ["ExternalServer", "ExternalStack", "PROBE_PROMPT"]

log = logging.getLogger(__name__)

#: The prompt of a readiness generation.
PROBE_PROMPT = "The quick server"
_POLL_S = 0.5            # between two readiness tries
_REQUEST_TIMEOUT_S = 30.0  # one discovery or probe request


def _client() -> httpx.Client:
    """A client that ignores proxy environment variables (the URL is reached directly)."""
    return httpx.Client(timeout=_REQUEST_TIMEOUT_S, trust_env=False)


class ExternalServer:
    """One server the harness attaches to (implements ``harness.stack.base.Server`` and the
    capabilities ``readiness`` and ``metrics``). ``incarnation`` stays 0 and ``restarts``
    empty: restarts by someone else are measured by the load and the probes (module doc).

    Args:
        name: ``"spec"`` or ``"ref"``.
        base_url: ``http(s)://host:port`` (validated by the configuration).
        startup_timeout_s: default bound of :meth:`wait_ready`, seconds.
        timeline: where ``stack`` events go (None: nowhere).
    """

    def __init__(self, name: str, base_url: str, *, startup_timeout_s: float = 300.0,
                 timeline: Timeline | None = None):
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.model = ""
        self.incarnation = 0
        self.restarts: list[dict[str, Any]] = []
        self.startup_timeout_s = startup_timeout_s
        self.timeline = timeline
        self.has_metrics = False
        self.version = "unknown"
        self._ready_at: float | None = None

    # ------------------------------------------------------------------ capabilities
    def wait_ready(self, timeout_s: float | None = None) -> float:
        """Discover the model (``/v1/models``), then wait for a real generation to succeed.

        Args:
            timeout_s: longest wait, seconds (default: ``startup_timeout_s``).

        Returns:
            The epoch s the generation succeeded.

        Raises:
            StackError: no model listed or no successful generation within ``timeout_s``
                (the message names the URL and the last answer).
        """
        deadline = time.monotonic() + (self.startup_timeout_s if timeout_s is None else timeout_s)
        last = "no answer yet"
        with _client() as client:
            while True:
                try:
                    if not self.model:
                        self.model = self._discover_model(client)
                    ok, last = self._generate(client)
                    if ok:
                        self._ready_at = now()
                        return self._ready_at
                except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
                    last = f"{type(exc).__name__}: {exc}"
                if time.monotonic() >= deadline:
                    raise StackError(f"external server {self.name} at {self.base_url} did not generate within "
                                     f"{timeout_s if timeout_s is not None else self.startup_timeout_s:.0f} s: {last}",
                                     where=f"configuration.specchaos.stack.{self.name}_url" if self.name == "spec"
                                     else "configuration.specchaos.stack.reference_url",
                                     hint="is the server running, and does it serve /v1/models and /v1/completions? "
                                          "On a slow server raise stack.startup_timeout_s")
                time.sleep(_POLL_S)

    def is_up(self) -> bool:
        """One real generation succeeds now (bounded by the request timeout)."""
        try:
            with _client() as client:
                return bool(self.model) and self._generate(client)[0]
        except httpx.HTTPError:
            return False

    def metrics_url(self) -> str | None:
        """``base_url/metrics`` when it answered 200 at attach time, else None."""
        return f"{self.base_url}/metrics" if self.has_metrics else None

    # ------------------------------------------------------------------ attach
    def attach(self, timeout_s: float) -> float:
        """:meth:`wait_ready`, then probe ``/metrics`` and ``/version`` and put
        ``server_attached`` on the timeline. Returns the ready time (epoch s).

        Raises:
            StackError: as :meth:`wait_ready`.
        """
        ready = self.wait_ready(timeout_s)
        with _client() as client:
            try:
                self.has_metrics = client.get(f"{self.base_url}/metrics", timeout=5.0).status_code == 200
            except httpx.HTTPError:
                self.has_metrics = False
            try:
                r = client.get(f"{self.base_url}/version", timeout=5.0)
                if r.status_code == 200:
                    self.version = str(r.json().get("version") or "unknown")
            except (httpx.HTTPError, ValueError, AttributeError):
                pass
        if self.timeline is not None:
            self.timeline.emit("stack", "server_attached", server=self.name, url=self.base_url, model=self.model,
                               metrics=self.has_metrics, vllm_version=self.version, ready_at=ready)
        log.info("attached to %s server %s (model %s, /metrics %s)", self.name, self.base_url, self.model,
                 "yes" if self.has_metrics else "no")
        return ready

    def _discover_model(self, client: httpx.Client) -> str:
        r = client.get(f"{self.base_url}/v1/models")
        r.raise_for_status()
        models = [m.get("id") for m in r.json().get("data") or [] if isinstance(m, dict) and m.get("id")]
        if not models:
            raise ValueError("/v1/models lists no model")
        return str(models[0])

    def _generate(self, client: httpx.Client) -> tuple[bool, str]:
        """``(ok, what happened)`` of a 2-token greedy completion."""
        r = client.post(f"{self.base_url}/v1/completions",
                        json={"model": self.model, "prompt": PROBE_PROMPT, "max_tokens": 2, "temperature": 0})
        if r.status_code != 200:
            return False, f"HTTP {r.status_code} from /v1/completions"
        body = r.json()
        ok = bool(body.get("choices")) and (body.get("usage") or {}).get("completion_tokens", 0) >= 1
        return ok, "generated" if ok else "a completion without tokens"

    def count_tokens(self, text: str) -> int:
        """Prompt tokens of ``text`` by the server's own tokenizer (vLLM's ``POST /tokenize``,
        special tokens included as in ``usage.prompt_tokens``).

        Raises:
            StackError: the server has no ``/tokenize`` or did not answer.
        """
        try:
            with _client() as client:
                r = client.post(f"{self.base_url}/tokenize", json={"model": self.model, "prompt": text})
                r.raise_for_status()
                return int(r.json()["count"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise StackError(f"cannot count tokens on {self.base_url}/tokenize: {exc}",
                             where="configuration.specchaos.stack.spec_url",
                             hint="the prompt set is measured with the server's tokenizer (vLLM's /tokenize)") from None

    def __repr__(self) -> str:
        return f"ExternalServer({self.name!r}, {self.base_url!r}, model={self.model!r})"


class ExternalStack:
    """The servers at ``stack.spec_url`` and, if given, ``stack.reference_url``
    (implements ``harness.stack.base.Stack``; see the module doc).

    Args:
        cfg: the ``stack`` block (launcher ``external``).
        run_dir: the run's output directory (nothing is written there: no logs of its own).
        timeline: where ``stack`` events go.
    """

    launcher = "external"
    #: What the launcher does, in refusals (:func:`harness.stack.capabilities.refusal`).
    summary = "attaches to URLs only"
    server_class = ExternalServer

    def __init__(self, cfg: StackConfig, run_dir: str | os.PathLike, timeline: Timeline | None = None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.timeline = timeline
        urls = {"spec": cfg.spec_url}
        if cfg.reference and cfg.reference_url:
            urls["ref"] = cfg.reference_url
        self.servers: dict[str, ExternalServer] = {
            name: ExternalServer(name, str(url), startup_timeout_s=cfg.startup_timeout_s, timeline=timeline)
            for name, url in urls.items()}
        self.vllm_version = "unknown"

    @classmethod
    def preflight(cls, cfg: StackConfig, where: str) -> None:
        """Validate-time checks: none beyond the configuration's own (URLs, allow-list);
        nothing is contacted before the run."""
        return None

    @property
    def speculative(self) -> dict[str, Any]:
        """The speculative settings the configuration declares (module doc)."""
        return {"method": self.cfg.method, "draft": self.cfg.draft,
                "num_speculative_tokens": self.cfg.num_speculative_tokens}

    def count_tokens(self, text: str) -> int:
        """Prompt tokens of ``text`` by the speculative server's tokenizer (:meth:`ExternalServer.count_tokens`)."""
        return self.servers["spec"].count_tokens(text)

    def start(self) -> None:
        """Attach to every server concurrently (module doc); returns when each generated.

        Raises:
            StackError: a server did not list a model or generate within ``startup_timeout_s``.
        """
        errors: dict[str, BaseException] = {}

        def attach(server: ExternalServer) -> None:
            try:
                server.attach(self.cfg.startup_timeout_s)
            except BaseException as exc:  # noqa: BLE001 - re-raised below, in the caller's thread
                errors[server.name] = exc

        threads = [threading.Thread(target=attach, args=(s,), name=f"specchaos-attach-{n}", daemon=True)
                   for n, s in self.servers.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for name in self.servers:
            if name in errors:
                raise errors[name]
        self.vllm_version = self.servers["spec"].version

    def stop(self, timeout_s: float = 20.0) -> None:
        """Detach: sends nothing to the servers and stops nothing (they are not the
        harness's). Idempotent."""
        if self.timeline is not None:
            for name, server in self.servers.items():
                if server._ready_at is not None:
                    self.timeline.emit("stack", "server_detached", server=name, url=server.base_url)
                    server._ready_at = None

    def __enter__(self) -> "ExternalStack":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

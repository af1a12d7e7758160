"""What every launcher provides (local processes, Docker containers, external servers).

A *server* is one vLLM OpenAI-compatible server; a *stack* is the speculative server
(``"spec"``) plus, optionally, the non-speculative reference (``"ref"``) on the same
target model. Process *roles* inside one server, from the process tree:

* ``"api"``: the API server process (``vllm.entrypoints.openai.api_server``),
* ``"engine"``: its child whose title starts with ``VLLM::EngineCore``,
* ``"worker"``: the engine's child whose title starts with ``VLLM::Worker``
  (runs both the target and the draft model).
"""

from __future__ import annotations

from typing import Any, Protocol

import psutil

ROLES = ("api", "engine", "worker")

#: What each role is, in words (``specchaos faults`` and the generated docs reference show it).
ROLE_DOCS = {
    "api": "the OpenAI API server process (python -m vllm.entrypoints.openai.api_server); "
           "killing it takes its engine and worker down with it",
    "engine": "its child VLLM::EngineCore (scheduler, KV cache manager); killed: /health 503 "
              "for a few seconds, then the API server exits with code 0",
    "worker": "the engine's child VLLM::Worker (runs the target and the draft model); killed: every "
              "in-flight request fails at once and the API server exits with code 0",
}


class Server(Protocol):
    """One supervised vLLM OpenAI server of a stack."""

    name: str                 # "spec" or "ref"
    base_url: str             # e.g. "http://127.0.0.1:41234"
    model: str                # served model name to put in requests
    incarnation: int          # 0 for the first start, +1 per supervised restart
    restarts: list[dict[str, Any]]  # one {"t", "returncode", "incarnation"} per restart

    def roles(self) -> dict[str, list[psutil.Process]]:
        """Live processes per role (see module doc). Empty lists when down."""

    def api_process(self) -> psutil.Process | None:
        """The current API server process, or None when down."""

    def wait_for_incarnation(self, n: int, timeout_s: float) -> float | None:
        """Block until incarnation >= ``n`` is ready; the epoch time it became ready,
        or None on timeout (evidence of a supervised restart)."""


class Stack(Protocol):
    """The servers of one run, started and stopped together. What a server offers beyond
    :class:`Server` is declared by ``server_class`` (:mod:`harness.stack.capabilities`)."""

    launcher: str                 # "local", "docker", "external"
    summary: str                  # what the launcher does, e.g. "attaches to URLs only" (for refusals)
    server_class: type            # the class of its servers: its capabilities are read from it
    vllm_version: str
    speculative: dict[str, Any]   # {"method", "draft", "num_speculative_tokens"}
    servers: dict[str, Server]    # "spec" and, if configured, "ref"

    def __init__(self, cfg: Any, run_dir: Any, timeline: Any = None) -> None:
        """A stack for ``cfg`` (its ``stack`` block) writing under ``run_dir``, events to ``timeline``; starts nothing."""

    @classmethod
    def preflight(cls, cfg: Any, where: str) -> None:
        """Validate-time checks of a ``stack`` block for this launcher (``specchaos validate``
        and ``run`` before anything starts); starts and contacts nothing.

        Raises:
            SpecchaosError: one line; ``where`` prefixes the field concerned.
        """

    def start(self) -> None:
        """Start every server and return when each is ready (a real generation succeeded).

        Raises:
            StackError: a port is in use, a server exited or timed out while starting
                (everything started so far is stopped first).
        """

    def stop(self) -> None:
        """Stop every server and all its processes; no restart follows. Idempotent."""

"""What a server may offer beyond the :class:`harness.stack.base.Server` core (name, base
URL, model), declared as small protocols, toxiproxy-style (``StatefulToxic``): a caller
tests for a capability once, and ``specchaos validate`` refuses a fault whose family needs
one that the chosen launcher's servers lack, before anything starts.

=================  ===================================  =======================================
capability         protocol                             what it gives
=================  ===================================  =======================================
``processes``      :class:`ProcessRoles`                process ids per role (pid-safe handles)
``supervision``    :class:`Supervised`                  a supervisor that restarts the server
                                                        and reports each incarnation
``respeculation``  :class:`Respeculating`               a planned restart with other
                                                        speculative settings
``readiness``      :class:`Readiness`                   readiness by a real generation
``logs``           :class:`Logs`                        the server's log file
``metrics``        :class:`MetricsEndpoint`             a ``/metrics`` endpoint to scrape
``containers``     :class:`Containerised`               a container per incarnation (pause,
                                                        live limits, kill of the whole server)
=================  ===================================  =======================================

A launcher's servers are instances of its stack class's ``server_class``; what that class
provides is read from the class itself (:func:`capabilities_of`), so a launcher cannot
claim a capability it does not implement. A fault family lists what it needs in its
``needs`` class attribute (:class:`faults.base.Fault`); :func:`refusal` words the one-line
refusal.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import psutil

__all__ = ["TokenCounting", "ProcessRoles", "Containerised", "Supervised", "Respeculating", "Readiness", "Logs", "MetricsEndpoint", "Capability",
           "CAPABILITIES", "capabilities_of", "provides", "missing", "refusal"]


@runtime_checkable
class ProcessRoles(Protocol):
    """Process ids per role (:data:`harness.stack.base.ROLES`), as pid-safe ``psutil``
    handles (a handle remembers its process's create time, so a reused pid is never
    signalled)."""

    def roles(self) -> dict[str, list[psutil.Process]]:
        """Live processes per role; empty lists when down."""
        ...

    def api_process(self) -> psutil.Process | None:
        """The current API server process, or None when down."""
        ...


@runtime_checkable
class Supervised(Protocol):
    """A server the harness supervises: a process that exits is restarted, each start is
    an incarnation (0, 1, ... in ``incarnation``), and a planned restart with extra
    environment is possible."""

    def wait_for_incarnation(self, n: int, timeout_s: float | None = None) -> float | None:
        """Epoch s incarnation ``>= n`` became ready, or None when the wait ended first."""
        ...

    def restart_with_env(self, env: Any, *, reason: str = "") -> int:
        """Restart with ``env`` added to the environment; the new incarnation's number."""
        ...

    @property
    def state(self) -> str:
        """``starting``, ``ready``, ``restarting``, ``failed``, ``gave_up``, ``stopped``..."""
        ...

    @property
    def settled_at(self) -> float | None:
        """Epoch s the current incarnation became ready with no planned restart pending; None otherwise."""
        ...


@runtime_checkable
class Respeculating(Protocol):
    """A server that can be restarted with other speculative settings (draft swap, circuit breaker)."""

    #: The speculative settings it was started with (``{"method", "draft", "num_speculative_tokens"}``).
    configured_speculative: dict[str, Any]

    @property
    def speculative(self) -> dict[str, Any]:
        """The speculative settings in force (method None: plain decoding)."""
        ...

    def respeculate(self, method: str | None, draft: str | os.PathLike | None = None,
                    num_speculative_tokens: int | None = None, *, reason: str = "") -> int:
        """Planned restart with the new settings; the new incarnation's number."""
        ...


@runtime_checkable
class Readiness(Protocol):
    """Readiness judged by a real generation, not by ``/health`` alone."""

    def wait_ready(self, timeout_s: float | None = None) -> float:
        """Block until ready; the epoch s it became ready. Raises ``StackError`` on timeout."""
        ...

    def is_up(self) -> bool:
        """Whether the server is ready now."""
        ...


@runtime_checkable
class Logs(Protocol):
    """The server writes a log file the harness can read (attachments, start errors)."""

    def log_file(self) -> Path | None:
        """The log file, or None when there is none."""
        ...


@runtime_checkable
class MetricsEndpoint(Protocol):
    """A Prometheus ``/metrics`` endpoint (vLLM's counters: speculation, KV cache, preemptions)."""

    def metrics_url(self) -> str | None:
        """The URL to scrape, or None when the server has none."""
        ...


@runtime_checkable
class Containerised(Protocol):
    """A server whose every incarnation is a container (launcher ``docker``): the fault
    families' container mechanisms (kill and restart of the container, ``docker pause``,
    live CPU and memory limits through ``container.update``) act on it."""

    def container(self) -> Any | None:
        """The running container (a ``docker`` SDK ``Container``) of the current incarnation, or None when down."""
        ...

    def container_name(self) -> str | None:
        """The current container's name (evidence, messages), or None before the first start."""
        ...


@runtime_checkable
class TokenCounting(Protocol):
    """A *stack* that measures prompts with its server's own tokenizer (an external server,
    whose model directory the harness may not have); a stack without it is measured with
    the target model's tokenizer under ``stack.models_dir``."""

    def count_tokens(self, text: str) -> int:
        """Prompt tokens of ``text``, special tokens included (as ``usage.prompt_tokens``)."""
        ...


@dataclass(frozen=True)
class Capability:
    """One capability: its name, its protocol and what it means in a refusal ("needs <what>")."""

    name: str
    protocol: type
    what: str


#: Every capability by name.
CAPABILITIES: dict[str, Capability] = {c.name: c for c in (
    Capability("processes", ProcessRoles, "process ids"),
    Capability("supervision", Supervised, "a supervisor that restarts the server and counts its incarnations"),
    Capability("respeculation", Respeculating, "a planned restart with other speculative settings"),
    Capability("readiness", Readiness, "readiness by a real generation"),
    Capability("logs", Logs, "the server's log file"),
    Capability("metrics", MetricsEndpoint, "a /metrics endpoint"),
    Capability("containers", Containerised, "a container per server (launcher docker)"),
)}


def _members(protocol: type) -> set[str]:
    """The names a protocol declares (methods, properties, annotated attributes)."""
    names = {n for n in vars(protocol) if not n.startswith("_")}
    return names | set(getattr(protocol, "__annotations__", {}))


def provides(obj: Any, capability: str) -> bool:
    """Whether ``obj`` (a server, or a server class) offers ``capability``.

    A class offers it when it defines every member of the protocol (an annotated
    attribute counts when the class annotates or defines it); an instance is checked with
    ``isinstance`` against the runtime-checkable protocol.

    Raises:
        KeyError: unknown capability name.
    """
    proto = CAPABILITIES[capability].protocol
    if isinstance(obj, type):
        annotated: set[str] = set()
        for klass in obj.__mro__:
            annotated |= set(getattr(klass, "__annotations__", {}))
        return all(hasattr(obj, n) or n in annotated for n in _members(proto))
    return isinstance(obj, proto)


def capabilities_of(obj: Any) -> frozenset[str]:
    """The capabilities ``obj`` (a server or a server class) offers (:func:`provides`)."""
    return frozenset(name for name in CAPABILITIES if provides(obj, name))


def missing(needs: tuple[str, ...] | list[str] | frozenset[str], server_class: type) -> list[str]:
    """The capabilities of ``needs`` that ``server_class`` lacks, in ``needs``' order.

    Raises:
        KeyError: an unknown capability name in ``needs`` (a family's declaration is wrong).
    """
    return [n for n in needs if not provides(server_class, n)]


def refusal(subject: str, needs: list[str], launcher: str, launcher_says: str, alternatives: list[str]) -> str:
    """The one-line refusal of ``subject`` (e.g. ``"faults[0] process-kill"``) that needs
    the capabilities ``needs`` which launcher ``launcher`` (described by ``launcher_says``,
    e.g. "attaches to URLs only") lacks; ``alternatives`` are launchers that offer them all.
    E.g. ``faults[0] process-kill needs process ids (capability `processes`); launcher
    `external` attaches to URLs only: use launcher docker or local``."""
    wanted = " and ".join(f"{CAPABILITIES[n].what} (capability `{n}`)" for n in needs)
    use = f"use launcher {' or '.join(alternatives)}" if alternatives else "no registered launcher offers it"
    return f"{subject} needs {wanted}; launcher `{launcher}` {launcher_says}: {use}"

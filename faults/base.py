"""The protocol every fault family implements (toxiproxy-style: tiny, one file each).

A fault is constructed from validated parameters, then driven by the generic
:class:`faults.ledger.Ledger`-backed injector in :mod:`faults.inject`:

1. the ledger records the *intent* (kind, target, params) **before** anything acts;
2. :meth:`Fault.inject` acts and returns what it did (pids, previous values...),
   which goes into the ledger so a crashed run can be reverted;
   (before the load starts, :meth:`Fault.prepare` may set up what the fault needs on the
   load path, e.g. a proxy the load is routed through; :meth:`Fault.release` undoes it
   at the end of the run);
3. :meth:`Fault.evidence` gathers proof that it acted (a measured effect). A fault
   without evidence makes the run an *error*, never a pass;
4. :meth:`Fault.clear` reverts it (idempotent; also called on exceptions and signals);
5. :meth:`Fault.recover` reverts from a ledger entry alone, after a crash
   (``specchaos cleanup``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from harness.stack.base import Server
from harness.stack.config import StackConfig
from harness.timeline import Timeline


class FaultContext(Protocol):
    """Everything a fault may reach, and nothing else (the run's session provides it;
    :class:`faults.inject.InjectionContext` is the implementation).

    Attributes:
        servers: the started stack's servers by name (``"spec"``, ``"ref"``): base URL,
            process roles (``roles()``: api, engine, worker), incarnation and
            ``wait_for_incarnation`` (evidence of a supervised restart). Empty before
            the stack started.
        load_urls: server name → the base URL the load sends to. It is the server's own
            URL unless a fault interposes something on the load path (e.g. a proxy),
            which it records here before the load starts.
        timeline: the run's timeline (fault events go through the injector; a fault may
            add its own measurements as events).
    """

    @property
    def servers(self) -> Mapping[str, Server]: ...

    @property
    def load_urls(self) -> MutableMapping[str, str]: ...

    @property
    def timeline(self) -> Timeline: ...

    def now(self) -> float:
        """The harness clock (epoch seconds)."""
        ...


class FaultParams(BaseModel):
    """Base of every family's parameter model: unknown fields are errors."""

    model_config = ConfigDict(extra="forbid")


@dataclass
class Evidence:
    """Proof a fault acted.

    Fields:
        acted: True only if the effect was observed (e.g. the process is gone).
        observations: measured facts, JSON-serialisable (e.g. ``{"gone_after_s": 0.02,
            "restart_seen_after_s": 24.1}``).
        detail: one human sentence.
    """

    acted: bool
    observations: dict[str, Any] = field(default_factory=dict)
    detail: str = ""


class Fault(ABC):
    """One injectable, reversible fault.

    Subclasses set :attr:`kind` (registry name, e.g. ``"process-kill"``), :attr:`activity`
    (the name of the typed Chaos Toolkit action generated for the family, e.g.
    ``"kill_process"``, whose arguments are :attr:`Params`' fields) and :attr:`Params`
    (a :class:`FaultParams` model), and implement the methods below. ``ctx`` is a
    :class:`FaultContext`: servers and their roles, the load path, the timeline, the clock.
    """

    kind: ClassVar[str]
    activity: ClassVar[str]
    Params: ClassVar[type[FaultParams]]
    #: What time to recover is measured from: ``"cleared"`` (default: the damage lasts
    #: while the fault is active, e.g. a freeze or a toxic) or ``"injected"`` (the damage is
    #: done when it acts, e.g. a killed process; its "clear" only waits for the restart).
    recovery_from: Literal["injected", "cleared"] = "cleared"
    #: The server capabilities the family needs (names of
    #: :data:`harness.stack.capabilities.CAPABILITIES`, e.g. ``("processes",)``): ``specchaos
    #: validate`` refuses the fault, before anything starts, with a launcher whose servers
    #: lack one. Empty: the family needs only the server's URL (e.g. a network toxic).
    needs: ClassVar[tuple[str, ...]] = ()

    def required(self) -> tuple[str, ...]:
        """The capabilities this fault, with its arguments, needs: :attr:`needs` unless a
        mechanism asks for more (e.g. ``role: container`` needs ``containers``)."""
        return type(self).needs

    def excluded(self) -> dict[str, str]:
        """Capabilities with which this fault, with its arguments, must not run:
        ``{capability: why, in words}`` (e.g. a cgroup mechanism would move a container's
        processes out of Docker's cgroups). ``specchaos validate`` refuses it on a launcher
        whose servers offer one. Empty by default."""
        return {}

    def __init__(self, params: FaultParams):
        self.params = params
        #: The ledger's id of the current injection (``"<kind>-<8 hex>"``), set by the
        #: injector after the ``intended`` line and before :meth:`inject`; a fault may name
        #: what it creates after it (e.g. a cgroup), so a crash can be reverted by that name.
        self.fault_id: str | None = None

    @abstractmethod
    def describe_target(self, ctx: FaultContext) -> str:
        """Human/ledger name of the target, e.g. ``"spec/worker"``. Must not act."""

    @abstractmethod
    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        """Act. Returns JSON-serialisable facts needed to revert or judge (stored in the ledger).

        Raises:
            FaultError: the target cannot be found or the fault cannot act.
        """

    @abstractmethod
    def evidence(self, ctx: FaultContext, timeout_s: float) -> Evidence:
        """Wait up to ``timeout_s`` for the effect, and report it."""

    @abstractmethod
    def clear(self, ctx: FaultContext) -> None:
        """Revert the fault. Idempotent; must not raise on an already-cleared fault."""

    def check_host(self) -> None:
        """Validate-time check that this host can do what the parameters ask (e.g. a
        writable cgroup, an NVIDIA GPU), called by ``specchaos validate`` and before a run
        starts anything. Must not act. Default: nothing to check.

        Raises:
            SpecchaosError: one line saying what is missing; its ``where`` names the
                argument concerned (e.g. ``"mechanism"``), which validation prefixes with
                the activity's location.
        """
        return None

    def check_stack(self, stack: StackConfig) -> None:
        """Validate-time check of the parameters against the run's ``stack`` block (e.g. a
        model the fault names exists under ``stack.models_dir``), called by ``specchaos
        validate`` and before a run starts anything, right after :meth:`check_host`. Must
        not act. Default: nothing to check.

        Raises:
            SpecchaosError: one line; its ``where`` names the argument concerned (e.g.
                ``"draft"``), which validation prefixes with the activity's location.
        """
        return None

    def prepare(self, ctx: FaultContext) -> None:
        """Called once per fault the experiment declares, after the stack started and
        before the load starts. It must not disturb the system under test; it may put
        something on the load path (set ``ctx.load_urls[server]`` to a proxy's URL), so a
        network fault re-routes the load without touching the session. Default: nothing.

        Raises:
            FaultError: what it needs cannot be set up (the run then fails to start).
        """
        return None

    def release(self, ctx: FaultContext) -> None:
        """Undo :meth:`prepare` at the end of the run (after the load stopped). Idempotent;
        default: nothing."""
        return None

    @classmethod
    def recover(cls, entry: dict[str, Any]) -> None:
        """Best-effort revert from a ledger entry after a crash. Default: nothing to revert."""
        return None

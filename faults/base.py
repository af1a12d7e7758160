"""The protocol every fault family implements (toxiproxy-style: tiny, one file each).

A fault is constructed from validated parameters, then driven by the generic
:class:`faults.ledger.Ledger`-backed injector in :mod:`faults.inject`:

1. the ledger records the *intent* (kind, target, params) **before** anything acts;
2. :meth:`Fault.inject` acts and returns what it did (pids, previous values...),
   which goes into the ledger so a crashed run can be reverted;
3. :meth:`Fault.evidence` gathers proof that it acted (a measured effect). A fault
   without evidence makes the run an *error*, never a pass;
4. :meth:`Fault.clear` reverts it (idempotent; also called on exceptions and signals);
5. :meth:`Fault.recover` reverts from a ledger entry alone, after a crash
   (``specchaos cleanup``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict


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

    Subclasses set :attr:`kind` (registry name, e.g. ``"process-kill"``) and
    :attr:`Params` (a :class:`FaultParams` model), and implement the methods below.
    ``ctx`` is a :class:`faults.inject.FaultContext`: it resolves targets (servers,
    process roles), and gives the timeline and the clock.
    """

    kind: ClassVar[str]
    Params: ClassVar[type[FaultParams]]

    def __init__(self, params: FaultParams):
        self.params = params

    @abstractmethod
    def describe_target(self, ctx: Any) -> str:
        """Human/ledger name of the target, e.g. ``"spec/worker"``. Must not act."""

    @abstractmethod
    def inject(self, ctx: Any) -> dict[str, Any]:
        """Act. Returns JSON-serialisable facts needed to revert or judge (stored in the ledger).

        Raises:
            FaultError: the target cannot be found or the fault cannot act.
        """

    @abstractmethod
    def evidence(self, ctx: Any, timeout_s: float) -> Evidence:
        """Wait up to ``timeout_s`` for the effect, and report it."""

    @abstractmethod
    def clear(self, ctx: Any) -> None:
        """Revert the fault. Idempotent; must not raise on an already-cleared fault."""

    @classmethod
    def recover(cls, entry: dict[str, Any]) -> None:
        """Best-effort revert from a ledger entry after a crash. Default: nothing to revert."""
        return None

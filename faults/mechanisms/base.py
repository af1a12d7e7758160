"""What every mechanism shares: the :class:`Target` a family hands it, the class attributes
the selector reads (:class:`Mechanism`), and the protocol of each action a family drives.

A mechanism's protocol (per action, below): ``apply`` acts and returns the facts for the
ledger; ``read back`` is measured in ``observe``/``evidence`` (the setting as the kernel or
the engine reports it, never "applied"); ``restore`` undoes it (idempotent; FaultError when
something stays); the classmethod ``recover(facts, fault_id)`` undoes it after a crash from
the ledger's facts (nothing to do: return).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import psutil

from faults.base import Evidence
from harness.errors import FaultError
from harness.stack.capabilities import provides
from harness.stack.procs import Recorded, same_process


@dataclass
class Target:
    """What a family acts on: ``srv`` (the stack's server ``server``), ``where`` (the
    fault's target, e.g. ``"spec/tree"``, named in errors), ``roles`` (None: the whole
    tree), ``recorded`` (the processes the family found, pid-safe), ``incarnation`` (the
    server's, when they were found) and ``fault_id`` (names what the mechanism creates)."""

    srv: Any
    server: str
    where: str
    fault_id: str
    roles: Sequence[str] | None = None
    recorded: list[Recorded] = field(default_factory=list)
    incarnation: int = 0


class Mechanism:
    """Class attributes and defaults every mechanism has (:func:`faults.mechanisms.select`).

    ``name``: recorded as the facts' ``mechanism``; ``action``: ``"cpu"``, ``"memory"``,
    ``"freeze"`` or ``"kill"``; ``answers``: the family argument values it serves (a
    ``mechanism``, or a ``role``; ``"auto"`` when it may be chosen unasked); ``needs``: the
    server capabilities (:mod:`harness.stack.capabilities`) without which ``"auto"`` passes
    it by (:meth:`serves`; a launcher's own mechanism may test its server class instead); ``stands_in``: why it serves an asked value other than its name."""

    name: ClassVar[str]
    action: ClassVar[str]
    answers: ClassVar[tuple[str, ...]] = ("auto",)
    needs: ClassVar[tuple[str, ...]] = ()
    stands_in: ClassVar[str | None] = None

    def __init__(self, t: Target):
        self.t = t
        self.targets: list[Recorded] = []   # the processes it acts on (for the family's log and evidence)

    @classmethod
    def serves(cls, srv: Any) -> bool:
        """Whether ``"auto"`` may choose it for ``srv``: the server offers every one of :attr:`needs`."""
        return all(provides(srv, c) for c in cls.needs)

    @classmethod
    def unfit(cls, t: Target) -> FaultError | None:
        """Why it cannot act on ``t`` (None: it can)."""
        return None

    @classmethod
    def check_host(cls) -> None:
        """Refuse a host it cannot act on, before anything starts (FaultError)."""
        return None

    @classmethod
    def recover(cls, facts: dict[str, Any], fault_id: str) -> None:
        """Undo after a crash, from the ledger's facts (``{}``: the crash came before them)."""
        return None


class CpuCap(Protocol):
    """``cpu-throttle``: hold ``t``'s processes to ``cpu_fraction`` of one CPU."""

    name: str
    targets: list[Recorded]
    measured_by: str

    def apply(self, cpu_fraction: float, period_s: float) -> dict[str, Any]: ...

    def observe(self, window_s: float, limit_cpus: float, obs: dict[str, Any]) -> tuple[bool, str]:
        """Measure over ``window_s`` s into ``obs``: (acted, detail)."""
        ...

    def restore(self) -> None: ...


class MemoryCap(Protocol):
    """``memory-limit``: limit what ``t`` may charge to ``size(current use in bytes)`` bytes."""

    name: str

    def apply(self, size: Callable[[int], int]) -> dict[str, Any]: ...

    def observe(self, obs: dict[str, Any], restart: Callable[[], None]) -> tuple[bool, str]:
        """Read the limit and use back into ``obs`` after the family's window; ``restart``
        waits for a supervised restart: (acted, detail)."""
        ...

    def restore(self) -> None: ...


class Freezer(Protocol):
    """``process-freeze``: stop ``t`` (for the duration, or ``duty_cycle`` of each ``period_s``)."""

    name: str

    def apply(self, duty_cycle: float | None, period_s: float) -> dict[str, Any]: ...

    def evidence(self, base_url: str, timeout_s: float, window_s: float) -> Evidence:
        """Observe the stop within ``timeout_s`` s (a window of at most ``window_s`` s)."""
        ...

    def restore(self) -> None: ...


def cpu_seconds(pids: Sequence[tuple[int, float | None]]) -> float:
    """User+system CPU seconds of the processes that still are themselves (psutil)."""
    total = 0.0
    for pid, ct in pids:
        try:
            if ct is not None and not same_process(pid, ct):
                continue
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


def gone(where: str, what: str) -> FaultError:
    """The error for a target whose every process went away before it could be ``what``."""
    return FaultError(f"every process of {where} went away before it could be {what}", where=where,
                      hint="the server may be restarting; inject once it is ready")


def generating(obs: dict[str, Any]) -> str:
    """``"; still generating"`` / ``"; no token produced in the window"`` / ``""`` from
    ``obs["still_generating"]`` (True / False / not measured)."""
    return ("; still generating" if obs["still_generating"] else
            "; no token produced in the window" if obs["still_generating"] is False else "")

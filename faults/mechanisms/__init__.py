"""How a fault family acts on a server, below the families. A family states *what*
(throttle role X to 30 %, limit memory to N, freeze role X, kill role X); :func:`select`
picks *how* — a mechanism class — from the server's capabilities
(:mod:`harness.stack.capabilities`) and the family's argument, and the family drives it
through its action's protocol (:mod:`faults.mechanisms.base`): apply, read back (in its
evidence), restore, and :func:`recover` after a crash, keyed by the ``mechanism`` name the
facts in the ledger record.

=================  ==========  ===============================================================
module             action      mechanism (``name`` in the facts)
=================  ==========  ===============================================================
``cgroup_cpu``     cpu         :class:`CgroupCpu` (``cgroup``): a CFS quota, a cgroup of our own
``duty_cycle``     cpu         :class:`DutyCycleCpu` (``duty_cycle``): SIGSTOP/SIGCONT per role
``cgroup_memory``  memory      :class:`CgroupMemory` (``cgroup``): a memory limit, a cgroup of our own
``signal``         freeze      :class:`SignalStop` (``signal``): SIGSTOP, for good or in a duty cycle
``signal``         kill        :class:`SignalKill` (``signal``): a kill signal by recorded identity
``container``      all four    :class:`ContainerCpu`, :class:`ContainerMemory`,
                               :class:`ContainerPause` (``docker_pause``), :class:`ContainerKill`
                               (``container``): through the Docker engine
=================  ==========  ===============================================================

A new launcher brings its mechanisms: a module here and its classes in :data:`MECHANISMS`
(or :func:`register`); no family changes. Earlier entries win where several fit.
"""

from __future__ import annotations

from typing import Any

from faults.mechanisms.base import CpuCap, Freezer, Mechanism, MemoryCap, Target
from faults.mechanisms.cgroup_cpu import IN_CONTAINER as CPU_ROLES_IN_CONTAINER
from faults.mechanisms.cgroup_cpu import CgroupCpu
from faults.mechanisms.cgroup_memory import IN_CONTAINER as MEMORY_ROLES_IN_CONTAINER
from faults.mechanisms.cgroup_memory import CgroupMemory
from faults.mechanisms.container import ContainerCpu, ContainerKill, ContainerMemory, ContainerPause
from faults.mechanisms.duty_cycle import MIN_SLICE_S, DutyCycleCpu, slice_error
from faults.mechanisms.signal import SignalKill, SignalStop
from harness.errors import FaultError

__all__ = ["MECHANISMS", "Mechanism", "Target", "CpuCap", "MemoryCap", "Freezer", "select", "check_host", "recover",
           "register", "MIN_SLICE_S", "slice_error", "CPU_ROLES_IN_CONTAINER", "MEMORY_ROLES_IN_CONTAINER"]

#: Every mechanism, in order of preference within an action.
MECHANISMS: list[type[Mechanism]] = [
    ContainerCpu, ContainerMemory, ContainerPause, ContainerKill,
    CgroupCpu, DutyCycleCpu, CgroupMemory, SignalStop, SignalKill,
]


def register(cls: type[Mechanism], first: bool = True) -> None:
    """Add a mechanism (before the others of its action with ``first``: a launcher's own
    mechanisms fit only its servers, so they go first). Idempotent."""
    if cls not in MECHANISMS:
        MECHANISMS.insert(0 if first else len(MECHANISMS), cls)


def _of(action: str, asked: str) -> list[type[Mechanism]]:
    return [m for m in MECHANISMS if m.action == action and asked in m.answers]


def select(action: str, t: Target, asked: str = "auto") -> tuple[Any, str | None]:
    """The mechanism that does ``action`` (``"cpu"``, ``"memory"``, ``"freeze"``,
    ``"kill"``) on ``t`` as asked (the family's ``mechanism`` or ``role`` argument), built
    for ``t``, and why it was chosen over what was asked (None: it is what was asked, or the
    first choice of ``"auto"``).

    ``"auto"`` passes by a mechanism that does not :meth:`~Mechanism.serves` the server;
    any other that is :meth:`~Mechanism.unfit` gives its reason to the next.

    Raises:
        FaultError: none fits: the reason of the one named as asked, else the first reason.
    """
    reasons: dict[str, FaultError] = {}
    for m in _of(action, asked):
        if asked == "auto" and not m.serves(t.srv):
            continue
        if (why := m.unfit(t)) is not None:
            reasons.setdefault(m.name, why)
            continue
        note = m.stands_in if asked not in ("auto", m.name) else None
        return m(t), note or (next(iter(reasons.values())).one_line() if reasons and asked == "auto" else None)
    if not reasons:
        raise FaultError(f"no mechanism does {action} {asked!r} on server {t.server}", where=t.where)
    raise reasons.get(asked) or next(iter(reasons.values()))


def check_host(action: str, asked: str = "auto") -> None:
    """Refuse, before anything starts, a host none of the mechanisms that may serve
    ``asked`` can act on: the one named ``asked``, or for ``"auto"`` those that need no
    launcher capability beyond process ids (FaultError of the first)."""
    cands = [m for m in _of(action, asked) if m.name == asked or
             (asked == "auto" and set(m.needs) <= {"processes"})]
    errors: list[FaultError] = []
    for m in cands:
        try:
            m.check_host()
            return
        except FaultError as exc:
            errors.append(exc)
    if errors:
        raise errors[0]


def recover(action: str, entry: dict[str, Any]) -> list[str]:
    """After a crash, undo ``action`` from a ledger entry: the mechanism its facts name, or,
    when they name none (the crash came before them), every mechanism of the action (each
    undoes only what its facts or the fault id show). The errors, one line each."""
    facts = entry.get("facts") or {}
    name = facts.get("mechanism")
    errors = []
    for m in dict.fromkeys(m for m in MECHANISMS if m.action == action and name in (None, m.name)):
        try:
            m.recover(facts, str(entry.get("fault_id")))
        except (FaultError, OSError) as exc:
            errors.append(exc.one_line() if isinstance(exc, FaultError) else str(exc))
    return errors

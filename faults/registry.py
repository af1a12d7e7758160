"""Fault families by name. Adding a family: one new module in ``faults/`` and one line here.

Each family also gets a typed Chaos Toolkit action named by its ``activity``
(:mod:`harness.experiment.actions` generates them from this registry).
"""

from __future__ import annotations

import difflib
from typing import Any, Sequence

from pydantic import ValidationError

from faults.base import Fault
from faults.client_abort import ClientAbort
from faults.cpu_throttle import CpuThrottle
from faults.cuda_error import CudaError
from faults.draft_swap import DraftSwap
from faults.kv_pressure import KvPressure
from faults.memory_hog import MemoryHog
from faults.memory_limit import MemoryLimit
from faults.network import Network
from faults.process_freeze import ProcessFreeze
from faults.process_kill import ProcessKill
from harness.errors import ExperimentError, first_error

REGISTRY: dict[str, type[Fault]] = {
    ProcessKill.kind: ProcessKill,
    ProcessFreeze.kind: ProcessFreeze,
    MemoryHog.kind: MemoryHog,
    KvPressure.kind: KvPressure,
    CpuThrottle.kind: CpuThrottle,
    MemoryLimit.kind: MemoryLimit,
    Network.kind: Network,
    ClientAbort.kind: ClientAbort,
    DraftSwap.kind: DraftSwap,
    CudaError.kind: CudaError,
}


def register_fault(cls: type[Fault]) -> None:
    """Add (or replace) a family at run time, e.g. from a plugin or a test; a family of
    this package is one line in :data:`REGISTRY` instead. The typed action of a family
    registered after :mod:`harness.experiment.actions` was imported appears there once
    ``refresh_fault_actions()`` is called."""
    REGISTRY[cls.kind] = cls


def unregister_fault(kind: str) -> None:
    """Remove a family (no error if absent)."""
    REGISTRY.pop(kind, None)


def fault_class(kind: str, where: str = "") -> type[Fault]:
    """The family registered as ``kind``.

    Raises:
        ExperimentError: unknown kind (``where`` as given, hint lists the known kinds).
    """
    try:
        return REGISTRY[kind]
    except (KeyError, TypeError):
        raise ExperimentError(
            f"unknown fault {kind!r}", where=where or None, hint=f"known: {', '.join(sorted(REGISTRY))}"
        ) from None


def make_fault(kind: str, params: dict[str, Any] | None, where: str = "", also: Sequence[str] = ()) -> Fault:
    """Build a fault of family ``kind`` from raw experiment arguments.

    Args:
        kind: registry name, e.g. ``"process-kill"``.
        params: the family's arguments (without ``kind``), validated by its ``Params`` model.
        where: location of the activity for errors, e.g. ``"exp.yaml: method[2].provider"``.
        also: the other arguments accepted beside the family's (a typed action's
            ``duration_s``, ``evidence_timeout_s``), named in an unknown argument's hint.

    Raises:
        ExperimentError: unknown kind; or the first invalid/unknown argument, located as
            ``<where>.arguments.<field>``; an unknown one's hint offers the closest accepted
            name (``did you mean 'toxic'?``, :func:`difflib.get_close_matches`) and lists them all.
    """
    cls = fault_class(kind, where)
    try:
        validated = cls.Params.model_validate(params or {})
    except ValidationError as exc:
        field, msg, kind_of_error = first_error(exc)
        known = [*cls.Params.model_fields, *also]
        hint = f"{kind} takes: {', '.join(known)}"
        if kind_of_error == "extra_forbidden":
            msg = f"unknown argument of {kind}"
            near = difflib.get_close_matches(field.rsplit(".", 1)[-1], known, n=1, cutoff=0.6)
            if near:
                hint = f"did you mean {near[0]!r}? {hint}"
        at = f"{where}.arguments" if where else "arguments"
        loc = f"{at}.{field}" if field else at   # a rule across fields has no one field
        raise ExperimentError(msg, where=loc, hint=hint) from None
    return cls(validated)


def by_activity(name: str) -> type[Fault] | None:
    """The family whose typed action is called ``name`` (e.g. ``"kill_process"``), or None."""
    for cls in REGISTRY.values():
        if cls.activity == name:
            return cls
    return None

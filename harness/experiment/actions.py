"""Chaos Toolkit actions of the harness (``provider: {type: python, module:
harness.experiment.actions, func: ...}``). Each is a small typed function; the
session (opened by the ``specchaos`` control) carries the stack, load and ledger.

Fault actions: one typed action per fault family, generated from the family's
parameter model (:data:`faults.registry.REGISTRY`; e.g. ``kill_process(server, role,
signal, expect_restart, gone_timeout_s, duration_s, evidence_timeout_s)``), so Chaos
Toolkit validates an experiment's arguments against a real signature and
``chaos discover`` lists every family. ``inject_fault(kind, arguments)`` stays as a
generic alias.

Phases are marked here, on the run's one clock: a fault action starts the ``fault``
phase and, once the fault is cleared, the ``recovery`` phase; ``await_recovery`` then
waits for the stack to be back within SLO; ``hold_phase("after", ...)`` runs the
``after`` phase.
"""

from __future__ import annotations

import inspect
import logging
import time
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field

from faults.base import Fault
from faults.registry import REGISTRY
from harness.checks.recovery import first_slo_window_end
from harness.checks.run import recorded_run
from harness.errors import FaultError
from harness.experiment import session as sess
from harness.load.records import is_spec_load, read_records
from harness.stack.capabilities import Supervised

log = logging.getLogger(__name__)

class FaultTiming(BaseModel):
    """The arguments every fault action takes besides its family's parameters:
    ``duration_s`` (seconds the fault stays active, ≥ 0) and ``evidence_timeout_s``
    (seconds to wait for evidence, > 0, or None for ``phases.fault_timeout_s``). The one
    definition: the typed actions' signatures and ``specchaos validate`` both use it."""

    model_config = ConfigDict(extra="ignore")

    duration_s: float = Field(0.0, ge=0, allow_inf_nan=False, strict=True)
    evidence_timeout_s: float | None = Field(None, gt=0, allow_inf_nan=False, strict=True)


def _parameters(model: type[BaseModel]) -> list[inspect.Parameter]:
    """A pydantic model's fields as function parameters (names, annotations, defaults),
    required ones first."""
    params = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                default=(f.get_default(call_default_factory=True) if not f.is_required()
                                         else inspect.Parameter.empty),
                                annotation=f.annotation)
              for name, f in model.model_fields.items()]
    return sorted(params, key=lambda p: p.default is not inspect.Parameter.empty)


def run_fault(kind: str, params: dict[str, Any], duration_s: float = 0.0,
              evidence_timeout_s: float | None = None) -> dict[str, Any]:
    """Inject one fault, prove it acted, hold it ``duration_s``, then clear it.

    Marks the ``fault`` phase before acting and the ``recovery`` phase once cleared —
    with overlapping fault actions (Chaos Toolkit's ``background: true``), the ``fault``
    phase starts with the first and ``recovery`` once the last one cleared.

    Args:
        kind: fault family name (see ``faults.registry.REGISTRY``), e.g. ``"process-kill"``.
        params: the family's parameters (validated by its ``Params`` model).
        duration_s: seconds the fault stays active, counted from the moment it acted (the
            family's ``inject`` returned; 0: clear as soon as evidence is in; for a kill,
            evidence includes the supervised restart).
        evidence_timeout_s: how long to wait for evidence; default ``phases.fault_timeout_s``.

    Returns:
        ``{"fault_id", "kind", "target", "acted", "evidence"}``.

    Raises:
        ExperimentError: unknown kind or invalid parameters (nothing acted).
        FaultError: the fault could not act or left no evidence (the run becomes an error).
    """
    s = sess.current()
    timeout = evidence_timeout_s if evidence_timeout_s is not None else s.cfg.phases.fault_timeout_s
    s.fault_began()
    handle = None
    try:
        handle = s.injector.inject(kind, params)
        t0 = time.monotonic()      # the fault acts from here (a hog may take a while to fill memory)
        ev = s.injector.collect_evidence(handle, timeout)
        left = duration_s - (time.monotonic() - t0)
        if left > 0:
            s.sleep(left)          # raises RunInterrupted on SIGINT/SIGTERM, in any thread
    finally:
        try:
            if handle is not None:
                s.injector.clear(handle)   # also when interrupted or failing: never hold a fault longer
        finally:
            s.fault_ended()
    out = {"fault_id": handle.fault_id, "kind": kind, "target": handle.target,
           "acted": ev.acted, "evidence": ev.observations}
    if not ev.acted:
        raise FaultError(f"fault {kind} on {handle.target} left no evidence that it acted: {ev.detail}",
                         hint="a fault that did not happen cannot pass; check the target and the logs")
    return out


def fault_action(cls: type[Fault]) -> Callable[..., dict[str, Any]]:
    """The typed action of a fault family: a function named ``cls.activity`` whose
    parameters are the fields of ``cls.Params`` (same names, types and defaults) plus
    ``duration_s`` and ``evidence_timeout_s``, calling :func:`run_fault`. Its signature
    is real (``inspect.signature``), so Chaos Toolkit's argument validation and
    ``chaos discover`` see it."""
    params = _parameters(cls.Params)
    common = _parameters(FaultTiming)
    names = [p.name for p in params]

    def action(*args: Any, **kwargs: Any) -> dict[str, Any]:
        bound = action.__signature__.bind(*args, **kwargs)   # type: ignore[attr-defined]
        bound.apply_defaults()
        values = dict(bound.arguments)
        return run_fault(cls.kind, {n: values[n] for n in names}, duration_s=values["duration_s"],
                         evidence_timeout_s=values["evidence_timeout_s"])

    action.__signature__ = inspect.Signature([*params, *common],   # type: ignore[attr-defined]
                                             return_annotation=dict[str, Any])
    action.__annotations__ = {**{p.name: p.annotation for p in [*params, *common]}, "return": dict[str, Any]}
    action.__name__ = action.__qualname__ = cls.activity
    action.__module__ = __name__
    family_doc = inspect.getdoc(cls.Params) or ""
    action.__doc__ = (f"Inject the ``{cls.kind}`` fault, prove it acted, hold it ``duration_s`` seconds, clear it.\n\n"
                      f"{family_doc}\n\n"
                      "duration_s: seconds the fault stays active from injection (0: clear once evidence is in).\n"
                      "evidence_timeout_s: how long to wait for evidence (default phases.fault_timeout_s).\n\n"
                      "Returns {fault_id, kind, target, acted, evidence}; raises FaultError when it left no "
                      "evidence that it acted.")
    return action


def inject_fault(kind: str, arguments: dict | None = None, duration_s: float = 0.0,
                 evidence_timeout_s: float | None = None) -> dict[str, Any]:
    """Generic alias of the typed fault actions: inject fault ``kind`` with ``arguments``
    (the family's parameters), as :func:`run_fault`. Prefer the typed action of the
    family (e.g. ``kill_process``), whose arguments Chaos Toolkit can check."""
    return run_fault(kind, arguments or {}, duration_s=duration_s, evidence_timeout_s=evidence_timeout_s)


def await_recovery(timeout_s: float | None = None) -> dict[str, Any]:
    """Once every fault action has cleared its fault (those run in the background
    included), wait until the speculative server is healthy, serves a complete
    generation, and a rolling window of load requests is back within the baseline
    (``recovery.slo_window_s``, ``recovery.baseline_p95_factor``) — or until ``timeout_s``
    (default ``phases.recovery_timeout_s``). Never raises on a stack that does not come
    back: that is judged (and failed) by the recovery checks, not an error of the run.

    Returns:
        ``{"recovered": bool, "waited_s": float, "slo_window_end": float|None}``.
    """
    s = sess.current()
    timeout = timeout_s if timeout_s is not None else s.cfg.phases.recovery_timeout_s
    if not s.await_faults_cleared():   # a fault action in the background still holds its fault
        log.warning("a fault action is still active; awaiting recovery anyway")
    # The recorded run so far, split into phases as the judge splits it. The baseline is
    # closed (its requests ended before the fault; those in flight then belong to the
    # fault phase), so its metrics are computed once.
    run = recorded_run(read_records(s.records_path), [], s.timeline.select(), s.cfg)
    since = run.windows["recovery"][0] if "recovery" in run.windows else time.time()
    # Measured from the fault, exactly as the judge measures time_to_slo_s.
    fault_t: float = (run.recovery_time if run.faults else None) or (
        run.windows["fault"][0] if "fault" in run.windows else since)
    baseline = run.phases.get("baseline") or {}

    def load_records() -> list:
        return [r for r in read_records(s.records_path) if is_spec_load(r)]

    spec = s.stack.servers.get("spec") if s.stack is not None else None
    breaker = s.cfg.stack.breaker

    def settled_since() -> float | None:
        """Epoch s from which the speculative server counts as settled, None while it is not:
        a planned restart (draft swap, circuit breaker) asked for or under way is no recovery,
        and with the breaker on, the server's latest incarnation must first have served one
        whole breaker window (plus a scrape) without the breaker acting on it."""
        if spec is None:
            return None
        ready = spec.settled_at if isinstance(spec, Supervised) else fault_t   # unsupervised: settled
        if ready is None:
            return None
        if not breaker.enabled:
            return fault_t
        # nor is the time before the breaker's last action (a route fallback restarts nothing)
        acted = max((a["breach_t"] for a in s.breaker.trips), default=fault_t) if s.breaker is not None else fault_t
        return max(fault_t, acted, ready + breaker.window_s + s.cfg.scrape.interval_s)

    start = time.monotonic()
    end_t: float | None = None
    while time.monotonic() - start < timeout:
        lower = settled_since()
        end_t = None if lower is None else first_slo_window_end(load_records(), lower, baseline, s.cfg.recovery)
        if end_t is not None:
            break
        s.sleep(0.5)
    waited = time.monotonic() - start
    if end_t is not None:
        log.info("back within the baseline SLO %.1f s after the fault (waited %.1f s in recovery)", end_t - fault_t, waited)
    else:
        log.warning("NOT back within the baseline SLO after waiting %.1f s in recovery", waited)
    s.mark_phase("after")
    return {"recovered": end_t is not None, "waited_s": round(waited, 3), "slo_window_end": end_t}


def hold_phase(phase: str | None = None, duration_s: float | None = None) -> dict[str, Any]:
    """Keep the load running for ``duration_s`` (default ``phases.after_s``).

    Args:
        phase: if given, mark the start of this phase first (``baseline``, ``fault``,
            ``recovery`` or ``after``); ``await_recovery`` already marks ``after``.
        duration_s: seconds to hold.
    """
    s = sess.current()
    if phase:
        s.mark_phase(phase)
    seconds = duration_s if duration_s is not None else s.cfg.phases.after_s
    s.sleep(seconds)
    return {"phase": phase, "held_s": seconds}


def clear_faults() -> list[dict[str, Any]]:
    """Rollback: clear every fault still active (idempotent). Returns the fault summary."""
    s = sess.peek()
    if s is None:
        return []
    s.injector.clear_all()
    return s.injector.summary()


#: The typed fault actions, one per registered family, by action name.
FAULT_ACTIONS: dict[str, Callable[..., dict[str, Any]]] = {}


def refresh_fault_actions() -> None:
    """(Re)generate one typed action per family of :data:`faults.registry.REGISTRY` into
    this module's namespace and ``__all__`` (call after registering a family at run time)."""
    for name in list(FAULT_ACTIONS):
        globals().pop(name, None)
    FAULT_ACTIONS.clear()
    for cls in REGISTRY.values():
        FAULT_ACTIONS[cls.activity] = globals()[cls.activity] = fault_action(cls)
    __all__[:] = [*FAULT_ACTIONS, "inject_fault", "await_recovery", "hold_phase", "clear_faults"]


__all__: list[str] = []
refresh_fault_actions()

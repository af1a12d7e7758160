"""The generic fault driver: ledger first, then act, then evidence, then clear.

:class:`FaultInjector` drives any registered family the same way::

    inj = FaultInjector(InjectionContext(stack, timeline, Ledger(out / "ledger.jsonl")))
    h = inj.inject("process-kill", {"role": "worker"}, where="exp.yaml: method[1]")
    ev = inj.collect_evidence(h, timeout_s=120)
    inj.clear(h)
    ...
    inj.clear_all()        # on normal end, on exception, on SIGINT/SIGTERM

Every step is written to the ledger (on disk, before acting) and to the timeline
(``fault_injected``, ``fault_evidence``, ``fault_cleared``; see :mod:`harness.timeline`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import asdict, dataclass, field
from collections.abc import Mapping
from typing import Any

import httpx

from faults.base import Evidence, Fault
from faults.ledger import Ledger
from faults.registry import make_fault
from harness.clock import now
from harness.errors import FaultError, SpecchaosError
from harness.stack.base import Server, Stack
from harness.timeline import Timeline

log = logging.getLogger(__name__)

_RESERVED = frozenset({"t", "source", "event", "fault_id", "kind", "target", "recovery_from", "acting_at"})


@dataclass
class InjectionContext:
    """The :class:`faults.base.FaultContext` a session hands its faults.

    Args:
        stack: the started stack (a :class:`harness.stack.base.Stack`), or None before
            it started (then :attr:`servers` is empty).
        timeline: the run's timeline; None keeps events in memory.
        ledger: the run's ledger.
        load_urls: server name → base URL the load uses (see ``FaultContext.load_urls``).
    """

    stack: Stack | None
    timeline: Timeline   # None given: a timeline in memory (set in __post_init__)
    ledger: Ledger
    load_urls: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.timeline is None:
            self.timeline = Timeline()

    @property
    def servers(self) -> Mapping[str, Server]:
        """The stack's servers by name (empty before the stack started)."""
        return self.stack.servers if self.stack is not None else {}

    @staticmethod
    def now() -> float:
        """The harness clock (epoch s)."""
        return now()


@dataclass
class FaultHandle:
    """One injection driven by a :class:`FaultInjector`. Times are epoch seconds."""

    fault_id: str
    kind: str
    target: str
    fault: Fault
    facts: dict[str, Any] = field(default_factory=dict)
    injected_at: float | None = None
    cleared_at: float | None = None
    evidence: Evidence | None = None
    error: str | None = None
    #: Held while the fault acts and while it is cleared, so a clear waits for an
    #: injection in progress (re-entrant: a signal handler in the injecting thread).
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    @property
    def active(self) -> bool:
        """Not cleared yet (it may have partly acted even if injection failed)."""
        return self.cleared_at is None


class FaultInjector:
    """Drives faults through the ledger and the timeline. Thread-safe; ``clear_all`` may
    be called from a signal handler while another call is in progress in the same thread.

    Usable as a context manager: leaving the block calls :meth:`clear_all`.
    """

    def __init__(self, ctx: InjectionContext):
        self.ctx = ctx
        self.handles: list[FaultHandle] = []
        self.prepared: list[Fault] = []
        self._lock = threading.RLock()
        #: Spec server base URL → what it answered on ``GET /version`` ("" for no answer), asked once each.
        self._versions: dict[str, str] = {}

    def _server_version(self) -> str:
        """The vLLM version the stack's spec server reported (:func:`reported_vllm_version`),
        asked once per server URL, before a fault acts; "" when there is no such server yet."""
        server = (getattr(self.ctx.stack, "servers", None) or {}).get("spec")
        url = getattr(server, "base_url", None)   # (a stand-in server without an endpoint reports none)
        if not url:
            return ""
        if url not in self._versions:
            self._versions[url] = reported_vllm_version(url)
        return self._versions[url]

    def __enter__(self) -> "FaultInjector":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.clear_all()

    def inject(self, kind: str, params: dict[str, Any] | None = None, where: str = "") -> FaultHandle:
        """Validate, record the intent in the ledger, act, record the facts, emit ``fault_injected``.

        Args:
            kind: registry name (e.g. ``"process-kill"``).
            params: the family's arguments.
            where: location of the activity in the experiment, for error messages.

        Returns:
            The handle (``fault_id``, ``target``, ``facts``, ``injected_at``).

        Raises:
            ExperimentError: unknown kind or invalid arguments (nothing recorded, nothing acted).
            FaultError: the fault could not act. The ledger then holds ``failed`` and, if the
                clear attempted right after succeeded, ``cleared``; otherwise the fault stays
                open and :meth:`clear_all` / ``specchaos cleanup`` retry it.
        """
        fault = self._prepared_instance(make_fault(kind, params, where))
        ledger, tl = self.ctx.ledger, self.ctx.timeline
        server_version = self._server_version()
        with self._lock:
            target = fault.describe_target(self.ctx)
            fault_id = ledger.intend(kind, target, fault.params.model_dump(mode="json"),
                                     system=system_of(self.ctx.stack, server_version))
            fault.fault_id = fault_id
            handle = FaultHandle(fault_id, kind, target, fault)
            self.handles.append(handle)
        # Only this fault waits while it acts (a hog may take a minute to fill memory);
        # other faults inject and clear meanwhile.
        with handle.lock:
            acting_at = now()   # the instant the fault starts to act (a kill's signal follows within ms)
            try:
                facts = fault.inject(self.ctx) or {}
            except BaseException as exc:  # noqa: BLE001 - recorded, cleared, re-raised
                handle.error = _describe(exc)
                ledger.failed(fault_id, handle.error)
                log.warning("injecting %s on %s failed: %s", kind, target, handle.error)
                self._clear_quietly(handle)
                if not isinstance(exc, Exception) or isinstance(exc, FaultError):
                    raise
                if isinstance(exc, SpecchaosError):
                    raise FaultError(exc.message, where=exc.where, hint=exc.hint) from exc
                raise FaultError(f"injecting {kind} failed: {handle.error}", where=where or target,
                                 hint="see the log; the fault was rolled back") from exc
            entry = ledger.injected(fault_id, facts)
            handle.facts, handle.injected_at = facts, entry["t"]
            extra = {k: v for k, v in facts.items() if k not in _RESERVED}
            tl.emit("fault", "fault_injected", t=entry["t"], fault_id=fault_id, kind=kind, target=target,
                    recovery_from=fault.recovery_from, acting_at=acting_at, **extra)
            return handle

    def prepare(self, faults: list[Fault]) -> None:
        """Let every declared fault set up what it needs before the load starts
        (:meth:`Fault.prepare`, e.g. a proxy on the load path); remembered for
        :meth:`release_all`.

        Raises:
            FaultError: a fault could not prepare (those prepared so far are released).
        """
        with self._lock:
            for fault in faults:
                try:
                    fault.prepare(self.ctx)
                except BaseException:
                    self.release_all()
                    raise
                self.prepared.append(fault)

    def _prepared_instance(self, fault: Fault) -> Fault:
        """The prepared fault of the same family and parameters, if any (it holds what
        :meth:`Fault.prepare` set up, e.g. its proxy), else ``fault`` itself."""
        params = fault.params.model_dump(mode="json")
        for p in self.prepared:
            if p.kind == fault.kind and p.params.model_dump(mode="json") == params:
                return p
        return fault

    def release_all(self) -> list[str]:
        """Undo every :meth:`prepare`, newest first; errors are logged and returned, and
        the others are still released."""
        failures = []
        with self._lock:
            while self.prepared:
                fault = self.prepared.pop()
                try:
                    fault.release(self.ctx)
                except Exception as exc:  # noqa: BLE001 - release the others
                    log.error("releasing %s failed: %s", fault.kind, _describe(exc))
                    failures.append(f"{fault.kind}: {_describe(exc)}")
        return failures

    def collect_evidence(self, handle: FaultHandle, timeout_s: float) -> Evidence:
        """Ask the fault for proof that it acted (waits up to ``timeout_s``), record it in the
        ledger and emit ``fault_evidence`` (``acted``, ``evidence``: {acted, observations, detail}).

        A :class:`FaultError` raised by the family becomes ``Evidence(acted=False)`` with the
        error as detail. Other exceptions are bugs and propagate.
        """
        try:
            ev = handle.fault.evidence(self.ctx, timeout_s)
        except FaultError as exc:
            ev = Evidence(False, {"error": exc.one_line()}, f"no evidence: {exc.one_line()}")
        with self._lock:
            handle.evidence = ev
            self.ctx.ledger.evidence(handle.fault_id, ev)
            self.ctx.timeline.emit("fault", "fault_evidence", fault_id=handle.fault_id, acted=ev.acted,
                                   evidence=asdict(ev))
        log.info("evidence for %s: %s", handle.fault_id, ev.detail)
        return ev

    def clear(self, handle: FaultHandle) -> None:
        """Revert the fault (idempotent), record ``cleared`` in the ledger, emit ``fault_cleared``.

        Raises:
            Exception: whatever the family's ``clear`` raised; the ledger then records
                ``failed`` and the fault stays open.
        """
        with handle.lock:
            if handle.cleared_at is not None:
                return
            try:
                handle.fault.clear(self.ctx)
            except BaseException as exc:
                self.ctx.ledger.failed(handle.fault_id, f"clear failed: {_describe(exc)}")
                raise
            entry = self.ctx.ledger.cleared(handle.fault_id)
            handle.cleared_at = entry["t"]
            if handle.injected_at is not None:  # a failed injection was never announced
                self.ctx.timeline.emit("fault", "fault_cleared", t=entry["t"], fault_id=handle.fault_id)

    def clear_all(self) -> list[dict[str, str]]:
        """Clear every fault still active, newest first. An error clearing one is logged and
        the others are still cleared.

        Returns:
            ``[{"fault_id", "error"}]`` for the faults that could not be cleared (empty if all were).
        """
        failures = []
        with self._lock:
            handles = list(self.handles)
        for handle in reversed(handles):
            if not handle.active:
                continue
            try:
                self.clear(handle)
            except Exception as exc:  # noqa: BLE001 - one failure must not leave others active
                log.error("could not clear fault %s (%s): %s", handle.fault_id, handle.target, _describe(exc))
                failures.append({"fault_id": handle.fault_id, "error": _describe(exc)})
        return failures

    def summary(self) -> list[dict[str, Any]]:
        """Plain-data list of the injections, in order::

            [{"fault_id", "kind", "target", "injected_at", "cleared_at", "acted", "evidence"}]

        ``acted`` is None and ``evidence`` None until evidence was collected; ``injected_at``
        is None for an injection that failed.
        """
        with self._lock:
            return [
                {
                    "fault_id": h.fault_id, "kind": h.kind, "target": h.target,
                    "injected_at": h.injected_at, "cleared_at": h.cleared_at,
                    "acted": h.evidence.acted if h.evidence else None,
                    "evidence": asdict(h.evidence) if h.evidence else None,
                }
                for h in self.handles
            ]

    def _clear_quietly(self, handle: FaultHandle) -> None:
        try:
            self.clear(handle)
        except Exception as exc:  # noqa: BLE001
            log.error("rolling back failed fault %s also failed: %s", handle.fault_id, _describe(exc))


def system_of(stack: Any, server_version: str = "") -> dict[str, str]:
    """What a fault on ``stack`` acts against, for the ledger's ``intended`` entry:
    ``{"launcher": ..., "vllm_version": ..., "server_vllm_version": ...}``: the launcher and the
    vLLM version the stack declares, and ``server_version``, the version its server reported
    (:func:`reported_vllm_version`). ``{}`` for no stack; a field the stack does not have, or an
    empty ``server_version``, is left out."""
    if stack is None:
        return {}
    out = {k: str(getattr(stack, k)) for k in ("launcher", "vllm_version") if getattr(stack, k, None) is not None}
    if server_version:
        out["server_vllm_version"] = server_version
    return out


def reported_vllm_version(base_url: str, timeout_s: float = 2.0) -> str:
    """The vLLM version the server at ``base_url`` reports on ``GET /version``
    (``{"version": "0.x.y"}``, vLLM's OpenAI server), or "" when it does not answer 200 with a
    version within ``timeout_s`` seconds (the test suite's fake vLLM has no ``/version``)."""
    try:
        with httpx.Client(trust_env=False, verify=False, timeout=timeout_s) as client:   # loopback or the user's URL, as the launchers ask
            r = client.get(f"{base_url}/version")
        return str(r.json().get("version") or "") if r.status_code == 200 else ""
    except (httpx.HTTPError, ValueError, AttributeError):
        return ""


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SpecchaosError):
        return exc.one_line()
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__

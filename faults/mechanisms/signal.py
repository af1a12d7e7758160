"""Signals to a role's processes by recorded identity (pid, create_time, command line,
re-checked through a pidfd before every signal: a reused pid is never signalled):

* :class:`SignalStop` (process-freeze of ``api``, ``engine`` or ``worker``): SIGSTOP for
  the duration, or a duty cycle (:class:`faults.mechanisms.duty_cycle.StopCycle`); SIGCONT
  on restore and on recover;
* :class:`SignalKill` (process-kill of a role): the kill signal; nothing to restore.
"""

from __future__ import annotations

import logging
import signal as signal_mod
import time
from typing import Any, ClassVar

import psutil

from faults.base import Evidence
from faults.engine_metrics import METRICS_TIMEOUT_S, RUNNING_METRIC, TOKENS_METRIC, read_metrics
from faults.mechanisms.base import Mechanism, Target
from faults.mechanisms.duty_cycle import StopCycle, resume_facts
from faults.targets import record_role, signal_recorded
from harness.clock import now
from harness.errors import FaultError
from harness.stack.procs import Recorded

log = logging.getLogger(__name__)

ROLES = ("api", "engine", "worker")
#: Seconds after the stop before the first counter read: outputs already on their way
#: from the engine when the stop hit are counted before the window, not in it.
SETTLE_S = 0.2
_POLL_S = 0.02


def _went_away(t: Target) -> FaultError:
    return FaultError(f"every {t.roles[0] if t.roles else 'tree'} process of server {t.server} went away before the "
                      f"signal", where=t.where, hint="the server may be restarting; inject once it is ready")


class SignalStop(Mechanism):
    """SIGSTOP every process of the role (for good, or in a duty cycle). Evidence: every
    stopped process observed ``stopped`` throughout a window inside one stopped stretch, and
    no output token produced meanwhile (:data:`TOKENS_METRIC` on ``/metrics``; a stopped API
    process answers nothing, which is the evidence then)."""

    name: ClassVar[str] = "signal"
    action: ClassVar[str] = "freeze"
    answers: ClassVar[tuple[str, ...]] = ROLES
    needs: ClassVar[tuple[str, ...]] = ("processes",)

    def __init__(self, t: Target):
        super().__init__(t)
        self.stops: StopCycle | None = None

    def apply(self, duty_cycle: float | None, period_s: float) -> dict[str, Any]:
        t = self.t
        role = t.roles[0] if t.roles else "api"
        t.incarnation, recorded = record_role(t.srv, t.server, role, t.where, verb="stopped")
        self.stops = StopCycle(t.where, duty_cycle, period_s)
        stopped_at = now()
        if not self.stops.start(recorded, t.where):
            raise _went_away(t)
        log.info("stopped %s (pids %s)%s", t.where, self.stops.facts()["pids"],
                 f", duty cycle {duty_cycle:g} of {period_s:g} s" if duty_cycle else "")
        return {**self.stops.facts(), "incarnation": t.incarnation, "stopped_at": stopped_at, "mechanism": self.name}

    def evidence(self, base_url: str, timeout_s: float, window_s: float) -> Evidence:
        stops, where = self.stops, self.t.where
        assert stops is not None
        pids = [pid for pid, _, _ in stops.targets]
        deadline = time.monotonic() + timeout_s
        obs: dict[str, Any] = {
            "role": self.t.roles[0] if self.t.roles else None, "pids": pids, "stopped": False,
            "stopped_after_s": None, "states": {}, "window_s": 0.0, "tokens_metric": TOKENS_METRIC,
            "tokens_before": None, "tokens_after": None, "tokens_while_frozen": None, "metrics_answered": False,
            "requests_running": None, "measured_by": f"{TOKENS_METRIC} on {base_url}/metrics before and after the window",
            "duty_cycle": stops.duty_cycle, "period_s": stops.period_s, "stopped_slices": 0,
        }
        sl = stops.stopped_slice(deadline)
        if sl is None:
            return Evidence(False, obs, f"{where}: no stopped slice to observe within {timeout_s:.0f} s")
        start, end = sl
        margin = min(0.1, 0.2 * (end - start)) if stops.duty_cycle else 0.0
        last = min(end - margin, deadline)

        def all_stopped(states: dict[int, str | None]) -> bool:
            return all(s == psutil.STATUS_STOPPED for s in states.values())

        while not all_stopped(stops.states()) and time.monotonic() < last:
            time.sleep(_POLL_S)
        seen = stops.states()
        if not all_stopped(seen):
            obs["states"] = {str(k): v for k, v in seen.items()}
            return Evidence(False, obs, f"{where} (pids {pids}): not observed stopped ({obs['states']})")
        obs["stopped_after_s"] = round(time.monotonic() - start, 4)
        time.sleep(max(0.0, min(SETTLE_S, 0.25 * (last - time.monotonic()))))
        w0 = time.monotonic()
        window_end = min(w0 + window_s, last)
        before = read_metrics(base_url, timeout_s=max(0.05, min(METRICS_TIMEOUT_S, window_end - w0)))
        throughout = True
        while time.monotonic() < window_end:
            throughout &= all_stopped(stops.states())
            time.sleep(min(0.05, max(0.0, window_end - time.monotonic())))
        after = read_metrics(base_url, timeout_s=max(0.05, min(METRICS_TIMEOUT_S, last - time.monotonic())))
        final = stops.states()
        throughout &= all_stopped(final)
        obs.update(stopped=throughout, states={str(k): v for k, v in final.items()},
                   window_s=round(time.monotonic() - w0, 3), stopped_slices=stops.slices_begun(),
                   metrics_answered=before is not None and after is not None)
        if before is not None:
            obs["tokens_before"], obs["requests_running"] = before[TOKENS_METRIC], before[RUNNING_METRIC]
        if after is not None:
            obs["tokens_after"] = after[TOKENS_METRIC]
        if obs["tokens_before"] is not None and obs["tokens_after"] is not None:
            obs["tokens_while_frozen"] = obs["tokens_after"] - obs["tokens_before"]
        head = f"{where} (pids {pids}) stopped after {obs['stopped_after_s']:.3f} s"
        if not throughout:
            return Evidence(False, obs, f"{head} but not stopped throughout the {obs['window_s']:.2f} s window "
                                        f"({obs['states']})")
        if obs["role"] == "api" and before is None:
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
        return Evidence(True, obs, f"{head}; 0 output tokens in {obs['window_s']:.2f} s ({TOKENS_METRIC} "
                                   f"{obs['tokens_before']:g}" + ("" if running is None else
                                                                   f", {running:g} requests running") + ")")

    def restore(self) -> None:
        """End the duty cycle, SIGCONT every stopped process and wait until none is ``stopped``."""
        if self.stops is None:
            return
        if left := self.stops.release():
            raise FaultError(f"pids {left} still stopped after SIGCONT",
                             hint="run `specchaos cleanup`, or kill -CONT them by hand")
        if self.stops.targets:
            log.info("resumed %s (pids %s)", self.t.where, self.stops.facts()["pids"])

    @classmethod
    def recover(cls, facts: dict[str, Any], fault_id: str) -> None:
        """SIGCONT the recorded processes that still are themselves (PermissionError: not permitted)."""
        if left := resume_facts(facts):
            raise FaultError(f"pids {left} still stopped after SIGCONT")


class SignalKill(Mechanism):
    """The kill signal to every process of the role (nothing to restore)."""

    name: ClassVar[str] = "signal"
    action: ClassVar[str] = "kill"
    answers: ClassVar[tuple[str, ...]] = ROLES
    needs: ClassVar[tuple[str, ...]] = ("processes",)

    def apply(self, signal: str) -> tuple[int, list[Recorded], dict[str, Any]]:
        t = self.t
        incarnation, recorded = record_role(t.srv, t.server, t.roles[0] if t.roles else "api", t.where)
        return incarnation, signal_recorded(recorded, int(getattr(signal_mod, signal)), t.where), {"mechanism": self.name}

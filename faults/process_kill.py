"""Fault family ``process-kill``: send a terminating signal to one process role of a server.

The target is a role (``api``, ``engine`` or ``worker``, see :mod:`harness.stack.base`)
of one server of the stack (``spec`` or ``ref``). Every process of that role is
signalled, pid-reuse safe: the pid's create_time and command line are recorded, and
re-checked through a pidfd immediately before the signal, so a pid that now belongs
to another process is never signalled.

Evidence: every signalled process is gone (``gone_after_s``). When ``expect_restart``,
the evidence also waits for the server's supervisor to bring up a new incarnation that
becomes ready (``restart_seen_after_s``, measured from the signal), so the fault phase
lasts until the server is back; a server that never comes back still counts as acted
(the processes died) and fails the recovery checks: exit 1, not an error. A kill has nothing to
revert: :meth:`ProcessKill.clear` and :meth:`ProcessKill.recover` do nothing.

Example (the typed Chaos Toolkit action generated for this family)::

    - type: action
      name: kill-draft-worker
      provider:
        type: python
        module: harness.experiment.actions
        func: kill_process
        arguments: {server: spec, role: worker, signal: SIGKILL}

Roles on vLLM (see :mod:`harness.stack.base`): ``api`` — the OpenAI API server process;
``engine`` — its child ``VLLM::EngineCore`` (scheduler; killing it makes the API answer
503, then exit 0); ``worker`` — the engine's child ``VLLM::Worker`` (runs the target and
the draft model; killing it fails every in-flight request and the API exits 0).
"""

from __future__ import annotations

import logging
import time
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from faults import mechanisms
from faults.base import Evidence, Fault, FaultContext, FaultParams
from faults.mechanisms import Target
from faults.targets import server_of
from harness.clock import now
from harness.errors import FaultError
from harness.stack.base import Server
from harness.stack.capabilities import Supervised
from harness.stack.procs import same_process

log = logging.getLogger(__name__)

#: Signals this family sends: the ones that end a process (by default action or by the
#: process's own handler). SIGSTOP/SIGCONT freeze and thaw: a separate (freeze) family.
KILL_SIGNALS = ("SIGKILL", "SIGTERM", "SIGINT", "SIGQUIT", "SIGABRT", "SIGHUP")
FREEZE_SIGNALS = ("SIGSTOP", "SIGCONT", "SIGTSTP")

_POLL_S = 0.02


def normalise_signal(name: str) -> str:
    """``"kill"``/``"SIGKILL"``/``" sigterm "`` → ``"SIGKILL"``/``"SIGTERM"``.

    Raises:
        ValueError: a freeze signal (SIGSTOP/SIGCONT/SIGTSTP) or a name not in
            :data:`KILL_SIGNALS`.
    """
    up = str(name).strip().upper()
    if not up.startswith("SIG"):
        up = "SIG" + up
    if up in FREEZE_SIGNALS:
        raise ValueError(
            f"{up} freezes or thaws a process instead of ending it; process-kill only sends "
            f"{', '.join(KILL_SIGNALS)} (SIGSTOP/SIGCONT freeze rather than kill: not a process-kill)"
        )
    if up not in KILL_SIGNALS:
        raise ValueError(f"unknown signal {name!r}; use one of {', '.join(KILL_SIGNALS)}")
    return up


class ProcessKillParams(FaultParams):
    """Arguments of ``process-kill``.

    Fields:
        server: key of ``stack.servers`` (``"spec"`` or ``"ref"``).
        role: ``"api"``, ``"engine"`` or ``"worker"``; every process of the role is signalled.
            ``"container"`` (launcher docker): the server's whole container, through the
            engine (``docker kill --signal``; its init forwards the signal, SIGKILL ends every
            role at once); the supervisor then starts a new container.
        signal: a name from :data:`KILL_SIGNALS`, with or without ``SIG`` (``"KILL"``).
        expect_restart: evidence requires a supervised restart of the server
            (a new incarnation that became ready).
        gone_timeout_s: how long the signalled processes may take to disappear.
    """

    server: str = "spec"
    role: Literal["api", "engine", "worker", "container"] = "worker"
    signal: str = "SIGKILL"
    expect_restart: bool = True
    gone_timeout_s: float = Field(15.0, gt=0)

    @field_validator("signal")
    @classmethod
    def _signal(cls, v: str) -> str:
        return normalise_signal(v)


class ProcessKill(Fault):
    """Kill (or terminate) every process of one role of one server."""

    kind: ClassVar[str] = "process-kill"
    activity: ClassVar[str] = "kill_process"
    needs: ClassVar[tuple[str, ...]] = ("processes",)   # + supervision to see a restart (expect_restart)
    recovery_from: Literal["injected", "cleared"] = "injected"   # the process died at the signal
    Params: ClassVar[type[FaultParams]] = ProcessKillParams
    params: ProcessKillParams

    def __init__(self, params: ProcessKillParams):
        super().__init__(params)
        self.facts: dict[str, Any] | None = None

    def describe_target(self, ctx: FaultContext) -> str:
        """``"<server>/<role>"``, e.g. ``"spec/worker"`` or ``"spec/container"``."""
        return f"{self.params.server}/{self.params.role}"

    def required(self) -> tuple[str, ...]:
        """Process ids; ``role: container`` needs a container instead."""
        return ("containers",) if self.params.role == "container" else type(self).needs

    def _server(self, ctx: FaultContext) -> Server:
        return server_of(ctx, self.params.server, self.describe_target(ctx))

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        """Signal every process of the role, by the mechanism :func:`faults.mechanisms.select`
        picks for it (the signal by recorded identity; ``role: container``: ``docker kill``).

        Returns:
            ``{"pids": [int], "create_times": [float], "cmdlines": [[str]], "signal": str,
            "incarnation_before": int, "signalled_at": epoch s, "mechanism": "signal"|"container"}``,
            with ``role: container`` also ``container``, ``container_name``, ``engine``
            (``pids``: the container's init, whose end is every role's).

        Raises:
            FaultError: unknown server; no process of the role (server down); a process
                vanished or its pid was reused between discovery and the signal (then
                nothing is signalled). ``pids`` lists what was signalled.
        """
        p = self.params
        target = self.describe_target(ctx)
        mech, _ = mechanisms.select("kill", Target(self._server(ctx), p.server, target, self.fault_id or "", [p.role]),
                                    p.role)
        incarnation, recorded, extra = mech.apply(p.signal)
        pids = [pid for pid, _, _ in recorded]
        if not pids:
            raise FaultError(f"every {p.role} process of server {p.server} went away before the signal",
                             where=target, hint="the server may be restarting; inject once it is ready")
        signalled_at = now()
        log.info("sent %s to %s (pids %s)", p.signal, target, pids)
        self.facts = {
            "pids": pids,
            "create_times": [ct for _, ct, _ in recorded],
            "cmdlines": [cmd for _, _, cmd in recorded],
            "signal": p.signal,
            "incarnation_before": incarnation,
            "signalled_at": signalled_at,
            **extra,
        }
        return dict(self.facts)

    def evidence(self, ctx: FaultContext, timeout_s: float) -> Evidence:
        """Wait for the signalled processes to be gone (at most ``gone_timeout_s``) and,
        if ``expect_restart``, for the restarted server to be ready (the rest of ``timeout_s``).

        Observations: ``signal``, ``pids``, ``gone`` (bool), ``gone_after_s`` (from the
        signal; None if not gone), ``still_running`` (pids), ``expect_restart``,
        ``incarnation_before``, ``restart_ready_at`` (epoch s or None),
        ``restart_seen_after_s`` (ready time − signal time, or None).

        Raises:
            FaultError: called before :meth:`inject`, or ``expect_restart`` on a server
                that cannot report restarts (no ``wait_for_incarnation``).
        """
        if self.facts is None:
            raise FaultError("process-kill evidence asked before injection", where=self.describe_target(ctx))
        p, f = self.params, self.facts
        start = time.monotonic()
        waiting = list(zip(f["pids"], f["create_times"]))
        gone_at = None
        deadline = start + min(p.gone_timeout_s, timeout_s)
        while True:
            waiting = [(pid, ct) for pid, ct in waiting if same_process(pid, ct)]
            if not waiting:
                gone_at = now()
                break
            if time.monotonic() >= deadline:
                break
            time.sleep(_POLL_S)
        gone = gone_at is not None
        obs: dict[str, Any] = {
            "signal": f["signal"], "pids": f["pids"], "gone": gone,
            "gone_after_s": round(gone_at - f["signalled_at"], 4) if gone else None,
            "still_running": [pid for pid, _ in waiting],
            "expect_restart": p.expect_restart, "incarnation_before": f["incarnation_before"],
            "restart_ready_at": None, "restart_seen_after_s": None,
        }
        target = self.describe_target(ctx)
        if not gone:
            return Evidence(False, obs, f"{f['signal']} to {target} (pids {f['pids']}): still running "
                                        f"{time.monotonic() - start:.1f} s later")
        detail = f"{f['signal']} to {target} (pids {f['pids']}): gone after {obs['gone_after_s']:.3f} s"
        if not p.expect_restart:
            return Evidence(True, obs, detail + "; no restart expected")
        srv = self._server(ctx)
        if not isinstance(srv, Supervised):
            raise FaultError(f"server {p.server} cannot report restarts", where=target,
                             hint="set arguments.expect_restart to false, or use a supervised launcher")
        remaining = max(0.0, timeout_s - (time.monotonic() - start))
        ready_at = srv.wait_for_incarnation(f["incarnation_before"] + 1, remaining)
        if ready_at is None:
            # The kill acted (the processes are gone); a server that does not come back is
            # the system under test failing to recover, judged (and failed) by the recovery
            # checks, never a run error.
            return Evidence(True, obs, detail + f"; NO restarted server ready within {timeout_s:.0f} s "
                                                "(left to the recovery checks)")
        obs["restart_ready_at"] = ready_at
        obs["restart_seen_after_s"] = round(ready_at - f["signalled_at"], 3)
        return Evidence(True, obs, detail + f"; restarted server ready {obs['restart_seen_after_s']:.1f} s "
                                            f"after the signal")

    def clear(self, ctx: FaultContext) -> None:
        """Nothing to revert for a kill (the supervisor restarts the server). Idempotent."""
        return None

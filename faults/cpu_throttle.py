"""Fault family ``cpu-throttle`` (thermal throttling, CPU side): cap the CPU time of a
server's process tree — a CFS quota through a cgroup of its own
(:mod:`faults.cgroup`), or, where cgroups cannot be written (or with
``mechanism: duty_cycle``), a SIGSTOP/SIGCONT duty cycle of the same processes (the
duty cycle of :mod:`faults.process_freeze`, one per role). On GPU hosts it can also lock
the GPUs' SM clocks (``gpu_clocks_mhz``) and/or lower their power limit
(``power_limit_w``), opt-in, always restored.

``cpu_fraction`` is a fraction of **one CPU** for the whole targeted tree together, in
(0, 1]: with the cgroup, quota = ``cpu_fraction`` × period (v1 ``cpu.cfs_quota_us`` /
``cpu.cfs_period_us``, v2 ``cpu.max``), so 0.3 lets the tree use at most 0.3 CPU-seconds
per second however many threads it runs. The duty cycle can only stop and resume the
processes: they run ``cpu_fraction`` of every ``period_s`` (stopped the rest), which caps
their CPU at ``cpu_fraction`` × what they would use unthrottled — a weaker, wall-clock
approximation, named as such in the evidence.

Targets: ``server`` (``spec``/``ref``) and ``roles`` (None: the API process and every
descendant; else the processes of each role), found as :func:`faults.cgroup.record_tree`.

Evidence (measured, never "applied"), over a window of up to :data:`EVIDENCE_WINDOW_S`
s starting :data:`SETTLE_S` s after the injection:

* the limit read back from the cgroup (``cpu.cfs_quota_us``/``cpu.cfs_period_us`` or
  ``cpu.max``) and the pids found in its ``cgroup.procs``;
* the tree's CPU use (psutil user+system seconds of every process in the cgroup, or of
  the stopped processes, ÷ window) and the kernel's throttling counters (``cpu.stat``
  ``nr_throttled``, ``throttled_time``/``throttled_usec``); for the duty cycle, the share
  of polls that saw the processes ``stopped``;
* output tokens/s from the server's ``/metrics`` (``vllm:generation_tokens_total``)
  during the window against the :data:`BEFORE_WINDOW_S` s before the injection (polled
  in the background from :meth:`CpuThrottle.prepare`, i.e. from before the load starts;
  when the fault was not prepared, :meth:`CpuThrottle.inject` first measures that window,
  which delays the throttle by as long).

``acted`` needs, with the cgroup: the quota read back as asked, every live targeted pid in
the cgroup, the kernel throttling the cgroup during the window (``nr_throttled`` grew),
and the tree's CPU use within the quota (+10 % and 0.02 CPU of measuring slack); with the
duty cycle: the processes observed stopped for a share of the window within 0.25 of
1 − ``cpu_fraction``. An idle tree is never throttled: that is "no evidence", not a pass.
The tokens/s drop is reported, not required (an idle server produces none either way); the
experiment's checks judge what the throttle did to the load.

Revert: :meth:`CpuThrottle.clear` (quota lifted, pids moved back, cgroup removed; duty
cycle ended, everything resumed; GPU clocks reset and power limits restored) and
:meth:`CpuThrottle.recover` from the ledger after a crash (also when the crash came
before the facts were written: the cgroup is found by its name, ``specchaos-<fault id>``).

Example::

    - type: action
      name: throttle-spec
      provider:
        type: python
        module: harness.experiment.actions
        func: throttle_cpu
        arguments: {server: spec, cpu_fraction: 0.3, duration_s: 20}
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from pathlib import Path
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import psutil
from docker import errors as docker_errors
from pydantic import Field, model_validator

from faults import cgroup, container_ops
from faults.base import Evidence, Fault, FaultContext, FaultParams
from faults.duty_cycle import MIN_SLICE_S, StopCycle, resume_facts
from faults.engine_metrics import TOKENS_METRIC, read_metrics
from faults.targets import record_role, server_of
from harness import gpu
from harness.clock import now
from harness.errors import FaultError
from harness.stack.capabilities import Containerised
from harness.stack.procs import Recorded, same_process

log = logging.getLogger(__name__)

#: Seconds after the injection before the evidence window opens (outputs already on their
#: way are not counted, and the quota's first periods pass).
SETTLE_S = 1.0
#: Longest evidence window, seconds.
EVIDENCE_WINDOW_S = 4.0
#: Seconds of token counter before the injection that the "before" rate is taken from.
BEFORE_WINDOW_S = 4.0
#: Seconds between two reads of ``/metrics`` by the background poller.
POLL_S = 0.5
#: seconds one ``/metrics`` read of the token poller may take (a loaded 2-core host answers in seconds)
METRICS_TIMEOUT_S = 5.0
#: Slack on the measured CPU use against the quota: ×(1 + this) ...
CPU_SLACK_RATIO = 0.10
#: ... + this many CPUs (psutil's tick resolution, processes leaving the tree).
CPU_SLACK_CPUS = 0.02
#: Largest distance between the observed stopped share and 1 − cpu_fraction (duty cycle).
DUTY_TOLERANCE = 0.25

ROLE_ORDER = ("api", "engine", "worker")


class CpuThrottleParams(FaultParams):
    """Arguments of ``cpu-throttle`` (how long: the action's ``duration_s``).

    Fields:
        server: key of ``stack.servers`` (``"spec"`` or ``"ref"``).
        roles: ``["api", "engine", "worker"]`` or a subset; None (default): the whole
            process tree of the server (API process and every descendant).
        cpu_fraction: the CPU the targeted tree may use, as a fraction of ONE CPU, in (0, 1].
        period_s: the CFS period (cgroup; 0.001 to 1 s) or the duty cycle's period, seconds.
        mechanism: ``"auto"`` (a server in a container: ``container`` for the whole tree, the
            duty cycle for roles; else cgroup where writable, else the duty cycle),
            ``"cgroup"`` (a non-writable cgroup is an error at validate time; on a server in a
            container, the container's own cgroup, set through the engine as ``container``;
            with ``roles`` refused there: it would move the container's processes out of
            Docker's cgroups), ``"duty_cycle"`` or ``"container"`` (launcher docker: the container's
            own CFS quota through ``container.update``, the whole container; no ``roles``).
        gpu_clocks_mhz: opt-in, GPU hosts: lock every GPU's SM clock to at most this (MHz).
        power_limit_w: opt-in, GPU hosts: set every GPU's power limit to this (W).
    """

    server: str = "spec"
    roles: list[Literal["api", "engine", "worker"]] | None = Field(None, min_length=1)
    cpu_fraction: float = Field(0.3, gt=0, le=1)
    period_s: float = Field(0.1, ge=0.001, le=1.0)
    mechanism: Literal["auto", "cgroup", "duty_cycle", "container"] = "auto"
    gpu_clocks_mhz: int | None = Field(None, gt=0)
    power_limit_w: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _duty_cycle(self) -> "CpuThrottleParams":
        if self.mechanism == "container" and self.roles:
            raise ValueError("mechanism container caps the whole container: remove roles, or use mechanism duty_cycle "
                             "for single roles")
        if self.mechanism == "duty_cycle":
            if self.cpu_fraction >= 1:
                raise ValueError("cpu_fraction 1 with mechanism duty_cycle would stop nothing; use a fraction below 1")
            stop, run = (1 - self.cpu_fraction) * self.period_s, self.cpu_fraction * self.period_s
            if min(stop, run) < MIN_SLICE_S:
                raise ValueError(f"a duty cycle of {self.cpu_fraction:g} CPU over period_s {self.period_s:g} makes a "
                                 f"slice shorter than {MIN_SLICE_S:g} s; lengthen period_s")
        return self


class TokenRate:
    """Background poller of a server's output-token counter (``/metrics``), every
    :data:`POLL_S` s: ``(monotonic s, tokens)`` samples, in memory only."""

    def __init__(self, base_url: str):
        self.base_url = base_url
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="cpu-throttle-tokens", daemon=True)
        self.started = time.monotonic()

    def start(self) -> "TokenRate":
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            m = read_metrics(self.base_url, timeout_s=METRICS_TIMEOUT_S)
            tokens = m[TOKENS_METRIC] if m is not None else None
            if tokens is not None:
                with self._lock:   # stamped on arrival: a starved server reads its counter late, not on the request
                    self.samples.append((time.monotonic(), tokens))
                    del self.samples[:-2000]
            self._stop.wait(max(0.0, POLL_S - (time.monotonic() - t)))

    def rate(self, t0: float, t1: float, widen: bool = False) -> tuple[float | None, float]:
        """``(tokens/s, seconds covered)`` between the first and last sample in
        [t0, t1] (monotonic); None when fewer than two samples fall in it. With
        ``widen``, a window holding fewer than two samples (slow ``/metrics`` answers on a
        busy host) reaches back to the poller's first sample instead."""
        with self._lock:
            inside = [s for s in self.samples if t0 <= s[0] <= t1]
            if widen and len(inside) < 2:
                inside = [s for s in self.samples if s[0] <= t1]
        if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
            return None, 0.0
        span = inside[-1][0] - inside[0][0]
        return (inside[-1][1] - inside[0][1]) / span, span

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=3)


def _cpu_seconds(pids: Sequence[tuple[int, float | None]]) -> float:
    """User+system CPU seconds of the processes that still are themselves."""
    total = 0.0
    for pid, ct in pids:
        try:
            p = psutil.Process(pid)
            if ct is not None and not same_process(pid, ct):
                continue
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


def _stat(text: str | None) -> dict[str, int]:
    out = {}
    for line in (text or "").splitlines():
        k, _, v = line.partition(" ")
        if v.strip().lstrip("-").isdigit():
            out[k] = int(v)
    return out


class CpuThrottle(Fault):
    """Cap the CPU of a server's process tree (cgroup CFS quota, or a SIGSTOP/SIGCONT duty cycle)."""

    kind: ClassVar[str] = "cpu-throttle"
    activity: ClassVar[str] = "throttle_cpu"
    needs: ClassVar[tuple[str, ...]] = ("processes",)
    Params: ClassVar[type[FaultParams]] = CpuThrottleParams
    params: CpuThrottleParams

    def __init__(self, params: CpuThrottleParams):
        super().__init__(params)
        self.facts: dict[str, Any] | None = None
        self._cg: cgroup.TreeCgroup | None = None
        self._stop_cycles: list[StopCycle] = []   # mechanism duty_cycle: one per role
        self._tokens: TokenRate | None = None
        self._injected_mono: float | None = None
        self._targets: list[Recorded] = []
        self._gpu_locked: list[int] = []
        self._gpu_power: dict[int, float] = {}
        self._container: Any = None   # mechanism container: the limited container

    # ------------------------------------------------------------------ helpers
    def required(self) -> tuple[str, ...]:
        """Process ids; ``mechanism: container`` needs a container."""
        return ("containers",) if self.params.mechanism == "container" else type(self).needs

    def excluded(self) -> dict[str, str]:
        """``mechanism: cgroup`` for single ``roles`` never on a container (see :class:`CpuThrottleParams`)."""
        if self.params.mechanism == "cgroup" and self.params.roles:
            return {"containers": "mechanism cgroup for single roles would move the container's processes out of "
                                  "Docker's cgroups: limit the whole container (no roles), or use mechanism duty_cycle"}
        return {}

    def describe_target(self, ctx: FaultContext) -> str:
        """``"<server>/<roles joined by +>"`` or ``"<server>/tree"``, e.g. ``"spec/tree"``."""
        return f"{self.params.server}/{'+'.join(self.params.roles) if self.params.roles else 'tree'}"

    def check_host(self) -> None:
        """``mechanism: cgroup`` needs a writable cpu cgroup; ``gpu_clocks_mhz`` and
        ``power_limit_w`` need an NVIDIA GPU.

        Raises:
            FaultError: ``"cgroup <path> not writable (...)"`` (where ``mechanism``), or
                ``"no NVIDIA GPU ..."`` (where the GPU argument).
        """
        p = self.params
        if p.mechanism == "cgroup":
            try:
                cgroup.check_writable("cpu")
            except FaultError as exc:
                raise FaultError(exc.message, where="mechanism", hint=exc.hint) from None
        for name in ("gpu_clocks_mhz", "power_limit_w"):
            if getattr(p, name) is not None and (why := gpu.unavailable()):
                raise FaultError(why, where=name, hint=f"remove {name} on hosts without an NVIDIA GPU")

    def _quota(self, version: int) -> tuple[dict[str, str], dict[str, str]]:
        """(values to write, values that lift the limit) for the cgroup version."""
        period_us = int(round(self.params.period_s * 1e6))
        quota_us = max(1000, int(round(self.params.cpu_fraction * period_us)))
        if version == 1:
            return ({"cpu.cfs_period_us": str(period_us), "cpu.cfs_quota_us": str(quota_us)},
                    {"cpu.cfs_quota_us": "-1"})
        return {"cpu.max": f"{quota_us} {period_us}"}, {"cpu.max": f"max {period_us}"}

    def prepare(self, ctx: FaultContext) -> None:
        """Start polling the server's token counter, so the "before" window is measured
        without delaying the injection."""
        if self._tokens is None and self.params.server in ctx.servers:
            self._tokens = TokenRate(ctx.servers[self.params.server].base_url).start()

    def release(self, ctx: FaultContext) -> None:
        """Stop the token poller. Idempotent."""
        if self._tokens is not None:
            self._tokens.stop()
            self._tokens = None

    # ------------------------------------------------------------------ inject
    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        """Throttle the tree (see module doc).

        Returns:
            ``{"mechanism": "cgroup"|"duty_cycle", "fallback_reason": str|None,
            "cpu_fraction", "period_s", "pids", "create_times", "incarnation",
            "throttled_at": epoch s, "cgroup": cgroup facts (see
            :meth:`faults.cgroup.TreeCgroup.facts`)|None, "read_back": {file: value}|None,
            "freezes": [process-freeze facts]|None, "gpu_locked": [index],
            "gpu_power_restore_w": {index: W}}``.

        Raises:
            FaultError: unknown server, server down, cgroup refused (mechanism cgroup),
                NVML refused; whatever acted is undone by the injector's clear.
        """
        p = self.params
        target = self.describe_target(ctx)
        srv = server_of(ctx, p.server, target)
        if self._tokens is None:
            self._tokens = TokenRate(srv.base_url).start()
        wait = BEFORE_WINDOW_S - (time.monotonic() - self._tokens.started)
        if wait > 0:
            log.info("%s: measuring %.1f s of tokens/s before throttling (the fault was not prepared)", target, wait)
            time.sleep(wait)
        incarnation, recorded = cgroup.record_tree(srv, p.server, p.roles, target)
        mechanism, why = p.mechanism, None
        in_container = isinstance(srv, Containerised)
        if mechanism == "cgroup" and in_container:
            if p.roles:
                raise FaultError(self.excluded()["containers"], where=target)
            mechanism, why = "container", "a container's cgroup is Docker's: its quota set through the engine"
        if mechanism == "auto" and in_container:
            mechanism = "duty_cycle" if p.roles else "container"
            if p.roles:
                why = "per-role limits in a container: its cgroups are Docker's"
        if mechanism == "auto":
            try:
                cgroup.check_writable("cpu")
                mechanism = "cgroup"
            except FaultError as exc:
                mechanism, why = "duty_cycle", exc.one_line()
                log.warning("%s: %s; falling back to a SIGSTOP/SIGCONT duty cycle", target, why)
        self.facts = {"mechanism": mechanism, "fallback_reason": why, "cpu_fraction": p.cpu_fraction,
                      "period_s": p.period_s, "pids": [r[0] for r in recorded],
                      "create_times": [r[1] for r in recorded], "incarnation": incarnation, "throttled_at": None,
                      "cgroup": None, "read_back": None, "freezes": None, "gpu_locked": [],
                      "gpu_power_restore_w": {}}
        self._injected_mono = time.monotonic()
        if mechanism == "container":
            c = container_ops.container_of(srv, p.server, target)
            self.facts.update(container_ops.identity(c))
            self.facts["read_back"] = container_ops.limit_cpu(c, p.cpu_fraction)
            self._container = c
            self._targets = list(recorded)
        elif mechanism == "cgroup":
            self._cg = cgroup.TreeCgroup("cpu", self.fault_id or f"{self.kind}-{uuid.uuid4().hex[:8]}")
            values, lift = self._quota(self._cg.h.version)
            self._cg.lift = lift
            self._cg.create()
            self.facts["read_back"] = self._cg.write(values)
            moved = self._cg.move_in(recorded)
            if not moved:
                raise FaultError(f"every process of {target} went away before it could be throttled", where=target,
                                 hint="the server may be restarting; inject once it is ready")
            self._targets = [r for r in recorded if r[0] in moved]
            self.facts["cgroup"] = self._cg.facts()
        else:
            if p.cpu_fraction >= 1:
                raise FaultError("cpu_fraction 1 leaves the duty cycle nothing to stop", where=target,
                                 hint="use a cpu_fraction below 1, or a host with writable cgroups")
            present = srv.roles() or {}
            roles: list[str] = list(p.roles) if p.roles else [r for r in ROLE_ORDER if present.get(r)]   # the whole tree
            for role in roles:
                period_s = max(p.period_s, 1.01 * MIN_SLICE_S / min(p.cpu_fraction, 1 - p.cpu_fraction))
                role_target = f"{p.server}/{role}"
                role_incarnation, role_procs = record_role(srv, p.server, role, role_target, verb="stopped")
                cycle = StopCycle(role_target, 1 - p.cpu_fraction, period_s)
                self._stop_cycles.append(cycle)
                stopped_at = now()
                if not cycle.start(role_procs, role_target):
                    raise FaultError(f"every {role} process of server {p.server} went away before the signal",
                                     where=role_target, hint="the server may be restarting; inject once it is ready")
                self.facts["freezes"] = [*(self.facts["freezes"] or []),
                                         {**cycle.facts(), "role": role, "duty_cycle": 1 - p.cpu_fraction,
                                          "period_s": period_s, "incarnation": role_incarnation,
                                          "stopped_at": stopped_at}]
            self._targets = [(pid, ct, cmd) for ff in self.facts["freezes"]
                             for pid, ct, cmd in zip(ff["pids"], ff["create_times"], ff["cmdlines"])]
        self._apply_gpu()
        self.facts["throttled_at"] = now()
        log.info("throttled %s to %.2f CPU by %s (pids %s)", target, p.cpu_fraction, mechanism,
                 [t[0] for t in self._targets])
        return dict(self.facts)

    def _apply_gpu(self) -> None:
        p = self.params
        if p.gpu_clocks_mhz is None and p.power_limit_w is None:
            return
        if why := gpu.unavailable():
            raise FaultError(why, where="gpu_clocks_mhz" if p.gpu_clocks_mhz is not None else "power_limit_w")
        assert self.facts is not None
        try:
            if p.gpu_clocks_mhz is not None:
                self._gpu_locked = gpu.lock_clocks(p.gpu_clocks_mhz)
                self.facts["gpu_locked"] = list(self._gpu_locked)
            if p.power_limit_w is not None:
                self._gpu_power = gpu.power_limit_w()
                self.facts["gpu_power_restore_w"] = {str(k): v for k, v in self._gpu_power.items()}
                gpu.set_power_limit_w({i: p.power_limit_w for i in self._gpu_power})
        except Exception as exc:   # noqa: BLE001 - NVML errors: one message, the clear restores
            raise FaultError(f"NVML refused the GPU limit: {exc}", hint="GPU limits need root") from exc

    # ------------------------------------------------------------------ evidence
    def evidence(self, ctx: FaultContext, timeout_s: float) -> Evidence:
        """Measure the throttle over one window (see module doc).

        Observations: ``mechanism``, ``fallback_reason``, ``cpu_fraction`` (the limit, CPUs),
        ``read_back`` (cgroup files as read back), ``quota_read_back_cpus``,
        ``pids_in_cgroup``, ``missing_pids`` (targeted, alive, not in the cgroup),
        ``window_s``, ``cpu_used_cpus`` (tree CPU-seconds ÷ window), ``cpu_seconds``,
        ``throttled_periods`` (``nr_throttled`` growth), ``throttled_s``, ``stopped_share``
        (duty cycle: share of polls with every process stopped), ``tokens_metric``,
        ``tokens_per_s_before`` (the :data:`BEFORE_WINDOW_S` s before injection),
        ``tokens_per_s_during``, ``tokens_ratio`` (during ÷ before), ``measured_by``.

        Raises:
            FaultError: called before :meth:`inject`.
        """
        if self.facts is None or self._injected_mono is None:
            raise FaultError("cpu-throttle evidence asked before injection", where=self.describe_target(ctx))
        p, f = self.params, self.facts
        target = self.describe_target(ctx)
        start = time.monotonic()
        time.sleep(max(0.0, min(SETTLE_S, timeout_s / 4) - (start - self._injected_mono)))
        window = max(1.0, min(EVIDENCE_WINDOW_S, timeout_s - (time.monotonic() - start)))
        obs: dict[str, Any] = {
            "mechanism": f["mechanism"], "fallback_reason": f["fallback_reason"], "cpu_fraction": p.cpu_fraction,
            "read_back": f["read_back"], "quota_read_back_cpus": None, "pids_in_cgroup": None, "missing_pids": [],
            "window_s": None, "cpu_used_cpus": None, "cpu_seconds": None, "throttled_periods": None,
            "throttled_s": None, "stopped_share": None, "tokens_metric": TOKENS_METRIC,
            "tokens_per_s_before": None, "tokens_per_s_during": None, "tokens_ratio": None,
            "measured_by": "psutil CPU times of the tree over the window; "
                           + ("the cgroup's cpu.stat; " if f["mechanism"] == "cgroup" else "process states; ")
                           + f"{TOKENS_METRIC} on /metrics",
        }
        if self._container is not None:
            return self._container_evidence(ctx, window, obs)
        cg = self._cg
        stat_file = "cpu.stat"
        if cg is not None:
            s0 = _stat(cg.read([stat_file])[stat_file])
            procs: list[tuple[int, float | None]] = [(pid, None) for pid in cg.procs()]
        else:
            s0 = {}
            procs = [(pid, ct) for pid, ct, _ in self._targets]
        c0, w0 = _cpu_seconds(procs), time.monotonic()
        polls, stopped = 0, 0
        while time.monotonic() - w0 < window:
            if cg is None:
                states = []
                for pid, ct, _ in self._targets:
                    try:
                        states.append(psutil.Process(pid).status() if same_process(pid, ct) else None)
                    except psutil.Error:
                        states.append(None)
                live = [s for s in states if s is not None]
                polls += 1
                stopped += bool(live) and all(s == psutil.STATUS_STOPPED for s in live)
            time.sleep(0.02)
        w1 = time.monotonic()
        c1 = _cpu_seconds(procs)
        obs["window_s"] = round(w1 - w0, 3)
        obs["cpu_seconds"] = round(c1 - c0, 4)
        obs["cpu_used_cpus"] = round((c1 - c0) / (w1 - w0), 4)
        tok = self._token_rates(obs, w0, w1)
        limit_cpus = p.cpu_fraction * (1 + CPU_SLACK_RATIO) + CPU_SLACK_CPUS
        if cg is not None:
            s1 = _stat(cg.read([stat_file])[stat_file])
            back = cg.read(list(f["read_back"] or {}))
            obs["read_back"] = back
            values, _ = self._quota(cg.h.version)
            if cg.h.version == 1:
                q, per = back.get("cpu.cfs_quota_us"), back.get("cpu.cfs_period_us")
                ok_limit = q == values["cpu.cfs_quota_us"] and per == values["cpu.cfs_period_us"]
                if ok_limit:
                    obs["quota_read_back_cpus"] = round(int(q or 0) / int(per or 1), 4)
                obs["throttled_s"] = round((s1.get("throttled_time", 0) - s0.get("throttled_time", 0)) / 1e9, 4)
            else:
                raw = back.get("cpu.max") or ""
                ok_limit = raw.split() == values["cpu.max"].split()
                if ok_limit:
                    q, per = raw.split()
                    obs["quota_read_back_cpus"] = round(int(q) / int(per), 4)
                obs["throttled_s"] = round((s1.get("throttled_usec", 0) - s0.get("throttled_usec", 0)) / 1e6, 4)
            obs["throttled_periods"] = s1.get("nr_throttled", 0) - s0.get("nr_throttled", 0)
            inside = set(cg.procs())
            obs["pids_in_cgroup"] = sorted(inside)
            obs["missing_pids"] = [pid for pid, ct, cmd in self._targets
                                   if pid not in inside and same_process(pid, ct, cmd)]
            head = f"{target}: quota read back {obs['quota_read_back_cpus']} CPU (asked {p.cpu_fraction:g})"
            if not ok_limit:
                return Evidence(False, obs, f"{target}: the quota read back {back} is not the one written {values}")
            if obs["missing_pids"]:
                return Evidence(False, obs, f"{head}, but pids {obs['missing_pids']} are not in {cg.path}")
            if obs["throttled_periods"] <= 0:
                return Evidence(False, obs, f"{head}, but the kernel never throttled the tree in "
                                            f"{obs['window_s']:.1f} s (it used {obs['cpu_used_cpus']:.3f} CPU: idle?)")
            if obs["cpu_used_cpus"] > limit_cpus:
                return Evidence(False, obs, f"{head}, yet the tree used {obs['cpu_used_cpus']:.3f} CPU")
            return Evidence(True, obs, f"{head}; the tree used {obs['cpu_used_cpus']:.3f} CPU over "
                                       f"{obs['window_s']:.1f} s, throttled in {obs['throttled_periods']} periods "
                                       f"({obs['throttled_s']:.2f} s){tok}")
        share = stopped / polls if polls else 0.0
        obs["stopped_share"] = round(share, 3)
        head = (f"{target}: duty cycle ({f['fallback_reason'] or 'asked'}): stopped {share:.0%} of "
                f"{obs['window_s']:.1f} s (planned {1 - p.cpu_fraction:.0%}), tree used {obs['cpu_used_cpus']:.3f} CPU")
        if abs(share - (1 - p.cpu_fraction)) > DUTY_TOLERANCE:
            return Evidence(False, obs, head + " — not the planned share")
        return Evidence(True, obs, head + tok)

    def _token_rates(self, obs: dict[str, Any], w0: float, w1: float) -> str:
        """Fill ``tokens_per_s_before``/``_during``/``tokens_ratio`` for the window [w0, w1]
        (monotonic s); the words for the evidence's detail ("" when not measured)."""
        assert self._injected_mono is not None
        if self._tokens is not None:
            before, _ = self._tokens.rate(self._injected_mono - BEFORE_WINDOW_S - POLL_S, self._injected_mono,
                                          widen=True)
            during, _ = self._tokens.rate(w0 - POLL_S, w1 + POLL_S)
            deadline = time.monotonic() + METRICS_TIMEOUT_S
            while during is None and self._tokens.samples and time.monotonic() < deadline:
                # the poller's next sample closes the window; a starved server answers late, so
                # the window then runs from the injection to the latest sample
                time.sleep(POLL_S)
                during, _ = self._tokens.rate(self._injected_mono, time.monotonic())
            obs["tokens_per_s_before"] = None if before is None else round(before, 2)
            obs["tokens_per_s_during"] = None if during is None else round(during, 2)
            if before and during is not None:
                obs["tokens_ratio"] = round(during / before, 3)
        return (f"; tokens/s {obs['tokens_per_s_before']} before → {obs['tokens_per_s_during']} during"
                if obs["tokens_per_s_during"] is not None else "")

    def _container_evidence(self, ctx: FaultContext, window: float, obs: dict[str, Any]) -> Evidence:
        """``mechanism: container``: the quota read back from the engine (``HostConfig``),
        the engine's CPU counters of the container over the window (``throttling_data``
        ``throttled_periods`` grew; CPU used within the quota plus slack)."""
        p, f, c = self.params, self.facts or {}, self._container
        target = self.describe_target(ctx)
        obs["measured_by"] = f"the engine's HostConfig and CPU stats of container {f.get('container_name')}; " \
                             f"{TOKENS_METRIC} on /metrics"
        hc = container_ops.host_config(c)
        back = {"cpu_quota_us": hc.get("CpuQuota"), "cpu_period_us": hc.get("CpuPeriod")}
        obs["read_back"] = back
        s0 = container_ops.cpu_stats(c)
        time.sleep(window)
        s1 = container_ops.cpu_stats(c)
        tok = self._token_rates(obs, s0[0] if s0 else time.monotonic() - window, time.monotonic())
        asked = f.get("read_back") or {}
        if back != asked:
            return Evidence(False, obs, f"{target}: the engine reports {back}, not the limit asked {asked}")
        obs["quota_read_back_cpus"] = round((back["cpu_quota_us"] or 0) / (back["cpu_period_us"] or 1), 4)
        if s0 is None or s1 is None:
            return Evidence(False, obs, f"{target}: the engine's CPU stats of {f.get('container_name')} are unreadable")
        span = s1[0] - s0[0]
        obs["window_s"] = round(span, 3)
        obs["cpu_seconds"] = round((s1[1]["usage_ns"] - s0[1]["usage_ns"]) / 1e9, 4)
        obs["cpu_used_cpus"] = round(obs["cpu_seconds"] / span, 4) if span > 0 else None
        obs["throttled_periods"] = s1[1]["throttled_periods"] - s0[1]["throttled_periods"]
        head = (f"{target}: container {f.get('container_name')} quota read back {obs['quota_read_back_cpus']} CPU "
                f"(asked {p.cpu_fraction:g})")
        if obs["throttled_periods"] <= 0:
            return Evidence(False, obs, f"{head}, but the kernel never throttled it in {obs['window_s']:.1f} s (it used "
                                        f"{obs['cpu_used_cpus']} CPU: idle?)")
        if obs["cpu_used_cpus"] is None or obs["cpu_used_cpus"] > p.cpu_fraction * (1 + CPU_SLACK_RATIO) + CPU_SLACK_CPUS:
            return Evidence(False, obs, f"{head}, yet it used {obs['cpu_used_cpus']} CPU")
        return Evidence(True, obs, f"{head}; it used {obs['cpu_used_cpus']:.3f} CPU over {obs['window_s']:.1f} s, "
                                   f"throttled in {obs['throttled_periods']} periods{tok}")

    # ------------------------------------------------------------------ revert
    def clear(self, ctx: FaultContext) -> None:
        """Lift the quota (pids back, cgroup removed) or end the duty cycle (everything
        resumed); reset GPU clocks, restore power limits; stop the token poller. Idempotent.

        Raises:
            FaultError: the cgroup could not be removed, or a process stayed stopped.
        """
        errors = []
        if self._container is not None:
            container_ops.lift_cpu(self._container)
            quota = container_ops.host_config(self._container).get("CpuQuota")
            if quota not in (None, 0, -1):
                errors.append(f"container {self._container.name} still has a CPU quota of {quota} us")
            else:
                log.info("unthrottled %s (container %s)", self.describe_target(ctx), self._container.name)
                self._container = None
        if self._cg is not None:
            try:
                res = self._cg.revert()
                log.info("unthrottled %s: moved back %s, removed %s", self.describe_target(ctx),
                         res["moved_back"] + res["to_parent"], res["path"])
                self._cg = None
            except FaultError as exc:
                errors.append(exc.one_line())
        for cycle in list(self._stop_cycles):
            left = cycle.release()
            if left:
                errors.append(f"{cycle.name}: pids {left} still stopped after SIGCONT")
            else:
                self._stop_cycles.remove(cycle)
        errors += _restore_gpu(self._gpu_locked, self._gpu_power)
        self._gpu_locked, self._gpu_power = [], {}
        if self._tokens is not None:
            self._tokens.stop()
            self._tokens = None
        if errors:
            raise FaultError("; ".join(errors), where=self.describe_target(ctx), hint="run `specchaos cleanup`")

    @classmethod
    def recover(cls, entry: dict[str, Any]) -> None:
        """After a crash, from the ledger entry: revert the cgroup (from the facts, or found
        by its name ``specchaos-<fault id>`` when the facts were never written), resume the
        duty-cycled processes, reset GPU clocks and restore power limits.

        Raises:
            RuntimeError: something could not be reverted (the cleanup keeps the run's state).
        """
        facts = entry.get("facts") or {}
        params = entry.get("params") or {}
        errors = []
        if facts.get("mechanism") == "container":
            try:
                container_ops.lift_cpu(container_ops.client_for(facts).containers.get(facts["container"]))
            except docker_errors.NotFound:
                pass   # removed meanwhile: no limit is left
            except FaultError as exc:
                errors.append(exc.one_line())
            paths = []
        elif facts.get("cgroup"):
            paths = [facts["cgroup"]]
        else:
            paths = [{"path": str(pth), "parent": str(pth.parent), "lift": _lift_for(pth)}
                     for pth in cgroup.find_cgroups(str(entry.get("fault_id")), "cpu")]
        for cg_facts in paths:
            try:
                cgroup.revert(cg_facts)
            except FaultError as exc:
                errors.append(exc.one_line())
        for ff in facts.get("freezes") or []:
            try:
                if left := resume_facts(ff):
                    errors.append(f"pids {left} still stopped after SIGCONT")
            except PermissionError as exc:
                errors.append(str(exc))
        locked = facts.get("gpu_locked") or []
        power = {int(k): float(v) for k, v in (facts.get("gpu_power_restore_w") or {}).items()}
        if not facts and (params.get("gpu_clocks_mhz") is not None or params.get("power_limit_w") is not None):
            errors.append("GPU limits asked but no facts were written: check the GPUs' clocks and power limits "
                          "(nvidia-smi -rgc; nvidia-smi -pl)")
        errors += _restore_gpu(locked, power)
        if errors:
            raise RuntimeError("; ".join(errors))


def _lift_for(path: Path) -> dict[str, str]:
    """The values that lift a quota on a cgroup found by name (no facts)."""
    return {"cpu.cfs_quota_us": "-1"} if (path / "cpu.cfs_quota_us").exists() else {"cpu.max": "max"}


def _restore_gpu(locked: list[int], power: dict[int, float]) -> list[str]:
    errors = []
    if locked:
        try:
            gpu.reset_clocks(locked)
        except Exception as exc:   # noqa: BLE001 - reported, the rest still restored
            errors.append(f"resetting GPU clocks {locked} failed: {exc}")
    if power:
        try:
            gpu.set_power_limit_w(power)
        except Exception as exc:   # noqa: BLE001
            errors.append(f"restoring GPU power limits {power} failed: {exc}")
    return errors


"""Fault family ``cpu-throttle`` (thermal throttling, CPU side): cap the CPU time of a
server's process tree — a CFS quota through a cgroup of its own
(:mod:`faults.mechanisms.cgroup_cpu`), a container's own quota through its engine
(:mod:`faults.mechanisms.container`), or, where cgroups cannot be written (or with
``mechanism: duty_cycle``), a SIGSTOP/SIGCONT duty cycle of the same processes
(:mod:`faults.mechanisms.duty_cycle`, one per role); :func:`faults.mechanisms.select` picks. On GPU hosts it can also lock
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
descendant; else the processes of each role), found as :func:`faults.targets.record_tree`.

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
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from faults import mechanisms
from faults.base import Evidence, Fault, FaultContext, FaultParams
from faults.engine_metrics import TOKENS_METRIC, read_metrics
from faults.mechanisms import MIN_SLICE_S, CpuCap, Target
from faults.targets import record_tree, server_of
from harness import gpu
from harness.clock import now
from harness.errors import FaultError

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
        self._mech: CpuCap | None = None
        self._tokens: TokenRate | None = None
        self._injected_mono: float | None = None
        self._gpu_locked: list[int] = []
        self._gpu_power: dict[int, float] = {}

    # ------------------------------------------------------------------ helpers
    def required(self) -> tuple[str, ...]:
        """Process ids; ``mechanism: container`` needs a container."""
        return ("containers",) if self.params.mechanism == "container" else type(self).needs

    def excluded(self) -> dict[str, str]:
        """``mechanism: cgroup`` for single ``roles`` never on a container (see :class:`CpuThrottleParams`)."""
        if self.params.mechanism == "cgroup" and self.params.roles:
            return {"containers": mechanisms.CPU_ROLES_IN_CONTAINER}
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
        try:
            mechanisms.check_host("cpu", p.mechanism)
        except FaultError as exc:
            raise FaultError(exc.message, where="mechanism", hint=exc.hint) from None
        for name in ("gpu_clocks_mhz", "power_limit_w"):
            if getattr(p, name) is not None and (why := gpu.unavailable()):
                raise FaultError(why, where=name, hint=f"remove {name} on hosts without an NVIDIA GPU")

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
        """Throttle the tree (see module doc) by the mechanism :func:`faults.mechanisms.select` picks.

        Returns:
            ``{"mechanism": "cgroup"|"duty_cycle"|"container", "fallback_reason": str|None,
            "cpu_fraction", "period_s", "pids", "create_times", "incarnation",
            "throttled_at": epoch s, "cgroup": cgroup facts (see
            :meth:`faults.cgroup.TreeCgroup.facts`)|None, "read_back": {file: value}|None,
            "freezes": [process-freeze facts]|None, "gpu_locked": [index],
            "gpu_power_restore_w": {index: W}}``; a container's also ``container``,
            ``container_name``, ``engine``.

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
        incarnation, recorded = record_tree(srv, p.server, p.roles, target)
        t = Target(srv, p.server, target, self.fault_id or f"{self.kind}-{uuid.uuid4().hex[:8]}", p.roles, recorded,
                   incarnation)
        mech, why = mechanisms.select("cpu", t, p.mechanism)
        if why:
            log.warning("%s: %s; throttling by %s instead", target, why, mech.name)
        self.facts = {"mechanism": mech.name, "fallback_reason": why, "cpu_fraction": p.cpu_fraction,
                      "period_s": p.period_s, "pids": [r[0] for r in recorded],
                      "create_times": [r[1] for r in recorded], "incarnation": incarnation, "throttled_at": None,
                      "cgroup": None, "read_back": None, "freezes": None, "gpu_locked": [],
                      "gpu_power_restore_w": {}}
        self._injected_mono = time.monotonic()
        self._mech = mech
        self.facts.update(mech.apply(p.cpu_fraction, p.period_s))
        self._apply_gpu()
        self.facts["throttled_at"] = now()
        log.info("throttled %s to %.2f CPU by %s (pids %s)", target, p.cpu_fraction, mech.name,
                 [r[0] for r in mech.targets])
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
        ``read_back`` (cgroup files, or the engine's quota, as read back), ``quota_read_back_cpus``,
        ``pids_in_cgroup``, ``missing_pids`` (targeted, alive, not in the cgroup),
        ``window_s``, ``cpu_used_cpus`` (tree CPU-seconds ÷ window), ``cpu_seconds``,
        ``throttled_periods`` (``nr_throttled`` growth), ``throttled_s``, ``stopped_share``
        (duty cycle: share of polls with every process stopped), ``tokens_metric``,
        ``tokens_per_s_before`` (the :data:`BEFORE_WINDOW_S` s before injection),
        ``tokens_per_s_during``, ``tokens_ratio`` (during ÷ before), ``measured_by``.

        Raises:
            FaultError: called before :meth:`inject`.
        """
        if self.facts is None or self._injected_mono is None or self._mech is None:
            raise FaultError("cpu-throttle evidence asked before injection", where=self.describe_target(ctx))
        p, f = self.params, self.facts
        start = time.monotonic()
        time.sleep(max(0.0, min(SETTLE_S, timeout_s / 4) - (start - self._injected_mono)))
        window = max(1.0, min(EVIDENCE_WINDOW_S, timeout_s - (time.monotonic() - start)))
        obs: dict[str, Any] = {
            "mechanism": f["mechanism"], "fallback_reason": f["fallback_reason"], "cpu_fraction": p.cpu_fraction,
            "read_back": f["read_back"], "quota_read_back_cpus": None, "pids_in_cgroup": None, "missing_pids": [],
            "window_s": None, "cpu_used_cpus": None, "cpu_seconds": None, "throttled_periods": None,
            "throttled_s": None, "stopped_share": None, "tokens_metric": TOKENS_METRIC,
            "tokens_per_s_before": None, "tokens_per_s_during": None, "tokens_ratio": None,
            "measured_by": f"{self._mech.measured_by}{TOKENS_METRIC} on /metrics",
        }
        w0 = time.monotonic()
        acted, detail = self._mech.observe(window, p.cpu_fraction * (1 + CPU_SLACK_RATIO) + CPU_SLACK_CPUS, obs)
        tok = self._token_rates(obs, w0, time.monotonic())
        return Evidence(acted, obs, detail + tok if acted else detail)

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

    # ------------------------------------------------------------------ revert
    def clear(self, ctx: FaultContext) -> None:
        """Lift the limit (the mechanism's restore: quota lifted, pids back, cgroup removed;
        or the duty cycle ended, everything resumed); reset GPU clocks, restore power limits;
        stop the token poller. Idempotent.

        Raises:
            FaultError: the limit could not be lifted, or a process stayed stopped.
        """
        errors = []
        if self._mech is not None:
            try:
                self._mech.restore()
            except FaultError as exc:
                errors.append(exc.one_line())
        errors += _restore_gpu(self._gpu_locked, self._gpu_power)
        self._gpu_locked, self._gpu_power = [], {}
        if self._tokens is not None:
            self._tokens.stop()
            self._tokens = None
        if errors:
            raise FaultError("; ".join(errors), where=self.describe_target(ctx), hint="run `specchaos cleanup`")

    @classmethod
    def recover(cls, entry: dict[str, Any]) -> None:
        """After a crash, from the ledger entry: the mechanism's recover
        (:func:`faults.mechanisms.recover`: the cgroup reverted, found by its name
        ``specchaos-<fault id>`` when the facts were never written; the duty-cycled
        processes resumed; the container's quota lifted), then GPU clocks reset and power
        limits restored.

        Raises:
            RuntimeError: something could not be reverted (the cleanup keeps the run's state).
        """
        facts = entry.get("facts") or {}
        params = entry.get("params") or {}
        errors = mechanisms.recover("cpu", entry)
        locked = facts.get("gpu_locked") or []
        power = {int(k): float(v) for k, v in (facts.get("gpu_power_restore_w") or {}).items()}
        if not facts and (params.get("gpu_clocks_mhz") is not None or params.get("power_limit_w") is not None):
            errors.append("GPU limits asked but no facts were written: check the GPUs' clocks and power limits "
                          "(nvidia-smi -rgc; nvidia-smi -pl)")
        errors += _restore_gpu(locked, power)
        if errors:
            raise RuntimeError("; ".join(errors))


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


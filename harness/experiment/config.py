"""The ``specchaos`` block of an experiment's Chaos Toolkit ``configuration``.

Validated with pydantic; every unknown or mistyped field is an
:class:`~harness.errors.ExperimentError` naming the file and the field path.
Durations are seconds (``*_s``), sizes GiB (``*_gib``).
"""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harness.errors import ExperimentError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RestartPolicy(_Strict):
    """Supervisor policy for a server that exits unexpectedly (any exit code)."""

    max_restarts: int = Field(3, ge=0)
    backoff_s: float = Field(1.0, ge=0)
    backoff_max_s: float = Field(10.0, ge=0)


class StackConfig(_Strict):
    """What to start: a speculative server and a non-speculative reference on one target."""

    launcher: Literal["local"] = "local"
    models_dir: str = "models"
    target: str = "target"
    draft: str | None = "draft-exact"
    method: Literal["draft_model", "ngram", "eagle", "eagle3", "mtp"] = "draft_model"
    num_speculative_tokens: int = Field(4, ge=1, le=16)
    reference: bool = True
    host: str = "127.0.0.1"
    spec_port: int = Field(0, ge=0, le=65535)
    ref_port: int = Field(0, ge=0, le=65535)
    max_model_len: int = Field(1024, ge=64)
    max_num_seqs: int = Field(16, ge=1)
    kv_cache_gib: float = Field(1.0, gt=0)
    enforce_eager: bool = True
    dtype: str = "bfloat16"
    seed: int = 0
    extra_args: list[str] = Field(default_factory=list)
    startup_timeout_s: float = Field(300.0, gt=0)
    restart: RestartPolicy = Field(default_factory=RestartPolicy)

    @field_validator("host")
    @classmethod
    def _loopback_only(cls, v: str) -> str:
        try:
            ok = ipaddress.ip_address(v).is_loopback
        except ValueError:
            ok = v == "localhost"
        if not ok:
            raise ValueError("must be a loopback address (127.0.0.0/8, ::1 or localhost)")
        return v

    @model_validator(mode="after")
    def _two_ports(self) -> "StackConfig":
        if self.reference and self.spec_port and self.spec_port == self.ref_port:
            raise ValueError(f"spec_port and ref_port are both {self.spec_port}: use two ports (or 0 for a free one)")
        return self


class LoadConfig(_Strict):
    """Streaming load driven by locust (closed loop: each user sends, waits, sends again)."""

    users: int = Field(4, ge=1, le=256)
    spawn_rate: float = Field(4.0, gt=0)
    seed: int = 1234
    short_prompts: int = Field(12, ge=0)
    medium_prompts: int = Field(8, ge=0)
    long_prompts: int = Field(4, ge=0)
    max_tokens: int = Field(32, ge=1)
    ignore_eos: bool = False
    request_timeout_s: float = Field(30.0, gt=0)
    max_requests: int = Field(20000, ge=1)
    think_time_s: float = Field(0.0, ge=0)
    error_backoff_s: float = Field(0.25, ge=0)


class PhasesConfig(_Strict):
    """Phase lengths. The fault phase lasts until the fault is cleared (for a kill: the
    killed server is back); the recovery phase until the stack is back within SLO or
    ``recovery_timeout_s`` passed."""

    warmup_s: float = Field(5.0, ge=0)
    baseline_s: float = Field(30.0, gt=0)
    fault_timeout_s: float = Field(120.0, gt=0)
    recovery_timeout_s: float = Field(120.0, gt=0)
    after_s: float = Field(30.0, gt=0)


class SloConfig(_Strict):
    """Per-request SLOs (p95 over a phase) held in the baseline and after phases.
    TTFT/TPOT/ITL/E2E as in vLLM's serving benchmark; ITL per token."""

    ttft_p95_s: float = Field(2.0, gt=0)
    tpot_p95_s: float = Field(0.5, gt=0)
    itl_p95_s: float = Field(1.0, gt=0)
    e2e_p95_s: float = Field(10.0, gt=0)
    error_rate: float = Field(0.0, ge=0, le=1)


class DegradationConfig(_Strict):
    """How far things may move while the fault acts, and how close 'after' must come back."""

    #: Highest error rate allowed while the fault acts; None (default) = not judged (a
    #: killed server fails every request until it is back, so no limit fits every fault).
    fault_max_error_rate: float | None = Field(None, ge=0, le=1)
    after_vs_baseline_max_ratio: float = Field(2.0, gt=0)
    min_requests_per_phase: int = Field(3, ge=1)


class RecoveryConfig(_Strict):
    """Limits on time to recover, measured from the fault (or process death)."""

    time_to_healthy_s: float = Field(120.0, gt=0)
    time_to_first_success_s: float = Field(150.0, gt=0)
    time_to_slo_s: float = Field(180.0, gt=0)
    slo_window_s: float = Field(5.0, gt=0)
    slo_tolerance: float = Field(2.0, gt=0)
    health_interval_s: float = Field(0.25, gt=0)


class FailFastConfig(_Strict):
    """Requests in flight when the fault hits must end (with an error) within this."""

    max_error_latency_s: float = Field(5.0, gt=0)


class IntegrityConfig(_Strict):
    """Integrity against the reference: at least ``min_compared`` complete responses must
    be compared token for token (fewer fails the ``integrity.compared`` check)."""

    min_compared: int = Field(20, ge=0)


class SpecchaosConfig(_Strict):
    """The ``configuration.specchaos`` block of an experiment file: durations in seconds,
    latency limits in seconds (p95 over a phase), rates as fractions in [0, 1]."""

    stack: StackConfig = Field(default_factory=StackConfig)
    load: LoadConfig = Field(default_factory=LoadConfig)
    phases: PhasesConfig = Field(default_factory=PhasesConfig)
    slo: SloConfig = Field(default_factory=SloConfig)
    degradation: DegradationConfig = Field(default_factory=DegradationConfig)
    recovery: RecoveryConfig = Field(default_factory=RecoveryConfig)
    fail_fast: FailFastConfig = Field(default_factory=FailFastConfig)
    integrity: IntegrityConfig = Field(default_factory=IntegrityConfig)

    @model_validator(mode="after")
    def _integrity_needs_reference(self) -> "SpecchaosConfig":
        if not self.stack.reference and self.integrity.min_compared > 0:
            raise ValueError("integrity.min_compared > 0 needs the reference server: set stack.reference: true "
                             "(or integrity.min_compared: 0 to judge no integrity)")
        return self


def first_error(exc: ValidationError) -> tuple[str, str, str]:
    """The first error of a pydantic validation: ``(dotted field path, message, type)``,
    the message without pydantic's ``"Value error, "`` prefix (path ``""`` at model level)."""
    err = exc.errors()[0]
    return ".".join(str(p) for p in err["loc"]), str(err["msg"]).removeprefix("Value error, "), err["type"]


def parse_config(raw: dict | None, where: str = "configuration.specchaos") -> SpecchaosConfig:
    """Validate the ``specchaos`` configuration block.

    Args:
        raw: the block as loaded (after Chaos Toolkit resolved env references).
        where: prefix for error locations, e.g. ``"experiments/x.yaml: configuration.specchaos"``.

    Raises:
        ExperimentError: first invalid field, as ``where.field.path: message``.
    """
    try:
        return SpecchaosConfig.model_validate(raw or {})
    except ValidationError as exc:
        loc, msg, _ = first_error(exc)
        raise ExperimentError(msg, where=f"{where}.{loc}" if loc else where) from None

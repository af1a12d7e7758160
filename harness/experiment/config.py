"""The ``specchaos`` block of an experiment's Chaos Toolkit ``configuration``.

This module only composes the blocks each layer owns — ``stack``
(:mod:`harness.stack.config`), ``load`` (:mod:`harness.load.config`), the check limits
``slo``/``degradation``/``recovery``/``fail_fast``/``integrity``/``liveness``/``hang``/
``speculation``/``server_memory``/``gpu`` (:mod:`harness.checks.config`), the metrics scraper's
``scrape`` (:mod:`harness.metrics.config`), the Prometheus export's ``prometheus``
(:mod:`harness.report.config`) — plus ``phases`` (the runner orders time) and the rules
that span blocks. Every unknown or mistyped field is an
:class:`~harness.errors.ExperimentError` naming the file and the field path.
Durations are seconds (``*_s``), sizes GiB (``*_gib``).
"""

from __future__ import annotations

from typing import Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from harness.checks.config import (AcceptanceFloorConfig, ClientAbortConfig, DegradationConfig, FailFastConfig,
                                   FallbackConfig, GpuConfig, HangConfig, IntegrityConfig, JudgeConfig, LivenessConfig,
                                   MirrorConfig,
                                   RecoveryConfig, SafeguardConfig, ServerMemoryConfig, SloConfig, SoakConfig,
                                   SpeculationConfig)
from harness.metrics.config import MetricsConfig, ScrapeConfig
from harness.errors import ExperimentError, first_error
from harness.experiment.overrides import Override, known_fields, override_at, unknown_field_hint
from harness.load.config import LoadConfig
from harness.report.config import PrometheusConfig
from harness.stack.config import EXTERNAL, StackConfig

__all__ = ["PhasesConfig", "SpecchaosConfig", "parse_config"]


class PhasesConfig(BaseModel):
    """Phase lengths. The fault phase lasts until the fault is cleared (for a kill: the
    killed server is back); the recovery phase until the stack is back within SLO or
    ``recovery_timeout_s`` passed."""

    model_config = ConfigDict(extra="forbid")

    warmup_s: float = Field(5.0, ge=0)
    baseline_s: float = Field(30.0, gt=0)
    fault_timeout_s: float = Field(120.0, gt=0)
    recovery_timeout_s: float = Field(120.0, gt=0)
    after_s: float = Field(30.0, gt=0)


class SpecchaosConfig(BaseModel):
    """The ``configuration.specchaos`` block of an experiment file: durations in seconds,
    latency limits in seconds (p95 over a phase), rates as fractions in [0, 1]."""

    model_config = ConfigDict(extra="forbid")

    stack: StackConfig = Field(default_factory=StackConfig)
    load: LoadConfig = Field(default_factory=LoadConfig)
    phases: PhasesConfig = Field(default_factory=PhasesConfig)
    slo: SloConfig = Field(default_factory=SloConfig)
    degradation: DegradationConfig = Field(default_factory=DegradationConfig)
    recovery: RecoveryConfig = Field(default_factory=RecoveryConfig)
    fail_fast: FailFastConfig = Field(default_factory=FailFastConfig)
    integrity: IntegrityConfig = Field(default_factory=IntegrityConfig)
    liveness: LivenessConfig = Field(default_factory=LivenessConfig)
    hang: HangConfig = Field(default_factory=HangConfig)
    client_abort: ClientAbortConfig = Field(default_factory=ClientAbortConfig)
    mirror: MirrorConfig = Field(default_factory=MirrorConfig)
    acceptance_floor: AcceptanceFloorConfig = Field(default_factory=AcceptanceFloorConfig)
    scrape: ScrapeConfig = Field(default_factory=ScrapeConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    speculation: SpeculationConfig = Field(default_factory=SpeculationConfig)
    server_memory: ServerMemoryConfig = Field(default_factory=ServerMemoryConfig)
    soak: SoakConfig = Field(default_factory=SoakConfig)
    fallback: FallbackConfig = Field(default_factory=FallbackConfig)
    gpu: GpuConfig = Field(default_factory=GpuConfig)
    safeguards: list[SafeguardConfig] = Field(default_factory=list)
    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    prometheus: PrometheusConfig = Field(default_factory=PrometheusConfig)

    @model_validator(mode="after")
    def _safeguard_names(self) -> "SpecchaosConfig":
        names = [sg.label for sg in self.safeguards]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"safeguards: two safeguards are named {dup[0]!r}: give each its own name")
        return self

    @model_validator(mode="after")
    def _floor_exclusions_are_classes(self) -> "SpecchaosConfig":
        if self.load.source is not None:   # a source's categories are known once it is read (validate checks them)
            return self
        known = {c.name for c in self.load.request_classes or []} or {"plain"}
        for field in ("exclude_request_classes", "request_classes"):
            unknown = [n for n in getattr(self.acceptance_floor, field) if n not in known]
            if unknown:
                raise ValueError(f"acceptance_floor.{field}: {unknown[0]!r} is not a request class of "
                                 f"load.request_classes (known: {', '.join(sorted(known))})")
        return self

    @model_validator(mode="after")
    def _integrity_needs_reference(self) -> "SpecchaosConfig":
        if not self.stack.reference and self.integrity.min_compared > 0 and self.stack.launcher != EXTERNAL:
            # (an external server without reference_url: integrity is reported not judged, with the reason)
            raise ValueError("integrity.min_compared > 0 needs the reference server: set stack.reference: true "
                             "(or integrity.min_compared: 0 to judge no integrity)")
        return self

    @model_validator(mode="after")
    def _mirror_and_buckets(self) -> "SpecchaosConfig":
        if self.load.mirror and not self.stack.reference:
            raise ValueError("load.mirror needs the reference server: set stack.reference: true (or load.mirror: false)")
        if self.load.target == "ref" and (self.load.mirror or not self.stack.reference):
            raise ValueError("load.target: ref needs the reference server and no mirror: set stack.reference: true "
                             "and load.mirror: false (or load.target: spec)")
        name, longest, out = self.load.longest_request_tokens()
        if longest + out > self.stack.max_model_len:
            own = self.load.buckets is not None and any(b.name == name and b.max_tokens for b in self.load.buckets)
            what = f"its max_tokens ({out})" if own else f"load.max_tokens ({out})"
            raise ValueError(f"load.buckets: the longest prompts ({longest} tokens) plus {what} exceed "
                             f"stack.max_model_len ({self.stack.max_model_len}) in bucket {name}: shorten the "
                             f"bucket or raise stack.max_model_len")
        name, longest, turns, out = self.load.longest_conversation_tokens()
        if longest + turns * out > self.stack.max_model_len:
            raise ValueError(f"load.request_classes: class {name}: the longest prompts ({longest} tokens) plus "
                             f"{turns} turn(s) of {out} output tokens exceed stack.max_model_len "
                             f"({self.stack.max_model_len}): lower the class's max_tokens or turns, or raise "
                             f"stack.max_model_len")
        return self


def parse_config(raw: dict | None, where: str = "configuration.specchaos",
                 overrides: Sequence[Override] = ()) -> SpecchaosConfig:
    """Validate the ``specchaos`` configuration block.

    Args:
        raw: the block as loaded (after Chaos Toolkit resolved env references), with any
            overrides already applied (:func:`harness.experiment.overrides.apply_overrides`).
        where: prefix for error locations, e.g. ``"experiments/x.yaml: configuration.specchaos"``.
        overrides: the overrides applied to ``raw``: an invalid value one of them set is
            named by the override's source.

    Raises:
        ExperimentError: first invalid field, as ``where.field.path: message``, or as the
            override's source (``--set load.users=0: Input should be ...``) when an override
            set it.
    """
    try:
        return SpecchaosConfig.model_validate(raw or {})
    except ValidationError as exc:
        loc, msg, kind = first_error(exc)
        ov = override_at(loc, overrides) if loc else None
        if ov is not None:
            raise ExperimentError(msg, where=ov.source if loc == ov.path else f"{ov.source}: {loc}") from None
        hint = f"overrides applied: {'; '.join(o.source for o in overrides)}" if overrides else None
        if kind == "extra_forbidden" and loc:   # a misspelt field: say which ones exist there
            *parent, name = loc.split(".")
            fields = known_fields(SpecchaosConfig, parent)
            msg = f"unknown field {name!r}"
            hint = "; ".join(h for h in (unknown_field_hint(name, fields) if fields else None, hint) if h) or None
        raise ExperimentError(msg, where=f"{where}.{loc}" if loc else where, hint=hint) from None

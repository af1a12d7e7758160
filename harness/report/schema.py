"""The typed view of ``report.json`` and its published JSON Schema.

:class:`Report` types the fields a reader of a report relies on (the verdict, the stack,
the faults, per-phase figures, the checks, recovery, acceptance); every other section (and
any field added later) is allowed as plain JSON, so a report with more in it still
validates. The JSON Schema published as ``schemas/report.v<N>.schema.json`` is
``Report.model_json_schema()`` (:func:`report_schema`); ``N`` is the report's
``schema_version`` (:data:`harness.report.json_report.SCHEMA_VERSION`), raised when a field
changes meaning or goes away.

Units as in the report: instants epoch seconds, durations and latencies seconds, rates
fractions in [0, 1]. Latency distributions are vLLM's serving benchmark's
(:func:`harness.metrics.latency.distribution`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


__all__ = ["SCHEMA_VERSION", "Report", "Phase", "Distribution", "Check", "FaultRecord", "AcceptanceCounts", "Required",
           "report_schema", "REPORT_SCHEMA_ID"]

#: The report's ``schema_version``: raised when a field changes meaning or goes away.
SCHEMA_VERSION = 1

#: ``$id`` of the published schema.
REPORT_SCHEMA_ID = f"urn:specchaos:schema:report:v{SCHEMA_VERSION}"


class _Open(BaseModel):
    """A section of the report: the typed fields, and any others as plain JSON."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


class Distribution(_Open):
    """A latency distribution in seconds: how many values, their mean and percentiles
    (numpy's linear interpolation, as ``vllm bench serve``); all ``null`` without data."""

    n: int
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    p99_9: float | None = Field(None, alias="p99.9")


class BucketPhase(_Open):
    """One prompt-length bucket within a phase."""

    tries: int | None = None
    complete: int | None = None
    enough_samples: bool | None = None
    ttft_s: Distribution | None = None
    tpot_s: Distribution | None = None
    itl_s: Distribution | None = None
    itl_per_token_s: Distribution | None = None
    e2e_s: Distribution | None = None


class Phase(_Open):
    """The figures of one phase (baseline, fault, recovery, after): its window, requests
    (logical: every try of one request once), errors and error rate, and the latency
    distributions: TTFT, TPOT, ITL per chunk (as vLLM), ITL per token, E2E."""

    start: float | None = None
    end: float | None = None
    duration_s: float | None = None
    requests: int | None = None
    errors: int | None = None
    error_rate: float | None = None
    tries: int | None = None
    failed_tries: int | None = None
    complete: int | None = None
    unavailable_s: float | None = None
    enough_samples: bool | None = None
    ttft_s: Distribution | None = None
    tpot_s: Distribution | None = None
    itl_s: Distribution | None = None
    itl_per_token_s: Distribution | None = None
    e2e_s: Distribution | None = None
    buckets: dict[str, BucketPhase] = Field(default_factory=dict)
    output_tokens_per_s: float | None = None
    request_throughput_rps: float | None = None
    goodput_rps: float | None = None


class Speculative(_Open):
    method: str | None = None
    draft: str | None = None
    num_speculative_tokens: int | None = None


class Stack(_Open):
    """What ran: the launcher, vLLM's version, the speculative settings."""

    launcher: str | None = None
    vllm_version: str | None = None
    speculative: Speculative | None = None


class FaultRecord(_Open):
    """One injected fault: when it acted and was cleared, and whether it left evidence."""

    fault_id: str
    kind: str
    target: str | None = None
    injected_at: float | None = None
    cleared_at: float | None = None
    acted: bool
    evidence: dict[str, Any] | None = None


class Check(_Open):
    """One check: ``passed`` is true, false, or null when it was not judged (``detail``
    says why)."""

    name: str
    category: str | None = None
    passed: bool | None
    judged: bool | None = None
    observed: Any = None
    limit: Any = None
    detail: str | None = None


class Requests(_Open):
    total: int
    ok: int
    failed: int


class Recovery(_Open):
    """Seconds from the fault's clear (or the process's death) to health 200, to the first
    successful generation, and to a rolling window back within the baseline SLO; null when
    not reached."""

    time_to_healthy_s: float | None = None
    time_to_first_success_s: float | None = None
    time_to_slo_s: float | None = None
    measured_from: float | None = None


class InvariantCounts(_Open):
    """One request-class invariant (:mod:`harness.checks.request_classes`): responses it
    judged, how many violated it, and the first violation (``request_id``, ``detail``)."""

    judged: int
    violations: int
    first: dict[str, str] | None = None


class RequestClassIntegrity(_Open):
    """One request class (``integrity.classes.NAME``): its finished responses, those
    compared with the reference, and each invariant its requests' body asks for."""

    responses: int
    compared: int
    invariants: dict[str, InvariantCounts] = Field(default_factory=dict)


class Integrity(_Open):
    """Sequence integrity (:mod:`harness.checks.integrity`): responses compared with the
    reference, and the defects counted; with ``load.request_classes``, ``classes``: each
    class's invariants."""

    compared: int | None = None
    mismatched: int | None = None
    near_ties: int | None = None
    malformed: int | None = None
    cut_by_planned_stop: int | None = None
    false_success: int | None = None
    not_comparable: int | None = None
    classes: dict[str, RequestClassIntegrity] | None = None


class AcceptanceCounts(_Open):
    """Speculation measured at the client from the streamed steps: acceptance rate
    (accepted ÷ draft tokens) and mean acceptance length (1 + accepted ÷ steps)."""

    requests: int | None = None
    steps: int | None = None
    accepted: int | None = None
    draft_tokens: int | None = None
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None


class AcceptancePhase(_Open):
    total: AcceptanceCounts | None = None
    #: prompt-length bucket → sampling class → counts
    buckets: dict[str, dict[str, AcceptanceCounts]] = Field(default_factory=dict)


class AcceptanceFloor(_Open):
    """Client-side acceptance (:mod:`harness.checks.acceptance_floor`): over the run and per phase."""

    total: AcceptanceCounts | None = None
    buckets: dict[str, dict[str, AcceptanceCounts]] = Field(default_factory=dict)
    phases: dict[str, AcceptancePhase] = Field(default_factory=dict)


class SpeculationPhase(_Open):
    """vLLM's own counters (``/metrics``) over one phase."""

    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None


class SpeculationServer(_Open):
    speculative: bool | None = None
    phases: dict[str, SpeculationPhase] = Field(default_factory=dict)


class Speculation(_Open):
    servers: dict[str, SpeculationServer] = Field(default_factory=dict)


class StepAcceptance(_Open):
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    draft_tokens: float | None = None
    accepted_tokens: float | None = None


class Step(Phase):
    """The figures of one load step (:mod:`harness.metrics.steps`): a constant level of the
    profile, or a window of a ramp, with the phase figures over the requests sent in it and
    the speculative server's acceptance there. ``level``, ``from``, ``to``: users (closed
    loop) or requests/s (open loop); ``offset_s``: seconds since the load started."""

    index: int
    kind: Literal["level", "ramp"]
    unit: Literal["users", "rate"] | None = None
    level: float
    from_: float | None = Field(None, alias="from")
    to: float | None = None
    offset_s: float | None = None
    phases: list[str] = Field(default_factory=list)
    acceptance: StepAcceptance | None = None


class Steps(_Open):
    """Per-step figures of a profile with a ramp or steps; ``steps`` empty (and a ``note``)
    for a constant profile."""

    unit: Literal["users", "rate"] | None = None
    note: str | None = None
    steps: list[Step] = Field(default_factory=list)


class RequiredCheck(_Open):
    """One required check (:mod:`harness.checks.required`): a family, category or check
    name, why it is required (``judge.required`` or ``default for <fault kind>``), whether
    the run judged it, how many of the run's checks belong to it, and why not."""

    name: str
    why: str | None = None
    judged: bool
    checks: int | None = None
    reason: str | None = None


class Required(_Open):
    """What the experiment exists to judge: ``judged`` of ``of`` required checks were
    judged; one that was not makes the verdict ``error``."""

    judged: int
    of: int
    checks: list[RequiredCheck] = Field(default_factory=list)


class OverrideRecord(_Open):
    path: str
    value: Any = None
    source: str


class Report(_Open):
    """``report.json``: the verdict of one run and what it rests on (see
    :mod:`harness.report.json_report` for every section)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, title="specchaos report.json",
                              json_schema_extra={"$id": REPORT_SCHEMA_ID})

    schema_version: Literal[SCHEMA_VERSION]   # type: ignore[valid-type]
    experiment: str
    verdict: Literal["pass", "fail", "aborted", "error"]
    stack: Stack
    faults: list[FaultRecord]
    phases: dict[str, Phase]
    checks: list[Check]
    requests: Requests
    restarts: int
    errors: list[str]
    interrupted: bool | None = None
    fault_time: float | None = None
    recovery: Recovery | None = None
    integrity: Integrity | None = None
    acceptance_floor: AcceptanceFloor | None = None
    speculation: Speculation | None = None
    steps: Steps | None = None
    required: Required | None = None
    generated_at: float | None = None
    source: str | None = None
    overrides: list[OverrideRecord] = Field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The report as ``report.json`` holds it: every field it was read with, by its JSON
        name (``p99.9``, ``from``); fields absent from the file stay absent."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)

    def failed_checks(self) -> list[Check]:
        """The checks that failed (``passed`` false), in report order."""
        return [c for c in self.checks if c.passed is False]

    def not_judged(self) -> list[Check]:
        """The checks that were not judged (``passed`` null), in report order."""
        return [c for c in self.checks if c.passed is None]


def report_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of ``report.json``, as published."""
    schema = Report.model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}

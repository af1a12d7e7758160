"""What every check takes and returns: a :class:`RecordedRun` in, a list of :class:`CheckResult` out.

A check is a plain function ``check(run: RecordedRun) -> list[CheckResult]`` over data
that was recorded (request records, the timeline, the Chaos Toolkit journal); it never
talks to a server. The registry (:mod:`harness.checks.registry`) lists every check once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Union

from harness.checks.config import CheckLimits
from harness.load.records import RequestRecord
from harness.timeline import recovery_reference

Number = Union[int, float]


@dataclass
class CheckResult:
    """One named judgement with what was observed and the limit it was held to.

    Fields:
        name: dotted name, e.g. ``"slo.baseline.ttft_p95_s"``, ``"integrity.mismatched"``,
            ``"recovery.time_to_healthy_s"``.
        category: ``"slo"``, ``"degradation"``, ``"integrity"``, ``"recovery"``,
            ``"fail_fast"``, ``"liveness"``, ``"hang"``, ``"orphans"``, ``"coverage"``, ``"steady_state"``, ``"speculation"``, ``"memory"``,
            ``"gpu"`` or ``"fault"``.
        passed: the verdict: True, False, or None when the check was **not judged** (its
            data is too thin to judge fairly, e.g. a p95 resting on fewer requests than
            ``metrics.min_samples``): neither passed nor failed, shown in the report with
            the reason in ``detail`` and left out of the verdict. A check whose question
            did not arise in this run, often by timing (no request in flight at a kill, no
            /health sample during one), is not judged too. A check whose missing data is
            itself the finding fails (no complete request in a phase, too few responses
            compared: the SLO and ``coverage`` checks). No check passes vacuously.
        observed: the measured value (seconds for ``*_s`` names), or None if unmeasurable.
        limit: the limit it was held to, or None.
        detail: one human sentence (e.g. the first divergence of a mismatched output).
    """

    name: str
    category: str
    passed: bool | None
    observed: Number | str | None
    limit: Number | str | None
    detail: str = ""

    @property
    def judged(self) -> bool:
        """False for a check that was not judged (``passed`` is None)."""
        return self.passed is not None

    @property
    def failed(self) -> bool:
        """True only for a judged check that did not pass."""
        return self.passed is False

    @classmethod
    def not_judged(cls, name: str, category: str, observed: Number | str | None, limit: Number | str | None,
                   reason: str) -> "CheckResult":
        """A check that was not judged, with the reason (``detail`` starts with ``"not judged: "``)."""
        return cls(name, category, None, observed, limit, f"not judged: {reason}")

    def to_dict(self) -> dict:
        """The check as JSON: its fields plus ``judged`` (False when ``passed`` is None)."""
        return {**asdict(self), "judged": self.judged}


@dataclass
class RecordedRun:
    """Everything a check may judge, all of it recorded data (see
    :func:`harness.checks.run.load_run` for how a run directory becomes one).

    Fields:
        records: the speculative server's load records (``source == "load"``,
            ``server == "spec"``), warm-up included: what every check judges unless it
            is mirror-aware.
        reference: the complete non-speculative reference record per ``prompt_id``.
        events: timeline events in time order (:mod:`harness.timeline`).
        limits: the run's configuration (:class:`~harness.checks.config.CheckLimits`).
        windows: ``{phase: (start, end)}``, epoch seconds.
        members: ``{phase: [records]}``, the requests each phase answers for.
        phases: ``{phase: metrics}`` (:func:`harness.metrics.phases.phase_metrics`).
        faults: one summary per injected fault (:func:`harness.timeline.fault_summary`).
        journal: the Chaos Toolkit journal, None when the run has none.
        run_dir: where the data was read from (None when built in memory).
        memo: scratch space for a check family to share one computation between its
            checks and its report section (keyed by family name).
        ref_records: mirror mode's load records sent to the reference (plain) server
            (``server == "ref"``); empty without mirror mode.
        class_reference: the reference server's answers per request class
            (``class_reference.jsonl``: each prompt as the class's first turn), the
            reference of the classes' own invariants outside mirror mode; empty without.
        load_stats: the open loop's own account (``load_stats.json``, merged over workers:
            arrivals, drops, the pacer's lag, :func:`harness.load.profiles.read_load_stats`);
            None for a closed loop.
    """

    records: list[RequestRecord]
    reference: dict[int, RequestRecord]
    events: list[dict[str, Any]]
    limits: CheckLimits
    windows: dict[str, tuple[float, float]] = field(default_factory=dict)
    members: dict[str, list[RequestRecord]] = field(default_factory=dict)
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)
    faults: list[dict[str, Any]] = field(default_factory=list)
    journal: dict[str, Any] | None = None
    run_dir: Path | None = None
    memo: dict[str, Any] = field(default_factory=dict)
    ref_records: list[RequestRecord] = field(default_factory=list)
    load_stats: dict[str, Any] | None = None
    class_reference: list[RequestRecord] = field(default_factory=list)

    @property
    def soak(self) -> bool:
        """A soak run (``soak.enabled``): the sustained load is the experiment, so it needs no
        fault (:mod:`harness.checks.soak`)."""
        return bool(getattr(getattr(self.limits, "soak", None), "enabled", False))

    @property
    def fault_time(self) -> float | None:
        """Epoch seconds of the first fault's injection (None when no fault was injected)."""
        return self.faults[0]["injected_at"] if self.faults else None

    @property
    def recovery_time(self) -> float | None:
        """Epoch seconds time to recover is measured from: the fault's clear, or its
        injection for a fault whose damage is done when it acts
        (:func:`harness.timeline.recovery_reference`); with several faults, the latest of
        those instants (recovery starts when the last damage ended); None without a fault."""
        return max(recovery_reference(f) for f in self.faults) if self.faults else None


def instant(t: float, fault_t: float | None = None,
            windows: Mapping[str, tuple[float, float]] | None = None) -> str:
    """An instant for a check's detail, placed as a reader places it (epoch seconds stay in
    ``report.json``): with the run's phase windows (``{phase: (start, end)}``, epoch s), the
    phase it falls in and the seconds since that phase began, e.g. ``"recovery +2.4 s"``
    (before the first phase: that phase and a negative offset); else, with the fault's
    epoch seconds, the seconds from the fault, e.g. ``"fault +5.0 s"``; else the epoch
    seconds, ``"epoch 1796015284.123"``."""
    if windows:
        starts = sorted(((w[0], name) for name, w in windows.items()), key=lambda x: x[0])
        start, name = next(((a, n) for a, n in reversed(starts) if a <= t), starts[0])
        return f"{name} {_offset(t - start)} s"
    if fault_t is not None:
        return f"fault {_offset(t - fault_t)} s"
    return f"epoch {t:.3f}"


def _offset(d: float) -> str:
    """Signed seconds: tenths from a second on, hundredths below (``+5.0``, ``-0.01``)."""
    return f"{d:+.1f}" if abs(d) >= 1 else f"{d:+.2f}"


#: The one signature of a check.
Check = Callable[[RecordedRun], "list[CheckResult]"]

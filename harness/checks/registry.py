"""Every check family, listed once (as toxiproxy lists its toxics): the judge iterates
:data:`CHECKS` in order. Adding a check is one module exposing
``check(run: RecordedRun) -> list[CheckResult]`` (and, if it has one, a
``section(run) -> dict`` for ``report.json``, with ``summarize(section)`` for how it reads
in the terminal summary and Allure and ``phase_figures(section)`` for columns of the phase
tables) plus one line here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from harness.checks import (acceptance_floor, availability, breaker, client_abort, fail_fast, fault, gpu, hang, integrity,
                            liveness, mirror, orphans, pacing, recovery, safeguards, server_memory, slo, speculation,
                            soak, steady_state, steps)
from harness.checks.base import Check, RecordedRun
from harness.checks.view import PhaseFigures, Summarize

__all__ = ["CheckFamily", "CHECKS", "RESERVED_NAMES", "register_check", "unregister_check"]


@dataclass(frozen=True)
class CheckFamily:
    """One family of checks.

    Fields:
        name: the family's name; also its ``report.json`` key when it has a section.
        check: ``RecordedRun -> list[CheckResult]``.
        section: optional ``RecordedRun -> JSON-able`` data for ``report.json[name]``.
        summarize: optional ``section -> list[View]`` (:mod:`harness.checks.view`): how the
            section reads in the terminal summary and in Allure, which call it for every
            family in order with ``report.json[name]`` (None when the report has none) and
            name no family themselves.
        phase_figures: optional ``section -> {name: {phase: value}}``: figures of the
            family's per phase that the summary's phase table and Allure's per-phase table
            show as columns.
    """

    name: str
    check: Check
    section: Callable[[RecordedRun], Any] | None = None
    summarize: Summarize | None = None
    phase_figures: PhaseFigures | None = None


CHECKS: dict[str, CheckFamily] = {f.name: f for f in (
    CheckFamily("fault", fault.check),
    CheckFamily("slo", slo.check),
    CheckFamily("availability", availability.check, availability.section),
    CheckFamily("integrity", integrity.check, integrity.section, integrity.summarize),
    CheckFamily("recovery", recovery.check, recovery.section, recovery.summarize),
    CheckFamily("fail_fast", fail_fast.check, fail_fast.section),
    CheckFamily("liveness", liveness.check, liveness.section),
    CheckFamily("hang", hang.check, hang.section),
    CheckFamily("orphans", orphans.check, orphans.section),
    CheckFamily("steady_state", steady_state.check),
    CheckFamily("client_abort", client_abort.check, client_abort.section),
    CheckFamily("gpu", gpu.check, gpu.section, gpu.summarize),
    CheckFamily("mirror", mirror.check, mirror.section, mirror.summarize),
    CheckFamily("acceptance_floor", acceptance_floor.check, acceptance_floor.section, acceptance_floor.summarize,
                acceptance_floor.phase_figures),
    CheckFamily("speculation", speculation.check, speculation.section, speculation.summarize,
                speculation.phase_figures),
    CheckFamily("server_memory", server_memory.check, server_memory.section, server_memory.summarize),
    CheckFamily("breaker", breaker.check, breaker.section),
    CheckFamily("safeguards", safeguards.check, safeguards.section, safeguards.summarize),
    CheckFamily("steps", steps.check, steps.section, steps.summarize),
    CheckFamily("soak", soak.check, soak.section),
    CheckFamily("pacing", pacing.check, pacing.section, pacing.summarize),
)}


#: ``report.json`` keys the judge itself writes: no check family may be named like one
#: (its section would collide with them).
RESERVED_NAMES = frozenset({
    "schema_version", "required", "experiment", "verdict", "stack", "faults", "phases", "checks", "requests",
    "restarts", "errors", "interrupted", "fault_time", "fault_evidence", "server_events", "journal_status", "steady_state",
    "generated_at", "method_skipped", "source"})


def register_check(family: CheckFamily) -> None:
    """Add (or replace) a check family; it runs after those already listed.

    Raises:
        ValueError: the name is one of :data:`RESERVED_NAMES`.
    """
    if family.name in RESERVED_NAMES:
        raise ValueError(f"a check family may not be called {family.name!r}: report.json uses that key")
    CHECKS.pop(family.name, None)
    CHECKS[family.name] = family


def unregister_check(name: str) -> None:
    """Remove a family (no error if absent)."""
    CHECKS.pop(name, None)

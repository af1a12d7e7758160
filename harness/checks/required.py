"""Required checks: what an experiment exists to judge, and whether the run judged it.

An experiment declares ``judge.required`` (:class:`~harness.checks.config.JudgeConfig`):
check families, categories or check names. Left out, the requirement follows the faults
the run injects (:data:`DEFAULTS`, keyed by the fault's ``kind``; a fault class may carry
its own tuple as the class attribute ``required_checks``, read through the fault registry
by the caller) and ``soak`` for a soak run. ``judge.optional`` takes names out of that set.
Integrity is left out of the default set of a run without a reference server
(``stack.reference`` false): the configuration chose to compare nothing, and the report
lists integrity's comparison as not judged. Named in ``judge.required``, it is required
all the same.

When is a requirement met (:func:`judge_required`)?

* a **check name** (a check of exactly that name ran): that check was judged;
* a **family or category** (``integrity``, ``degradation``): the family's core checks
  (:data:`CORE`; integrity's comparison with the reference) were all judged, or, for a
  family without core checks, at least one of its checks was judged. A check belongs to
  ``X`` when its category is ``X`` or its name is ``X`` or starts with ``X.``.

A requirement not met makes the verdict ``error`` (:func:`harness.checks.verdict.verdict`):
``"required check X not judged: <reason>"``, the reason taken from the first not-judged
check that decided it (its ``detail``), or "no check of that name ran".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from harness.checks.base import CheckResult
from harness.checks.config import JudgeConfig
from harness.checks.integrity import NEEDS_REFERENCE
from harness.checks.registry import CHECKS

__all__ = ["DEFAULTS", "SOAK_DEFAULT", "CORE", "CATEGORIES", "Requirement", "RequiredStatus", "required_checks",
           "judge_required", "unknown_requirements", "required_section", "required_line"]

#: The default required checks per fault kind (the registry's ``kind``): what a fault of
#: that family exists to test. A kind not listed requires nothing by default.
DEFAULTS: dict[str, tuple[str, ...]] = {
    # the process dies: it must come back, in-flight requests must end, outputs stay right
    "process-kill": ("recovery", "fail_fast", "integrity"),
    # a device error crashes the engine the same way
    "cuda-error": ("recovery", "fail_fast", "integrity"),
    # a frozen process: the stall must be seen (hang), outputs stay right
    "process-freeze": ("hang", "integrity"),
    # resource and network faults: graceful degradation, outputs stay right
    "network": ("degradation", "integrity"),
    "memory-hog": ("degradation", "integrity"),
    "memory-limit": ("degradation", "integrity"),
    "cpu-throttle": ("degradation", "integrity"),
    "kv-pressure": ("degradation", "integrity"),
    # closed streams: the server drains them, the others stay right
    "client-abort": ("client_abort", "integrity"),
    # a bad draft: the canaries see it, the breaker acts on it
    "draft-swap": ("speculation", "breaker"),
}

#: The default requirement of a soak run (``soak.enabled``): its canaries.
SOAK_DEFAULT: tuple[str, ...] = ("soak",)

#: Families whose requirement means specific checks: all of them must be judged (without an
#: entry, one judged check of the family meets it).
CORE: dict[str, tuple[str, ...]] = {
    "integrity": NEEDS_REFERENCE,
}

#: Check categories that are not a family's name (``CheckResult.category``).
CATEGORIES = frozenset({"degradation", "coverage", "memory"})


@dataclass(frozen=True)
class Requirement:
    """One required name and why: ``"judge.required"`` or ``"default for <kind>"``."""

    name: str
    why: str


@dataclass(frozen=True)
class RequiredStatus:
    """A requirement judged against the run's checks.

    Fields:
        name, why: the :class:`Requirement`.
        judged: True when met (module doc).
        checks: how many of the run's checks belong to it.
        reason: why it is not met (None when met).
    """

    name: str
    why: str
    judged: bool
    checks: int
    reason: str | None = None

    @property
    def message(self) -> str:
        """``"required check X not judged: <reason>"`` (the run error of an unmet requirement)."""
        return f"required check {self.name} not judged: {self.reason}"


def required_checks(kinds: Iterable[str], cfg: JudgeConfig, *, soak: bool = False, reference: bool = True,
                    overrides: Mapping[str, Sequence[str]] | None = None) -> list[Requirement]:
    """The requirements of a run, in a stable order (module doc).

    Args:
        kinds: the fault kinds the run injects (or the experiment declares), any order,
            repeats allowed.
        cfg: the experiment's ``judge`` block; ``required`` given replaces the defaults.
        soak: a soak run (adds :data:`SOAK_DEFAULT`).
        reference: the run has a reference server (without one, integrity is not a default).
        overrides: a fault kind's own requirement (a fault class's ``required_checks``),
            used instead of its :data:`DEFAULTS` entry.
    """
    if cfg.required is not None:
        return [Requirement(n, "judge.required") for n in dict.fromkeys(cfg.required)]
    out: dict[str, Requirement] = {}
    for kind in dict.fromkeys(kinds):
        names = (overrides or {}).get(kind)
        for n in DEFAULTS.get(kind, ()) if names is None else names:
            out.setdefault(n, Requirement(n, f"default for {kind}"))
    if soak:
        for n in SOAK_DEFAULT:
            out.setdefault(n, Requirement(n, "default for soak"))
    if not reference:
        out.pop("integrity", None)
    for n in cfg.optional:
        out.pop(n, None)
    return list(out.values())


def _belongs(c: CheckResult, name: str) -> bool:
    return c.category == name or c.name == name or c.name.startswith(name + ".")


def _why_not(c: CheckResult) -> str:
    return c.detail.removeprefix("not judged: ") or "not judged"


def _status(req: Requirement, checks: Sequence[CheckResult]) -> RequiredStatus:
    exact = [c for c in checks if c.name == req.name]
    if exact:
        missing = next((c for c in exact if not c.judged), None)
        return RequiredStatus(req.name, req.why, missing is None, len(exact), None if missing is None else _why_not(missing))
    mine = [c for c in checks if _belongs(c, req.name)]
    if not mine:
        return RequiredStatus(req.name, req.why, False, 0, "no check of that name ran in this run")
    core = CORE.get(req.name)
    if core:
        for name in core:
            c = next((c for c in mine if c.name == name), None)
            if c is None:
                return RequiredStatus(req.name, req.why, False, len(mine), f"{name} did not run")
            if not c.judged:
                return RequiredStatus(req.name, req.why, False, len(mine), f"{name}: {_why_not(c)}")
        return RequiredStatus(req.name, req.why, True, len(mine))
    if any(c.judged for c in mine):
        return RequiredStatus(req.name, req.why, True, len(mine))
    return RequiredStatus(req.name, req.why, False, len(mine), f"none of its {len(mine)} check(s) was judged "
                                                               f"({mine[0].name}: {_why_not(mine[0])})")


def judge_required(checks: Iterable[CheckResult], required: Iterable[Requirement]) -> list[RequiredStatus]:
    """Each requirement met or not by the run's checks (module doc), in order."""
    checks = list(checks)
    return [_status(r, checks) for r in required]


def unknown_requirements(names: Iterable[str]) -> list[str]:
    """The names whose first dotted part is neither a registered check family nor a check
    category (a typo in ``judge.required``)."""
    known = set(CHECKS) | CATEGORIES
    return [n for n in names if n.split(".", 1)[0] not in known]


def required_section(statuses: Sequence[RequiredStatus]) -> dict:
    """``report.json``'s ``required``: ``{"judged": N, "of": M, "checks": [{"name", "why",
    "judged", "checks", "reason"}]}``."""
    return {"judged": sum(s.judged for s in statuses), "of": len(statuses),
            "checks": [{"name": s.name, "why": s.why, "judged": s.judged, "checks": s.checks, "reason": s.reason}
                       for s in statuses]}


def required_line(required: Sequence[Requirement]) -> str:
    """The requirements in one line, grouped by why, e.g. ``"recovery, fail_fast, integrity
    (default for process-kill); degradation (default for memory-hog)"``."""
    if not required:
        return "nothing (no judge.required, and no default for these faults)"
    groups: dict[str, list[str]] = {}
    for r in required:
        groups.setdefault(r.why, []).append(r.name)
    return "; ".join(f"{', '.join(names)} ({why})" for why, names in groups.items())

"""Judge a run: recorded data → phases → metrics → every registered check → one verdict.

Pure over recorded data: :func:`judge_run` reads a run directory
(:func:`harness.checks.run.load_run`), :func:`judge` judges a
:class:`~harness.checks.base.RecordedRun`; neither talks to a server. The same code
judges a live run at its end and re-judges a saved one (``specchaos report DIR``). The
checks come from :data:`harness.checks.registry.CHECKS`; the verdict is computed here
and nowhere else (:func:`harness.checks.verdict.verdict`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from harness.checks.base import CheckResult, RecordedRun
from harness.checks.config import CheckLimits
from harness.checks.fault import method_skipped
from harness.checks.registry import CHECKS
from harness.checks.required import RequiredStatus, judge_required, required_checks, required_section
from harness.checks.run import load_run
from harness.checks.safeguards import ABORT_PREFIX, abort_event
from harness.checks.verdict import verdict
from harness.clock import now
from harness.load.records import is_complete, record_files, unreadable_lines
from harness.metrics.availability import last_try, tries_by_logical
from harness.report.json_report import build_report, jsonable
from harness.timeline import count_restarts, server_events
from faults.registry import REGISTRY

#: The run error of a run whose method injected no fault.
NO_FAULT_ERROR = "no fault was injected: the experiment tested nothing"
NO_FAULT_BEFORE_INTERRUPT = "no fault was injected before the interruption"

__all__ = ["judge", "judge_run", "NO_FAULT_ERROR", "NO_FAULT_BEFORE_INTERRUPT"]

log = logging.getLogger(__name__)


def _run_errors(run: RecordedRun, errors: list[str], interrupted: bool, skipped: bool,
                aborted: bool = False) -> list[str]:
    """The run errors: the runner's, plus a missing fault or a fault without evidence
    (after an interruption, named as its consequence rather than the fault's failure;
    after a safeguard's abort, not an error: the abort cut the evidence short, and an
    activity that ended because of the abort is no error either)."""
    out = list(errors)
    if aborted:
        return [e for e in out if ABORT_PREFIX not in e]
    if not run.faults and not skipped and not run.soak:
        out.append(NO_FAULT_BEFORE_INTERRUPT if interrupted else NO_FAULT_ERROR)
    for f in run.faults:
        if f["acted"]:
            continue
        ev = f.get("evidence")
        detail = (ev.get("detail") or "") if isinstance(ev, dict) else ""
        what = ("its evidence was not collected before the interruption" if interrupted
                else "left no evidence that it acted")
        out.append(f"fault {f['fault_id']} ({f['kind']} on {f['target']}): {what}" + (f": {detail}" if detail else ""))
    return out


def fault_requirements() -> dict[str, tuple[str, ...]]:
    """The fault kinds whose class states its own required checks (a ``required_checks``
    class attribute, tuple of names), read through the fault registry."""
    out: dict[str, tuple[str, ...]] = {}
    for kind, cls in REGISTRY.items():
        names = getattr(cls, "required_checks", None)   # optional: most families use the defaults table
        if names is not None:
            out[kind] = tuple(names)
    return out


def run_requirements(run: RecordedRun, checks: list[CheckResult]) -> list[RequiredStatus]:
    """The run's required checks (:mod:`harness.checks.required`: the ``judge`` block, else
    the defaults of the faults it injected), each met or not by ``checks``."""
    stack = getattr(run.limits, "stack", None)   # the stack block, when the limits carry it
    required = required_checks([f["kind"] for f in run.faults], run.limits.judge, soak=run.soak,
                               reference=bool(getattr(stack, "reference", True)), overrides=fault_requirements())
    return judge_required(checks, required)


def judge(run: RecordedRun, meta: dict[str, Any]) -> dict[str, Any]:
    """Run every registered check family over ``run`` and assemble the report
    (schema in :mod:`harness.report.json_report`).

    Args:
        run: the recorded run.
        meta: from the runner: ``experiment`` (title), ``stack`` (launcher,
            vllm_version, speculative), ``errors`` (run errors, one line each),
            ``interrupted``, ``journal_status``, ``steady_state``; other keys are copied
            into the report.

    Returns:
        The report dict. Verdict ``"aborted"`` when a safeguard stopped the method (and no
        run error besides), ``"error"`` on a run error, an interruption, no fault
        (unless Chaos Toolkit skipped the method after a missed hypothesis, which is a
        failed steady-state check), or a fault without evidence; ``"fail"`` if a check
        failed; else ``"pass"``.
    """
    interrupted = bool(meta.get("interrupted"))
    skipped = method_skipped(run)
    checks: list[CheckResult] = []
    sections: dict[str, Any] = {}
    broken: list[str] = []
    for family in CHECKS.values():
        try:   # a check that raises is a bug in the check: a run error, and the others still judge
            checks += family.check(run)
            if family.section is not None:
                sections[family.name] = family.section(run)
        except Exception as exc:  # noqa: BLE001
            log.exception("check family %s raised", family.name)
            broken.append(f"check family '{family.name}' raised {type(exc).__name__}: {exc}")
    if run.run_dir is not None:   # recorded data that cannot be read is lost data: never skipped silently
        for f in [*record_files(run.run_dir / "records.jsonl"), run.run_dir / "reference.jsonl"]:
            name = f.name   # records.worker<i>.jsonl too (distributed load)
            bad = unreadable_lines(f)
            if bad:
                broken.append(f"{name}: {len(bad)} line(s) are not request records (line {', '.join(map(str, bad[:5]))}"
                              f"{', ...' if len(bad) > 5 else ''}); they were not judged")
    aborted = abort_event(run.events) is not None
    required = run_requirements(run, checks)
    unmet = [] if aborted or skipped else [s.message for s in required if not s.judged]
    errors = _run_errors(run, [str(e) for e in (meta.get("errors") or [])] + broken + unmet, interrupted, skipped,
                         aborted)
    fault_acted = (bool(run.faults) or skipped or run.soak) and all(f["acted"] for f in run.faults)
    v = verdict(checks, fault_acted=fault_acted, errors=errors, interrupted=interrupted, aborted=aborted,
                required=[] if aborted or skipped else required)
    records = run.records
    n_ok = sum(1 for r in records if is_complete(r)[0])
    logical = tries_by_logical(records)
    report = build_report(
        experiment=str(meta.get("experiment") or (run.run_dir.name if run.run_dir else "experiment")),
        verdict=v,
        stack=dict(meta.get("stack") or {}),
        faults=run.faults,
        phases=run.phases,
        checks=checks,
        requests={"total": len(records), "ok": n_ok, "failed": len(records) - n_ok,
                  "client_ok": sum(1 for r in records if r.ok), "logical": len(logical),
                  "logical_failed": sum(1 for ts in logical.values() if not is_complete(last_try(ts))[0])},
        restarts=count_restarts(run.events, "spec"),
        errors=errors,
        **sections,
        required=required_section(required),
        interrupted=interrupted,
        fault_time=run.fault_time,
        fault_evidence=[e for e in run.events if e.get("event") == "fault_evidence"],
        server_events=server_events(run.events),
        journal_status=meta.get("journal_status"),
        steady_state=meta.get("steady_state"),
        generated_at=now(),
    )
    if skipped:
        report["method_skipped"] = "steady-state hypothesis not met before the method"
    for k, val in meta.items():  # anything else the runner knows (e.g. "source")
        report.setdefault(k, jsonable(val))
    log.debug("judged: %s (%d checks, %d failed, %d not judged)", v, len(checks), sum(c.failed for c in checks),
              sum(not c.judged for c in checks))
    return report


def judge_run(run_dir: str | Path, limits: CheckLimits, meta: dict[str, Any],
              journal: dict | None = None) -> dict[str, Any]:
    """Judge a run directory (see :func:`judge`; files as :func:`harness.checks.run.load_run`)."""
    return judge(load_run(run_dir, limits, journal=journal), meta)

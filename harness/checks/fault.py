"""Did the fault happen? One check per injected fault (``fault.<fault_id>.acted``) from
its recorded evidence, and ``fault.injected`` when none was: a fault that did not act
proves nothing, so the judge also counts it as a run error (verdict ``error``)."""

from __future__ import annotations

from harness.checks.base import CheckResult, RecordedRun

__all__ = ["fault_checks", "check"]


def fault_checks(faults: list[dict], expected: bool = True) -> list[CheckResult]:
    """Checks over fault summaries (:func:`harness.timeline.fault_summary`).

    Args:
        faults: one summary per injected fault (``fault_id``, ``kind``, ``target``,
            ``acted``, ``evidence``).
        expected: whether a fault was meant to run (False when Chaos Toolkit skipped the
            method: then no fault is no finding).
    """
    if not faults:
        return [CheckResult("fault.injected", "fault", False, 0, 1, "no fault was injected: nothing was tested")] \
            if expected else []
    out = []
    for f in faults:
        ev = f.get("evidence")
        detail = (ev.get("detail") or "") if isinstance(ev, dict) else ""
        out.append(CheckResult(f"fault.{f['fault_id']}.acted", "fault", bool(f["acted"]), bool(f["acted"]), True,
                               f"{f['kind']} on {f['target']}: " + (detail or ("acted" if f["acted"] else
                                                                                 "no evidence it acted"))))
    return out


def method_skipped(run: RecordedRun) -> bool:
    """No fault, because Chaos Toolkit skipped the method after the steady-state
    hypothesis was missed before it (then the missed probe is the finding)."""
    before = ((run.journal or {}).get("steady_states") or {}).get("before")
    return not run.faults and bool(before) and not before.get("steady_state_met")


def check(run: RecordedRun) -> list[CheckResult]:
    """The fault checks of a recorded run (a soak, ``soak.enabled``, needs no fault: the
    long load is its experiment)."""
    return fault_checks(run.faults, expected=not method_skipped(run) and not run.soak)

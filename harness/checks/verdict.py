"""The run's verdict from its checks and what went wrong around them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Literal

from harness.checks.base import CheckResult

if TYPE_CHECKING:
    from harness.checks.required import RequiredStatus

__all__ = ["Verdict", "verdict", "EXIT_CODES"]

Verdict = Literal["pass", "fail", "error", "aborted"]

#: The exit code of each verdict (``specchaos run`` and ``specchaos report`` exit with it).
#: ``aborted``: a continuous safeguard stopped the method: the system under test crossed a
#: hard limit, a finding like a failed check.
EXIT_CODES = {"pass": 0, "fail": 1, "aborted": 1, "error": 2}


def verdict(checks: Iterable[CheckResult], *, fault_acted: bool, errors: list[str], interrupted: bool = False,
            aborted: bool = False, required: Iterable["RequiredStatus"] = ()) -> Verdict:
    """``"error"``, ``"aborted"``, ``"fail"`` or ``"pass"``.

    * ``"error"``: the experiment itself did not run as declared — any run error, an
      interruption, or a fault without evidence that it acted (a fault that did not
      happen proves nothing: it is an error, never a pass), no judged check at all
      (nothing was judged), or a required check that was not judged
      (:mod:`harness.checks.required`: what the experiment exists to judge was not judged,
      so the run proves nothing about it);
    * ``"aborted"``: a continuous safeguard (:mod:`harness.checks.safeguards`) was breached
      during the method and stopped it (rollbacks ran): the system under test crossed a
      hard limit, a finding like a failed check (exit 1), named apart because the method
      did not run to its end. A fault whose evidence the abort cut short is no error here;
      the judge leaves it out of ``errors``;
    * ``"fail"``: it ran, and at least one judged check failed;
    * ``"pass"``: it ran and every judged check passed.

    Checks that were not judged (``passed`` None, e.g. a p95 on too few requests) and not
    required count neither way; the report lists them with their reason. The judge leaves
    ``required`` empty for an aborted run and a run whose method was skipped.
    """
    judged = [c for c in checks if c.judged]
    if errors or interrupted or not judged or any(not r.judged for r in required):
        return "error"
    if aborted:
        return "aborted"
    if not fault_acted:
        return "error"
    if any(c.failed for c in judged):
        return "fail"
    return "pass"

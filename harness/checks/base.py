"""The result every check returns."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Union

Number = Union[int, float]


@dataclass
class CheckResult:
    """One named judgement with what was observed and the limit it was held to.

    Fields:
        name: dotted name, e.g. ``"slo.baseline.ttft_p95_s"``, ``"integrity.mismatched"``,
            ``"recovery.time_to_healthy_s"``.
        category: ``"slo"``, ``"degradation"``, ``"integrity"``, ``"recovery"``,
            ``"fail_fast"``, ``"coverage"`` or ``"fault"``.
        passed: the verdict. A check with nothing to judge (e.g. no requests in a phase)
            fails; it never passes vacuously.
        observed: the measured value (seconds for ``*_s`` names), or None if unmeasurable.
        limit: the limit it was held to, or None.
        detail: one human sentence (e.g. the first divergence of a mismatched output).
    """

    name: str
    category: str
    passed: bool
    observed: Number | str | None
    limit: Number | str | None
    detail: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

"""How a check family's report section is shown: plain tables and lines that any renderer
draws (the terminal summary with rich, Allure as text), so a family that owns a section
also owns how it reads, and the renderers name no family.

A family's ``summarize(section) -> list[View]`` (:class:`harness.checks.registry.CheckFamily`)
turns its ``report.json`` section (plain JSON, as read back) into views, in order; an empty
list when there is nothing to show.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Union

__all__ = ["Table", "Line", "View", "Summarize", "PhaseFigures", "pct", "ms", "num", "enough", "lat"]


@dataclass
class Table:
    """A titled table of strings.

    Fields:
        title: the table's title.
        columns: the header cells.
        rows: the cells, one list per row, as long as ``columns``.
        labels: how many leading columns are labels (left-justified); the others are
            figures (right-justified).
        dim: indexes of rows to show dimmed (figures resting on too few samples, not judged).
        caption: one line under the table ("" for none).
        header: False for a two-column list of "what: value" rows without a header.
    """

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    labels: int = 1
    dim: set[int] = field(default_factory=set)
    caption: str = ""
    header: bool = True

    def add(self, *cells: str, dim: bool = False) -> None:
        """Append a row (dimmed when ``dim``)."""
        if dim:
            self.dim.add(len(self.rows))
        self.rows.append([str(c) for c in cells])


@dataclass
class Line:
    """One line of text; ``style`` ``"note"`` (dimmed), ``"alert"`` (a finding, in red) or ``""``."""

    text: str
    style: str = ""


View = Union[Table, Line]
#: A family's rendering hook: its ``report.json`` section → views.
Summarize = Callable[[Any], "list[View]"]
#: A family's per-phase figures for the phase tables: its section → ``{name: {phase: value}}``.
PhaseFigures = Callable[[Any], "dict[str, dict[str, float | None]]"]


def pct(v: Any) -> str:
    """A fraction as a percentage with one decimal, ``—`` for None."""
    return "—" if v is None else f"{v * 100:.1f}%"


def ms(v: Any) -> str:
    """Seconds as milliseconds (no decimal from 100 ms, one below), ``—`` for None."""
    return "—" if v is None else f"{v * 1000:.0f}" if v >= 0.1 else f"{v * 1000:.1f}"


def num(v: Any, fmt: str = ".3g") -> str:
    """A value for a table cell: floats by ``fmt``, booleans lower-case, ``—`` for None."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return format(v, fmt)
    return str(v)


def enough(m: dict[str, Any]) -> bool:
    """Whether a phase's (or bucket's, or step's) latency figures rest on enough requests
    (``enough_samples``; a report without the field counts as enough)."""
    return m.get("enough_samples", True) is not False


def lat(m: dict[str, Any], key: str) -> str:
    """``p50/p95`` in ms of one latency distribution of ``m``, or ``n=K`` when the figures
    rest on fewer than ``metrics.min_samples`` complete requests."""
    if not enough(m):
        return f"n={m.get('complete', 0)}"
    d = m.get(key) or {}
    return f"{ms(d.get('p50'))}/{ms(d.get('p95'))}"

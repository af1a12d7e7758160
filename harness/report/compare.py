"""The terminal table and the Allure result of ``specchaos compare`` (the comparison
itself is :mod:`harness.experiment.compare`; this module only presents its dict)."""

from __future__ import annotations

import json
import time
from hashlib import md5
from pathlib import Path
from typing import Any
from uuid import uuid4

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

__all__ = ["CORRECTIONS", "beyond", "render_comparison", "write_allure_comparison"]

_STYLE = {"regression": "bold red", "improvement": "green", "inconclusive": "yellow", "not_judged": "dim",
          "needs_repeats": "dim"}

#: How ``correction`` is named on screen.
CORRECTIONS = {"bh": "Benjamini–Hochberg", "holm": "Holm", "none": "no correction"}


def _fmt(v: float | None, figure: str) -> str:
    """A figure's value: seconds as ms (``ttft_s p95``, ``time_to_healthy_s``), else 3 digits."""
    if v is None:
        return "—"
    if figure.split()[0].endswith("_s"):
        return f"{v * 1000:.1f} ms" if abs(v) < 1 else f"{v:.2f} s"
    return f"{v:.3g}"


def _change(row: dict[str, Any], v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v * 100:+.1f}%" if row["kind"] == "relative" else f"{v:+.3g}"


def _tol(row: dict[str, Any]) -> str:
    t = f"±{row['tolerance'] * 100:.3g}%" if row["kind"] == "relative" else f"±{row['tolerance']:.3g}"
    return t + (" (A/A)" if row.get("tolerance_from") == "calibrated" else "")


def _p(v: float | None) -> str:
    return "—" if v is None else f"{v:.2g}" if v >= 0.001 else "<0.001"


def beyond(row: dict[str, Any]) -> bool:
    """The point estimate of the change lies beyond the tolerance in the worse direction
    (a description of one comparison, not a verdict)."""
    c = row["change"]
    return c is not None and (c > row["tolerance"] if row["worse"] == "up" else c < -row["tolerance"])


def _summary(result: dict[str, Any]) -> Text:
    verdict = result["verdict"]
    na, nb = len(result["a"]["runs"]), len(result["b"]["runs"])
    if verdict == "needs_repeats":
        moved = sum(1 for r in result["rows"] if beyond(r))
        return Text(f"no verdict: A has {na} run(s), B {nb}; with one run on a side the spread between runs is "
                    f"unknown, so no change can be called a regression with confidence. {moved} figure(s) moved "
                    "beyond their tolerance in this one comparison (a description, not a verdict). For a verdict "
                    "run each side with `specchaos run --repeat 3` (or more), or gather several run directories "
                    "of a side in one directory.", style="bold yellow")
    how = (f"p-values adjusted by {CORRECTIONS.get(result['correction'], result['correction'])} over "
           f"{result['family']} figures, held to {1 - result['confidence']:.2g}")
    return Text(("REGRESSION" if verdict == "regression" else "no regression with confidence")
                + f": {result['regressions']} regression(s), {result['improvements']} improvement(s), "
                f"{result['inconclusive']} inconclusive ({how})",
                style="bold red" if verdict == "regression" else "bold green")


def render_comparison(result: dict[str, Any], everything: bool = False) -> RenderableType:
    """The comparison as a rich renderable: the settings that differ (allowed), every
    ``all``-bucket figure and, per bucket, those that moved (a verdict other than
    ``within``, or with one run a side a change beyond the tolerance; ``everything``:
    every row); then one line with the counts and the verdict."""
    conf = result["confidence"]
    na, nb = len(result["a"]["runs"]), len(result["b"]["runs"])
    single = result["verdict"] == "needs_repeats"
    title = (f"B vs A: change (A {na} run(s), B {nb} run(s)); no intervals with one run on a side" if single else
             f"B vs A: change with {conf * 100:g}% interval (cluster bootstrap over runs and requests, "
             f"A {na} run(s), B {nb} run(s)); p adj.: of a regression beyond the tolerance, "
             f"{CORRECTIONS.get(result['correction'], result['correction'])}-adjusted")
    tab = Table(title=title, title_justify="left")
    for col in ("phase", "bucket", "figure", "A", "B", "change", "interval", "p adj.", "tolerance", "verdict"):
        tab.add_column(col, justify="left" if col in ("phase", "bucket", "figure", "verdict") else "right")
    for r in result["rows"]:
        moved = beyond(r) if r["verdict"] == "needs_repeats" else r["verdict"] not in ("within", "not_judged")
        if not everything and r["bucket"] != "all" and not moved:
            continue
        interval = "—" if r["low"] is None else f"[{_change(r, r['low'])}, {_change(r, r['high'])}]"
        change = _change(r, r["change"])
        tab.add_row(r["phase"], r["bucket"], r["figure"], _fmt(r["a"], r["figure"]), _fmt(r["b"], r["figure"]),
                    Text(change, style="yellow") if single and beyond(r) else change, interval,
                    _p(r.get("p_regression_adj")), _tol(r), r["verdict"].replace("_", " "),
                    style=_STYLE.get(r["verdict"]))
    parts: list[RenderableType] = [Text(f"settings that differ (allowed): {d['line']}", style="yellow")
                                   for d in result.get("differences") or []]
    return Group(*parts, tab, _summary(result))


def write_allure_comparison(result: dict[str, Any], target: str | Path, name: str | None = None) -> Path:
    """One Allure result (a test case per comparison of the same two paths, so Allure's
    history and trend follow it): failed with the regressions as its message, skipped
    when a side has one run (no verdict), else passed; the comparison attached as JSON.
    Returns the result file's path."""
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    title = name or f"compare {Path(result['b']['path']).name} vs {Path(result['a']['path']).name}"
    attach = f"{uuid4()}-attachment.json"
    (target / attach).write_text(json.dumps(result, indent=1))
    regressions = [r for r in result["rows"] if r["verdict"] == "regression"]
    msg = "; ".join(f"{r['phase']}/{r['bucket']} {r['figure']} {_change(r, r['change'])} "
                    f"(interval {_change(r, r['low'])}..{_change(r, r['high'])}, tolerance {_tol(r)}, "
                    f"adjusted p {_p(r['p_regression_adj'])})"
                    for r in regressions[:10])
    now_ms = int(time.time() * 1000)
    key = md5(title.encode()).hexdigest()   # noqa: S324 - an identifier, not security
    res = {"uuid": str(uuid4()), "historyId": key, "testCaseId": key, "name": title, "fullName": title,
           "status": "failed" if regressions else "skipped" if result["verdict"] == "needs_repeats" else "passed",
           "statusDetails": {"message": msg} if regressions else {"message": str(_summary(result))}
           if result["verdict"] == "needs_repeats" else {},
           "labels": [{"name": "suite", "value": "specchaos compare"}, {"name": "feature", "value": "compare"}],
           "parameters": [{"name": "A", "value": result["a"]["path"]}, {"name": "B", "value": result["b"]["path"]},
                          {"name": "confidence", "value": str(result["confidence"])},
                          {"name": "correction", "value": result["correction"]}],
           "attachments": [{"name": "comparison", "source": attach, "type": "application/json"}],
           "start": now_ms, "stop": now_ms}
    path = target / f"{res['uuid']}-result.json"
    path.write_text(json.dumps(res))
    return path

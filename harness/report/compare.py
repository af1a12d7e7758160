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

__all__ = ["render_comparison", "write_allure_comparison"]

_STYLE = {"regression": "bold red", "improvement": "green", "inconclusive": "yellow", "not_judged": "dim"}


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
    return f"±{row['tolerance'] * 100:g}%" if row["kind"] == "relative" else f"±{row['tolerance']:g}"


def render_comparison(result: dict[str, Any], everything: bool = False) -> RenderableType:
    """The comparison as a rich renderable: every ``all``-bucket figure and, per bucket,
    those that are not ``within`` (``everything``: every row); then one line with the
    counts and the verdict."""
    conf = result["confidence"]
    tab = Table(title=f"B vs A: change with {conf * 100:g}% bootstrap interval "
                      f"(A {len(result['a']['runs'])} run(s), B {len(result['b']['runs'])} run(s))",
                title_justify="left")
    for col in ("phase", "bucket", "figure", "A", "B", "change", "interval", "tolerance", "verdict"):
        tab.add_column(col, justify="left" if col in ("phase", "bucket", "figure", "verdict") else "right")
    for r in result["rows"]:
        if not everything and r["bucket"] != "all" and r["verdict"] in ("within", "not_judged"):
            continue
        interval = "—" if r["low"] is None else f"[{_change(r, r['low'])}, {_change(r, r['high'])}]"
        tab.add_row(r["phase"], r["bucket"], r["figure"], _fmt(r["a"], r["figure"]), _fmt(r["b"], r["figure"]),
                    _change(r, r["change"]), interval, _tol(r), r["verdict"].replace("_", " "),
                    style=_STYLE.get(r["verdict"]))
    verdict = result["verdict"]
    line = Text(f"{result['regressions']} regression(s), {result['improvements']} improvement(s), "
                f"{result['inconclusive']} inconclusive: " + ("REGRESSION" if verdict == "regression" else
                                                              "no regression with confidence"),
                style="bold red" if verdict == "regression" else "bold green")
    return Group(tab, line)


def write_allure_comparison(result: dict[str, Any], target: str | Path, name: str | None = None) -> Path:
    """One Allure result (a test case per comparison of the same two paths, so Allure's
    history and trend follow it): failed with the regressions as its message, else passed;
    the comparison attached as JSON. Returns the result file's path."""
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    title = name or f"compare {Path(result['b']['path']).name} vs {Path(result['a']['path']).name}"
    attach = f"{uuid4()}-attachment.json"
    (target / attach).write_text(json.dumps(result, indent=1))
    regressions = [r for r in result["rows"] if r["verdict"] == "regression"]
    msg = "; ".join(f"{r['phase']}/{r['bucket']} {r['figure']} {_change(r, r['change'])} "
                    f"(interval {_change(r, r['low'])}..{_change(r, r['high'])}, tolerance {_tol(r)})"
                    for r in regressions[:10])
    now_ms = int(time.time() * 1000)
    key = md5(title.encode()).hexdigest()   # noqa: S324 - an identifier, not security
    res = {"uuid": str(uuid4()), "historyId": key, "testCaseId": key, "name": title, "fullName": title,
           "status": "failed" if regressions else "passed",
           "statusDetails": {"message": msg} if regressions else {},
           "labels": [{"name": "suite", "value": "specchaos compare"}, {"name": "feature", "value": "compare"}],
           "parameters": [{"name": "A", "value": result["a"]["path"]}, {"name": "B", "value": result["b"]["path"]},
                          {"name": "confidence", "value": str(result["confidence"])}],
           "attachments": [{"name": "comparison", "source": attach, "type": "application/json"}],
           "start": now_ms, "stop": now_ms}
    path = target / f"{res['uuid']}-result.json"
    path.write_text(json.dumps(res))
    return path

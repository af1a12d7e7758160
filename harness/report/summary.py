"""A readable terminal summary of a report (rich tables).

Verdict line, per-phase table (requests, errors, p50/p95 TTFT, TPOT, ITL per chunk, E2E
in milliseconds, output tokens/s), recovery times, integrity counts, then every check
with PASS/FAIL and observed vs limit, failed first. Reads only the report dict.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

__all__ = ["render_summary", "print_summary"]

_PHASES = ("baseline", "fault", "recovery", "after")
_VERDICT_STYLE = {"pass": "bold green", "fail": "bold red", "error": "bold yellow"}


def _ms(v: Any) -> str:
    return "—" if v is None else f"{v * 1000:.0f}" if v >= 0.1 else f"{v * 1000:.1f}"


def _num(v: Any, fmt: str = ".3g") -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (int, float)):
        return format(v, fmt) if isinstance(v, float) else str(v)
    return str(v)


def _verdict_line(report: dict[str, Any]) -> Text:
    v = str(report.get("verdict", "?"))
    t = Text()
    t.append(f"{v.upper()}", style=_VERDICT_STYLE.get(v, "bold"))
    t.append(f"  {report.get('experiment', '')}")
    stack = report.get("stack") or {}
    spec = stack.get("speculative") or {}
    if spec:
        t.append(
            f"  [{spec.get('method')}"
            + (f", draft {spec.get('draft')}" if spec.get("draft") else "")
            + f", k={spec.get('num_speculative_tokens')}; vLLM {stack.get('vllm_version', '?')}]",
            style="dim",
        )
    faults = report.get("faults") or []
    if faults:
        t.append("\nfaults: " + "; ".join(
            f"{f.get('kind')} on {f.get('target')} ({'acted' if f.get('acted') else 'NO EVIDENCE'})" for f in faults))
    t.append(f"\nrestarts: {report.get('restarts', 0)}")
    req = report.get("requests") or {}
    if req:
        t.append(f"   requests: {req.get('total', 0)} total, {req.get('ok', 0)} complete, {req.get('failed', 0)} failed")
    for e in report.get("errors") or []:
        t.append(f"\nerror: {e}", style="yellow")
    if report.get("interrupted"):
        t.append("\ninterrupted", style="yellow")
    return t


def _phase_table(report: dict[str, Any]) -> Table:
    tab = Table(title="phases (latencies in ms, p50/p95)", title_justify="left")
    for col in ("phase", "requests", "errors", "TTFT", "TPOT", "ITL/chunk", "E2E", "tokens/s", "tok/chunk"):
        tab.add_column(col, justify="left" if col == "phase" else "right")
    phases = report.get("phases") or {}
    for ph in _PHASES:
        m = phases.get(ph)
        if m is None:
            tab.add_row(ph, "—", "—", "—", "—", "—", "—", "—", "—", style="dim")
            continue

        def pp(key: str) -> str:
            d = m.get(key) or {}
            return f"{_ms(d.get('p50'))}/{_ms(d.get('p95'))}"

        tps, tpc = m.get("output_tokens_per_s"), m.get("mean_tokens_per_chunk")
        tab.add_row(ph, str(m.get("requests", 0)), str(m.get("errors", 0)), pp("ttft_s"), pp("tpot_s"),
                    pp("itl_s"), pp("e2e_s"), "—" if tps is None else f"{tps:.1f}",
                    "—" if tpc is None else f"{tpc:.2f}")
    return tab


def _recovery_integrity(report: dict[str, Any]) -> Table:
    tab = Table(title="recovery and integrity", title_justify="left", show_header=False)
    tab.add_column("what")
    tab.add_column("value", justify="right")
    rec = report.get("recovery") or {}
    for key, label in (("time_to_healthy_s", "time to healthy"), ("time_to_first_success_s", "time to first success"),
                       ("time_to_slo_s", "time to SLO")):
        v = rec.get(key)
        tab.add_row(label, "never" if v is None else f"{v:.2f} s")
    integ = report.get("integrity") or {}
    for key in ("compared", "mismatched", "malformed", "false_success"):
        if key in integ:
            tab.add_row(key.replace("_", " "), str(integ[key]))
    if integ.get("first_divergence"):
        tab.add_row("first divergence", str(integ["first_divergence"]))
    return tab


def _checks_table(report: dict[str, Any]) -> Table:
    tab = Table(title="checks (failed first)", title_justify="left")
    for col in ("", "check", "observed", "limit", "detail"):
        tab.add_column(col, overflow="fold")
    checks = list(report.get("checks") or [])
    checks.sort(key=lambda c: bool(c.get("passed")))  # stable: failed first, order kept
    for c in checks:
        ok = bool(c.get("passed"))
        tab.add_row(Text("PASS", style="green") if ok else Text("FAIL", style="bold red"), str(c.get("name")),
                    _num(c.get("observed")), _num(c.get("limit")), str(c.get("detail") or ""))
    return tab


def render_summary(report: dict[str, Any]) -> RenderableType:
    """The summary of a report as one rich renderable (a :class:`rich.console.Group`)."""
    return Group(_verdict_line(report), _phase_table(report), _recovery_integrity(report), _checks_table(report))


def print_summary(report: dict[str, Any], console: Console | None = None) -> None:
    """Print :func:`render_summary` to ``console`` (default: a new stdout console)."""
    (console or Console()).print(render_summary(report))

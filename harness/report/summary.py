"""A readable terminal summary of a report (rich tables).

Verdict line; per phase, requests and availability (logical requests, failed ones,
tries, seconds unavailable, output tokens/s, goodput, tokens per engine step = mean
acceptance length); per phase, latency in milliseconds (p50/p95 of TTFT, TPOT, ITL per
chunk, ITL per token, E2E, with ``n`` the complete requests they rest on; ``n=K`` instead
of percentiles below ``metrics.min_samples``, and where a phase's figures come from when
they were sent after an outage inside it); the same per prompt-length bucket; the
client-side acceptance per prompt bucket × sampling class × phase, speculative decoding per server and phase as vLLM's
``/metrics`` counted it (acceptance rate, mean acceptance length, per-position acceptance)
with each server's RSS swing, recovery times, integrity counts, then every check
with PASS/FAIL (or N/J: not judged, with the reason) and observed vs limit, failed first,
then not judged (checks of one category not judged for one reason, as every GPU check on a
host without a GPU, in one row). It ends,
as pytest ends with its summary line, with the closing lines: the run errors, the required
checks (judged N of M, each one not judged with its reason), the failed checks, and last
the verdict with the exit code. Reads only the report dict.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from harness.checks.registry import CHECKS
from harness.checks.verdict import EXIT_CODES
from harness.checks.view import Line, View, enough, lat, num

__all__ = ["render_summary", "print_summary", "required_line"]

_PHASES = ("baseline", "fault", "recovery", "after")
_VERDICT_STYLE = {"pass": "bold green", "fail": "bold red", "aborted": "bold red", "error": "bold yellow"}


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
        if req.get("logical") is not None and req.get("logical") != req.get("total"):
            t.append(f" ({req['logical']} logical requests, {req.get('logical_failed', 0)} failed after retries)")
    workload = workload_line(report.get("load"))
    if workload:
        t.append("\n" + workload, style="dim")
    if report.get("interrupted"):
        t.append("\ninterrupted", style="yellow")
    return t


def _class_label(c: dict[str, Any]) -> str:
    """A request class in the workload line: ``"talk (chat, 3 turns, weight 1)"``."""
    turns = f", {c['turns']} turns" if (c.get("turns") or 1) > 1 else ""
    return f"{c.get('name')} ({c.get('endpoint')}{turns}, weight {num(c.get('weight'))})"


def workload_line(load: Any) -> str:
    """One line for ``report["load"]`` (:func:`harness.load.profiles.load_section`): the
    profile, the retry policy, the request classes when configured and the plan digest
    (first 16 hex digits); ``""`` if absent."""
    if not isinstance(load, dict):
        return ""
    p = load.get("profile") or {}
    src = load.get("source") or {}
    if p.get("kind") == "open" and p.get("rate") is None:
        what = (f"open loop at the trace's timestamps (speedup {num(src.get('speedup'))}, repeats every "
                f"{num(src.get('period_s'))} s), max in flight {p.get('max_in_flight')}")
    elif p.get("kind") == "open":
        what = f"open loop {num(p.get('rate'))} req/s, burstiness {num(p.get('burstiness'))}, " \
               f"max in flight {p.get('max_in_flight')}"
    else:
        what = f"closed loop {p.get('users')} users"
    if p.get("ramp") or p.get("steps"):
        what += f" (ramp{'' if p.get('ramp') else ' none'}, {len(p.get('steps') or [])} steps)"
    r = load.get("retry") or {}
    if r.get("max_retries"):
        retry = (f"retry {r.get('backoff')} {num(r.get('initial_s'))}..{num(r.get('max_s'))} s "
                 f"x{r.get('max_retries')}, jitter {r.get('jitter')}")
    else:
        retry = "no retries"
    ol = load.get("open_loop") or {}
    dropped = f"; {ol.get('dropped', 0)}/{ol.get('arrivals', 0)} arrivals dropped" if ol else ""
    classes = load.get("request_classes") or []
    if classes:
        dropped += "; classes " + ", ".join(_class_label(c) for c in classes)
    if src:
        dropped += f"; source {src.get('format')} {src.get('path')} ({src.get('requests')} requests)"
    return f"workload: {what}; {retry}{dropped}; seed {load.get('seed')}, plan {str(load.get('plan_digest', ''))[:16]}"


def phase_figures(report: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """The per-phase figures the check families add to the phase table
    (:attr:`harness.checks.registry.CheckFamily.phase_figures`): ``{name: {phase: value}}``,
    in the registry's order."""
    out: dict[str, dict[str, float | None]] = {}
    for family in CHECKS.values():
        if family.phase_figures is not None:
            out.update(family.phase_figures(report.get(family.name)))
    return out


def _phase_table(report: dict[str, Any]) -> Table:
    """Per phase: requests (logical), failed, tries, seconds unavailable, tokens/s, goodput,
    then the families' figures (e.g. tok/step, the client-side mean acceptance length)."""
    tab = Table(title="phases: requests and availability", title_justify="left")
    figures = phase_figures(report)
    for col in ("phase", "s", "requests", "failed", "tries", "unavailable s", "tokens/s", "goodput/s", *figures):
        tab.add_column(col, justify="left" if col == "phase" else "right")
    phases = report.get("phases") or {}
    for ph in _PHASES:
        m = phases.get(ph)
        if m is None:
            tab.add_row(ph, *["—"] * (7 + len(figures)), style="dim")
            continue
        tps, gp, un = m.get("output_tokens_per_s"), m.get("goodput_rps"), m.get("unavailable_s")
        dur = m.get("duration_s")
        tab.add_row(ph, "—" if dur is None else f"{dur:.1f}", str(m.get("requests", 0)), str(m.get("errors", 0)),
                    str(m.get("tries", m.get("requests", 0))), "—" if un is None else f"{un:.2f}",
                    "—" if tps is None else f"{tps:.1f}", "—" if gp is None else f"{gp:.2f}",
                    *("—" if f.get(ph) is None else f"{f[ph]:.2f}" for f in figures.values()))
    return tab


def _window_notes(report: dict[str, Any]) -> list[str]:
    """Where a phase's latency figures come from, when an outage began inside the phase and
    requests sent after it began are among them: a killed server completes nothing while
    down, so such figures describe the server after it came back (or mix both)."""
    notes = []
    for ph in _PHASES:
        m = (report.get("phases") or {}).get(ph) or {}
        w = m.get("latency_window") or {}
        after, n, t0 = w.get("sent_after_outage_start") or 0, m.get("complete") or 0, m.get("start")
        a, b = w.get("outage_start"), w.get("outage_end")
        if not after or a is None or t0 is None or a < t0:
            continue
        ended = "it lasted to the phase's end" if b is None else f"ended +{b - t0:.1f} s"
        notes.append(f"{ph}: {after} of the {n} complete requests were sent after the outage began "
                     f"(+{a - t0:.1f} s into the phase; {ended}): "
                     + ("the figures describe the server after it came back" if after == n
                        else "the figures mix the server before and after the outage"))
    return notes


def _latency_table(report: dict[str, Any]) -> Table:
    """Per phase: p50/p95 in ms of TTFT, TPOT, ITL per chunk and per token, E2E, and n."""
    tab = Table(title="phases: latency (ms, p50/p95 over n complete requests)", title_justify="left")
    for col in ("phase", "n", "TTFT", "TPOT", "ITL/chunk", "ITL/token", "E2E"):
        tab.add_column(col, justify="left" if col == "phase" else "right")
    phases = report.get("phases") or {}
    for ph in _PHASES:
        m = phases.get(ph)
        if m is None:
            tab.add_row(ph, *["—"] * 6, style="dim")
            continue
        tab.add_row(ph, str(m.get("complete", "—")), *(lat(m, k) for k in _LATENCY_KEYS),
                    style=None if enough(m) else "dim")
    return tab


def _latency_notes(report: dict[str, Any]) -> Text | None:
    """What ``n=K`` means, and where thin or mixed latency figures come from."""
    phases = report.get("phases") or {}
    thin = [ph for ph in _PHASES if ph in phases and not enough(phases[ph])]
    notes = []
    if thin:
        k = next((phases[ph].get("min_samples") for ph in thin if phases[ph].get("min_samples")), None)
        notes.append(f"n=K: fewer than {k or 'metrics.min_samples'} complete requests "
                     f"({', '.join(thin)}): no percentile printed, latency checks not judged")
    notes += _window_notes(report)
    return Text("\n".join(notes), style="dim") if notes else None


def _group_table(report: dict[str, Any], key: str, what: str, col: str) -> Table | None:
    """Per phase × group (``key``: ``"buckets"``, the prompt-length buckets, or
    ``"request_classes"``; ``what`` names them in the title, ``col`` in the column): n and
    p50/p95 in ms (``n=K`` below the minimum); None when no phase has such groups."""
    phases = report.get("phases") or {}
    if not any((phases.get(ph) or {}).get(key) for ph in _PHASES):
        return None
    tab = Table(title=f"latency per {what} in ms (p50/p95)", title_justify="left")
    for name in ("phase", col, "n", "TTFT", "TPOT", "ITL/chunk", "ITL/token", "E2E"):
        tab.add_column(name, justify="left" if name in ("phase", col) else "right")
    for ph in _PHASES:
        for group, m in ((phases.get(ph) or {}).get(key) or {}).items():
            tab.add_row(ph, group, str(m.get("complete", "—")), *(lat(m, k) for k in _LATENCY_KEYS),
                        style=None if enough(m) else "dim")
    return tab


_LATENCY_KEYS = ("ttft_s", "tpot_s", "itl_s", "itl_per_token_s", "e2e_s")


#: Checks of one category not judged for one reason, at least this many, show as one row.
COLLAPSE_AT = 3


def _collapse(checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Checks of one category not judged for one and the same reason (every GPU check on a
    host without a GPU) as one row ``<category>.* (N checks)``, where the first of them was."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for c in checks:
        if c.get("passed") is None:
            groups.setdefault((str(c.get("category")), str(c.get("detail") or "")), []).append(c)
    out = list(checks)
    for (category, detail), members in groups.items():
        if len(members) < COLLAPSE_AT:
            continue
        at = out.index(members[0])
        out[at] = {"name": f"{category}.* ({len(members)} checks)", "category": category, "passed": None,
                   "observed": None, "limit": None, "detail": detail}
        out = [c for c in out if not any(c is m for m in members[1:])]
    return out


def _checks_table(report: dict[str, Any]) -> Table:
    tab = Table(title="checks (failed first; N/J = not judged, neither passed nor failed)", title_justify="left")
    for col in ("", "check", "observed", "limit", "detail"):
        tab.add_column(col, overflow="fold")
    checks = _collapse(list(report.get("checks") or []))
    rank = {False: 0, None: 1, True: 2}
    checks.sort(key=lambda c: rank[None if c.get("passed") is None else bool(c.get("passed"))])  # stable
    for c in checks:
        p = c.get("passed")
        mark = (Text("N/J", style="yellow") if p is None else Text("PASS", style="green") if p
                else Text("FAIL", style="bold red"))
        tab.add_row(mark, str(c.get("name")), num(c.get("observed")), num(c.get("limit")), str(c.get("detail") or ""))
    return tab


_LINE_STYLE = {"note": "dim", "alert": "bold red", "": None}


def _render_view(view: View) -> RenderableType:
    """A family's view (:mod:`harness.checks.view`) as a rich renderable."""
    if isinstance(view, Line):
        return Text(view.text, style=_LINE_STYLE.get(view.style) or "")
    tab = Table(title=view.title, title_justify="left", show_header=view.header,
                caption=view.caption or None)
    for i, col in enumerate(view.columns):
        tab.add_column(col, justify="left" if i < view.labels or not view.header else "right")
    for i, row in enumerate(view.rows):
        tab.add_row(*row, style="dim" if i in view.dim else None)
    return tab


def family_views(report: dict[str, Any]) -> list[View]:
    """Every check family's views of its section, in the registry's order
    (:attr:`harness.checks.registry.CheckFamily.summarize`)."""
    out: list[View] = []
    for family in CHECKS.values():
        if family.summarize is not None:
            out += family.summarize(report.get(family.name))
    return out


def render_summary(report: dict[str, Any]) -> RenderableType:
    """The summary of a report as one rich renderable (a :class:`rich.console.Group`)."""
    parts: list[RenderableType] = [_verdict_line(report), _phase_table(report), _latency_table(report)]
    notes = _latency_notes(report)
    if notes is not None:
        parts.append(notes)
    for key, what, col in (("buckets", "prompt-length bucket", "bucket"), ("request_classes", "request class", "class")):
        table = _group_table(report, key, what, col)
        if table is not None:
            parts.append(table)
    parts += [_render_view(v) for v in family_views(report)]
    return Group(*parts, _checks_table(report), _closing(report))


def required_line(report: dict[str, Any]) -> str | None:
    """``"required: judged N of M (names)"`` from ``report["required"]``; None without it."""
    req = report.get("required")
    if not isinstance(req, dict) or not req.get("of"):
        return None
    names = ", ".join(str(r.get("name")) for r in req.get("checks") or [])
    return f"required: judged {req.get('judged', 0)} of {req['of']} ({names})"


def _closing(report: dict[str, Any]) -> Text:
    """The last lines on screen: run errors, required checks, failed checks, then the
    verdict with its exit code."""
    v = str(report.get("verdict", "?"))
    t = Text("\n" + "─" * 40 + "\n", style="dim")
    for e in report.get("errors") or []:
        t.append(f"error: {e}\n", style="yellow")
    line = required_line(report)
    if line:
        t.append(line + "\n")
    failed = [c for c in report.get("checks") or [] if c.get("passed") is False]
    for c in failed:
        t.append("FAIL ", style="bold red")
        t.append(f"{c.get('name')}: {c.get('detail') or ''}\n")
    t.append(v.upper(), style=_VERDICT_STYLE.get(v, "bold"))
    t.append(f"  {report.get('experiment', '')}: {len(failed)} failed check(s), "
             f"{sum(1 for c in report.get('checks') or [] if c.get('passed') is None)} not judged; "
             f"exit code {EXIT_CODES.get(v, 2)}")
    return t


def print_summary(report: dict[str, Any], console: Console | None = None) -> None:
    """Print :func:`render_summary` to ``console`` (default: a new stdout console)."""
    (console or Console()).print(render_summary(report))

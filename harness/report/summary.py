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
then not judged (the GPU checks a host without a GPU could not judge in one row). It ends,
as pytest ends with its summary line, with the closing lines: the run errors, the required
checks (judged N of M, each one not judged with its reason), the failed checks, and last
the verdict with the exit code. Reads only the report dict.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from harness.checks.verdict import EXIT_CODES

__all__ = ["render_summary", "print_summary", "required_line"]

_PHASES = ("baseline", "fault", "recovery", "after")
_VERDICT_STYLE = {"pass": "bold green", "fail": "bold red", "aborted": "bold red", "error": "bold yellow"}


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
        if req.get("logical") is not None and req.get("logical") != req.get("total"):
            t.append(f" ({req['logical']} logical requests, {req.get('logical_failed', 0)} failed after retries)")
    workload = workload_line(report.get("load"))
    if workload:
        t.append("\n" + workload, style="dim")
    if report.get("interrupted"):
        t.append("\ninterrupted", style="yellow")
    ab = (report.get("safeguards") or {}).get("abort")
    if ab:
        lat = ab.get("detection_latency_s")
        t.append(f"\n{ab.get('reason')}", style="bold red")
        t.append(f" (detection latency {'—' if lat is None else f'{lat:.2f} s'} beyond for_s"
                 + (f", {ab['fault_to_abort_s']:.2f} s after the fault" if ab.get("fault_to_abort_s") is not None
                    else "") + "; rollbacks ran)", style="red")
    return t


def _class_label(c: dict[str, Any]) -> str:
    """A request class in the workload line: ``"talk (chat, 3 turns, weight 1)"``."""
    turns = f", {c['turns']} turns" if (c.get("turns") or 1) > 1 else ""
    return f"{c.get('name')} ({c.get('endpoint')}{turns}, weight {_num(c.get('weight'))})"


def workload_line(load: Any) -> str:
    """One line for ``report["load"]`` (:func:`harness.load.profiles.load_section`): the
    profile, the retry policy, the request classes when configured and the plan digest
    (first 16 hex digits); ``""`` if absent."""
    if not isinstance(load, dict):
        return ""
    p = load.get("profile") or {}
    src = load.get("source") or {}
    if p.get("kind") == "open" and p.get("rate") is None:
        what = (f"open loop at the trace's timestamps (speedup {_num(src.get('speedup'))}, repeats every "
                f"{_num(src.get('period_s'))} s), max in flight {p.get('max_in_flight')}")
    elif p.get("kind") == "open":
        what = f"open loop {_num(p.get('rate'))} req/s, burstiness {_num(p.get('burstiness'))}, " \
               f"max in flight {p.get('max_in_flight')}"
    else:
        what = f"closed loop {p.get('users')} users"
    if p.get("ramp") or p.get("steps"):
        what += f" (ramp{'' if p.get('ramp') else ' none'}, {len(p.get('steps') or [])} steps)"
    r = load.get("retry") or {}
    if r.get("max_retries"):
        retry = (f"retry {r.get('backoff')} {_num(r.get('initial_s'))}..{_num(r.get('max_s'))} s "
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


def _enough(m: dict[str, Any]) -> bool:
    """Whether a phase's (or bucket's) latency figures rest on enough requests; reports
    written before ``enough_samples`` existed count as enough."""
    return m.get("enough_samples", True) is not False


def _lat(m: dict[str, Any], key: str) -> str:
    """``p50/p95`` in ms of one latency metric, or ``n=K`` when the figures rest on fewer
    than ``metrics.min_samples`` complete requests."""
    if not _enough(m):
        return f"n={m.get('complete', 0)}"
    d = m.get(key) or {}
    return f"{_ms(d.get('p50'))}/{_ms(d.get('p95'))}"


def _phase_table(report: dict[str, Any]) -> Table:
    """Per phase: requests (logical), failed, tries, seconds unavailable, tokens/s, goodput, tok/step."""
    tab = Table(title="phases: requests and availability", title_justify="left")
    for col in ("phase", "s", "requests", "failed", "tries", "unavailable s", "tokens/s", "goodput/s", "tok/step"):
        tab.add_column(col, justify="left" if col == "phase" else "right")
    phases = report.get("phases") or {}
    for ph in _PHASES:
        m = phases.get(ph)
        if m is None:
            tab.add_row(ph, *["—"] * 8, style="dim")
            continue
        tps, tpc, gp, un = (m.get("output_tokens_per_s"), _tokens_per_step(report, ph), m.get("goodput_rps"),
                            m.get("unavailable_s"))
        dur = m.get("duration_s")
        tab.add_row(ph, "—" if dur is None else f"{dur:.1f}", str(m.get("requests", 0)), str(m.get("errors", 0)),
                    str(m.get("tries", m.get("requests", 0))), "—" if un is None else f"{un:.2f}",
                    "—" if tps is None else f"{tps:.1f}", "—" if gp is None else f"{gp:.2f}",
                    "—" if tpc is None else f"{tpc:.2f}")
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
        tab.add_row(ph, str(m.get("complete", "—")), *(_lat(m, k) for k in _LATENCY_KEYS),
                    style=None if _enough(m) else "dim")
    return tab


def _latency_notes(report: dict[str, Any]) -> Text | None:
    """What ``n=K`` means, and where thin or mixed latency figures come from."""
    phases = report.get("phases") or {}
    thin = [ph for ph in _PHASES if ph in phases and not _enough(phases[ph])]
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
            tab.add_row(ph, group, str(m.get("complete", "—")), *(_lat(m, k) for k in _LATENCY_KEYS),
                        style=None if _enough(m) else "dim")
    return tab


_LATENCY_KEYS = ("ttft_s", "tpot_s", "itl_s", "itl_per_token_s", "e2e_s")


def _tokens_per_step(report: dict[str, Any], phase: str) -> float | None:
    """Mean acceptance length (tokens per engine step, as vLLM defines it) of a phase, from
    the client-side acceptance section; None when not measured."""
    ph = ((report.get("acceptance_floor") or {}).get("phases") or {}).get(phase) or {}
    return (ph.get("total") or {}).get("mean_acceptance_length")


def _acceptance_cell(t: dict[str, Any] | None, mark: str = "") -> str:
    """``"rate / mean acceptance length"`` of a tally (``—`` when not measured)."""
    if not t or t.get("acceptance_rate") is None:
        return "—"
    return f"{t['acceptance_rate']:.2f} / {t['mean_acceptance_length']:.2f}{mark}"


def _acceptance_table(report: dict[str, Any]) -> RenderableType:
    """Client-side acceptance rate and mean acceptance length per bucket × sampling class × phase."""
    sec = report.get("acceptance_floor") or {}
    title = ("speculation, client side (acceptance rate / mean acceptance length in tokens per step, "
             f"k={sec.get('num_speculative_tokens')})")
    if not sec.get("phases"):
        return Text(f"speculation, client side: {sec.get('note') or 'not measured'}", style="dim")
    tab = Table(title=title, title_justify="left")
    for col in ("bucket", "sampling", *_PHASES):
        tab.add_column(col, justify="left" if col in ("bucket", "sampling") else "right")
    floors = {(r.get("phase"), r.get("bucket"), r.get("sampling")): r for r in sec.get("floors") or []}
    rows = sorted({(b, s) for ph in sec["phases"].values() for b, cls in (ph.get("buckets") or {}).items() for s in cls})
    for bucket, cls in rows:
        cells = []
        for ph in _PHASES:
            t = (((sec["phases"].get(ph) or {}).get("buckets") or {}).get(bucket) or {}).get(cls)
            f = floors.get((ph, bucket, cls)) or {}
            measured = bool(t) and t.get("acceptance_rate") is not None
            mark = "" if not (f.get("judged") and measured) else (" ✓" if t["acceptance_rate"] >= f["floor"] else " ✗")
            cells.append(_acceptance_cell(t, mark))
        tab.add_row(bucket, cls, *cells)
    # per request class (load.request_classes), every bucket and sampling class pooled
    for name in sorted({c for ph in sec["phases"].values() for c in ph.get("request_classes") or {}}):
        tab.add_row(f"class {name}", "all", *(_acceptance_cell(
            ((sec["phases"].get(ph) or {}).get("request_classes") or {}).get(name)) for ph in _PHASES))
    notes = [str(sec["note"])] if sec.get("note") else []
    for c in sec.get("speculation_changes") or []:
        notes.append(f"speculative settings changed at {c['t']:.3f}: "
                     + (f"{c['method']}, k={c['num_speculative_tokens']}" if c.get("method") else "no speculation"))
    if notes:
        tab.caption = "; ".join(notes)
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
    if rec.get("resolution_s") is not None:
        tab.add_row("recovery resolution", f"{rec['resolution_s'] * 1000:.0f} ms")
    integ = report.get("integrity") or {}
    for key in ("compared", "mismatched", "near_ties", "malformed", "cut_by_planned_stop", "false_success",
                "not_comparable"):
        if key in integ:
            tab.add_row(key.replace("_", " "), str(integ[key]))
    if integ.get("first_divergence"):
        tab.add_row("first divergence", str(integ["first_divergence"]))
    for name, cls in (integ.get("classes") or {}).items():
        tab.add_row(f"class {name}", _class_line(cls))
    g = report.get("gpu") or {}
    if g.get("available") is False and g.get("note"):
        tab.add_row("GPU telemetry", str(g["note"]))
    elif g.get("available"):
        tab.add_row("GPU telemetry", f"{len(g.get('gpus') or [])} GPU(s), {g.get('samples')} samples (gpu.jsonl)")
    gpu_mem_note = (report.get("server_memory") or {}).get("gpu_note")
    if gpu_mem_note:
        tab.add_row("GPU memory swing", f"not judged: {gpu_mem_note}")
    return tab


def _class_line(section: dict[str, Any]) -> str:
    """One request class's line (``integrity.classes.NAME``): its finished responses and,
    per invariant, violations of judged (``"12 responses; stop 0/12, usage 1/12"``)."""
    invs = section.get("invariants") or {}
    parts = [f"{inv} {e['violations']}/{e['judged']}" for inv, e in invs.items()]
    return f"{section.get('responses', 0)} responses" + ("; " + ", ".join(parts) if parts else "")


def _collapse_gpu(checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The GPU checks not judged for one reason (a host without a GPU) as one row."""
    nj = [c for c in checks if c.get("category") == "gpu" and c.get("passed") is None]
    reasons = {str(c.get("detail") or "") for c in nj}
    if len(nj) < 2 or len(reasons) != 1:
        return checks
    row = {"name": f"gpu.* ({len(nj)} checks)", "category": "gpu", "passed": None, "observed": None, "limit": None,
           "detail": reasons.pop()}
    first = checks.index(nj[0])
    rest = [c for c in checks if c not in nj]
    return [*rest[:first], row, *rest[first:]]


def _checks_table(report: dict[str, Any]) -> Table:
    tab = Table(title="checks (failed first; N/J = not judged, neither passed nor failed)", title_justify="left")
    for col in ("", "check", "observed", "limit", "detail"):
        tab.add_column(col, overflow="fold")
    checks = _collapse_gpu(list(report.get("checks") or []))
    rank = {False: 0, None: 1, True: 2}
    checks.sort(key=lambda c: rank[None if c.get("passed") is None else bool(c.get("passed"))])  # stable
    for c in checks:
        p = c.get("passed")
        mark = (Text("N/J", style="yellow") if p is None else Text("PASS", style="green") if p
                else Text("FAIL", style="bold red"))
        tab.add_row(mark, str(c.get("name")), _num(c.get("observed")), _num(c.get("limit")), str(c.get("detail") or ""))
    return tab


def _mirror_table(report: dict[str, Any]) -> Table | None:
    """Speculative vs plain (mirror mode): per phase × bucket × sampling class, median
    TTFT, TPOT and E2E of both servers, TPOT spec ÷ plain, and the speedup."""
    m = report.get("mirror") or {}
    if not m.get("enabled"):
        return None
    tab = Table(title="speculative vs plain (mirror mode; p50 in ms as spec/plain; TPOT ratio = spec ÷ plain, "
                      "speedup = plain ÷ spec TPOT)", title_justify="left")
    for col in ("phase", "bucket", "sampling", "n spec/plain", "TTFT", "TPOT", "E2E", "TPOT ratio", "speedup"):
        tab.add_column(col, justify="left" if col in ("phase", "bucket", "sampling") else "right")
    for g in m.get("groups") or []:
        s, r = g.get("spec") or {}, g.get("ref") or {}

        def sr(key: str) -> str:
            return f"{_ms((s.get(key) or {}).get('p50'))}/{_ms((r.get(key) or {}).get('p50'))}"

        ratio = (g.get("ratio") or {}).get("tpot_p50")
        sp = g.get("speedup")
        tab.add_row(g.get("phase", ""), g.get("bucket", ""), g.get("sampling", ""),
                    f"{s.get('complete', 0)}/{r.get('complete', 0)}", sr("ttft_s"), sr("tpot_s"), sr("e2e_s"),
                    "—" if ratio is None else f"{ratio:.2f}", "—" if sp is None else f"{sp:.2f}×",
                    style=None if g.get("judged") else "dim")
    return tab


def _pct(v: Any) -> str:
    return "—" if v is None else f"{v * 100:.1f}%"


def _speculation_table(report: dict[str, Any]) -> Table | None:
    """Per server and phase, speculative decoding as vLLM's /metrics counted it (acceptance
    rate, mean acceptance length, per-position acceptance) and the server's RSS swing."""
    spec = report.get("speculation") or {}
    mem = (report.get("server_memory") or {}).get("servers") or {}
    servers = spec.get("servers") or {}
    if not servers:
        return None
    tab = Table(title="speculative decoding (vLLM /metrics; server memory)", title_justify="left")
    for col in ("server", "phase", "acceptance rate", "mean acceptance length", "per-position acceptance",
                "draft tokens", "gaps/restarts", "RSS swing"):
        tab.add_column(col, justify="left" if col in ("server", "phase", "per-position acceptance") else "right")
    for name, sv in servers.items():
        for ph in _PHASES:
            m = (sv.get("phases") or {}).get(ph)
            if m is None:
                continue
            if not sv.get("speculative"):
                rate, length, pos, tokens = "—", "—", "no speculation", "—"
            else:
                mal = m.get("mean_acceptance_length")
                rate, length = _pct(m.get("acceptance_rate")), "—" if mal is None else f"{mal:.2f}"
                pos = " ".join(f"{v:.2f}" for v in m.get("per_position_acceptance") or []) or "—"
                tokens = f"{m.get('draft_tokens', 0):.0f}"
            sw = ((mem.get(name) or {}).get(ph) or {}).get("swing")
            tab.add_row(name, ph, rate, length, pos, tokens, f"{m.get('gaps', 0)}/{m.get('resets', 0)}", _pct(sw))
    return tab


def _steps_table(report: dict[str, Any]) -> Table | None:
    """Per load step (:mod:`harness.metrics.steps`): the level (users or requests/s), when
    it ran, the phases it overlaps, requests, failed, p50/p95 ms of TTFT, TPOT and E2E,
    output tokens/s, goodput/s and the acceptance rate; None for a constant profile."""
    sec = report.get("steps") or {}
    steps = sec.get("steps") or []
    if not steps:
        return None
    unit = "users" if sec.get("unit") == "users" else "req/s"
    tab = Table(title=f"per load step ({unit}): latency in ms (p50/p95)", title_justify="left")
    for col in ("step", unit, "from s", "phases", "requests", "failed", "TTFT", "TPOT", "E2E", "tokens/s",
                "goodput/s", "acceptance"):
        tab.add_column(col, justify="left" if col in ("step", "phases") else "right")
    for st in steps:
        level = st.get("level")
        label = f"{level:g}" if st.get("kind") == "level" else f"{st.get('from', 0):.3g}→{st.get('to', 0):.3g}"
        acc = (st.get("acceptance") or {}).get("acceptance_rate")
        tps, gp = st.get("output_tokens_per_s"), st.get("goodput_rps")
        tab.add_row(f"{st.get('index')} {st.get('kind')}", label, f"{st.get('offset_s', 0):.0f}",
                    ",".join(st.get("phases") or []), str(st.get("requests", 0)), str(st.get("errors", 0)),
                    *(_lat(st, k) for k in ("ttft_s", "tpot_s", "e2e_s")),
                    "—" if tps is None else f"{tps:.1f}", "—" if gp is None else f"{gp:.2f}",
                    "—" if acc is None else f"{acc:.2f}", style=None if _enough(st) else "dim")
    return tab


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
    parts.append(_acceptance_table(report))
    for optional in (_steps_table(report), _speculation_table(report), _mirror_table(report)):
        if optional is not None:
            parts.append(optional)
    return Group(*parts, _recovery_integrity(report), _checks_table(report), _closing(report))


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

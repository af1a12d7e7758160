"""Speculation health from the server's own counters (``metrics.jsonl``, written by
:mod:`harness.metrics.scraper`): the report's ``speculation`` section — per server and per
phase, vLLM's acceptance rate, mean acceptance length and per-position acceptance
(:mod:`harness.metrics.speculation` has the definitions), plus the server-side load
(running/waiting requests, KV-cache usage, preemptions) and vLLM's own mean TTFT and ITL
— and two canaries over consecutive windows of ``speculation.window_s`` seconds:

* ``speculation.<server>.collapse`` — the acceptance rate fell by more than
  ``speculation.collapse_max_drop`` (absolute), with confidence (below). Observed: the
  largest fall one can be confident of, over every span (0 when none).
* ``speculation.<server>.saturation`` — the acceptance rate jumped to ≥
  ``speculation.saturation_rate``, at least ``speculation.saturation_min_jump`` above its
  reference, with confidence (public bug reports show acceptance jumping to ~100% before an
  engine crash). Observed: the largest confident rise into a span at ≥ ``saturation_rate``
  (0 when none).

The test (each canary, each server): a window's acceptance rate is noisy well beyond a
binomial over its draft tokens — they come from the few requests in flight, and a draft
guesses some prompts far better than others — so the windows are the clusters
(:func:`harness.metrics.speculation.acceptance_shift`). Within one server incarnation,
every span of ``speculation.span_windows`` consecutive judged windows is compared with all
the judged windows of that incarnation before it (at least
``speculation.min_reference_windows``): the pooled rates (weighted by draft tokens), the
between-window variance τ² measured on the reference (DerSimonian–Laird), standard error
sd = √(var_reference + var_span), var = (p(1−p)Σn + τ²Σn²) ÷ (Σn)². The fall one can be
confident of is fall − z·sd with z the standard normal quantile of 1 − α ÷ m
(``speculation.alpha``, one-sided, Bonferroni over the m spans tested), and the collapse
canary fails when that bound exceeds ``collapse_max_drop`` — a one-sided z-test of
"fall ≤ collapse_max_drop" at family-wise level α (likewise the rise for saturation).
One thin window (a window of 84 draft tokens with none accepted, among windows at
0.10–0.40) is no collapse; a draft that stops being accepted for several windows is.

What is judged: windows from the first phase's start to the load's stop (the whole series
when the run has no phases) with at least ``speculation.min_draft_tokens`` draft tokens,
each incarnation of the server apart: a window holding a server restart (a counter that
started over, or the scraped process changed: :func:`harness.metrics.speculation.incarnation`)
ends one incarnation and is not judged; a restart — a killed worker brought back, a swapped
draft — is a new series, not a collapse or a saturation. A server without spec-decode
counters (the non-speculative reference, or speculation switched off) is not judged; a
speculative one with no span to test (no incarnation with ``min_reference_windows`` +
``span_windows`` judged windows) is **not judged** (``passed`` None, "not judged: ..." in
the detail, N/J in every report, left out of the verdict; its section says why). A run
without ``metrics.jsonl`` (recorded before the scraper existed) gets no speculation checks
and a section note.
"""

from __future__ import annotations

from statistics import NormalDist
from typing import Any

from harness.checks.base import CheckResult, RecordedRun, instant
from harness.checks.view import Table, View, pct
from harness.checks.config import SpeculationConfig
from harness.metrics.scraper import METRICS_FILE
from harness.metrics.speculation import (AcceptanceShift, SpeculationSeries, acceptance_shift, counter_increments,
                                         read_series, server_lines, servers_in, window_acceptance)

__all__ = ["summarize", "phase_figures", "series", "server_series", "incarnation_runs", "canaries", "check",
           "section"]

_MEMO = "speculation"


def series(run: RecordedRun) -> list[dict[str, Any]]:
    """The run's ``metrics.jsonl`` lines in time order (read once per run; [] without a run directory)."""
    if "metrics_lines" not in run.memo:
        run.memo["metrics_lines"] = read_series(run.run_dir / METRICS_FILE) if run.run_dir is not None else []
    return run.memo["metrics_lines"]


def _cfg(run: RecordedRun) -> SpeculationConfig:
    return getattr(run.limits, "speculation", None) or SpeculationConfig()


def _span(run: RecordedRun) -> tuple[float | None, float | None]:
    if not run.windows:
        return None, None
    return min(a for a, _ in run.windows.values()), max(b for _, b in run.windows.values())


def incarnation_runs(windows: list[dict[str, Any]], min_draft_tokens: int) -> list[list[dict[str, Any]]]:
    """The judged windows of one server, one list per incarnation (module doc): a window
    holding a restart (``resets``) ends a list and is left out; a window with fewer than
    ``min_draft_tokens`` draft tokens is left out. Lists in time order, empty ones dropped."""
    runs: list[list[dict[str, Any]]] = [[]]
    for w in windows:
        if w["resets"]:
            runs.append([])
        elif w.get("acceptance_rate") is not None and w["draft_tokens"] >= min_draft_tokens:
            runs[-1].append(w)
    return [r for r in runs if r]


def _shift_entry(sh: AcceptanceShift, bound: float, span: list[dict[str, Any]]) -> dict[str, Any]:
    return {"bound": bound, "from": sh.reference_rate, "to": sh.span_rate, "sd": sh.sd, "tau2": sh.tau2,
            "reference_windows": sh.reference_windows, "span_windows": sh.span_windows,
            "span_tokens": sh.span_tokens, "at": span[0]["start"]}


def canaries(windows: list[dict[str, Any]], cfg: SpeculationConfig) -> dict[str, Any]:
    """The collapse and saturation canaries over one server's windows (module doc: the test).

    Args:
        windows: :func:`harness.metrics.speculation.window_acceptance` of one server.
        cfg: the ``speculation`` limits.

    Returns:
        ``{"spans_tested": m, "windows_judged": n, "incarnations": n, "alpha": α, "z": the
        one-sided quantile of 1 − α ÷ m (None when m is 0), "collapse": entry|None,
        "saturation": entry|None}``; an entry is the span with the largest confident fall
        (collapse) or the largest confident rise into a span at ≥ ``saturation_rate``:
        ``{"bound" (the fall or rise one can be confident of, fraction), "from" (reference
        rate), "to" (span rate), "sd", "tau2", "reference_windows", "span_windows",
        "span_tokens", "at" (the span's start, epoch s)}``.
    """
    runs = incarnation_runs(windows, cfg.min_draft_tokens)
    h, r0 = cfg.span_windows, cfg.min_reference_windows
    tests: list[tuple[AcceptanceShift, list[dict[str, Any]]]] = []
    for run in runs:
        counts = [(w["accepted_tokens"], w["draft_tokens"]) for w in run]
        for k in range(r0, len(run) - h + 1):
            sh = acceptance_shift(counts[:k], counts[k:k + h])
            if sh is not None:
                tests.append((sh, run[k:k + h]))
    m = len(tests)
    out: dict[str, Any] = {"spans_tested": m, "windows_judged": sum(len(r) for r in runs), "incarnations": len(runs),
                           "alpha": cfg.alpha, "z": None, "collapse": None, "saturation": None}
    if not m:
        return out
    z = NormalDist().inv_cdf(1.0 - cfg.alpha / m)
    worst_fall: dict[str, Any] | None = None
    worst_rise: dict[str, Any] | None = None
    for sh, span in tests:
        fall = sh.fall_bound(z)
        if worst_fall is None or fall > worst_fall["bound"]:
            worst_fall = _shift_entry(sh, fall, span)
        rise = sh.rise_bound(z)
        if sh.span_rate >= cfg.saturation_rate and (worst_rise is None or rise > worst_rise["bound"]):
            worst_rise = _shift_entry(sh, rise, span)
    return {**out, "z": z, "collapse": worst_fall, "saturation": worst_rise}


def _analyse(run: RecordedRun) -> dict[str, Any]:
    if _MEMO in run.memo:
        return run.memo[_MEMO]
    cfg = _cfg(run)
    lines = series(run)
    start, end = _span(run)
    servers: dict[str, Any] = {}
    for name in servers_in(lines):
        ss = server_lines(lines, name)
        sp = SpeculationSeries(ss)
        windows = window_acceptance(sp, cfg.window_s, start, end) if sp.speculative else []
        servers[name] = {"series": sp, "lines": ss, "windows": windows,
                         "canaries": canaries(windows, cfg) if sp.speculative else None}
    run.memo[_MEMO] = servers
    return servers


def server_series(run: RecordedRun, name: str) -> SpeculationSeries | None:
    """One server's spec-decode series of the run (computed once per run, shared by the
    speculation checks, the per-step figures and the soak canaries); None when the run
    recorded no ``metrics.jsonl`` line of that server."""
    s = _analyse(run).get(name)
    return None if s is None else s["series"]


def _test_detail(c: dict[str, Any], cfg: SpeculationConfig) -> str:
    return (f"one-sided z-test at family-wise α = {cfg.alpha:g} (z = {c['z']:.2f}, Bonferroni over "
            f"{c['spans_tested']} span(s) of {cfg.span_windows} × {cfg.window_s:g} s windows, each against the "
            f"≥ {cfg.min_reference_windows} earlier windows of its incarnation; windows as clusters, "
            f"between-window variance from the reference; {c['windows_judged']} window(s) with "
            f"≥ {cfg.min_draft_tokens} draft tokens in {c['incarnations']} incarnation(s))")


def _span_text(e: dict[str, Any], fault_t: float | None,
               windows: dict[str, tuple[float, float]] | None = None) -> str:
    where = instant(e["at"], fault_t, windows)
    return (f"{e['from']:.3f} over {e['reference_windows']} window(s) → {e['to']:.3f} over the "
            f"{e['span_windows']} window(s) from {where} ({e['span_tokens']:.0f} draft tokens; "
            f"sd {e['sd']:.3f}, between-window sd {e['tau2'] ** 0.5:.3f})")


def check(run: RecordedRun) -> list[CheckResult]:
    """The collapse and saturation canaries of every speculative server (module doc)."""
    cfg = _cfg(run)
    out: list[CheckResult] = []
    fault_t = run.fault_time
    for name, s in _analyse(run).items():
        c = s["canaries"]
        if c is None:   # no speculation on this server: nothing to judge
            continue
        if not c["spans_tested"]:
            why = (f"no incarnation with {cfg.min_reference_windows} + {cfg.span_windows} {cfg.window_s:g} s "
                   f"windows of ≥ {cfg.min_draft_tokens} draft tokens ({len(s['windows'])} window(s), "
                   f"{c['windows_judged']} with enough draft tokens, in {c['incarnations']} incarnation(s))")
            for kind, limit in (("collapse", cfg.collapse_max_drop), ("saturation", cfg.saturation_min_jump)):
                if limit is not None:
                    out.append(CheckResult.not_judged(f"speculation.{name}.{kind}", "speculation", None, limit, why))
            continue
        conf = f"{100 * (1 - cfg.alpha):g}%"
        if cfg.collapse_max_drop is not None:
            d = c["collapse"]
            drop = max(0.0, d["bound"])
            passed = drop <= cfg.collapse_max_drop
            detail = (f"acceptance rate fell {_span_text(d, fault_t, run.windows)}: a fall of at least {drop:.3f} "
                      f"at {conf} confidence" if not passed else
                      f"largest fall one can be {conf} confident of: {drop:.3f} "
                      f"({_span_text(d, fault_t, run.windows)}; point fall {d['from'] - d['to']:.3f})")
            out.append(CheckResult(f"speculation.{name}.collapse", "speculation", passed, round(drop, 4),
                                   cfg.collapse_max_drop, f"{detail}; {_test_detail(c, cfg)}"))
        if cfg.saturation_min_jump is not None:
            r = c["saturation"]
            rise = max(0.0, r["bound"]) if r else 0.0
            passed = rise < cfg.saturation_min_jump
            if r is None:
                detail = f"no span reached acceptance ≥ {cfg.saturation_rate:g}"
            else:
                detail = (f"acceptance rate jumped to ≥ {cfg.saturation_rate:g}: {_span_text(r, fault_t, run.windows)}, a rise "
                          f"of at least {rise:.3f} at {conf} confidence" if not passed else
                          f"largest rise into a span at ≥ {cfg.saturation_rate:g} one can be {conf} confident "
                          f"of: {rise:.3f} ({_span_text(r, fault_t, run.windows)})")
            out.append(CheckResult(f"speculation.{name}.saturation", "speculation", passed, round(rise, 4),
                                   cfg.saturation_min_jump, f"{detail}; {_test_detail(c, cfg)}"))
    return out


def _gauge_max(lines: list[dict[str, Any]], names: tuple[str, ...], start: float, end: float) -> float | None:
    vals = [v for ln in lines if ln.get("ok") and start <= ln["t"] < end
            for n in names if (v := (ln.get("gauges") or {}).get(n)) is not None]
    return max(vals) if vals else None


def _increase(lines: list[dict[str, Any]], get: Any, start: float, end: float) -> float | None:
    incs = counter_increments(lines, get)
    if not incs:
        return None
    return float(sum(i.delta for i in incs if start <= i.t1 < end))


def _hist_mean(lines: list[dict[str, Any]], names: tuple[str, ...], start: float, end: float) -> float | None:
    for n in names:
        def part(key: str, n: str = n) -> Any:
            return lambda ln: ((ln.get("histograms") or {}).get(n) or {}).get(key)
        total, count = _increase(lines, part("sum"), start, end), _increase(lines, part("count"), start, end)
        if total is not None and count:
            return total / count
    return None


def _server_side(lines: list[dict[str, Any]], start: float, end: float) -> dict[str, Any]:
    return {
        "num_requests_running_max": _gauge_max(lines, ("vllm:num_requests_running",), start, end),
        "num_requests_waiting_max": _gauge_max(lines, ("vllm:num_requests_waiting",), start, end),
        "kv_cache_usage_perc_max": _gauge_max(lines, ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
                                              start, end),
        "num_preemptions": _increase(lines, lambda ln: (ln.get("counters") or {}).get("vllm:num_preemptions_total"),
                                     start, end),
        "ttft_mean_s": _hist_mean(lines, ("vllm:time_to_first_token_seconds",), start, end),
        "itl_mean_s": _hist_mean(lines, ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
                                 start, end),
    }


def section(run: RecordedRun) -> dict[str, Any]:
    """The ``speculation`` block of ``report.json``::

        {"source": "metrics.jsonl", "note": str|None, "window_s": s,
         "servers": {name: {"speculative": bool, "samples": n, "gaps": n, "resets": n,
                            "total": {acceptance over the judged span},
                            "phases": {phase: {"drafts", "draft_tokens", "accepted_tokens",
                                       "acceptance_rate", "mean_acceptance_length",
                                       "per_position_acceptance": [...], "samples", "gaps", "resets",
                                       "num_requests_running_max", "num_requests_waiting_max",
                                       "kv_cache_usage_perc_max", "num_preemptions",
                                       "ttft_mean_s", "itl_mean_s" (vLLM's histograms, seconds)}},
                            "windows": [{"start", "end", "acceptance_rate", "draft_tokens", "resets"}],
                            "canaries": :func:`canaries`' dict | None}}}

    Acceptance fields are None for a server without speculation (or a window without draft tokens).
    """
    cfg = _cfg(run)
    lines = series(run)
    if not lines:
        return {"source": METRICS_FILE, "note": f"no {METRICS_FILE} recorded in this run", "window_s": cfg.window_s,
                "servers": {}}
    start, end = _span(run)
    out: dict[str, Any] = {}
    for name, s in _analyse(run).items():
        sp: SpeculationSeries = s["series"]
        a = sp.first_t if start is None else start
        b = (sp.last_t + 1e-6 if sp.last_t is not None else a) if end is None else end
        total = sp.stats(a, b) if a is not None else {}
        phases = {ph: {**sp.stats(t0, t1), **_server_side(s["lines"], t0, t1)} for ph, (t0, t1) in run.windows.items()}
        out[name] = {
            "speculative": sp.speculative,
            "samples": sum(1 for ln in s["lines"] if ln.get("ok")),
            "gaps": sum(1 for ln in s["lines"] if not ln.get("ok")),
            "resets": sum(1 for i in sp.draft_tokens if i.reset) if sp.speculative else
            sum(1 for i in counter_increments(s["lines"], lambda ln: (ln.get("counters") or {}).get(
                "vllm:generation_tokens_total")) if i.reset),
            "total": total,
            "phases": phases,
            "windows": [{k: w[k] for k in ("start", "end", "acceptance_rate", "draft_tokens", "resets")}
                        for w in s["windows"]],
            "canaries": s["canaries"],
        }
    note = None if any(v["speculative"] for v in out.values()) else \
        "no server exposed vLLM's spec-decode counters (vllm:spec_decode_*): nothing speculative to judge"
    return {"source": METRICS_FILE, "note": note, "window_s": cfg.window_s, "servers": out}


def summarize(sec: dict[str, Any] | None) -> list[View]:
    """The terminal/Allure view of :func:`section`: per server and phase, speculative
    decoding as vLLM's /metrics counted it (acceptance rate, mean acceptance length,
    per-position acceptance, draft tokens, gaps and restarts)."""
    servers = (sec or {}).get("servers") or {}
    if not servers:
        return []
    tab = Table("speculative decoding (vLLM /metrics)", ["server", "phase", "acceptance rate", "mean acceptance length",
                "per-position acceptance", "draft tokens", "gaps/restarts"], labels=2)
    for name, sv in servers.items():
        for ph in ("baseline", "fault", "recovery", "after"):
            m = (sv.get("phases") or {}).get(ph)
            if m is None:
                continue
            if not sv.get("speculative"):
                rate, length, pos, tokens = "—", "—", "no speculation", "—"
            else:
                mal = m.get("mean_acceptance_length")
                rate, length = pct(m.get("acceptance_rate")), "—" if mal is None else f"{mal:.2f}"
                pos = " ".join(f"{v:.2f}" for v in m.get("per_position_acceptance") or []) or "—"
                tokens = f"{m.get('draft_tokens', 0):.0f}"
            tab.add(name, ph, rate, length, pos, tokens, f"{m.get('gaps', 0)}/{m.get('resets', 0)}")
    return [tab]


def phase_figures(sec: dict[str, Any] | None) -> dict[str, dict[str, float | None]]:
    """``acceptance_rate``: the speculative server's acceptance rate per phase from vLLM's
    counters (``/metrics``); nothing without counters of the ``spec`` server."""
    spec = ((sec or {}).get("servers") or {}).get("spec")
    if not spec:
        return {}
    return {"acceptance_rate": {ph: (m or {}).get("acceptance_rate") for ph, m in (spec.get("phases") or {}).items()}}

"""Soak canaries: does the stack drift over a long run? (``soak.enabled``; limits in
:class:`~harness.checks.config.SoakConfig`.)

The judged span runs from the baseline's start (the warm-up excluded) to the load's stop,
cut into consecutive windows of ``soak.window_s`` seconds (a last partial window is kept
when at least half as long). Per window, from recorded data only:

* the speculative server's acceptance rate as vLLM counted it (``metrics.jsonl``;
  :func:`harness.metrics.speculation.acceptance`), when it saw ``min_draft_tokens``;
* each server's process-tree RSS (median of the window's scrapes of one tree,
  :func:`harness.checks.server_memory.rss_segments`) and the speculative server's KV-cache
  usage (mean of ``vllm:kv_cache_usage_perc``);
* TTFT p95 and TPOT p50 of the load's complete requests sent in it (definitions of
  :mod:`harness.metrics.latency`, vLLM's serving benchmark), when at least
  ``min_requests_per_window`` completed; and the tries that failed.

A window overlapping a fault's active span (``acting_at`` → ``cleared_at``), or in which a
server's process tree changed or a server was down (a restart: from what ended its
incarnation to its next ``server_ready``, :func:`harness.checks.server_memory.down_spans`),
is left out of the fits and of the error-burst count: what a fault does is judged by the
fault's checks. Every trend is fitted **per incarnation** of the server it describes (the
speculative server for acceptance, KV-cache usage and latency; each server for its RSS) and
never across a restart: a window's incarnation is the number of restarts of that server
before it (its down spans, and its counters starting over:
:func:`harness.metrics.speculation.counter_increments`, which also covers runs recorded
before the scraper wrote the supervisor's incarnation number). A robust line (Theil–Sen,
:mod:`harness.metrics.drift`) through each incarnation's windows gives the checks:

* ``soak.acceptance_drop`` — fitted first − last acceptance rate ≤ ``max_acceptance_drop``;
* ``soak.<server>.rss_growth_per_30min`` — fitted slope × 1800 s ÷ fitted start ≤
  ``max_rss_growth_per_30min``, the line fitted through the **later half** of the windows:
  a process's allocator grows while it warms up and then levels off (measured here: the
  speculative vLLM server 3226 → 3386 MiB over its first 2 minutes under load, then flat
  within 1 MiB), a leak keeps growing; so the first half is not judged;
* ``soak.kv_usage_growth`` — fitted last − first KV-cache usage ≤ ``max_kv_usage_growth``;
* ``soak.ttft_p95_drift``, ``soak.tpot_p50_drift`` — fitted last ÷ first − 1 ≤
  ``max_latency_drift``;
* ``soak.error_burst`` — the most failed tries in one window ≤ ``max_errors_per_window``.

A trend canary fails only when the fitted change exceeds its limit **and** the series
trends that way beyond its own window-to-window scatter: the one-sided Mann–Kendall test
(:func:`harness.metrics.drift.mann_kendall`) at level ``soak.alpha`` in that incarnation
(with k incarnations judged, noise alone fails a canary with a chance below k·α: it must
also exceed the limit). A window or two of a noisy draft does not make a decay; a leak, which
grows window after window, does (for 4 windows a strictly monotone series reaches p = 0.045).
The observed value is the worst incarnation's fitted change; the detail gives its p-value.
An incarnation with fewer than ``min_windows`` usable windows is not judged; a canary
with no incarnation judged is not judged (N/J, with why).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from harness.checks.base import CheckResult, RecordedRun
from harness.checks.config import SoakConfig
from harness.checks.server_memory import down_spans, rss_segments
from harness.checks.speculation import series, server_series
from harness.load.records import is_complete
from harness.metrics.drift import Trend, TrendTest, mann_kendall, theil_sen
from harness.metrics.latency import tpot_s, ttft_s
from harness.metrics.speculation import counter_increments, server_lines, servers_in

__all__ = ["check", "section", "soak_windows"]

_KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
#: Counters whose start over tells a restart (every vLLM server has the first; a speculative
#: one the second).
_RESET_COUNTERS = ("vllm:generation_tokens_total", "vllm:spec_decode_num_draft_tokens_total")


def _cfg(run: RecordedRun) -> SoakConfig:
    return getattr(run.limits, "soak", None) or SoakConfig()


def soak_windows(run: RecordedRun, cfg: SoakConfig) -> list[dict[str, Any]]:
    """The soak's windows with their figures (module doc): ``[{"start", "end",
    "excluded": reason|None, "requests", "errors", "ttft_p95_s", "tpot_p50_s",
    "acceptance_rate", "draft_tokens", "kv_usage", "rss_bytes": {server: bytes},
    "incarnation": {server: restarts of it before the window}}]``; figures None where too
    thin. Empty without a judged span."""
    if not run.windows:
        return []
    start = run.windows["baseline"][0] if "baseline" in run.windows else min(a for a, _ in run.windows.values())
    end = max(b for _, b in run.windows.values())
    bounds = []
    a = start
    while a < end:
        b = min(a + cfg.window_s, end)
        if b - a >= cfg.window_s / 2:
            bounds.append((a, b))
        a += cfg.window_s
    lines = series(run)
    spec = server_series(run, "spec")
    spec_lines = spec.lines if spec is not None else []
    down = down_spans(run.events)
    names = servers_in(lines)
    segments = {name: rss_segments(server_lines(lines, name), down=down.get(name, [])) for name in names}
    starts = {name: _incarnation_starts(server_lines(lines, name), down.get(name, [])) for name in {*names, "spec"}}
    faults = [(f.get("acting_at") or f["injected_at"], f.get("cleared_at") or end) for f in run.faults
              if f.get("injected_at") is not None]
    restarts = [e["t"] for e in run.events if e.get("event") in ("server_exited", "server_started")]
    all_down = [sp for spans in down.values() for sp in spans]
    out = []
    for a, b in bounds:
        reason = ("fault" if any(fa < b and fb > a for fa, fb in faults)
                  else "restart" if any(a <= t < b for t in restarts)
                  or any(da < b and db > a for da, db in all_down) else None)
        sent = [r for r in run.records if a <= r.send_time < b]
        done = [r for r in sent if is_complete(r)[0]]
        ttfts = [v for v in (ttft_s(r) for r in done) if v is not None]
        tpots = [v for v in (tpot_s(r) for r in done) if v is not None]
        enough = len(done) >= cfg.min_requests_per_window
        acc = spec.stats(a, b) if spec is not None and spec.speculative else None
        rate = acc["acceptance_rate"] if acc and acc["draft_tokens"] >= cfg.min_draft_tokens and not acc["resets"] else None
        kv = [g for g in (_kv_usage(ln) for ln in spec_lines if a <= ln["t"] < b and ln.get("ok")) if g is not None]
        rss: dict[str, float | None] = {}
        for name, segs in segments.items():
            inside = [[v for t, v in seg if a <= t < b] for seg in segs]
            inside = [vals for vals in inside if vals]
            if len(inside) > 1 and reason is None:
                reason = "restart"
            rss[name] = float(np.median(max(inside, key=len))) if inside else None
        out.append({"start": a, "end": b, "excluded": reason, "requests": len(sent),
                    "errors": len(sent) - len(done),
                    "ttft_p95_s": float(np.percentile(ttfts, 95)) if enough and ttfts else None,
                    "tpot_p50_s": float(np.percentile(tpots, 50)) if enough and tpots else None,
                    "acceptance_rate": rate, "draft_tokens": acc["draft_tokens"] if acc else None,
                    "kv_usage": float(np.mean(kv)) if kv else None, "rss_bytes": rss,
                    "incarnation": {name: sum(1 for t in ts if t <= a) for name, ts in starts.items()}})
    return out


def _counter(name: str) -> Callable[[dict[str, Any]], float | None]:
    return lambda ln: (ln.get("counters") or {}).get(name)


def _incarnation_starts(lines: list[dict[str, Any]], down: list[tuple[float, float]]) -> list[float]:
    """The instants (epoch s) one server's incarnations after its first began, as recorded:
    the start of each down span (:func:`harness.checks.server_memory.down_spans`) and each
    counter that started over outside them (between two scrapes, ``t0`` → ``t1``, that touch
    no down span: a restart the timeline does not show, e.g. a run recorded without it; the
    earlier scrape is the instant)."""
    starts = {a for a, _ in down}
    for name in _RESET_COUNTERS:
        for i in counter_increments(lines, _counter(name)):
            if i.reset and not any(a <= i.t1 and i.t0 <= b for a, b in down):
                starts.add(i.t0)   # a set: the counters of one restart give one instant
    return sorted(starts)


def _kv_usage(line: dict[str, Any]) -> float | None:
    """The KV-cache usage gauge of one ``metrics.jsonl`` line (vLLM's current name, else its
    older one), None without it."""
    gauges = line.get("gauges") or {}
    return next((gauges[k] for k in _KV if gauges.get(k) is not None), None)


#: One incarnation's fit: its number, the Theil–Sen line, the Mann–Kendall test.
Fit = tuple[int, Trend, TrendTest]


def _fit(windows: list[dict[str, Any]], get, server: str = "spec", later_half: bool = False) -> list[Fit]:
    """Theil–Sen and Mann–Kendall over the usable windows' midpoints, per incarnation of
    ``server`` (``later_half``: the later half of each incarnation's windows only)."""
    groups: dict[int, list[tuple[float, float]]] = {}
    for w in windows:
        if w["excluded"] is None and get(w) is not None:
            groups.setdefault(w["incarnation"].get(server, 0), []).append(((w["start"] + w["end"]) / 2, get(w)))
    out: list[Fit] = []
    for inc, pts in sorted(groups.items()):
        if later_half:
            pts = pts[len(pts) // 2:]
        t, y = [p for p, _ in pts], [v for _, v in pts]
        trend = theil_sen(t, y)
        if trend is not None:
            out.append((inc, trend, mann_kendall(t, y)))
    return out


def _analyse(run: RecordedRun) -> dict[str, Any]:
    if "soak" in run.memo:
        return run.memo["soak"]
    cfg = _cfg(run)
    ws = soak_windows(run, cfg) if cfg.enabled else []
    servers = sorted({s for w in ws for s in w["rss_bytes"]})
    fits = {
        "acceptance_rate": _fit(ws, lambda w: w["acceptance_rate"]),
        "kv_usage": _fit(ws, lambda w: w["kv_usage"]),
        "ttft_p95_s": _fit(ws, lambda w: w["ttft_p95_s"]),
        "tpot_p50_s": _fit(ws, lambda w: w["tpot_p50_s"]),
        **{f"rss_bytes.{s}": _fit(ws, lambda w, s=s: w["rss_bytes"].get(s), server=s, later_half=True)
           for s in servers},
    }
    run.memo["soak"] = {"windows": ws, "fits": fits, "servers": servers}
    return run.memo["soak"]


def _judge(name: str, fits: list[Fit], observe: Any, limit: float, cfg: SoakConfig, what: str,
           worse: str, unit: str = "") -> CheckResult:
    """One trend canary over the incarnations' fits (module doc): ``observe(trend)`` is the
    fitted change (None: not measurable), ``worse`` the direction that is bad
    (``increasing`` or ``decreasing``)."""
    judged = [(inc, t, mk, observe(t)) for inc, t, mk in fits if t.points >= cfg.min_windows]
    if not judged:
        n = max((t.points for _, t, _ in fits), default=0)
        return CheckResult.not_judged(name, "soak", None, limit,
                                      f"{n} usable window(s) of {what} in its longest incarnation, fewer than "
                                      f"soak.min_windows ({cfg.min_windows})")
    measurable = [j for j in judged if j[3] is not None]
    if not measurable:
        return CheckResult.not_judged(name, "soak", None, limit, f"{what}: the fitted start is not positive")
    level = cfg.alpha

    def p_bad(mk: TrendTest) -> float:
        return mk.p_increasing if worse == "increasing" else mk.p_decreasing

    failing = [j for j in measurable if j[3] > limit and p_bad(j[2]) < level]
    inc, trend, mk, observed = max(failing or measurable, key=lambda j: j[3])
    detail = (f"{what}: fitted {trend.start:.4g}{unit} → {trend.end:.4g}{unit} over {trend.span_s:.0f} s "
              f"({trend.points} windows of incarnation {inc}; {len(judged)} incarnation(s) judged apart); "
              f"Mann–Kendall one-sided p = {p_bad(mk):.3g} for {worse}, significant below "
              f"soak.alpha = {level:g} in each incarnation)")
    if observed > limit and not failing:
        detail += ": beyond the limit but within the series' own scatter"
    return CheckResult(name, "soak", not failing, round(observed, 4), limit, detail)


def check(run: RecordedRun) -> list[CheckResult]:
    """The soak canaries (module doc); none when ``soak.enabled`` is false."""
    cfg = _cfg(run)
    if not cfg.enabled:
        return []
    a = _analyse(run)
    fits = a["fits"]
    out: list[CheckResult] = []
    if cfg.max_acceptance_drop is not None:
        out.append(_judge("soak.acceptance_drop", fits["acceptance_rate"], lambda t: -t.change,
                          cfg.max_acceptance_drop, cfg, "acceptance rate", "decreasing"))
    if cfg.max_rss_growth_per_30min is not None:
        for s in a["servers"]:
            out.append(_judge(f"soak.{s}.rss_growth_per_30min", fits[f"rss_bytes.{s}"],
                              lambda t: None if t.start <= 0 else t.slope * 1800.0 / t.start,
                              cfg.max_rss_growth_per_30min, cfg, f"RSS of server {s}", "increasing", " B"))
    if cfg.max_kv_usage_growth is not None:
        out.append(_judge("soak.kv_usage_growth", fits["kv_usage"], lambda t: t.change, cfg.max_kv_usage_growth,
                          cfg, "KV-cache usage", "increasing"))
    if cfg.max_latency_drift is not None:
        for key, what in (("ttft_p95_s", "TTFT p95"), ("tpot_p50_s", "TPOT p50")):
            out.append(_judge(f"soak.{key.rsplit('_', 1)[0]}_drift", fits[key], lambda t: t.relative_change(),
                              cfg.max_latency_drift, cfg, what, "increasing", " s"))
    if cfg.max_errors_per_window is not None:
        usable = [w for w in a["windows"] if w["excluded"] is None]
        if not usable:
            out.append(CheckResult.not_judged("soak.error_burst", "soak", None, cfg.max_errors_per_window,
                                              "no window outside the faults' spans"))
        else:
            worst = max(usable, key=lambda w: w["errors"])
            out.append(CheckResult("soak.error_burst", "soak", worst["errors"] <= cfg.max_errors_per_window,
                                   worst["errors"], cfg.max_errors_per_window,
                                   f"most failed tries in one window of {cfg.window_s:g} s: {worst['errors']} of "
                                   f"{worst['requests']} ({len(usable)} windows)"))
    return out


def section(run: RecordedRun) -> dict[str, Any]:
    """The ``soak`` block of ``report.json``: ``{"enabled", "window_s", "windows": [...]
    (:func:`soak_windows`), "trends": {series: {"slope" (per s), "start", "end", "span_s",
    "points"}|None} (the line of the incarnation with the most windows), "incarnation_trends":
    {series: [{"incarnation", "slope", "start", "end", "span_s", "points", "mann_kendall_s",
    "p_increasing", "p_decreasing"}]} (one per incarnation with a line)}``; just
    ``{"enabled": false}`` when off."""
    cfg = _cfg(run)
    if not cfg.enabled:
        return {"enabled": False}
    a = _analyse(run)

    def line(t: Trend) -> dict[str, Any]:
        return {"slope": t.slope, "start": t.start, "end": t.end, "span_s": t.span_s, "points": t.points}

    return {"enabled": True, "window_s": cfg.window_s, "windows": a["windows"],
            "trends": {k: line(max(fits, key=lambda f: f[1].points)[1]) if fits else None
                       for k, fits in a["fits"].items()},
            "incarnation_trends": {k: [{"incarnation": inc, **line(t), "mann_kendall_s": mk.s,
                                        "p_increasing": mk.p_increasing, "p_decreasing": mk.p_decreasing}
                                       for inc, t, mk in fits] for k, fits in a["fits"].items()}}

"""The timeline plot of a finished run (``<run_dir>/timeline.png``), drawn from recorded
data only, as every report is: ``records*.jsonl`` (:func:`harness.load.records.read_records`),
``timeline.jsonl`` (:func:`harness.timeline.read_timeline`), ``metrics.jsonl``
(:mod:`harness.metrics.speculation`) and ``probes.jsonl`` (the dense recovery probes).

Four panels on one x axis (seconds since the load started, or the first event):

1. latency: p50 and p95 TTFT and E2E (definitions of :mod:`harness.metrics.latency`) of the
   complete requests (:func:`harness.load.records.is_complete`) sent in each time bucket,
   in seconds, log scale; the recovery probes as dots (failed probes as crosses);
2. output tokens/s: tokens of every output chunk arriving in each bucket, complete or not
   (the same arrival rule as the report's ``output_tokens_per_s``);
3. error rate: not-complete ÷ all load requests *ending* in the bucket (when the client
   saw the error), 0..1;
4. acceptance rate: vLLM's Δaccepted ÷ Δdraft tokens per bucket, from the scraped
   ``/metrics`` counters (:func:`harness.metrics.speculation.window_acceptance`); the panel
   says so when nothing was scraped.

On every panel: fault windows shaded (``fault_injected`` → ``fault_cleared``, or the end
of the data when never cleared), server exits and supervised restarts marked (dashed
red: an unexpected ``server_exited``, dotted green: ``server_ready`` of a new
incarnation), phases (warm-up from ``load_started``, then baseline, fault, recovery,
after from :func:`harness.metrics.phases.phase_windows`) labelled along the top.

:func:`plot_timeline` raises on a run it cannot draw; :func:`try_plot_timeline` never
raises (a plot is a reading aid: its failure is logged and reported, the verdict stays).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")   # no display: CI, servers   # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker as ticker  # noqa: E402
import numpy as np  # noqa: E402

from harness.load.records import RequestRecord, is_complete, is_spec_load, read_records  # noqa: E402
from harness.metrics.latency import e2e_s, ttft_s  # noqa: E402
from harness.metrics.phases import phase_windows  # noqa: E402
from harness.metrics.scraper import METRICS_FILE  # noqa: E402
from harness.metrics.speculation import SpeculationSeries, read_series, server_lines, window_acceptance  # noqa: E402
from harness.timeline import fault_summary, read_timeline, server_events  # noqa: E402

__all__ = ["PLOT_FILE", "bucket_width_s", "timeline_series", "plot_timeline", "try_plot_timeline"]

log = logging.getLogger(__name__)

#: The plot's file name inside a run directory.
PLOT_FILE = "timeline.png"
#: Aim for about this many time buckets over the run (at least 1 s each).
TARGET_BUCKETS = 60
_PHASE_COLOURS = {"warm-up": "#eeeeee", "baseline": "#e3f2fd", "fault": "#ffebee", "recovery": "#fff8e1",
                  "after": "#e8f5e9"}


def bucket_width_s(duration_s: float, target: int = TARGET_BUCKETS) -> float:
    """A round bucket width (s) giving about ``target`` buckets over ``duration_s``:
    1, 2, 5, 10, 15, 30, 60, 120 … seconds, never below 1 s."""
    raw = max(1.0, duration_s / max(1, target))
    for w in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600):
        if raw <= w:
            return float(w)
    return float(math.ceil(raw / 600) * 600)


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def timeline_series(records: list[RequestRecord], t0: float, t1: float, width_s: float) -> dict[str, np.ndarray]:
    """Per-bucket series of the load records over ``[t0, t1)`` (epoch s), buckets of
    ``width_s`` seconds.

    Returns:
        ``{"t"`` (bucket starts, s after ``t0``), ``"ttft_p50"``, ``"ttft_p95"``,
        ``"e2e_p50"``, ``"e2e_p95"`` (s, NaN in a bucket without complete requests; by send
        time), ``"tokens_per_s"`` (output tokens arriving in the bucket ÷ ``width_s``),
        ``"error_rate"`` (not complete ÷ ended in the bucket, NaN without any),
        ``"ended"`` (requests ended per bucket)}; every array has one value per bucket.
    """
    n = max(1, int(math.ceil((t1 - t0) / width_s)))
    ttft: list[list[float]] = [[] for _ in range(n)]
    e2e: list[list[float]] = [[] for _ in range(n)]
    tokens = np.zeros(n)
    ended = np.zeros(n)
    failed = np.zeros(n)

    def index(t: float) -> int | None:
        i = int((t - t0) // width_s)
        return i if 0 <= i < n else None

    for r in records:
        ok = is_complete(r)[0]
        i = index(r.send_time)
        if ok and i is not None:
            for series, value in ((ttft, ttft_s(r)), (e2e, e2e_s(r))):
                if value is not None:
                    series[i].append(value)
        for off, k in zip(r.chunk_offsets_s, r.chunk_tokens):
            j = index(r.send_time + off)
            if j is not None:
                tokens[j] += k
        end = r.end_time
        j = index(end) if end is not None else None
        if j is not None:
            ended[j] += 1
            failed[j] += 0 if ok else 1
    with np.errstate(invalid="ignore", divide="ignore"):
        error_rate = np.where(ended > 0, failed / np.maximum(ended, 1), np.nan)
    return {"t": np.arange(n) * width_s,
            "ttft_p50": np.array([_pct(v, 50) for v in ttft]), "ttft_p95": np.array([_pct(v, 95) for v in ttft]),
            "e2e_p50": np.array([_pct(v, 50) for v in e2e]), "e2e_p95": np.array([_pct(v, 95) for v in e2e]),
            "tokens_per_s": tokens / width_s, "error_rate": error_rate, "ended": ended}


class NothingToPlot(ValueError):
    """The run recorded no timeline event and no request (it ended before the stack or the
    load started): no plot, and nothing wrong with the plotting."""


def _span(events: list[dict[str, Any]], records: list[RequestRecord]) -> tuple[float, float]:
    """``(start, end)`` of the plot in epoch s: the load's start (else the first event or
    send) to its stop (else the last event or record end)."""
    starts = [e["t"] for e in events if e.get("event") == "load_started"]
    stops = [e["t"] for e in events if e.get("event") == "load_stopped"]
    t0 = starts[0] if starts else min([e["t"] for e in events] + [r.send_time for r in records], default=None)
    t1 = stops[-1] if stops else max([e["t"] for e in events] + [r.end_time or r.send_time for r in records],
                                     default=None)
    if t0 is None or t1 is None:
        raise NothingToPlot("nothing to plot: no timeline events and no request records")
    return float(t0), float(max(t1, t0 + 1.0))


def _phases(events: list[dict[str, Any]], t0: float) -> list[tuple[str, float, float]]:
    """``[(label, start, end)]`` in epoch s: warm-up (load start → first phase), then the phases."""
    windows = phase_windows(events)
    out = []
    if windows:
        first = min(a for a, _ in windows.values())
        if first > t0:
            out.append(("warm-up", t0, first))
    out += [(ph, a, b) for ph, (a, b) in windows.items()]
    return out


def _read_probes(run_dir: Path) -> list[RequestRecord]:
    return read_records(run_dir / "probes.jsonl") if (run_dir / "probes.jsonl").exists() else []


def plot_timeline(run_dir: str | Path, out: str | Path | None = None, width_s: float | None = None,
                  title: str | None = None) -> Path:
    """Draw the timeline plot of a finished run directory (module doc) as a PNG.

    Args:
        run_dir: the run directory.
        out: where to write (default ``<run_dir>/timeline.png``).
        width_s: bucket width in seconds (default :func:`bucket_width_s` of the run's length).
        title: the plot's title (default the directory's name).

    Returns:
        The path written (a PNG of 1400 × 1000 pixels).

    Raises:
        ValueError: the directory holds neither timeline events nor request records.
        OSError: a file cannot be read or the PNG cannot be written.
    """
    d = Path(run_dir)
    events = read_timeline(d / "timeline.jsonl")
    records = [r for r in read_records(d / "records.jsonl") if is_spec_load(r)]
    t0, t1 = _span(events, records)
    width = width_s or bucket_width_s(t1 - t0)
    s = timeline_series(records, t0, t1, width)
    mid = s["t"] + width / 2

    fig, axes = plt.subplots(4, 1, figsize=(14, 10), dpi=100, sharex=True,
                             gridspec_kw={"height_ratios": [3, 2, 1.4, 1.4]})
    ax_lat, ax_tps, ax_err, ax_acc = axes

    # latency
    for key, label, style in (("ttft_p50", "TTFT p50", "C0-"), ("ttft_p95", "TTFT p95", "C0--"),
                              ("e2e_p50", "E2E p50", "C1-"), ("e2e_p95", "E2E p95", "C1--")):
        ax_lat.plot(mid, s[key], style, marker=".", label=label)
    probes = _read_probes(d)
    if probes:
        good = [(p.send_time - t0, e2e_s(p)) for p in probes if is_complete(p)[0] and e2e_s(p)]
        bad = [p.send_time - t0 for p in probes if not is_complete(p)[0]]
        if good:
            ax_lat.plot(*zip(*good), "o", ms=3, color="C2", alpha=0.6, label="recovery probe E2E")
        if bad:
            ax_lat.plot(bad, [ax_lat.get_ylim()[0] if ax_lat.has_data() else 0.01] * len(bad), "x", color="C3",
                        label="failed probe")
    ax_lat.set_ylabel("latency (s)")
    if np.isfinite(np.concatenate([s["ttft_p50"], s["e2e_p95"]])).any():
        ax_lat.set_yscale("log")
    ax_lat.legend(loc="best", fontsize=8, ncol=3)
    if ax_lat.get_yscale() == "log":   # labels at 1, 2, 5 × 10^k, written plainly (0.02, not 2×10⁻²)
        ax_lat.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax_lat.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
        ax_lat.yaxis.set_minor_formatter(ticker.NullFormatter())
    fig.suptitle(f"{title or d.name}: {width:g} s buckets (latency of complete requests by send time; red: fault)",
                 fontsize=11, x=0.01, ha="left")

    # tokens/s
    ax_tps.bar(s["t"], s["tokens_per_s"], width=width, align="edge", color="C4", alpha=0.7)
    ax_tps.set_ylabel("output tokens/s")

    # error rate
    ax_err.plot(mid, s["error_rate"], "C3-", marker=".")
    ax_err.set_ylim(-0.05, 1.05)
    ax_err.set_ylabel("error rate")

    # acceptance rate (vLLM's /metrics)
    lines = server_lines(read_series(d / METRICS_FILE), "spec")
    series = SpeculationSeries(lines) if lines else None
    if series is not None and series.speculative:
        wins = window_acceptance(series, width, start=t0, end=t1)
        xs = [(w["start"] + w["end"]) / 2 - t0 for w in wins]
        ys = [np.nan if w["acceptance_rate"] is None else w["acceptance_rate"] for w in wins]
        ax_acc.plot(xs, ys, "C5-", marker=".")
        ax_acc.set_ylim(-0.05, 1.05)
    else:
        ax_acc.text(0.5, 0.5, "acceptance rate: not scraped (no spec-decode counters in metrics.jsonl)",
                    ha="center", va="center", transform=ax_acc.transAxes, fontsize=9, color="grey")
    ax_acc.set_ylabel("acceptance rate")
    ax_acc.set_xlabel("seconds since the load started")

    # phases, faults, restarts on every panel
    phases = _phases(events, t0)
    for ax in axes:
        for name, a, b in phases:
            ax.axvspan(a - t0, b - t0, color=_PHASE_COLOURS.get(name, "#f5f5f5"), alpha=0.5, zorder=0, lw=0)
        ax.grid(True, alpha=0.3)
    for name, a, b in phases:
        ax_lat.text((a + b) / 2 - t0, 1.01, name, transform=ax_lat.get_xaxis_transform(), ha="center", va="bottom",
                    fontsize=9, fontweight="bold")
    for f in fault_summary(events):
        a = float(f["injected_at"]) - t0
        b = (float(f["cleared_at"]) if f.get("cleared_at") is not None else t1) - t0
        for ax in axes:
            ax.axvspan(a, max(b, a + width / 20), color="red", alpha=0.18, zorder=1, lw=0)
        ax_err.text(a, 0.95, f" {f.get('kind')} on {f.get('target')}", fontsize=8, color="darkred", va="top")
    for e in server_events(events):
        x = float(e["t"]) - t0
        if e["event"] == "server_exited" and not e.get("expected"):
            for ax in axes:
                ax.axvline(x, color="red", ls="--", lw=1)
            ax_tps.text(x, 0.98, f" {e.get('server')} exited", transform=ax_tps.get_xaxis_transform(), fontsize=8,
                        color="red", va="top")
        elif e["event"] == "server_ready" and (e.get("incarnation") or 0) > 0:
            for ax in axes:
                ax.axvline(x, color="green", ls=":", lw=1.2)
            ax_tps.text(x, 0.85, f" {e.get('server')} restarted", transform=ax_tps.get_xaxis_transform(),
                        fontsize=8, color="green", va="top")
    ax_acc.set_xlim(0, t1 - t0)
    fig.subplots_adjust(left=0.06, right=0.99, top=0.92, bottom=0.06, hspace=0.12)   # fixed size: no layout pass
    path = Path(out) if out else d / PLOT_FILE
    try:
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return path


def try_plot_timeline(run_dir: str | Path, out: str | Path | None = None,
                      title: str | None = None) -> tuple[Path | None, str | None]:
    """:func:`plot_timeline` that never raises: ``(path, None)`` when drawn, else
    ``(None, "timeline plot failed: <error>")`` (also logged) — a plot error never
    changes a run's verdict."""
    try:
        return plot_timeline(run_dir, out, title=title), None
    except Exception as exc:  # noqa: BLE001  (a reading aid: any failure is reported, never raised)
        if isinstance(exc, NothingToPlot):
            log.info("no timeline plot of %s: %s", run_dir, exc)
        else:   # one line; the traceback at debug level
            log.warning("timeline plot of %s failed: %s: %s", run_dir, type(exc).__name__, exc)
            log.debug("timeline plot of %s failed", run_dir, exc_info=True)
        return None, f"timeline plot failed: {type(exc).__name__}: {exc}"

"""GPU health, judged on what the GPU telemetry sampler recorded (``gpu.jsonl``,
:mod:`harness.metrics.gpu_telemetry`) against the experiment's ``gpu`` limits
(:class:`harness.checks.config.GpuConfig`). Checks, per GPU *i* (category ``gpu``):

* ``gpu.gpu<i>.temperature_max_c`` — the hottest sample in the judged phases ≤
  ``max_temperature_c`` (°C).
* ``gpu.gpu<i>.temperature_slope_c_per_min`` — the steepest temperature change, °C per
  minute: the least-squares slope over each window of ``slope_window_s`` seconds ending at a
  sample, with ≥ ``min_samples`` samples spanning ≥ half the window, rising or falling
  (:func:`max_slope_per_min`) ≤ ``max_temperature_slope_c_per_min``.
* ``gpu.gpu<i>.ecc_corrected_per_hour`` / ``ecc_uncorrected_per_hour`` — ECC errors added
  (the volatile counts; a drop, e.g. a driver reload, adds nothing) within any window of
  ``ecc_window_s`` seconds, × 3600 ÷ ``ecc_window_s`` (:func:`growth_per_hour`) ≤ the limit.
* ``gpu.gpu<i>.pcie_utilisation_p95`` — p95 of max(TX, RX) ÷ the link's bandwidth per
  direction (:func:`pcie_bandwidth_bytes_per_s` of the current generation and width) ≤
  ``max_pcie_utilisation``.
* ``gpu.gpu<i>.xid_events`` — XID events NVML delivered (an event set, where the GPU
  supports one) over the whole recording, warm-up included, whose number is not in
  ``expected_xids``: must be 0.
* ``gpu.gpu<i>.<phase>.throttle_reasons`` — none of ``throttle_reasons`` seen in a sample of
  each phase of ``throttle_phases``.
* ``gpu.gpu<i>.<phase>.sm_clock_drop`` — 1 − (the phase's median SM clock ÷ the baseline's),
  samples marked ``GpuIdle`` left out, ≤ ``max_sm_clock_drop`` in each judged phase after
  the baseline.

Run-wide checks look at the samples inside the phases of ``gpu.phases``. A check whose data
is missing is **not judged** (N/J, the reason in its detail), never passed: on a host
without an NVIDIA GPU (the telemetry event's note, e.g. ``no NVIDIA GPU on this host
(NVML: NVML Shared Library Not Found)``) each check appears once, without a GPU index
(``gpu.temperature_max_c``...), N/J with that note; so does a run that recorded no
telemetry, a GPU that does not give a reading (ECC disabled, no event support), a window
too short for a slope, a phase with too few samples.

The GPU memory swing (``server_memory.gpu<i>.<phase>.memory_swing``) is judged by
:mod:`harness.checks.server_memory` on the same series (:func:`series`) with the same rule,
between server restarts (a GPU is shared by the stack's servers: its memory falls when a
killed server's processes free it and rises while the new one loads, which is the restart,
not a swing). The figures here describe the device (temperature, clocks, ECC, PCIe), not a
server process, and are judged over the whole phases.
"""

from __future__ import annotations

import statistics
from typing import Any

from harness.checks.base import CheckResult, RecordedRun
from harness.checks.view import Line, View
from harness.checks.config import GpuConfig
from harness.metrics.gpu_telemetry import GPU_FILE, read_gpu_series
from harness.metrics.latency import distribution, percentiles

__all__ = ["summarize",
           "series", "telemetry_note", "max_slope_per_min", "growth_per_hour", "pcie_bandwidth_bytes_per_s",
           "pcie_utilisation", "check", "section"]

#: Per-lane transfer rate (GT/s) and line-code efficiency of each PCIe generation.
PCIE_GENERATIONS = {1: (2.5, 8 / 10), 2: (5.0, 8 / 10), 3: (8.0, 128 / 130), 4: (16.0, 128 / 130),
                    5: (32.0, 128 / 130), 6: (64.0, 242 / 256)}
#: The phase every other phase's SM clock is compared with.
BASELINE = "baseline"
IDLE_REASON = "GpuIdle"


# ---------------------------------------------------------------------------- the recorded data
def series(run: RecordedRun) -> list[dict[str, Any]]:
    """The run's ``gpu.jsonl`` lines in time order (read once per run; [] without a run directory)."""
    if "gpu_lines" not in run.memo:
        run.memo["gpu_lines"] = read_gpu_series(run.run_dir / GPU_FILE) if run.run_dir is not None else []
    return run.memo["gpu_lines"]


def telemetry_note(run: RecordedRun) -> tuple[bool | None, str | None]:
    """``(available, note)`` from the run's ``gpu_telemetry`` event: ``(None, "no GPU telemetry
    recorded in this run")`` without one; ``(False, "no NVIDIA GPU on this host (...)")`` on a
    host without a GPU; ``(True, None)`` when the sampler ran."""
    event = next((e for e in run.events if e.get("event") == "gpu_telemetry"), None)
    if event is None:
        return None, "no GPU telemetry recorded in this run"
    return bool(event.get("available")), event.get("note")


def _by_gpu(lines: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for s in lines:
        out.setdefault(int(s.get("index", 0)), []).append(s)
    return dict(sorted(out.items()))


def _within(samples: list[dict[str, Any]], windows: list[tuple[float, float]]) -> list[dict[str, Any]]:
    return [s for s in samples if any(a <= s["t"] < b for a, b in windows)]


def _points(samples: list[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    return [(float(s["t"]), float(s[key])) for s in samples if s.get(key) is not None]


# ---------------------------------------------------------------------------- pure measures
def max_slope_per_min(points: list[tuple[float, float]], window_s: float, min_samples: int) -> dict[str, Any] | None:
    """The steepest least-squares slope (value units per minute) over the windows
    ``(t_i − window_s, t_i]`` ending at each point that hold ≥ ``min_samples`` points
    spanning ≥ ``window_s`` / 2 seconds; by absolute value (a fall counts as a rise does).

    Returns:
        ``{"slope_per_min", "from_t", "to_t", "samples", "windows"}`` (epoch s; ``windows``:
        how many windows were judged), or None when no window qualifies.
    """
    pts = sorted(points)
    best: dict[str, Any] | None = None
    judged = 0
    lo = 0
    for hi in range(len(pts)):
        t_end = pts[hi][0]
        while pts[lo][0] <= t_end - window_s:
            lo += 1
        win = pts[lo:hi + 1]
        if len(win) < min_samples or win[-1][0] - win[0][0] < window_s / 2:
            continue
        judged += 1
        n = len(win)
        mt = sum(t for t, _ in win) / n
        mv = sum(v for _, v in win) / n
        var = sum((t - mt) ** 2 for t, _ in win)
        slope = sum((t - mt) * (v - mv) for t, v in win) / var * 60.0
        if best is None or abs(slope) > abs(best["slope_per_min"]):
            best = {"slope_per_min": slope, "from_t": win[0][0], "to_t": win[-1][0], "samples": n}
    if best is not None:
        best["windows"] = judged
    return best


def growth_per_hour(points: list[tuple[float, float]], window_s: float) -> dict[str, Any] | None:
    """A counter's growth per hour: the most it grew within any window of ``window_s``
    seconds (increments summed, a drop adds nothing) × 3600 ÷ ``window_s``.

    Returns:
        ``{"per_hour", "added", "from_t", "to_t", "total_added"}`` (``from_t``/``to_t``: the
        samples bounding the worst window, epoch s), or None without a point.
    """
    pts = sorted(points)
    if not pts:
        return None
    steps = [(t1, max(0.0, v1 - v0)) for (_, v0), (t1, v1) in zip(pts, pts[1:])]
    best = {"added": 0.0, "from_t": pts[0][0], "to_t": pts[0][0]}
    lo, total = 0, 0.0
    for hi, (t_end, inc) in enumerate(steps):
        total += inc
        while steps[lo][0] <= t_end - window_s:
            total -= steps[lo][1]
            lo += 1
        if total > best["added"]:
            best = {"added": total, "from_t": pts[lo][0], "to_t": t_end}
    return {**best, "per_hour": best["added"] * 3600.0 / window_s, "total_added": sum(i for _, i in steps)}


def pcie_bandwidth_bytes_per_s(gen: int | None, width: int | None) -> float | None:
    """A PCIe link's bandwidth per direction, bytes/s: lanes × transfer rate × line-code
    efficiency ÷ 8 (gen 4 x16: 31.5 GB/s); None for an unknown generation or no width."""
    if not width or gen not in PCIE_GENERATIONS:
        return None
    gts, efficiency = PCIE_GENERATIONS[int(gen)]
    return int(width) * gts * 1e9 * efficiency / 8


def pcie_utilisation(sample: dict[str, Any]) -> float | None:
    """max(TX, RX) bytes/s ÷ the link's bandwidth per direction, for one ``gpu.jsonl`` line;
    None when a reading is missing."""
    bw = pcie_bandwidth_bytes_per_s(sample.get("pcie_link_gen"), sample.get("pcie_link_width"))
    flows = [v for v in (sample.get("pcie_tx_bytes_per_s"), sample.get("pcie_rx_bytes_per_s")) if v is not None]
    if bw is None or not flows:
        return None
    return max(flows) / bw


def _xids(samples: list[dict[str, Any]]) -> tuple[bool, list[tuple[float, int]]]:
    """(whether any sample watched events, [(t, xid)] of the XID events recorded)."""
    watched = any(isinstance(s.get("events"), list) for s in samples)
    found = [(float(s["t"]), int(e["xid"])) for s in samples for e in (s.get("events") or [])
             if e.get("type") == "xid" and e.get("xid") is not None]
    return watched, found


def _busy_clock_median(samples: list[dict[str, Any]]) -> tuple[float | None, int]:
    vals = [float(s["sm_clock_mhz"]) for s in samples
            if s.get("sm_clock_mhz") is not None and IDLE_REASON not in (s.get("throttle_reasons") or [])]
    return (statistics.median(vals) if vals else None), len(vals)


# ---------------------------------------------------------------------------- checks
def _cfg(run: RecordedRun) -> GpuConfig:
    return getattr(run.limits, "gpu", None) or GpuConfig()


def _names(cfg: GpuConfig) -> list[tuple[str, Any]]:
    """(check name without GPU index, limit) of every check the config asks for."""
    out = [(n, lim) for n, lim in (
        ("temperature_max_c", cfg.max_temperature_c),
        ("temperature_slope_c_per_min", cfg.max_temperature_slope_c_per_min),
        ("ecc_corrected_per_hour", cfg.max_ecc_corrected_per_hour),
        ("ecc_uncorrected_per_hour", cfg.max_ecc_uncorrected_per_hour),
        ("pcie_utilisation_p95", cfg.max_pcie_utilisation)) if lim is not None]
    out.append(("xid_events", 0))
    if cfg.throttle_reasons and cfg.throttle_phases:
        out.append(("throttle_reasons", _throttle_limit(cfg)))
    if cfg.max_sm_clock_drop is not None:
        out.append(("sm_clock_drop", cfg.max_sm_clock_drop))
    return out


def _throttle_limit(cfg: GpuConfig) -> str:
    return "none of " + ", ".join(cfg.throttle_reasons)


def _nj(name: str, limit: Any, why: str) -> CheckResult:
    return CheckResult.not_judged(name, "gpu", None, limit, why)


def _run_wide(i: int, samples: list[dict[str, Any]], sel: list[dict[str, Any]], cfg: GpuConfig,
              phases: str) -> list[CheckResult]:
    out: list[CheckResult] = []
    p = f"gpu.gpu{i}"
    if cfg.max_temperature_c is not None:
        temps = _points(sel, "temperature_c")
        if not temps:
            out.append(_nj(f"{p}.temperature_max_c", cfg.max_temperature_c, f"no temperature reading in {phases}"))
        else:
            t, hot = max(temps, key=lambda x: x[1])
            out.append(CheckResult(f"{p}.temperature_max_c", "gpu", hot <= cfg.max_temperature_c, hot,
                                   cfg.max_temperature_c, f"GPU {i} hottest {hot:g} °C at {t:.3f} over {len(temps)} "
                                                          f"samples in {phases}"))
    if cfg.max_temperature_slope_c_per_min is not None:
        limit = cfg.max_temperature_slope_c_per_min
        s = max_slope_per_min(_points(sel, "temperature_c"), cfg.slope_window_s, cfg.min_samples)
        if s is None:
            out.append(_nj(f"{p}.temperature_slope_c_per_min", limit,
                           f"no window of {cfg.slope_window_s:g} s in {phases} with ≥ {cfg.min_samples} temperature "
                           f"samples spanning ≥ {cfg.slope_window_s / 2:g} s"))
        else:
            slope = s["slope_per_min"]
            out.append(CheckResult(f"{p}.temperature_slope_c_per_min", "gpu", abs(slope) <= limit, round(slope, 3),
                                   limit, f"GPU {i} steepest change {slope:+.2f} °C/min (least-squares slope over "
                                          f"{s['samples']} samples, {s['from_t']:.3f} → {s['to_t']:.3f}; "
                                          f"{s['windows']} window(s) of {cfg.slope_window_s:g} s judged; "
                                          f"|slope| ≤ limit)"))
    for kind, limit in (("corrected", cfg.max_ecc_corrected_per_hour), ("uncorrected", cfg.max_ecc_uncorrected_per_hour)):
        if limit is None:
            continue
        name = f"{p}.ecc_{kind}_per_hour"
        g = growth_per_hour(_points(sel, f"ecc_{kind}"), cfg.ecc_window_s)
        if g is None:
            out.append(_nj(name, limit, f"no {kind} ECC count in {phases} (ECC disabled or not supported on this GPU)"))
            continue
        if not g["total_added"]:
            how = f"no {kind} ECC error added over {len(_points(sel, f'ecc_{kind}'))} samples in {phases}"
        else:
            how = (f"{g['added']:g} {kind} ECC error(s) added within {cfg.ecc_window_s:g} s ({g['from_t']:.3f} → "
                   f"{g['to_t']:.3f}; {g['total_added']:g} in all {phases}) = {g['per_hour']:.1f}/h (added in the "
                   f"worst window × 3600 ÷ {cfg.ecc_window_s:g})")
        out.append(CheckResult(name, "gpu", g["per_hour"] <= limit, round(g["per_hour"], 3), limit, f"GPU {i}: {how}"))
    if cfg.max_pcie_utilisation is not None:
        utils = [u for u in (pcie_utilisation(s) for s in sel) if u is not None]
        name = f"{p}.pcie_utilisation_p95"
        if not utils:
            out.append(_nj(name, cfg.max_pcie_utilisation, f"no PCIe throughput or link reading in {phases}"))
        else:
            p95 = percentiles(utils, (95,))["p95"]
            out.append(CheckResult(name, "gpu", p95 <= cfg.max_pcie_utilisation, round(p95, 4), cfg.max_pcie_utilisation,
                                   f"GPU {i}: p95 of max(TX, RX) ÷ link bandwidth per direction over {len(utils)} "
                                   f"samples in {phases} (max {max(utils):.3f})"))
    watched, xids = _xids(samples)
    name = f"{p}.xid_events"
    if not watched:
        out.append(_nj(name, 0, "NVML delivered no event set for this GPU (XID events not supported here)"))
    else:
        bad = [(t, x) for t, x in xids if x not in cfg.expected_xids]
        expected = f"; expected (not failing): {sorted(set(cfg.expected_xids))}" if cfg.expected_xids else ""
        what = ", ".join(f"XID {x} at {t:.3f}" for t, x in bad[:10]) or "none"
        out.append(CheckResult(name, "gpu", not bad, len(bad), 0,
                               f"GPU {i}: unexpected XID events over the whole recording: {what}{expected}"))
    return out


def _per_phase(i: int, samples: list[dict[str, Any]], run: RecordedRun, cfg: GpuConfig) -> list[CheckResult]:
    out: list[CheckResult] = []
    p = f"gpu.gpu{i}"
    if cfg.throttle_reasons and cfg.throttle_phases:
        limit = _throttle_limit(cfg)
        for ph in cfg.throttle_phases:
            name = f"{p}.{ph}.throttle_reasons"
            if ph not in run.windows:
                out.append(_nj(name, limit, f"the run has no {ph} phase"))
                continue
            ss = [s for s in _within(samples, [run.windows[ph]]) if s.get("throttle_reasons_mask") is not None
                  or s.get("throttle_reasons")]
            if not ss:
                out.append(_nj(name, limit, f"no sample with clock event reasons in the {ph} phase"))
                continue
            seen: dict[str, list[float]] = {}
            for s in ss:
                for r in s.get("throttle_reasons") or []:
                    if r in cfg.throttle_reasons:
                        seen.setdefault(r, []).append(float(s["t"]))
            detail = "; ".join(f"{r} in {len(ts)} of {len(ss)} samples from {min(ts):.3f}" for r, ts in sorted(seen.items()))
            out.append(CheckResult(name, "gpu", not seen, ", ".join(sorted(seen)) or "none", limit,
                                   f"GPU {i}, {ph}: " + (detail or f"none over {len(ss)} samples")))
    if cfg.max_sm_clock_drop is not None:
        limit = cfg.max_sm_clock_drop
        base, nb = _busy_clock_median(_within(samples, [run.windows[BASELINE]])) if BASELINE in run.windows else (None, 0)
        for ph in [ph for ph in cfg.phases if ph != BASELINE]:
            name = f"{p}.{ph}.sm_clock_drop"
            if ph not in run.windows:
                out.append(_nj(name, limit, f"the run has no {ph} phase"))
                continue
            if base is None or nb < cfg.min_samples:
                out.append(_nj(name, limit, f"{nb} busy (not GpuIdle) SM clock samples in the baseline, fewer than "
                                            f"{cfg.min_samples}"))
                continue
            med, n = _busy_clock_median(_within(samples, [run.windows[ph]]))
            if med is None or n < cfg.min_samples:
                out.append(_nj(name, limit, f"{n} busy (not GpuIdle) SM clock samples in the {ph} phase, fewer than "
                                            f"{cfg.min_samples}"))
                continue
            drop = max(0.0, 1.0 - med / base)
            out.append(CheckResult(name, "gpu", drop <= limit, round(drop, 4), limit,
                                   f"GPU {i}: median SM clock {med:g} MHz in {ph} ({n} busy samples) vs {base:g} MHz in "
                                   f"the baseline ({nb}); drop = 1 − {ph} ÷ baseline"))
    return out


def check(run: RecordedRun) -> list[CheckResult]:
    """Every GPU check of the module doc, per GPU; N/J with the reason where the data is missing."""
    cfg = _cfg(run)
    available, note = telemetry_note(run)
    gpus = _by_gpu(series(run))
    if not available or not gpus:
        why = note if not available else "the GPU telemetry sampler recorded no sample"
        return [_nj(f"gpu.{n}", lim, why or "no GPU telemetry") for n, lim in _names(cfg)]
    windows = [run.windows[ph] for ph in cfg.phases if ph in run.windows]
    phases = "the phases " + "/".join(ph for ph in cfg.phases if ph in run.windows) if windows else \
        f"the phases {'/'.join(cfg.phases)} (none in this run)"
    out: list[CheckResult] = []
    for i, samples in gpus.items():
        out += _run_wide(i, samples, _within(samples, windows), cfg, phases)
        out += _per_phase(i, samples, run, cfg)
    return out


# ---------------------------------------------------------------------------- report section
def _extreme(values: list[Any], fn: Any) -> Any:
    vals = [v for v in values if v is not None]
    return fn(vals) if vals else None


def section(run: RecordedRun) -> dict[str, Any]:
    """The ``gpu`` block of ``report.json``::

        {"available": bool|None (None: the run recorded no telemetry event), "note": str|None,
         "samples": int, "gpus": [{"index", "name", "samples", "temperature_c_max",
         "temperature_slope_c_per_min" (steepest, signed; None: no window), "sm_clock_mhz_min",
         "sm_clock_mhz_max", "throttle_reasons_seen": [str], "memory_used_bytes_max", "power_w_max",
         "ecc_corrected_delta", "ecc_uncorrected_delta", "gpu_util_pct_mean", "memory_util_pct_mean",
         "pcie_utilisation_p95", "pcie_utilisation_max", "events_supported": bool,
         "xid_events": [{"t", "xid"}], "sampler_wall_ms": {"n", "mean", "p50", ..., "max"},
         "sampler_cpu_ms": {...}}]}

    ``sampler_*_ms``: what one reading of that GPU cost the sampler (wall clock; CPU time of
    its thread), over the run's samples.
    """
    available, note = telemetry_note(run)
    if available is None:
        return {"available": None, "note": note, "samples": 0, "gpus": []}
    cfg = _cfg(run)
    lines = series(run)
    gpus = []
    for index, ss in _by_gpu(lines).items():
        def col(key: str, ss: list[dict[str, Any]] = ss) -> list[Any]:
            return [s.get(key) for s in ss]

        def delta(key: str) -> Any:
            vals = [v for v in col(key) if v is not None]
            return vals[-1] - vals[0] if vals else None

        def cost(key: str) -> dict[str, Any]:
            return {**distribution(col(key)), "max": _extreme(col(key), max)}

        slope = max_slope_per_min(_points(ss, "temperature_c"), cfg.slope_window_s, cfg.min_samples)
        utils = [u for u in (pcie_utilisation(s) for s in ss) if u is not None]
        watched, xids = _xids(ss)
        gpus.append({
            "index": index, "name": ss[0].get("name"), "samples": len(ss),
            "temperature_c_max": _extreme(col("temperature_c"), max),
            "temperature_slope_c_per_min": None if slope is None else round(slope["slope_per_min"], 3),
            "sm_clock_mhz_min": _extreme(col("sm_clock_mhz"), min),
            "sm_clock_mhz_max": _extreme(col("sm_clock_mhz"), max),
            "throttle_reasons_seen": sorted({r for s in ss for r in (s.get("throttle_reasons") or [])}),
            "memory_used_bytes_max": _extreme(col("memory_used_bytes"), max),
            "power_w_max": _extreme(col("power_w"), max),
            "ecc_corrected_delta": delta("ecc_corrected"), "ecc_uncorrected_delta": delta("ecc_uncorrected"),
            "gpu_util_pct_mean": distribution(col("gpu_util_pct"))["mean"],
            "memory_util_pct_mean": distribution(col("memory_util_pct"))["mean"],
            "pcie_utilisation_p95": percentiles(utils, (95,))["p95"], "pcie_utilisation_max": _extreme(utils, max),
            "events_supported": watched, "xid_events": [{"t": t, "xid": x} for t, x in xids],
            "sampler_wall_ms": cost("sample_wall_ms"), "sampler_cpu_ms": cost("sample_cpu_ms"),
        })
    return {"available": bool(available), "note": note, "samples": len({s.get("t") for s in lines}), "gpus": gpus}


def summarize(sec: dict[str, Any] | None) -> list[View]:
    """The terminal/Allure view of :func:`section`: one line on the telemetry (its note on a
    host without a GPU)."""
    if not sec:
        return []
    if sec.get("available") is False and sec.get("note"):
        return [Line(f"GPU telemetry: {sec['note']}", "note")]
    if sec.get("available"):
        return [Line(f"GPU telemetry: {len(sec.get('gpus') or [])} GPU(s), {sec.get('samples')} samples (gpu.jsonl)")]
    return []

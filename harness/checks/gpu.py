"""The report's ``gpu`` section: what the GPU telemetry sampler
(:mod:`harness.metrics.gpu_telemetry`) recorded, summarised per GPU. Recorded first, judged
later: this family has no checks yet, so a host without an NVIDIA GPU never fails a run —
its section carries the note instead.

Section::

    {"available": bool|None (None: the run recorded no telemetry event), "note": str|None,
     "samples": int, "gpus": [{"index", "name", "samples", "temperature_c_max",
     "sm_clock_mhz_min", "sm_clock_mhz_max", "throttle_reasons_seen": [str],
     "memory_used_bytes_max", "power_w_max", "ecc_corrected_delta", "ecc_uncorrected_delta"}]}
"""

from __future__ import annotations

import json
from typing import Any

from harness.checks.base import CheckResult, RecordedRun

__all__ = ["check", "section"]

GPU_FILE = "gpu.jsonl"


def check(run: RecordedRun) -> list[CheckResult]:
    """No GPU check yet (the telemetry is recorded and reported only)."""
    return []


def _series(run: RecordedRun) -> list[dict[str, Any]]:
    path = run.run_dir / GPU_FILE if run.run_dir is not None else None
    if path is None or not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _extreme(values: list[Any], fn: Any) -> Any:
    vals = [v for v in values if v is not None]
    return fn(vals) if vals else None


def section(run: RecordedRun) -> dict[str, Any]:
    """The ``gpu`` block of ``report.json`` (see module doc)."""
    event = next((e for e in run.events if e.get("event") == "gpu_telemetry"), None)
    if event is None:
        return {"available": None, "note": "no GPU telemetry recorded in this run", "samples": 0, "gpus": []}
    series = _series(run)
    gpus = []
    for index in sorted({s.get("index") for s in series}):
        ss = [s for s in series if s.get("index") == index]

        def col(key: str, ss: list[dict[str, Any]] = ss) -> list[Any]:
            return [s.get(key) for s in ss]

        def delta(key: str) -> Any:
            vals = [v for v in col(key) if v is not None]
            return vals[-1] - vals[0] if vals else None

        gpus.append({
            "index": index, "name": ss[0].get("name"), "samples": len(ss),
            "temperature_c_max": _extreme(col("temperature_c"), max),
            "sm_clock_mhz_min": _extreme(col("sm_clock_mhz"), min),
            "sm_clock_mhz_max": _extreme(col("sm_clock_mhz"), max),
            "throttle_reasons_seen": sorted({r for s in ss for r in (s.get("throttle_reasons") or [])}),
            "memory_used_bytes_max": _extreme(col("memory_used_bytes"), max),
            "power_w_max": _extreme(col("power_w"), max),
            "ecc_corrected_delta": delta("ecc_corrected"), "ecc_uncorrected_delta": delta("ecc_uncorrected"),
        })
    return {"available": bool(event.get("available")), "note": event.get("note"),
            "samples": len({s.get("t") for s in series}), "gpus": gpus}

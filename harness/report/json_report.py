"""The run report as plain JSON (``report.json``).

The report is a plain dict anyone can read without this code; :func:`build_report`
assembles it from what the judge computed, :func:`write_report` writes it atomically.
Instants are epoch seconds, durations seconds. Schema (more fields may be present)::

    {"experiment": str, "verdict": "pass"|"fail"|"aborted"|"error",
     "stack": {"launcher": str, "vllm_version": str,
               "speculative": {"method": str, "draft": str|null, "num_speculative_tokens": int}},
     "faults": [{"fault_id": str, "kind": str, "target": str, "injected_at": float,
                 "cleared_at": float|null, "acted": bool, "evidence": dict|null}],
     "fault_time": float|null,
     "phases": {phase: {"start", "end", "duration_s",
                        "requests", "errors", "error_rate", "retried" (logical requests: every
                        try of one logical_id once, failed when its last try failed),
                        "tries", "failed_tries" (every HTTP request), "complete",
                        "unavailable_s" (seconds the server refused or failed every request),
                        "min_samples", "enough_samples" (complete >= min_samples; else the
                        summary prints n=K and the latency checks are not judged),
                        "ttft_s", "tpot_s", "itl_s" (per chunk, as vLLM), "itl_per_token_s",
                        "e2e_s": {"n", "mean", "p50", "p90", "p95", "p99", "p99.9"},
                        "latency_window": {"first_send", "last_send", "outage_start", "outage_end", "sent_after_outage_start"},
                        "buckets": {prompt_class: {"tries", "complete", "enough_samples", "ttft_s", ...}},
                        "request_classes": {request_class: {...as buckets}} (with load.request_classes),
                        "output_tokens", "output_tokens_per_s" (arriving in the window),
                        "total_output_tokens", "output_throughput_tps" (vLLM's),
                        "request_throughput_rps", "goodput_rps", "mean_tokens_per_chunk"}},
     "checks": [{"name", "category", "passed" (true, false, or null: not judged), "judged",
                 "observed", "limit", "detail"}],
     "availability": {"definition", "servers": {server: {"unavailable_s", "intervals": [[start, end]],
                      "phases": {phase: {"unavailable_s", "requests", "failed", "retried", "tries",
                      "failed_tries"}}}}} (harness.checks.availability),
     "requests": {"total", "ok", "failed", "client_ok" (tries), "logical", "logical_failed"},
     "integrity": {"compared", "mismatched", "near_ties" (a greedy flip at a near-tie of the
                   reference's logprobs, not counted as mismatched), "malformed", "cut_by_planned_stop"
                   (cut while the harness stopped the server for a planned restart, not
                   counted as malformed), "false_success",
                   "not_comparable" (sampled, or a request class the plain reference does not
                   predict: not compared), "first_divergence", "examples",
                   "classes" (only with load.request_classes): {name: {"responses", "compared",
                   "invariants": {invariant: {"judged", "violations", "first": {"request_id",
                   "detail"}|null}}}} (harness.checks.request_classes)},
     "mirror": {"enabled", "groups": [...]} (speculative vs plain, :mod:`harness.checks.mirror`),
     "recovery": {"time_to_healthy_s", "time_to_first_success_s", "time_to_slo_s",
                  "measured_from": float|null, "resolution_s": float|null (how precisely the
                  first two are known), "resolution": {"time_to_healthy_s", "time_to_first_success_s"}},
     "safeguards": {"configured": [...], "breaches": {name: {...}|null},
                    "abort": {"safeguard", "metric", "observed", "n", "limit", "window_s", "for_s",
                              "breach_start", "due_at", "detected_at", "aborted_at",
                              "detection_latency_s", "breach_to_abort_s", "fault_to_abort_s",
                              "reason"}|null} (harness.checks.safeguards),
     "fail_fast": {"in_flight": int, "max_error_latency_s": float},
     "speculation": {"servers": {name: {"speculative", "phases": {phase: {"acceptance_rate",
                     "mean_acceptance_length", "per_position_acceptance", ...}}, "windows", ...}}}
                    (vLLM's /metrics counters; harness.checks.speculation),
     "server_memory": {"servers": {name: {phase: {"swing", "min", "max"}}}, "gpu_note"}
                    (harness.checks.server_memory),
     "gpu": {"available", "note", "samples", "gpus": [{"index", "name", "temperature_c_max",
             "temperature_slope_c_per_min", "xid_events", "pcie_utilisation_p95", "sampler_wall_ms", ...}]}
            (the GPU telemetry per GPU, harness.checks.gpu.section),
     "required": {"judged": int, "of": int, "checks": [{"name", "why", "judged", "checks", "reason"}]}
                 (what the experiment requires to be judged, harness.checks.required),
     "restarts": int, "server_events": [...], "fault_evidence": [...],
     "errors": [str], "interrupted": bool, "journal_status": str|null,
     "steady_state": {...}, "generated_at": float,
     "acceptance_floor": {"source": "client", "num_speculative_tokens", "total", "buckets",
                          "request_classes" (with load.request_classes), "phases", "floors",
                          "note"} (harness.checks.acceptance_floor.section)}
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterable

from harness.checks.base import CheckResult
from harness.report.schema import SCHEMA_VERSION, Report

__all__ = ["SCHEMA_VERSION", "jsonable", "build_report", "write_report", "read_report"]


def jsonable(value: Any) -> Any:
    """``value`` made strict-JSON safe: numpy scalars → Python numbers, NaN/±inf → None,
    tuples → lists, dataclass-like objects with ``to_dict`` → dicts."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if hasattr(value, "to_dict"):
        return jsonable(value.to_dict())
    if hasattr(value, "item"):  # numpy scalar
        return jsonable(value.item())
    return str(value)


def build_report(
    *,
    experiment: str,
    verdict: str,
    stack: dict[str, Any],
    faults: list[dict[str, Any]],
    phases: dict[str, dict[str, Any]],
    checks: Iterable[CheckResult | dict[str, Any]],
    requests: dict[str, int],
    restarts: int,
    errors: list[str],
    **extra: Any,
) -> dict[str, Any]:
    """Assemble the report dict (see module doc); ``extra`` fields (the check families'
    sections such as ``integrity`` and ``recovery``, and what the runner knows) are
    added as given.

    Checks keep their order. The result is strict-JSON safe (:func:`jsonable`).
    """
    rows = [c.to_dict() if isinstance(c, CheckResult) else dict(c) for c in checks]
    report = {
        "schema_version": SCHEMA_VERSION,
        "experiment": experiment,
        "verdict": verdict,
        "stack": stack,
        "faults": faults,
        "phases": phases,
        "checks": rows,
        "requests": requests,
        "restarts": int(restarts),
        "errors": list(errors),
        **extra,
    }
    return jsonable(report)


def write_report(path: str | os.PathLike, report: dict[str, Any]) -> Path:
    """Write ``report`` as indented strict JSON, atomically (temp file + rename).

    Returns:
        The path written.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(jsonable(report), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, p)
    return p


def read_report(path: str | os.PathLike) -> Report:
    """Load a ``report.json`` as its typed view (:class:`harness.report.schema.Report`;
    ``.to_dict()`` gives the plain JSON back).

    Raises:
        OSError: the file cannot be read; ValueError: not JSON;
        pydantic.ValidationError: JSON without the shape of a report.
    """
    return Report.model_validate_json(Path(path).read_text(encoding="utf-8"))

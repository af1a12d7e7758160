"""``specchaos compare A B``: is B worse than A, with confidence?

A and B are each a run directory written by ``specchaos run`` or a directory of them (the
repeats of ``specchaos run --repeat N``: every subdirectory holding a ``report.json``). A
is the base (the last release, plain decoding), B the candidate.

Compared, per phase (baseline, fault, recovery, after) and per prompt-length bucket (and
``all``), from the saved request records (:func:`harness.checks.run.load_run`, the same
phase membership the judge uses):

============================  ===========  ========  =====================================
figure                        change       worse     default tolerance
============================  ===========  ========  =====================================
TTFT, TPOT, ITL (per chunk),  relative     up        10 % (``--tolerance latency=0.10``)
E2E at p50, p95, p99 (s)
error rate (failed tries)     absolute     up        0.01 (``error_rate=``)
output throughput (tok/s),    relative     down      10 % (``throughput=``)
goodput (req/s), per run
acceptance rate, per run      absolute     down      0.05 (``acceptance=``)
(vLLM's counters, phase)
recovery times, per run (s)   relative     up        20 % (``recovery=``)
============================  ===========  ========  =====================================

Latency percentiles and error rates are bootstrapped over requests (and over runs when a
side has several); per-run figures over runs only, so they need two runs per side
(:mod:`harness.metrics.compare`). Verdicts per figure: regression, improvement, within,
inconclusive, not judged. The exit code of the command: 1 when any figure is a regression
(with confidence), 0 when none is, 2 on bad input.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
from pydantic import ValidationError

from harness.checks.run import load_run
from harness.errors import SpecchaosError, first_error
from harness.experiment.config import SpecchaosConfig
from harness.load.records import RequestRecord, is_complete
from harness.metrics.compare import bootstrap_change, bootstrap_changes, judge
from harness.metrics.latency import e2e_s, itl_s, tpot_s, ttft_s
from harness.metrics.phases import PHASES

__all__ = ["TOLERANCES", "Side", "read_side", "compare", "parse_tolerances", "COMPARE_FILE"]

COMPARE_FILE = "compare.json"

#: Default tolerances (module doc): the change a figure may make before it counts.
TOLERANCES: dict[str, float] = {"latency": 0.10, "error_rate": 0.01, "throughput": 0.10, "acceptance": 0.05,
                                "recovery": 0.20}

#: Per-request latency values (seconds) of a record: one, or ITL's one per chunk gap.
_LATENCIES: dict[str, Callable[[RequestRecord], Iterable[float | None]]] = {
    "ttft_s": lambda r: [ttft_s(r)], "tpot_s": lambda r: [tpot_s(r)], "itl_s": itl_s, "e2e_s": lambda r: [e2e_s(r)]}


def _failed(r: RequestRecord) -> list[float]:
    """1.0 for a try that did not complete, else 0.0 (the error rate's values)."""
    return [0.0 if is_complete(r)[0] else 1.0]
_PCTS = (50, 95, 99)
_RECOVERY = ("time_to_healthy_s", "time_to_first_success_s", "time_to_slo_s")


@dataclass
class Side:
    """The runs of one side: their directories, records per phase, and reports."""

    path: Path
    runs: list[Path]
    members: list[dict[str, list[RequestRecord]]] = field(default_factory=list)
    reports: list[dict[str, Any]] = field(default_factory=list)


def _run_dirs(path: Path) -> list[Path]:
    if (path / "report.json").is_file():
        return [path]
    if not path.is_dir():
        raise SpecchaosError("no such run directory", where=str(path))
    runs = sorted(p for p in path.iterdir() if (p / "report.json").is_file())
    if not runs:
        raise SpecchaosError("neither a run directory (report.json) nor a directory of runs", where=str(path))
    return runs


def read_side(path: str | Path) -> Side:
    """Read a side (module doc).

    Raises:
        SpecchaosError: no run there, or a run's saved files unreadable (named).
    """
    p = Path(path)
    side = Side(p, _run_dirs(p))
    for d in side.runs:
        try:
            side.reports.append(json.loads((d / "report.json").read_text()))
            cfg = SpecchaosConfig.model_validate(json.loads((d / "config.json").read_text()),
                                                 context={"recorded": True})
        except FileNotFoundError as exc:
            raise SpecchaosError(f"not a specchaos run directory ({Path(exc.filename).name} missing)",
                                 where=str(d)) from None
        except ValueError as exc:
            if isinstance(exc, ValidationError):
                fp, msg, _ = first_error(exc)
                raise SpecchaosError(msg, where=f"{d / 'config.json'}: {fp}") from None
            raise SpecchaosError(f"unreadable saved file: {exc}", where=str(d)) from None
        side.members.append(load_run(d, cfg).members)
    return side


def parse_tolerances(items: Iterable[str]) -> dict[str, float]:
    """``["latency=0.05", ...]`` over :data:`TOLERANCES`.

    Raises:
        SpecchaosError: an unknown name or a value that is not a number ≥ 0.
    """
    out = dict(TOLERANCES)
    for item in items:
        name, _, value = item.partition("=")
        if name not in TOLERANCES:
            raise SpecchaosError(f"unknown tolerance {name!r} (known: {', '.join(TOLERANCES)})", where="--tolerance")
        try:
            v = float(value)
        except ValueError:
            v = -1.0
        if not v >= 0:
            raise SpecchaosError(f"tolerance {name} must be a number >= 0, got {value!r}", where="--tolerance")
        out[name] = v
    return out


def _buckets(side: Side, phase: str) -> set[str]:
    return {r.prompt_class or "unknown" for m in side.members for r in m.get(phase, [])}


def _values(side: Side, phase: str, bucket: str, get: Callable[[RequestRecord], Iterable[float | None]],
            complete_only: bool = True) -> list[list[float]]:
    """Per run of the side, ``get``'s values over the phase's tries of ``bucket`` (``all``:
    every bucket); ``complete_only``: of the complete tries only (latencies)."""
    out = []
    for m in side.members:
        vals = []
        for r in m.get(phase, []):
            if bucket != "all" and (r.prompt_class or "unknown") != bucket:
                continue
            if complete_only and not is_complete(r)[0]:
                continue
            vals += [v for v in get(r) if v is not None]
        out.append(vals)
    return out


def _per_run(side: Side, *path: str) -> list[list[float]]:
    """Per run of the side, the number at ``path`` in its report.json (``[]`` where absent)."""
    out = []
    for rep in side.reports:
        v: Any = rep
        for key in path:
            v = v.get(key) if isinstance(v, dict) else None
        out.append([float(v)] if isinstance(v, (int, float)) and not isinstance(v, bool) else [])
    return out


def compare(a: Side, b: Side, *, tolerances: dict[str, float] | None = None, confidence: float = 0.95,
            resamples: int = 1000, seed: int = 0, min_samples: int = 10) -> dict[str, Any]:
    """Compare side B with side A (module doc).

    Args:
        a, b: from :func:`read_side`.
        tolerances: as :data:`TOLERANCES` (defaults for the names left out).
        confidence, resamples, seed: of the bootstrap (:func:`harness.metrics.compare.bootstrap_change`).
        min_samples: fewer per-request values on a side leaves a latency figure not judged.

    Returns:
        ``{"a": {"path", "runs"}, "b": {...}, "confidence", "resamples", "tolerances",
        "rows": [{"phase", "bucket", "figure", "kind": "relative"|"absolute", "worse": "up"|"down",
        "tolerance", "a", "b", "change", "low", "high", "n_a", "n_b", "runs_a", "runs_b",
        "verdict"}], "regressions": n, "improvements": n, "inconclusive": n, "verdict":
        "regression"|"no_regression"}``. Latencies in seconds, rates as fractions, changes
        as fractions (relative) or in the figure's unit (absolute).
    """
    tol = {**TOLERANCES, **(tolerances or {})}
    rows: list[dict[str, Any]] = []

    def row(phase: str, bucket: str, figure: str, est, relative: bool, worse: str, tkey: str) -> None:
        rows.append({"phase": phase, "bucket": bucket, "figure": figure, "kind": "relative" if relative else "absolute",
                     "worse": worse, "tolerance": tol[tkey], **asdict(est),
                     "verdict": judge(est, tol[tkey], worse)})   # type: ignore[arg-type]

    def add(phase: str, bucket: str, figure: str, a_vals, b_vals, stat, *, relative: bool, worse: str,
            tkey: str, per_run: bool = False, minimum: int = 1) -> None:
        row(phase, bucket, figure, bootstrap_change(a_vals, b_vals, stat, relative=relative, per_run=per_run,
                                                    confidence=confidence, resamples=resamples, seed=seed,
                                                    min_values=minimum), relative, worse, tkey)

    for phase in PHASES:
        if not any(phase in m for m in a.members) or not any(phase in m for m in b.members):
            continue
        for bucket in ["all", *sorted(_buckets(a, phase) & _buckets(b, phase))]:
            for name, get in _LATENCIES.items():
                av, bv = _values(a, phase, bucket, get), _values(b, phase, bucket, get)
                ests = bootstrap_changes(av, bv, lambda v: np.percentile(v, _PCTS), confidence=confidence,
                                         resamples=resamples, seed=seed, min_values=min_samples)
                for q, est in zip(_PCTS, ests):
                    row(phase, bucket, f"{name} p{q}", est, True, "up", "latency")
            add(phase, bucket, "error_rate", _values(a, phase, bucket, _failed, complete_only=False),
                _values(b, phase, bucket, _failed, complete_only=False), np.mean, relative=False, worse="up",
                tkey="error_rate")
        for fig in ("output_throughput_tps", "goodput_rps"):
            add(phase, "all", fig, _per_run(a, "phases", phase, fig), _per_run(b, "phases", phase, fig), np.mean,
                relative=True, worse="down", tkey="throughput", per_run=True)
        acc = ("speculation", "servers", "spec", "phases", phase, "acceptance_rate")
        add(phase, "all", "acceptance_rate", _per_run(a, *acc), _per_run(b, *acc), np.mean,
            relative=False, worse="down", tkey="acceptance", per_run=True)
    for key in _RECOVERY:
        add("recovery", "all", key, _per_run(a, "recovery", key), _per_run(b, "recovery", key), np.mean,
            relative=True, worse="up", tkey="recovery", per_run=True)
    rows = [r for r in rows if r["a"] is not None or r["b"] is not None]
    n = {v: sum(1 for r in rows if r["verdict"] == v) for v in ("regression", "improvement", "inconclusive")}
    return {"a": {"path": str(a.path), "runs": [str(p) for p in a.runs]},
            "b": {"path": str(b.path), "runs": [str(p) for p in b.runs]},
            "confidence": confidence, "resamples": resamples, "tolerances": tol, "rows": rows,
            "regressions": n["regression"], "improvements": n["improvement"], "inconclusive": n["inconclusive"],
            "verdict": "regression" if n["regression"] else "no_regression"}

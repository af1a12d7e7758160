"""``specchaos compare A B``: is B worse than A, with confidence?

A and B are each a run directory written by ``specchaos run`` or a directory of them (the
repeats of ``specchaos run --repeat N``, or run directories gathered in one directory:
every subdirectory holding a ``report.json``). A is the base (the last release, plain
decoding), B the candidate.

**Same settings first** (:func:`differences`): the runs' effective configuration
(``config.json``, dotted as ``--set`` paths), the method's fault actions
(``experiment.json``, ``method[i]...``), the experiment's title, the load plan's digest
and the vLLM version (``report.json``) are compared, between A and B and between the runs
of one side; each difference is named, with the override (``--set``, ``--var-file``,
environment) that set it. The command refuses a comparison with differences unless they
are allowed (``--allow-different``, or ``--allow-different-in FIELD`` for the ones under
a field such as ``stack.draft``, the thing a candidate changes).

Compared, per phase (baseline, fault, recovery, after) and per prompt-length bucket (and
``all``; the buckets only when there are two or more), from the saved request records
(:func:`harness.checks.run.load_run`, the same phase membership the judge uses):

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

A figure's tolerance is the larger of its group's and, with a tolerance file
(:func:`calibrate`, ``--calibrate FILE`` / ``--tolerance-file FILE``), the largest change
the figure made between two runs of an A/A calibration.

The statistics (:mod:`harness.metrics.compare`): with two or more runs a side, a cluster
bootstrap (runs, then requests within runs) gives each figure's interval and one-sided
p-values; the regression p-values of the whole family of figures are adjusted
(Benjamini–Hochberg by default, ``--correction holm``) and a figure is a regression when
its adjusted p-value is at most ``1 − confidence``. With one run on a side there is no
verdict: the changes are shown and the result is ``needs_repeats``. Exit code of the
command: 1 when a figure is a regression, 0 when none is (or a side has one run), 2 on
bad input or refused differences.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from harness.checks.run import load_run
from harness.errors import SpecchaosError, first_error
from harness.experiment.config import SpecchaosConfig
from harness.load.records import RequestRecord, is_complete
from harness.metrics.compare import MIN_RUNS, Correction, Estimate, adjust, cluster_changes, judge, p_values
from harness.metrics.latency import e2e_s, itl_s, tpot_s, ttft_s
from harness.metrics.phases import PHASES

__all__ = ["TOLERANCES", "Side", "Difference", "read_side", "differences", "refused", "compare",
           "parse_tolerances", "calibrate", "read_tolerance_file", "COMPARE_FILE"]

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


def _read_report(run_dir: Path) -> dict[str, Any]:
    """A run's ``report.json`` as plain data (the one place compare reads it)."""
    return json.loads((run_dir / "report.json").read_text(encoding="utf-8"))


def _at(data: Any, *path: str) -> Any:
    """``data[path[0]][path[1]]...``, None where a step is missing or not a mapping."""
    for key in path:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> dict[str, Any]:
    """Leaves of nested dicts (``a.b``) and lists of dicts (``a[0].b``) under ``prefix``;
    other lists are one leaf."""
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        for i, v in enumerate(value):
            _flatten(v, f"{prefix}[{i}]", out)
    else:
        out[prefix] = value
    return out


@dataclass
class Side:
    """The runs of one side: their directories, records per phase, reports, and per run
    the settings that must match (``field → value``, :func:`differences`) and the
    overrides that set them (``field → "--set ..."``)."""

    path: Path
    runs: list[Path]
    members: list[dict[str, list[RequestRecord]]] = field(default_factory=list)
    reports: list[dict[str, Any]] = field(default_factory=list)
    settings: list[dict[str, Any]] = field(default_factory=list)
    overrides: list[dict[str, str]] = field(default_factory=list)


def _run_dirs(path: Path) -> list[Path]:
    if (path / "report.json").is_file():
        return [path]
    if not path.is_dir():
        raise SpecchaosError("no such run directory", where=str(path))
    runs = sorted(p for p in path.iterdir() if (p / "report.json").is_file())
    if not runs:
        raise SpecchaosError("neither a run directory (report.json) nor a directory of runs", where=str(path))
    return runs


def _settings(config: dict[str, Any], experiment: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    """The settings of one run that a comparison needs equal (module doc)."""
    out = _flatten(config, "", {})
    _flatten(experiment.get("method") or [], "method", out)
    out["experiment"] = report.get("experiment")
    out["load.plan_digest"] = _at(report, "load", "plan_digest")
    out["stack.vllm_version"] = _at(report, "stack", "vllm_version")
    return out


def read_side(path: str | Path) -> Side:
    """Read a side (module doc).

    Raises:
        SpecchaosError: no run there, or a run's saved files unreadable (named).
    """
    p = Path(path)
    side = Side(p, _run_dirs(p))
    for d in side.runs:
        try:
            report = _read_report(d)
            raw = json.loads((d / "config.json").read_text())
            cfg = SpecchaosConfig.model_validate(raw, context={"recorded": True})
            exp = d / "experiment.json"
            experiment = json.loads(exp.read_text()) if exp.is_file() else {}
        except FileNotFoundError as exc:
            raise SpecchaosError(f"not a specchaos run directory ({Path(exc.filename).name} missing)",
                                 where=str(d)) from None
        except ValueError as exc:
            if isinstance(exc, ValidationError):
                fp, msg, _ = first_error(exc)
                raise SpecchaosError(msg, where=f"{d / 'config.json'}: {fp}") from None
            raise SpecchaosError(f"unreadable saved file: {exc}", where=str(d)) from None
        side.reports.append(report)
        side.settings.append(_settings(raw, experiment if isinstance(experiment, dict) else {}, report))
        side.overrides.append({str(o.get("path")): f"{o.get('source')} {o.get('path')}={o.get('value')}"
                               for o in report.get("overrides") or [] if isinstance(o, dict)})
        side.members.append(load_run(d, cfg).members)
    return side


@dataclass(frozen=True)
class Difference:
    """A setting that differs: ``field`` (a ``--set`` path, ``method[i]...``,
    ``experiment``, ``load.plan_digest``, ``stack.vllm_version``), its values, ``between``
    (``"A and B"``, or ``"the runs of A"``/``"... of B"``) and the overrides that set it."""

    field: str
    a: Any
    b: Any
    between: str
    set_by: str = ""

    def line(self) -> str:
        """One line naming the field and both values (each cut to 60 characters)."""
        def show(v: Any) -> str:
            text = "(absent)" if v is _ABSENT else json.dumps(v, default=str)
            return text if len(text) <= 60 else text[:57] + "..."

        names = ("A", "B") if self.between == "A and B" else ("first run", "another run")
        where = f"settings differ between {self.between}: " if self.between != "A and B" else "settings differ: "
        tail = f" ({self.set_by})" if self.set_by else ""
        return f"{where}{self.field}: {names[0]} {show(self.a)}, {names[1]} {show(self.b)}{tail}"


_ABSENT = object()


def _diff(x: dict[str, Any], y: dict[str, Any], between: str, ox: dict[str, str],
          oy: dict[str, str]) -> list[Difference]:
    out = []
    for key in sorted(x.keys() | y.keys()):
        vx, vy = x.get(key, _ABSENT), y.get(key, _ABSENT)
        if vx != vy:
            by = "; ".join(f"{n}: {o[key]}" for n, o in (("A", ox), ("B", oy)) if key in o)
            out.append(Difference(key, vx, vy, between, by))
    return out


def differences(a: Side, *others: Side) -> list[Difference]:
    """The settings that differ (module doc): between the runs of each side (each run
    against the side's first), then between each other side's first run and A's."""
    out: list[Difference] = []
    for name, side in (("A", a), *zip(("B", "C", "D"), others)):
        for s, o in zip(side.settings[1:], side.overrides[1:]):
            out += _diff(side.settings[0], s, f"the runs of {name}", side.overrides[0], o)
    for other in others:
        out += _diff(a.settings[0], other.settings[0], "A and B", a.overrides[0], other.overrides[0])
    return out


def refused(diffs: Sequence[Difference], allow_all: bool = False, allow_in: Sequence[str] = ()) -> list[Difference]:
    """The differences not allowed: all of them unless ``allow_all``, less those at or
    under a field of ``allow_in`` (``stack`` allows ``stack.draft``; ``method`` the faults)."""
    if allow_all:
        return []
    return [d for d in diffs
            if not any(d.field == f or d.field.startswith((f + ".", f + "[")) for f in allow_in)]


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


def _per_run(side: Side, path: tuple[str, ...]) -> list[list[float]]:
    """Per run of the side, the number at ``path`` in its report.json (``[]`` where absent)."""
    out = []
    for rep in side.reports:
        v = _at(rep, *path)
        out.append([float(v)] if isinstance(v, (int, float)) and not isinstance(v, bool) else [])
    return out


@dataclass(frozen=True)
class _Group:
    """Figures computed from the same values of a side: their names, how their change is
    measured and judged, the values per run and the statistics of pooled values."""

    phase: str
    bucket: str
    names: tuple[str, ...]
    relative: bool
    worse: Literal["up", "down"]
    tkey: str
    values: Callable[[Side], list[list[float]]]
    stats: Callable[[np.ndarray], np.ndarray]
    per_run: bool = False
    minimum: int = 1


def _mean(v: np.ndarray) -> np.ndarray:
    return np.array([np.mean(v)])


def _percentiles(v: np.ndarray) -> np.ndarray:
    return np.asarray(np.percentile(v, _PCTS))


def _groups(sides: Sequence[Side], min_samples: int) -> list[_Group]:
    """Every figure group of the comparison (module doc), over the phases every side has."""
    out: list[_Group] = []
    for phase in PHASES:
        if not all(any(phase in m for m in s.members) for s in sides):
            continue
        every = set().union(*(_buckets(s, phase) for s in sides))
        common = set.intersection(*(_buckets(s, phase) for s in sides))
        for bucket in ["all", *(sorted(common) if len(every) > 1 else [])]:
            for name, get in _LATENCIES.items():
                out.append(_Group(phase, bucket, tuple(f"{name} p{q}" for q in _PCTS), True, "up", "latency",
                                  partial(_values, phase=phase, bucket=bucket, get=get), _percentiles,
                                  minimum=min_samples))
            out.append(_Group(phase, bucket, ("error_rate",), False, "up", "error_rate",
                              partial(_values, phase=phase, bucket=bucket, get=_failed, complete_only=False), _mean))
        for fig in ("output_throughput_tps", "goodput_rps"):
            out.append(_Group(phase, "all", (fig,), True, "down", "throughput",
                              partial(_per_run, path=("phases", phase, fig)), _mean, per_run=True))
        out.append(_Group(phase, "all", ("acceptance_rate",), False, "down", "acceptance",
                          partial(_per_run, path=("speculation", "servers", "spec", "phases", phase, "acceptance_rate")),
                          _mean, per_run=True))
    for key in _RECOVERY:
        out.append(_Group("recovery", "all", (key,), True, "up", "recovery",
                          partial(_per_run, path=("recovery", key)), _mean, per_run=True))
    return out


def _key(phase: str, bucket: str, figure: str) -> str:
    return f"{phase}/{bucket}/{figure}"


def compare(a: Side, b: Side, *, tolerances: dict[str, float] | None = None, confidence: float = 0.95,
            resamples: int = 1000, seed: int = 0, min_samples: int = 10, correction: Correction = "bh",
            calibrated: dict[str, float] | None = None) -> dict[str, Any]:
    """Compare side B with side A (module doc).

    Args:
        a, b: from :func:`read_side`.
        tolerances: as :data:`TOLERANCES` (defaults for the names left out).
        confidence, resamples, seed: of the intervals
            (:func:`harness.metrics.compare.cluster_changes`); ``1 − confidence`` is the
            level the adjusted p-values are held to.
        min_samples: fewer per-request values on a side leaves a latency figure not judged.
        correction: how the family's p-values are adjusted (:func:`harness.metrics.compare.adjust`).
        calibrated: per figure key (``phase/bucket/figure``), the A/A spread that the
            figure's tolerance is at least (:func:`read_tolerance_file`).

    Returns:
        ``{"a": {"path", "runs"}, "b": {...}, "confidence", "resamples", "correction",
        "tolerances", "family" (figures whose p-values were adjusted together),
        "rows": [{"phase", "bucket", "figure", "kind": "relative"|"absolute", "worse":
        "up"|"down", "tolerance", "tolerance_from": "stated"|"calibrated", "a", "b",
        "change", "low", "high", "n_a", "n_b", "runs_a", "runs_b", "se", "df", "scale",
        "p_regression", "p_regression_adj", "p_improvement", "p_improvement_adj",
        "verdict"}], "regressions": n, "improvements": n, "inconclusive": n,
        "verdict": "regression"|"no_regression"|"needs_repeats"}``. Latencies in seconds,
        rates as fractions, changes as fractions (relative) or in the figure's unit
        (absolute); p-values None where no interval was computed.
    """
    tol = {**TOLERANCES, **(tolerances or {})}
    cal = calibrated or {}
    rows: list[dict[str, Any]] = []
    ests: list[Estimate] = []
    for g in _groups([a, b], min_samples):
        group = cluster_changes(g.values(a), g.values(b), g.stats, relative=g.relative, per_run=g.per_run,
                                confidence=confidence, resamples=resamples, seed=seed, min_values=g.minimum)
        for name, est in zip(g.names, group):
            if est.a is None and est.b is None:
                continue
            spread = cal.get(_key(g.phase, g.bucket, name), 0.0)
            t = max(tol[g.tkey], spread)
            p = p_values(est, t, g.worse)
            rows.append({"phase": g.phase, "bucket": g.bucket, "figure": name,
                         "kind": "relative" if g.relative else "absolute", "worse": g.worse, "tolerance": t,
                         "tolerance_from": "calibrated" if spread > tol[g.tkey] else "stated", **asdict(est),
                         "p_regression": None if p is None else p[0], "p_improvement": None if p is None else p[1]})
            ests.append(est)
    alpha = 1 - confidence
    for which in ("p_regression", "p_improvement"):
        for r, adj in zip(rows, adjust([r[which] for r in rows], correction)):
            r[f"{which}_adj"] = adj
    for r, est in zip(rows, ests):
        r["verdict"] = judge(est, r["tolerance"], r["worse"], p_regression=r["p_regression_adj"],
                             p_improvement=r["p_improvement_adj"], alpha=alpha)
    n = {v: sum(1 for r in rows if r["verdict"] == v) for v in ("regression", "improvement", "inconclusive")}
    single = min(len(a.runs), len(b.runs)) < MIN_RUNS
    return {"a": {"path": str(a.path), "runs": [str(p) for p in a.runs]},
            "b": {"path": str(b.path), "runs": [str(p) for p in b.runs]},
            "confidence": confidence, "resamples": resamples, "correction": correction, "tolerances": tol,
            "calibrated": bool(cal), "family": sum(1 for r in rows if r["p_regression"] is not None), "rows": rows,
            "regressions": n["regression"], "improvements": n["improvement"], "inconclusive": n["inconclusive"],
            "verdict": "regression" if n["regression"] else "needs_repeats" if single else "no_regression"}


# -- tolerances from an A/A calibration ------------------------------------------------

class _Spread(BaseModel):
    model_config = ConfigDict(extra="forbid")
    spread: float
    runs: int
    kind: Literal["relative", "absolute"]


class ToleranceFile(BaseModel):
    """A tolerance file (:func:`calibrate`): per figure key ``phase/bucket/figure``, the
    largest change between two of the calibration runs (a fraction for a relative
    figure, the figure's unit for an absolute one) and how many runs had the figure."""

    model_config = ConfigDict(extra="forbid")
    specchaos: Literal["tolerances"] = "tolerances"
    rule: str = "largest change of the figure between two of the runs"
    runs: list[str]
    experiment: str | None = None
    plan_digest: str | None = None
    figures: dict[str, _Spread]


def calibrate(sides: Sequence[Side], min_samples: int = 10) -> ToleranceFile:
    """Tolerances from the spread of runs of one experiment with the same settings (an
    A/A calibration): per figure, the largest change between any two runs (``max / min −
    1`` for a relative figure, ``max − min`` for an absolute one), each run's
    statistic computed from its own values (a run with fewer than ``min_samples``
    latency values does not count; a relative figure with a statistic ≤ 0 is left out).

    Raises:
        SpecchaosError: fewer than two runs in all.
    """
    runs = [r for s in sides for r in s.runs]
    if len(runs) < 2:
        raise SpecchaosError("an A/A calibration needs at least two runs (three or more are better)",
                             where="--calibrate")
    every = Side(sides[0].path, runs, [m for s in sides for m in s.members], [r for s in sides for r in s.reports],
                 [x for s in sides for x in s.settings], [o for s in sides for o in s.overrides])
    figures: dict[str, _Spread] = {}
    for g in _groups([every], min_samples):
        per = [np.asarray(g.stats(np.asarray(v, dtype=float)), dtype=float)
               for v in g.values(every) if len(v) >= g.minimum and len(v)]
        for i, name in enumerate(g.names):
            vals = [float(s[i]) for s in per if np.isfinite(s[i])]
            if len(vals) < 2 or (g.relative and min(vals) <= 0):
                continue
            spread = max(vals) / min(vals) - 1 if g.relative else max(vals) - min(vals)
            figures[_key(g.phase, g.bucket, name)] = _Spread(spread=spread, runs=len(vals),
                                                              kind="relative" if g.relative else "absolute")
    first = every.settings[0]
    return ToleranceFile(runs=[str(r) for r in runs], experiment=first.get("experiment"),
                         plan_digest=first.get("load.plan_digest"), figures=figures)


def read_tolerance_file(path: str | Path) -> ToleranceFile:
    """Read a tolerance file written by ``specchaos compare --calibrate``.

    Raises:
        SpecchaosError: missing, not JSON, or not a tolerance file (the field named).
    """
    p = Path(path)
    try:
        return ToleranceFile.model_validate_json(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecchaosError("no such tolerance file", where=f"--tolerance-file {p}") from None
    except ValidationError as exc:
        fp, msg, _ = first_error(exc)
        raise SpecchaosError(f"not a tolerance file: {msg}", where=f"--tolerance-file {p}: {fp}") from None

"""Turn a run directory into a :class:`~harness.checks.base.RecordedRun`: read the saved
files, split the load into phases and compute each phase's metrics. Reads files only.

Files (missing ones count as empty): ``records.jsonl`` (load records; the speculative
server's are judged by every check, mirror mode's requests to the reference server are
kept apart in ``RecordedRun.ref_records``),
``reference.jsonl`` (the non-speculative reference), ``class_reference.jsonl`` (the
reference's answers per request class, :data:`CLASS_REFERENCE_FILE`), ``timeline.jsonl``,
``load_stats.json`` (the open loop's account, its workers' files merged).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.checks.base import RecordedRun
from harness.checks.config import CheckLimits
from harness.load.profiles import read_load_stats
from harness.load.records import RequestRecord, is_complete, is_ref_load, is_spec_load, read_records
from harness.metrics.phases import assign_phases, phase_metrics, phase_windows
from harness.timeline import fault_summary, read_timeline

__all__ = ["CLASS_REFERENCE_FILE", "load_reference", "recorded_run", "load_run"]

#: The reference server's answers to each prompt sent as a request class's first turn, for
#: the classes whose invariants compare with the reference (written by the run).
CLASS_REFERENCE_FILE = "class_reference.jsonl"


def load_reference(records: list[RequestRecord]) -> dict[int, RequestRecord]:
    """Reference records by ``prompt_id``; the first complete one of each prompt wins
    (else the first seen, which integrity then ignores as not complete)."""
    out: dict[int, RequestRecord] = {}
    for r in records:
        cur = out.get(r.prompt_id)
        if cur is None or (not is_complete(cur)[0] and is_complete(r)[0]):
            out[r.prompt_id] = r
    return out


def recorded_run(records: list[RequestRecord], reference: list[RequestRecord], events: list[dict[str, Any]],
                 limits: CheckLimits, journal: dict | None = None, run_dir: Path | None = None) -> RecordedRun:
    """A :class:`RecordedRun` from data in memory: phases from the timeline's
    ``phase_start`` events, per-phase metrics with the goodput limits of ``limits.slo``
    and the ``limits.metrics`` settings (``min_samples``, ITL-per-token grouping).

    Args:
        records: request records; only load records are kept: those of the speculative
            server (:func:`~harness.load.records.is_spec_load`) as ``records``, mirror
            mode's to the reference server as ``ref_records``.
        reference: reference records (any order, duplicates allowed).
        events: timeline events (any order).
        limits: the run's configuration.
        journal: the Chaos Toolkit journal, if any.
    """
    load = [r for r in records if is_spec_load(r)]
    events = sorted(events, key=lambda e: e["t"])
    windows = phase_windows(events)
    members = assign_phases(load, windows)
    phases = {ph: phase_metrics(load, t0, t1, limits.slo.goodput, members=members[ph], metrics=limits.metrics)
              for ph, (t0, t1) in windows.items()}
    return RecordedRun(records=load, reference=load_reference(reference), events=events, limits=limits,
                       windows=windows, members=members, phases=phases, faults=fault_summary(events),
                       journal=journal, run_dir=run_dir, ref_records=[r for r in records if is_ref_load(r)])


def load_run(run_dir: str | Path, limits: CheckLimits, journal: dict | None = None) -> RecordedRun:
    """Read a run directory (see module doc) into a :class:`RecordedRun`."""
    d = Path(run_dir)
    run = recorded_run(read_records(d / "records.jsonl"), read_records(d / "reference.jsonl"),
                       read_timeline(d / "timeline.jsonl"), limits, journal=journal, run_dir=d)
    run.load_stats = read_load_stats(d / "load_stats.json")
    run.class_reference = read_records(d / CLASS_REFERENCE_FILE)
    return run

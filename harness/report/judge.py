"""Judge a run from its saved data: records + timeline → phases → metrics → checks → report.

Pure over the run directory: reads ``records.jsonl`` (load records only),
``reference.jsonl`` and ``timeline.jsonl``; talks to no server. The same function judges a
live run at its end and re-judges a saved one (``specchaos report DIR``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from harness.checks.base import CheckResult
from harness.checks.integrity import integrity_checks, is_complete
from harness.checks.liveness import fail_fast_checks, in_flight
from harness.checks.recovery import recovery_checks, recovery_times
from harness.checks.slo import slo_checks
from harness.checks.verdict import verdict
from harness.clock import now
from harness.experiment.config import SpecchaosConfig
from harness.load.records import RequestRecord, read_records
from harness.metrics.phases import assign_phases, phase_metrics, phase_windows
from harness.report.json_report import build_report, jsonable
from harness.timeline import read_timeline

#: The run error of a run whose method injected no fault.
NO_FAULT_ERROR = "no fault was injected: the experiment tested nothing"
NO_FAULT_BEFORE_INTERRUPT = "no fault was injected before the interruption"

__all__ = ["judge_run", "load_reference", "fault_summary", "count_restarts", "server_events"]

log = logging.getLogger(__name__)

_SERVER_EVENTS = ("server_started", "server_ready", "server_exited", "server_restarting", "server_gave_up")


def load_reference(records: list[RequestRecord]) -> dict[int, RequestRecord]:
    """Reference records by ``prompt_id``; the first complete one of each prompt wins
    (else the first seen, which integrity then ignores as not complete)."""
    out: dict[int, RequestRecord] = {}
    for r in records:
        cur = out.get(r.prompt_id)
        if cur is None or (not is_complete(cur)[0] and is_complete(r)[0]):
            out[r.prompt_id] = r
    return out


def fault_summary(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per ``fault_injected`` event, in time order: ``{"fault_id", "kind",
    "target", "injected_at", "cleared_at", "acted", "evidence"}``. ``acted`` comes from the
    last ``fault_evidence`` event of that fault (False when there is none)."""
    faults: list[dict[str, Any]] = []
    by_id: dict[Any, dict[str, Any]] = {}
    for e in sorted(events, key=lambda e: e["t"]):
        if e.get("source", "fault") != "fault":
            continue
        ev, fid = e.get("event"), e.get("fault_id")
        if ev == "fault_injected":
            entry = {"fault_id": fid, "kind": e.get("kind"), "target": e.get("target"),
                     "injected_at": e["t"], "cleared_at": None, "acted": False, "evidence": None}
            faults.append(entry)
            by_id[fid] = entry
        elif ev == "fault_evidence" and fid in by_id:
            by_id[fid]["acted"] = bool(e.get("acted"))
            by_id[fid]["evidence"] = e.get("evidence")
        elif ev == "fault_cleared" and fid in by_id and by_id[fid]["cleared_at"] is None:
            by_id[fid]["cleared_at"] = e["t"]
    return faults


def server_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stack's ``server_*`` events (any server), in time order."""
    return [e for e in sorted(events, key=lambda e: e["t"]) if e.get("event") in _SERVER_EVENTS]


def count_restarts(events: list[dict[str, Any]], server: str = "spec") -> int:
    """Supervised restarts of ``server``: ``server_restarting`` events each followed by a
    ``server_started`` of that server."""
    n, pending = 0, False
    for e in server_events(events):
        if e.get("server") != server:
            continue
        if e["event"] == "server_restarting":
            pending = True
        elif e["event"] == "server_started" and pending:
            n += 1
            pending = False
    return n


def _stack_info(meta_stack: dict[str, Any] | None, cfg: SpecchaosConfig) -> dict[str, Any]:
    sc = cfg.stack
    stack = dict(meta_stack or {})
    stack.setdefault("launcher", sc.launcher)
    stack.setdefault("vllm_version", "unknown")
    spec = dict(stack.get("speculative") or {})
    spec.setdefault("method", sc.method)
    spec.setdefault("draft", sc.draft)
    spec.setdefault("num_speculative_tokens", sc.num_speculative_tokens)
    stack["speculative"] = spec
    return stack


def judge_run(run_dir: Path, cfg: SpecchaosConfig, meta: dict[str, Any]) -> dict[str, Any]:
    """Judge a run directory and return the report (see :mod:`harness.report.json_report`).

    Args:
        run_dir: the run's output directory (``records.jsonl``, ``reference.jsonl``,
            ``timeline.jsonl``; missing files count as empty).
        cfg: the run's validated configuration (SLOs and limits).
        meta: from the runner: ``experiment`` (title), ``stack`` (launcher, vllm_version,
            speculative), ``errors`` (run errors, one line each), ``interrupted``,
            ``journal_status``, ``steady_state``; other keys are copied into the report.

    Returns:
        The report dict. Its verdict is ``"error"`` on a run error, an interruption, no
        fault, or a fault without evidence that it acted; ``"fail"`` if a check failed;
        else ``"pass"``. Fault time (start of recovery, fail-fast timing) is the first
        ``fault_injected`` event.
    """
    run_dir = Path(run_dir)
    records = [r for r in read_records(run_dir / "records.jsonl") if r.source == "load"]
    reference = load_reference(read_records(run_dir / "reference.jsonl"))
    events = read_timeline(run_dir / "timeline.jsonl")
    errors = [str(e) for e in (meta.get("errors") or [])]
    interrupted = bool(meta.get("interrupted"))

    windows = phase_windows(events)
    members = assign_phases(records, windows)
    phases = {ph: phase_metrics(records, t0, t1, cfg.slo, members=members[ph]) for ph, (t0, t1) in windows.items()}

    faults = fault_summary(events)
    fault_time = faults[0]["injected_at"] if faults else None

    # Chaos Toolkit skips the method when the hypothesis is not met before it: then no
    # fault was meant to run, and the failed probe (a check added by the strict verdict)
    # is the finding, not a run error.
    before = (meta.get("steady_state") or {}).get("before")
    method_skipped = not faults and bool(before) and not before.get("met")

    checks: list[CheckResult] = []
    # After an interruption, a missing fault or missing evidence is its consequence: say so
    # rather than blame the fault (the interruption itself is the run's first error).
    if not faults and not method_skipped:
        checks.append(CheckResult("fault.injected", "fault", False, 0, 1, "no fault was injected: nothing was tested"))
        errors.append(NO_FAULT_BEFORE_INTERRUPT if interrupted else NO_FAULT_ERROR)
    for f in faults:
        detail = ((f.get("evidence") or {}).get("detail") or "") if isinstance(f.get("evidence"), dict) else ""
        checks.append(CheckResult(f"fault.{f['fault_id']}.acted", "fault", f["acted"], f["acted"], True,
                                  f"{f['kind']} on {f['target']}: " + (detail or ("acted" if f["acted"] else "no evidence it acted"))))
        if not f["acted"]:
            what = "its evidence was not collected before the interruption" if interrupted else \
                "left no evidence that it acted"
            errors.append(f"fault {f['fault_id']} ({f['kind']} on {f['target']}) {what}"
                          + (f": {detail}" if detail else ""))

    checks += slo_checks(phases, cfg.slo, cfg.degradation)
    integ_checks, integrity = integrity_checks(records, reference, cfg.integrity.min_compared)
    checks += integ_checks

    times: dict[str, float | None] = {"time_to_healthy_s": None, "time_to_first_success_s": None, "time_to_slo_s": None}
    n_flying = 0
    if fault_time is not None:
        times = recovery_times(records, events, fault_time, phases.get("baseline") or {}, cfg.recovery)
        checks += recovery_checks(times, cfg.recovery)
        n_flying = len(in_flight(records, fault_time))
        checks += fail_fast_checks(records, fault_time, cfg.fail_fast)

    n_ok = sum(1 for r in records if is_complete(r)[0])
    fault_acted = (bool(faults) or method_skipped) and all(f["acted"] for f in faults)
    v = verdict(checks, fault_acted=fault_acted, errors=errors, interrupted=interrupted)

    report = build_report(
        experiment=str(meta.get("experiment") or run_dir.name),
        verdict=v,
        stack=_stack_info(meta.get("stack"), cfg),
        faults=faults,
        phases=phases,
        checks=checks,
        requests={"total": len(records), "ok": n_ok, "failed": len(records) - n_ok,
                  "client_ok": sum(1 for r in records if r.ok)},
        integrity=integrity,
        recovery={**times, "measured_from": fault_time},
        restarts=count_restarts(events, "spec"),
        errors=errors,
        interrupted=interrupted,
        fault_time=fault_time,
        fault_evidence=[e for e in events if e.get("event") == "fault_evidence"],
        fail_fast={"in_flight": n_flying, "max_error_latency_s": cfg.fail_fast.max_error_latency_s},
        server_events=server_events(events),
        journal_status=meta.get("journal_status"),
        steady_state=meta.get("steady_state"),
        generated_at=now(),
    )
    if method_skipped:
        report["method_skipped"] = "steady-state hypothesis not met before the method"
    for k, val in meta.items():  # anything else the runner knows (e.g. "source")
        report.setdefault(k, jsonable(val))
    log.debug("judged %s before the strict verdict: %s (%d checks, %d failed)", run_dir, v, len(checks), sum(not c.passed for c in checks))
    return report

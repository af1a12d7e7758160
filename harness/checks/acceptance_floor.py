"""Acceptance floor: does speculation still pay for every prompt length?

Judged from the load records alone (no server is asked): the client-side acceptance rate
of :mod:`harness.metrics.client_acceptance` — accepted draft tokens ÷ (decode steps ×
``num_speculative_tokens``), from the tokens each streamed engine step carried — per
prompt-length bucket (``prompt_class``), per sampling class, in each phase of
``acceptance_floor.phases`` (default baseline and after: the fault phase may degrade).

* ``acceptance_floor.<phase>.<bucket>.<sampling>`` (category ``speculation``) — the rate is
  at least the floor of that bucket and class
  (:meth:`~harness.checks.config.AcceptanceFloorConfig.floor_for`: greedy requests against
  ``floor``/``buckets``, default 0.6; a sampled class only when ``sampling`` names it,
  because sampling alone lowers acceptance several-fold even for a perfect draft).

Not judged, and said so in the section (``floors[].reason``, ``note``): a stack without
speculation (no method or no speculative tokens), a run whose speculative settings were
not recorded, a phase that did not happen, a bucket × class with fewer than
``min_steps`` counted steps, a sampled class without a configured floor, requests sent
while the server decoded without speculation (after a ``server_respeculating`` event to
plain decoding: a draft swap to none, the circuit breaker's hard trip).

``num_speculative_tokens`` and the method are the run's recorded stack settings
(``config.json``'s ``stack``, what ``report.json["stack"]["speculative"]`` shows), changed
for the requests sent after each ``server_respeculating`` timeline event of the ``spec``
server (its ``new`` settings).
"""

from __future__ import annotations

from typing import Any

from harness.checks.base import CheckResult, RecordedRun
from harness.checks.view import Line, Table, View
from harness.checks.config import AcceptanceFloorConfig
from harness.metrics.client_acceptance import STEP_GAP_S, acceptance_table, speculation_changes

__all__ = ["summarize", "phase_figures", "speculation", "judge_floors", "judge_class_floors", "check", "section"]

_MEMO = "acceptance_floor"


def speculation(run: RecordedRun) -> tuple[str | None, int | None, str | None]:
    """``(method, num_speculative_tokens, why_not)`` of the run's speculative server, from its
    recorded stack settings; ``why_not`` says why acceptance cannot be judged (no
    speculation, or settings not recorded), else None."""
    stack = getattr(run.limits, "stack", None)
    if stack is None:
        return None, None, "the run's speculative settings were not recorded"
    method = getattr(stack, "method", None)
    k = getattr(stack, "num_speculative_tokens", None)
    if method in (None, "", "none") or not k:
        if any(m for _t, m, _k in speculation_changes(run.events)):
            return None, None, None   # started plain, speculating after a restart
        return None, None, "the speculative server runs without speculation"
    return str(method), int(k), None


def _config(run: RecordedRun) -> AcceptanceFloorConfig:
    return getattr(run.limits, "acceptance_floor", None) or AcceptanceFloorConfig()


def judge_floors(table: dict[str, Any], cfg: AcceptanceFloorConfig) -> tuple[list[CheckResult], list[dict[str, Any]]]:
    """The floor checks over an :func:`~harness.metrics.client_acceptance.acceptance_table`.

    Returns:
        ``(checks, floors)``: one check per judged phase × bucket × sampling class, and one
        row per bucket × class seen (judged or not): ``{"phase", "bucket", "sampling",
        "floor", "acceptance_rate", "mean_acceptance_length", "steps", "judged", "reason"}``.
    """
    checks: list[CheckResult] = []
    rows: list[dict[str, Any]] = []
    for ph in cfg.phases:
        data = table["phases"].get(ph)
        empty = None if data is None else not data["buckets"]
        if data is None or empty:
            plain = 0 if data is None else data["requests_without_speculation"]
            rows.append({"phase": ph, "bucket": None, "sampling": None, "floor": None, "acceptance_rate": None,
                         "mean_acceptance_length": None, "steps": 0, "judged": False,
                         "reason": f"no {ph} phase in this run" if data is None else
                         f"no complete request with speculation in the {ph} phase"
                         + (f" ({plain} sent while the server decoded without speculation)" if plain else "")})
            continue
        seen_classes = {cls for classes in data["buckets"].values() for cls in classes}
        for bucket, cls in ([(b, "greedy") for b in cfg.buckets if b not in data["buckets"]]
                            + [(None, c) for c in cfg.sampling if c not in seen_classes]):
            rows.append({"phase": ph, "bucket": bucket, "sampling": cls, "floor": cfg.floor_for(bucket or "", cls),
                         "acceptance_rate": None, "mean_acceptance_length": None, "steps": 0, "judged": False,
                         "reason": f"configured, but no complete {'request' if bucket is None else bucket + ' request'}"
                                   f" of class {cls!r} with speculation in the {ph} phase"})
        for bucket, classes in data["buckets"].items():
            for cls, t in classes.items():
                floor = cfg.floor_for(bucket, cls)
                rate, steps = t["acceptance_rate"], t["steps"]
                reason = None
                if floor is None:
                    reason = f"sampled class {cls!r} has no floor (acceptance_floor.sampling)"
                elif steps < cfg.min_steps:
                    reason = f"{steps} counted steps < min_steps {cfg.min_steps}"
                rows.append({"phase": ph, "bucket": bucket, "sampling": cls, "floor": floor, "acceptance_rate": rate,
                             "mean_acceptance_length": t["mean_acceptance_length"], "steps": steps,
                             "judged": reason is None, "reason": reason})
                if reason is not None:
                    continue
                checks.append(CheckResult(
                    f"acceptance_floor.{ph}.{bucket}.{cls}", "speculation", rate >= floor, round(rate, 4), floor,
                    f"client-side acceptance rate {rate:.3f} over {steps} decode steps of {t['requests']} requests "
                    f"(mean acceptance length {t['mean_acceptance_length']:.2f} tokens per step)"))
    return checks, rows


def judge_class_floors(table: dict[str, Any], cfg: AcceptanceFloorConfig) -> tuple[list[CheckResult],
                                                                                   list[dict[str, Any]]]:
    """The per-request-class floor checks (``acceptance_floor.request_classes``): each named
    class's greedy requests over every bucket, in each phase of ``cfg.phases``, against its
    floor. Same return shape as :func:`judge_floors` (rows with ``"request_class"`` and
    ``bucket`` None); a class with fewer than ``min_steps`` counted greedy steps in a phase,
    or none at all, is reported, not judged."""
    checks: list[CheckResult] = []
    rows: list[dict[str, Any]] = []
    for ph in cfg.phases:
        data = (table["phases"].get(ph) or {}).get("request_class_sampling") or {}
        for name, floor in cfg.request_classes.items():
            t = (data.get(name) or {}).get("greedy")
            steps = t["steps"] if t else 0
            reason = None
            if t is None:
                reason = f"no complete greedy request of class {name!r} with speculation in the {ph} phase"
            elif steps < cfg.min_steps:
                reason = f"{steps} counted steps < min_steps {cfg.min_steps}"
            rate = t["acceptance_rate"] if t else None
            rows.append({"phase": ph, "bucket": None, "sampling": "greedy", "request_class": name, "floor": floor,
                         "acceptance_rate": rate, "mean_acceptance_length": t["mean_acceptance_length"] if t else None,
                         "steps": steps, "judged": reason is None, "reason": reason})
            check_name = f"acceptance_floor.{ph}.class.{name}"
            if reason is not None:
                checks.append(CheckResult.not_judged(check_name, "speculation", rate, floor, reason))
                continue
            assert t is not None and rate is not None
            checks.append(CheckResult(
                check_name, "speculation", rate >= floor, round(rate, 4), floor,
                f"client-side acceptance rate of class {name} {rate:.3f} over {steps} decode steps of "
                f"{t['requests']} greedy requests (mean acceptance length {t['mean_acceptance_length']:.2f})"))
    return checks, rows


def _judged(run: RecordedRun) -> dict[str, Any]:
    if _MEMO in run.memo:
        return run.memo[_MEMO]
    cfg = _config(run)
    method, k, why_not = speculation(run)
    out: dict[str, Any] = {"source": "client", "method": method, "num_speculative_tokens": k,
                           "step_gap_s": STEP_GAP_S, "judged": False, "note": why_not, "checks": []}
    if why_not is None:
        changes = speculation_changes(run.events)
        table = acceptance_table(run.records, k, run.members, STEP_GAP_S, changes)
        judged = table
        if cfg.exclude_request_classes:   # the floors over the other classes' requests only
            left_out = set(cfg.exclude_request_classes)
            keep = [r for r in run.records if r.request_class not in left_out]
            members = {ph: [r for r in rs if r.request_class not in left_out] for ph, rs in (run.members or {}).items()}
            judged = acceptance_table(keep, k, members if run.members else None, STEP_GAP_S, changes)
        checks, rows = judge_floors(judged, cfg)
        if cfg.exclude_request_classes:
            for c in checks:
                c.detail += f" (request classes {', '.join(cfg.exclude_request_classes)} left out)"
        class_checks, class_rows = judge_class_floors(table, cfg)
        checks += class_checks
        rows += class_rows
        reasons = "; ".join(sorted({r["reason"] for r in rows if r["reason"]})) or "no complete speculative request"
        out.update({"total": table["total"], "buckets": table["buckets"], "phases": table["phases"],
                    "speculation_changes": table["speculation_changes"],
                    "floors": rows, "judged": any(c.judged for c in checks), "checks": checks,
                    "note": None if any(c.judged for c in checks) else f"nothing judged: {reasons}"})
        if "request_classes" in table:   # request classes or source categories: acceptance per class too
            out["request_classes"] = table["request_classes"]
            out["request_class_buckets"] = table["request_class_buckets"]
    run.memo[_MEMO] = out
    return out


def check(run: RecordedRun) -> list[CheckResult]:
    """The floor checks of a recorded run (module doc); none when not judged."""
    return list(_judged(run)["checks"])


def section(run: RecordedRun) -> dict[str, Any]:
    """``report.json["acceptance_floor"]``: ``{"source": "client", "method",
    "num_speculative_tokens", "step_gap_s", "judged", "note", "total", "buckets":
    {bucket: {sampling: T}}, "request_classes": {class: T} (with request classes), "phases":
    {phase: {"total": T, "buckets": ..., "request_classes": ...}}, "floors": [...]}`` with ``T`` as :meth:`harness.metrics.client_acceptance.Tally.to_dict`
    (acceptance rate, mean acceptance length in tokens per step, per-position acceptance);
    ``total``/``buckets``/``phases``/``floors`` are absent when there is no speculation."""
    return {k: v for k, v in _judged(run).items() if k != "checks"}


def _cell(t: dict[str, Any] | None, mark: str = "") -> str:
    """``"rate / mean acceptance length"`` of a tally (``—`` when not measured)."""
    if not t or t.get("acceptance_rate") is None:
        return "—"
    return f"{t['acceptance_rate']:.2f} / {t['mean_acceptance_length']:.2f}{mark}"


def summarize(sec: dict[str, Any] | None) -> list[View]:
    """The terminal/Allure view of :func:`section`: client-side acceptance rate and mean
    acceptance length per bucket × sampling class × phase (✓/✗ where a floor was judged),
    a row per request class, and the notes; one line when nothing was measured."""
    sec = sec or {}
    if not sec.get("phases"):
        return [Line(f"speculation, client side: {sec.get('note') or 'not measured'}", "note")]
    phases = ("baseline", "fault", "recovery", "after")
    tab = Table("speculation, client side (acceptance rate / mean acceptance length in tokens per step, "
                f"k={sec.get('num_speculative_tokens')})", ["bucket", "sampling", *phases], labels=2)
    floors = {(r.get("phase"), r.get("bucket"), r.get("sampling")): r for r in sec.get("floors") or []}
    rows = sorted({(b, s) for ph in sec["phases"].values()
                   for b, cls in (ph.get("buckets") or {}).items() for s in cls})
    for bucket, cls in rows:
        cells = []
        for ph in phases:
            t = (((sec["phases"].get(ph) or {}).get("buckets") or {}).get(bucket) or {}).get(cls)
            f = floors.get((ph, bucket, cls)) or {}
            measured = bool(t) and t.get("acceptance_rate") is not None
            mark = "" if not (f.get("judged") and measured) else (" ✓" if t["acceptance_rate"] >= f["floor"] else " ✗")
            cells.append(_cell(t, mark))
        tab.add(bucket, cls, *cells)
    # per request class (load.request_classes, or a source's categories), every bucket and sampling class
    # pooled; a class floor (acceptance_floor.request_classes) marks its greedy rate
    class_floors = {(r.get("phase"), r.get("request_class")): r for r in sec.get("floors") or []
                    if r.get("request_class")}
    for name in sorted({c for ph in sec["phases"].values() for c in ph.get("request_classes") or {}}):
        cells = []
        for ph in phases:
            f = class_floors.get((ph, name)) or {}
            mark = "" if not f.get("judged") else (" ✓" if f["acceptance_rate"] >= f["floor"] else " ✗")
            cells.append(_cell(((sec["phases"].get(ph) or {}).get("request_classes") or {}).get(name), mark))
        tab.add(f"class {name}", "all", *cells)
    notes = [str(sec["note"])] if sec.get("note") else []
    for c in sec.get("speculation_changes") or []:
        notes.append(f"speculative settings changed at {c['t']:.3f}: "
                     + (f"{c['method']}, k={c['num_speculative_tokens']}" if c.get("method") else "no speculation"))
    tab.caption = "; ".join(notes)
    return [tab]


def phase_figures(sec: dict[str, Any] | None) -> dict[str, dict[str, float | None]]:
    """``tok/step``: the client-side mean acceptance length (tokens per engine step, as vLLM
    defines it) per phase; nothing without the section."""
    if sec is None:
        return {}
    return {"tok/step": {ph: ((m or {}).get("total") or {}).get("mean_acceptance_length")
                         for ph, m in (sec.get("phases") or {}).items()}}

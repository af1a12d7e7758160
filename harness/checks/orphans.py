"""Orphans: nothing of a server's process tree may outlive its API process.

Public reports against vLLM show an API server that exited while its ``EngineCore``
kept running, holding memory and sometimes the port, so the next start fails or the
host slowly runs out of memory. The supervisor (:mod:`harness.stack.local`) looks at
every exit of a server's API process — a crash, a kill, a clean stop — and gives the
rest of the tree ``orphan_grace_s`` (5 s) to follow; whatever is still running then is
recorded as a ``server_orphans`` event (``server``, ``incarnation``, ``expected``,
``orphans``: ``[{pid, title, role, rss_bytes}]``) and killed. This check judges those
events.

``orphans.left`` (category ``orphans``): the number of processes found outliving their
API process over the whole run, limit 0. Quiet on a run whose trees always followed
their API process; fails with the pids and titles otherwise. A run in which no server
exited has nothing to judge and gives no result.
"""

from __future__ import annotations

from typing import Any

from harness.checks.base import CheckResult, RecordedRun

__all__ = ["findings", "check", "section"]


def findings(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The orphans recorded on a timeline.

    Returns:
        ``{"server_exits": int (``server_exited`` events), "orphans": [{"server",
        "incarnation", "expected", "t", "pid", "title", "role", "rss_bytes"}]}``, one
        entry per leftover process, in time order.
    """
    exits = sum(1 for e in events if e.get("event") == "server_exited")
    found = []
    for e in sorted(events, key=lambda e: e["t"]):
        if e.get("event") != "server_orphans":
            continue
        for o in e.get("orphans") or []:
            found.append({"server": e.get("server"), "incarnation": e.get("incarnation"),
                          "expected": e.get("expected"), "t": e["t"], "pid": o.get("pid"),
                          "title": o.get("title"), "role": o.get("role"), "rss_bytes": o.get("rss_bytes")})
    return {"server_exits": exits, "orphans": found}


def check(run: RecordedRun) -> list[CheckResult]:
    """``orphans.left``: processes that outlived their API server (limit 0); no result
    when no server exited during the run."""
    f = findings(run.events)
    if not f["server_exits"] and not f["orphans"]:
        return []
    left = f["orphans"]
    if not left:
        detail = f"{f['server_exits']} server exit(s); every process tree followed its API process"
    else:
        detail = "; ".join(
            f"{o['server']} incarnation {o['incarnation']}: {o['title'] or o['role'] or '?'} pid {o['pid']}"
            + (f" ({o['rss_bytes'] / 2**20:.0f} MiB)" if o["rss_bytes"] else "")
            for o in left) + " outlived the API process"
    return [CheckResult("orphans.left", "orphans", not left, len(left), 0, detail)]


def section(run: RecordedRun) -> dict[str, Any]:
    """``report.json``'s ``orphans`` (see :func:`findings`)."""
    return findings(run.events)

"""The speculation circuit breaker, judged from recorded data (runs with ``stack.breaker.enabled``).

Runbooks for speculative decoding: turn speculation off when rejection passes 30 %, and be
back on plain decoding within 30 s. The breaker (:mod:`harness.stack.breaker`) acts live;
this check re-derives, from the saved scraper lines (``metrics.jsonl``), when the
rejection rate first crossed ``stack.breaker.hard_rejection`` — the same windowed rate
(:func:`harness.stack.breaker.rejection_series`: 1 − Δaccepted ÷ Δdraft tokens over
``window_s``, at least ``min_draft_tokens``) — and holds the breaker to it:

* ``breaker.tripped`` (category ``breaker``): the recorded rate breached the hard limit
  ⇒ a hard trip (``breaker_tripped``, ``level: hard``) followed; passes with no breach
  (and says how many windows were judged); fails when no window could be judged at all
  (no metrics recorded: nothing to hold the breaker to).
* ``breaker.fallback_s``: from the breach (the recorded one; the breaker's own
  ``breach_t`` if the recording has none) to plain decoding serving again, at most
  ``fallback.max_s`` (default 30 s). With ``stack.breaker.fallback: restart``: the end of
  the first complete response sent after the trip and finished after the restarted
  server without speculation was ready (``server_ready`` of the trip's incarnation). With
  ``route``: the end of the first complete response the load router's warm plain server
  served (the record's ``served_by`` is the trip's ``routed_to``) that finished after the
  router's switch (the trip's ``switched_at``); there is no start-up to count or leave
  out. Judged when a breach or a hard trip happened; None (fail) when plain decoding never
  served. With ``fallback.startup: excluded`` (restart) the plain server's start-up (its
  ``server_ready`` ``startup_s``) is left out of the figure and judged apart:
* ``breaker.fallback_startup_ratio`` (``startup: excluded`` only): the plain server's
  start-up ÷ the median of the same server's earlier start-ups in this run (the draft
  swap's restart, a supervised restart, the stack's start when the run started it), at
  most ``fallback.max_startup_ratio``; not judged (None) without an earlier start-up or
  when the plain server never became ready (``breaker.fallback_s`` fails then), nor for a
  route fallback.

Integrity across the swap and the fallback is the integrity check's (every complete
response against the reference, whichever incarnation or server served it; its coverage
counts the speculative server's); the after phase within SLO is the slo check's.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from harness.checks.base import CheckResult, RecordedRun, instant
from harness.load.records import is_complete
from harness.stack.breaker import first_breach, rejection_series

__all__ = ["METRICS_FILE", "read_metric_lines", "findings", "check", "section"]

#: The scraper's file in the run directory.
METRICS_FILE = "metrics.jsonl"


def read_metric_lines(run_dir: Path | None) -> list[dict[str, Any]]:
    """The scraper lines of a run directory (a torn last line skipped); [] without one."""
    if run_dir is None or not (Path(run_dir) / METRICS_FILE).exists():
        return []
    out = []
    for text in (Path(run_dir) / METRICS_FILE).read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(text))
        except json.JSONDecodeError:
            continue
    return out


def _cfg(run: RecordedRun) -> Any:
    stack = getattr(run.limits, "stack", None)
    return getattr(stack, "breaker", None)


def findings(run: RecordedRun, lines: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """What the breaker did, from recorded data; None when the breaker was not enabled.

    Returns:
        ``{"server", "window_s", "hard_rejection", "soft_rejection", "windows_judged",
        "first_breach": {"t", "rejection_rate", "draft_tokens"}|None, "trips": [breaker events],
        "hard_trip": the first hard trip after the breach|None, "plain_ready_at": epoch s|None (restart:
        the plain server ready; route: the router's switch),
        "first_plain_success_at": epoch s|None, "breach_t": epoch s|None, "fallback_s": s|None,
        "plain_startup_s": s|None (the plain server's start-up), "earlier_startups_s": [s]
        (the same server's start-ups recorded before it in this run), "mechanism": "restart"|"route"
        (the trip's; the configured one without a trip), "routed_to": the plain upstream of a route
        trip|None, "routes": [``router`` events: router_started, routed, routed_back, router_stopped],
        "complete_by_server": {server that served it: complete responses}}``.
    """
    cfg = _cfg(run)
    if cfg is None or not cfg.enabled:
        return None
    memo = run.memo.get("breaker")
    if memo is not None and lines is None:
        return memo
    lines = read_metric_lines(run.run_dir) if lines is None else lines
    series = rejection_series(lines, cfg.server, cfg.window_s, cfg.min_draft_tokens)
    breach = first_breach(series, cfg.hard_rejection)
    trips = [e for e in run.events if e.get("source") == "breaker"]
    hard = [e for e in trips if e.get("event") == "breaker_tripped" and e.get("level") == "hard"]
    after = (breach["t"] - cfg.window_s) if breach else None
    trip = next((e for e in hard if after is None or e["t"] >= after), None)
    breach_t = breach["t"] if breach else (trip.get("breach_t") if trip else None)
    ready_at = success_at = plain_startup = None
    readies = [e for e in run.events if e.get("event") == "server_ready" and e.get("server") == cfg.server]
    earlier = [float(e["startup_s"]) for e in readies if e.get("startup_s") is not None
               and (trip is None or e["t"] < trip["t"])]
    mechanism = (trip.get("mechanism") or "restart") if trip is not None else cfg.fallback
    routed_to = trip.get("routed_to") if trip is not None else None
    if trip is not None and mechanism == "route":
        # the plain server was warm: it serves from the router's switch on
        ready_at = trip.get("switched_at") or trip["t"]
        ends = [r.send_time + r.e2e_s for r in run.records
                if r.served_by == routed_to and r.e2e_s is not None and r.send_time + r.e2e_s >= ready_at
                and is_complete(r)[0]]
        success_at = min(ends) if ends else None
    elif trip is not None:
        plain = next((e for e in readies if e.get("incarnation") == trip.get("incarnation")), None)
        ready_at = plain["t"] if plain is not None else None
        plain_startup = plain.get("startup_s") if plain is not None else None
        if ready_at is not None:
            ends = [r.send_time + r.e2e_s for r in run.records
                    if r.send_time >= trip["t"] and r.e2e_s is not None and r.send_time + r.e2e_s >= ready_at
                    and is_complete(r)[0]]
            success_at = min(ends) if ends else None
    served: dict[str, int] = {}
    for r in run.records:
        if is_complete(r)[0]:
            served[r.served] = served.get(r.served, 0) + 1
    out = {"server": cfg.server, "window_s": cfg.window_s, "hard_rejection": cfg.hard_rejection,
           "soft_rejection": cfg.soft_rejection, "windows_judged": len(series), "first_breach": breach,
           "trips": trips, "hard_trip": trip, "plain_ready_at": ready_at, "first_plain_success_at": success_at,
           "breach_t": breach_t,
           "fallback_s": round(success_at - breach_t, 3) if success_at is not None and breach_t is not None else None,
           "plain_startup_s": plain_startup, "earlier_startups_s": earlier, "mechanism": mechanism,
           "routed_to": routed_to, "routes": [e for e in run.events if e.get("source") == "router"],
           "complete_by_server": served}
    run.memo["breaker"] = out
    return out


def check(run: RecordedRun) -> list[CheckResult]:
    """``breaker.tripped`` and ``breaker.fallback_s`` (see module doc); [] when the breaker is off."""
    f = findings(run)
    if f is None:
        return []
    limit = run.limits.fallback.max_s
    t0 = run.fault_time
    results = []
    breach, trip = f["first_breach"], f["hard_trip"]
    if breach is None and not f["windows_judged"]:
        results.append(CheckResult("breaker.tripped", "breaker", False, None, f">= {f['hard_rejection']:g}",
                                   f"no rejection rate could be judged ({METRICS_FILE} missing or without "
                                   f"{f['window_s']:g} s of speculation): nothing to hold the breaker to"))
    elif breach is None:
        results.append(CheckResult("breaker.tripped", "breaker", True, "no breach", f">= {f['hard_rejection']:g}",
                                   f"the rejection rate stayed below {f['hard_rejection']:g} in "
                                   f"{f['windows_judged']} judged windows of {f['window_s']:g} s"
                                   + (f"; {len(f['trips'])} breaker event(s)" if f["trips"] else "")))
    else:
        at = instant(breach["t"], t0, run.windows)
        if trip is None:
            results.append(CheckResult("breaker.tripped", "breaker", False, breach["rejection_rate"],
                                       f">= {f['hard_rejection']:g}",
                                       f"rejection {breach['rejection_rate']:.3f} over {f['window_s']:g} s at {at}, "
                                       f"but the breaker never fell back to plain decoding"))
        else:
            results.append(CheckResult("breaker.tripped", "breaker", True, breach["rejection_rate"],
                                       f">= {f['hard_rejection']:g}",
                                       f"rejection {breach['rejection_rate']:.3f} at {at}; hard trip "
                                       f"{trip['t'] - breach['t']:+.2f} s later (the breaker measured "
                                       f"{trip.get('rejection_rate')})"))
    if breach is not None or trip is not None:
        fb = f["fallback_s"]
        excluded = run.limits.fallback.startup == "excluded"
        if fb is None:
            why = ("the breaker never tripped" if trip is None else
                   "the server without speculation never became ready" if f["plain_ready_at"] is None else
                   f"no complete response came from {f['routed_to'] or 'it'}")
            detail = f"no plain decoding served after the breach: {why}"
        elif f["mechanism"] == "route":
            detail = (f"breach → new requests routed to the warm plain server {f['routed_to']} "
                      f"{f['plain_ready_at'] - f['breach_t']:.1f} s → its first complete response {fb:.1f} s")
        else:
            detail = (f"breach → plain server ready {f['plain_ready_at'] - f['breach_t']:.1f} s → first complete "
                      f"response {fb:.1f} s")
            if excluded and f["plain_startup_s"] is not None:
                fb = round(fb - f["plain_startup_s"], 3)
                detail += f"; its start-up ({f['plain_startup_s']:.1f} s) left out: {fb:.1f} s counted"
        results.append(CheckResult("breaker.fallback_s", "breaker", fb is not None and fb <= limit, fb, limit, detail))
        if excluded:
            results.append(_startup_ratio(f, run.limits.fallback.max_startup_ratio))
    return results


def _startup_ratio(f: dict[str, Any], limit: float) -> CheckResult:
    """``breaker.fallback_startup_ratio`` from :func:`findings` (see module doc)."""
    plain, earlier = f["plain_startup_s"], f["earlier_startups_s"]
    name = "breaker.fallback_startup_ratio"
    if f["mechanism"] == "route":
        return CheckResult(name, "breaker", None, None, limit,
                           "not judged: the route fallback starts nothing (the plain server was already warm)")
    if plain is None:
        return CheckResult(name, "breaker", None, None, limit, "not judged: the plain server never became ready")
    if not earlier:
        return CheckResult(name, "breaker", None, None, limit,
                           f"not judged: plain start-up {plain:.1f} s, no earlier start-up of {f['server']} in this run")
    base = statistics.median(earlier)
    ratio = round(plain / base, 3)
    return CheckResult(name, "breaker", ratio <= limit, ratio, limit,
                       f"plain start-up {plain:.1f} s ÷ median of {len(earlier)} earlier start-up(s) {base:.1f} s")


def section(run: RecordedRun) -> dict[str, Any] | None:
    """``report.json``'s ``breaker`` (see :func:`findings`); None when the breaker is off."""
    return findings(run)

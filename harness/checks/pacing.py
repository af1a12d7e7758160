"""Whether the load ran as planned: the open loop's (or trace replay's) pacer sent its
arrivals on time. A pacer that falls behind sends fewer, later and burstier requests than
the profile declares, so every latency figure of the run describes another load than the
one under test (aiperf and GuideLLM report the same lateness for the same reason).

Data: ``RecordedRun.load_stats`` (``load_stats.json``, merged over the load's workers:
:func:`harness.load.profiles.read_load_stats`), whose lag histogram the pacer filled
(:mod:`harness.load.lag`). A closed loop has no pacer: no check, no section.
"""

from __future__ import annotations

from typing import Any

from harness.checks.base import CheckResult, RecordedRun
from harness.checks.view import Line, View, ms, pct

__all__ = ["check", "section", "summarize"]

#: The lag figures of ``load_stats.json`` the section carries (seconds, fractions).
FIELDS = ("arrivals", "dropped", "lag_p50_s", "lag_p95_s", "lag_p99_s", "lag_max_s", "lag_mean_s",
          "share_late_1ms", "share_late_10ms")


def check(run: RecordedRun) -> list[CheckResult]:
    """``pacing.lag_p99_s``: the 99th percentile of arrival lag (seconds) against
    ``load.max_lag_p99_s``. Not judged without arrivals (the load never started) or
    from a run whose stats hold no lag histogram; no check at all for a closed loop or
    without a declared limit."""
    limit = getattr(getattr(run.limits, "load", None), "max_lag_p99_s", None)
    stats = run.load_stats
    if stats is None or limit is None:
        return []
    name = "pacing.lag_p99_s"
    p99 = stats.get("lag_p99_s")
    if not stats.get("arrivals") or p99 is None:
        return [CheckResult.not_judged(name, "pacing", None, limit, "no arrival lag recorded (no arrival was due)")]
    late = stats.get("share_late_10ms")
    detail = (f"arrival lag p99 {p99 * 1000:.2f} ms over {stats['arrivals']} arrivals "
              f"(p50 {stats.get('lag_p50_s', 0) * 1000:.2f} ms, max {stats.get('lag_max_s', 0) * 1000:.1f} ms, "
              f"{(late or 0) * 100:.1f}% later than 10 ms)")
    if p99 > limit:
        detail += ": the pacer fell behind its plan, so the load under test was not the declared one"
    return [CheckResult(name, "pacing", p99 <= limit, p99, limit, detail)]


def section(run: RecordedRun) -> dict[str, Any] | None:
    """``{"arrivals", "dropped", "lag_p50_s", "lag_p95_s", "lag_p99_s", "lag_max_s",
    "lag_mean_s", "share_late_1ms", "share_late_10ms"}`` for an open loop or trace replay
    (seconds; shares are fractions of arrivals), None for a closed loop."""
    stats = run.load_stats
    if stats is None:
        return None
    return {k: stats.get(k) for k in FIELDS}


def summarize(sec: dict[str, Any] | None) -> list[View]:
    """One line: the pacer's arrivals, drops and lag percentiles (ms), and the shares of
    arrivals later than 1 ms and 10 ms; nothing for a closed loop."""
    if not sec or not sec.get("arrivals"):
        return []
    return [Line(f"pacer: {sec['arrivals']} arrivals, {sec.get('dropped') or 0} dropped; lag p50/p95/p99/max "
                 f"{ms(sec.get('lag_p50_s'))}/{ms(sec.get('lag_p95_s'))}/{ms(sec.get('lag_p99_s'))}/"
                 f"{ms(sec.get('lag_max_s'))} ms; later than 1 ms {pct(sec.get('share_late_1ms'))}, "
                 f"than 10 ms {pct(sec.get('share_late_10ms'))}")]

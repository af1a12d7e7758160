"""A speculation policy from a sweep's cells: break-even, best k, and the recommendation.

Pure functions over plain data (no server, no file): a *cell* is one point of a sweep
(:mod:`harness.experiment.sweep`) with speculative decoding measured against plain decoding
on the same workload, as a dict::

    {"id": "exact-k4-c2-short-greedy", "speculator": "exact", "method": "draft_model",
     "draft": "draft-exact", "k": 4, "level": 2, "bucket": "short",
     "min_prompt_tokens": 16, "max_prompt_tokens": 60, "sampling": "greedy",
     "acceptance_rate": 0.93,
     "speedup": {"goodput": {"speedup": 1.8, "low": 1.6, "high": 2.0}, "tpot_p50": {...}, ...}}

``speedup`` is speculative over plain for goodput (higher is better) and plain over
speculative for a latency (so > 1 always means speculation helps; < 1 a net loss);
``low``/``high`` its bootstrap interval (:mod:`harness.metrics.sweep`). ``level`` is the
load level: concurrency (requests in flight per server) or arrival rate (requests/s).

Rules (each a function below, each with a known-answer test):

* **pays off** (:func:`pays_off`): a setting pays off for a workload where its speedup of
  the policy's figure is at least 1 for *every* sampling class of the sweep (the smallest
  speedup over classes: vLLM cannot switch speculation per request's sampling, so a mix
  pays off only where each part does). Decisions use the point estimates; each
  recommendation carries the intervals of the cells it rests on, and ``confident`` says
  whether those intervals lie wholly on the decided side of 1.
* **break-even** (:func:`break_even`): along the load levels of one setting and bucket,
  the last level that still pays off before the first that does not, and the level where
  the speedup crosses 1, linearly interpolated between those two.
* **best k** (:func:`best_k`): the k with the highest speedup (ties: the smaller k, fewer
  wasted draft tokens).
* **policy** (:func:`derive_policy`), in the shape vLLM and the field use: the speculator
  (method and draft) whose best k pays most at the lowest level, averaged over buckets;
  *enable above N prompt tokens* — the shortest bucket from which on every longer bucket
  pays off at the lowest level (N: that bucket's ``min_prompt_tokens``); *below
  concurrency C* — the smallest last-paying level over the enabled buckets (vLLM's
  ``speculative_config.disable_by_batch_size`` disables speculation above it); *k per
  length bucket*; *breaker thresholds* from measured acceptance
  (:func:`acceptance_threshold`): the hard trip at the rejection rate (1 − acceptance)
  beyond which the measured cells stopped paying off, the soft trip ``soft_margin`` below
  it, to the next smaller k of the sweep (the shape of ``stack.breaker``,
  :class:`harness.stack.breaker.BreakerConfig`).
"""

from __future__ import annotations

from collections import defaultdict
from statistics import mean
from typing import Any, Iterable, Sequence

__all__ = ["FIGURES", "pays_off", "break_even", "best_k", "acceptance_threshold", "combine_sampling",
           "derive_policy"]

#: The figures a cell's speedup is given for, the policy's default first.
FIGURES = ("goodput", "tpot_p50", "ttft_p50", "ttft_p99")


def pays_off(speedup: float | None) -> bool:
    """Speculation pays off at this speedup: at least 1 (a missing speedup does not)."""
    return speedup is not None and speedup >= 1.0


def break_even(points: Iterable[tuple[float, float | None]]) -> dict[str, Any]:
    """Where speculation stops paying off along the load levels of one setting.

    Args:
        points: ``(level, speedup)`` (any order; concurrency or requests/s; speedup None
            when not measured: such a level is skipped).

    Returns:
        ``{"last_win": level|None, "first_loss": level|None, "break_even": level|None,
        "state": "wins"|"loses"|"crosses"|"unmeasured"}``: ``last_win`` the highest level
        such that every measured level up to it pays off (None: the lowest already loses);
        ``first_loss`` the next measured level (None: none loses); ``break_even`` the
        level where the speedup crosses 1 between them, linear in level (None unless
        ``crosses``). ``wins``: every level pays off; ``loses``: the lowest does not.
    """
    pts = sorted((float(x), float(s)) for x, s in points if s is not None)
    if not pts:
        return {"last_win": None, "first_loss": None, "break_even": None, "state": "unmeasured"}
    last = None
    for i, (x, s) in enumerate(pts):
        if not pays_off(s):
            if last is None:
                return {"last_win": None, "first_loss": x, "break_even": None, "state": "loses"}
            x0, s0 = pts[i - 1]
            cross = x0 + (s0 - 1.0) / (s0 - s) * (x - x0) if s0 != s else x0
            return {"last_win": x0, "first_loss": x, "break_even": cross, "state": "crosses"}
        last = x
    return {"last_win": last, "first_loss": None, "break_even": None, "state": "wins"}


def best_k(points: Iterable[tuple[int, float | None]]) -> int | None:
    """The k with the highest speedup among ``(k, speedup)`` (ties: the smaller k; None
    speedups skipped); None when none is measured."""
    pts = [(s, -k) for k, s in points if s is not None]
    return -max(pts)[1] if pts else None


def acceptance_threshold(points: Iterable[tuple[float | None, float | None]]) -> float | None:
    """The acceptance rate that best separates the cells that pay off from those that do not.

    Args:
        points: ``(acceptance_rate, speedup)`` per cell (pairs with a None skipped).

    Returns:
        The threshold ``a`` (a midpoint between two measured acceptance rates) that
        misclassifies the fewest cells under "pays off iff acceptance ≥ a"; ties: the
        lowest such ``a`` (trip as late as the data allows). None when every cell pays off
        or none does (nothing to separate), or with no pair.
    """
    pts = sorted((float(a), pays_off(s)) for a, s in points if a is not None and s is not None)
    if not pts or all(w for _, w in pts) or not any(w for _, w in pts):
        return None
    accs = sorted({a for a, _ in pts})
    cuts = [(lo + hi) / 2 for lo, hi in zip(accs, accs[1:])]
    best: tuple[int, float] | None = None
    for c in cuts:
        wrong = sum(1 for a, w in pts if (a >= c) != w)
        if best is None or wrong < best[0]:
            best = (wrong, c)
    return None if best is None else best[1]


def _fig(cell: dict[str, Any], figure: str) -> dict[str, Any]:
    return (cell.get("speedup") or {}).get(figure) or {}


def combine_sampling(cells: Sequence[dict[str, Any]], figure: str) -> list[dict[str, Any]]:
    """One point per setting × level × bucket over the sampling classes (module doc:
    *pays off*): the smallest speedup of ``figure`` over the classes, with that cell's
    interval. Returns ``[{"speculator", "method", "draft", "k", "level", "bucket",
    "min_prompt_tokens", "max_prompt_tokens", "speedup", "low", "high", "cells": [ids]}]``;
    a point with a class not measured has speedup None."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for c in cells:
        groups[(c["speculator"], c["k"], c["level"], c["bucket"])].append(c)
    out = []
    for (spec, k, level, bucket), members in groups.items():
        speeds = [(_fig(c, figure).get("speedup"), c) for c in members]
        worst = None if any(s is None for s, _ in speeds) else min(speeds, key=lambda p: p[0])[1]
        f = _fig(worst, figure) if worst is not None else {}
        first = members[0]
        out.append({"speculator": spec, "method": first.get("method"), "draft": first.get("draft"), "k": k,
                    "level": level, "bucket": bucket, "min_prompt_tokens": first.get("min_prompt_tokens"),
                    "max_prompt_tokens": first.get("max_prompt_tokens"), "speedup": f.get("speedup"),
                    "low": f.get("low"), "high": f.get("high"), "cells": sorted(c["id"] for c in members)})
    return out


def _confident(points: Sequence[dict[str, Any]], wins: bool) -> bool:
    """Every point's interval lies wholly on its decided side of 1."""
    return all((p["low"] is not None and p["low"] >= 1.0) if wins else (p["high"] is not None and p["high"] < 1.0)
               for p in points)


def derive_policy(cells: Sequence[dict[str, Any]], figure: str = "goodput", soft_margin: float = 0.1,
                  level_kind: str = "concurrency") -> dict[str, Any]:
    """The recommended policy (module doc) from a sweep's cells.

    Args:
        cells: as in the module doc (each with ``speedup[figure]``).
        figure: the speedup the decisions use (one of :data:`FIGURES`).
        soft_margin: the soft breaker trips this much rejection below the hard trip.
        level_kind: ``concurrency`` or ``rate`` (names the limit).

    Returns:
        ``{"figure", "level_kind", "enabled": bool, "speculator", "method", "draft",
        "enable": {"min_prompt_tokens": N|None, "max_<level_kind>": C|None, "rests_on"},
        "k_by_bucket": [{"bucket", "min_prompt_tokens", "max_prompt_tokens", "k",
        "speedup", "low", "high", "enabled", "break_even", "rests_on"}],
        "breaker": {"hard_rejection", "soft_rejection", "soft_num_speculative_tokens",
        "acceptance_threshold", "rests_on"} | None, "vllm": {"speculative_config": {...}} |
        None, "notes": [str]}``; ``rests_on`` lists cell ids. ``enabled`` false (with a
        note) when no bucket pays off at the lowest level.

    Raises:
        ValueError: an unknown ``figure``, or no cell.
    """
    if figure not in FIGURES:
        raise ValueError(f"unknown figure {figure!r} (known: {', '.join(FIGURES)})")
    if not cells:
        raise ValueError("no cell to derive a policy from")
    points = combine_sampling(cells, figure)
    lowest = min(p["level"] for p in points)
    buckets = sorted({(p["min_prompt_tokens"] or 0, p["bucket"]) for p in points})
    notes: list[str] = []
    limit = f"max_{level_kind}"

    # best k per speculator and bucket, at the lowest level
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for spec in sorted({p["speculator"] for p in points}):
        for _, bucket in buckets:
            at_low = [p for p in points if p["speculator"] == spec and p["bucket"] == bucket and p["level"] == lowest]
            k = best_k((p["k"], p["speedup"]) for p in at_low)
            if k is not None:
                best[(spec, bucket)] = next(p for p in at_low if p["k"] == k)
    scores = {spec: mean(p["speedup"] for (s, _), p in best.items() if s == spec)
              for spec in {s for s, _ in best}}
    if not scores:
        return {"figure": figure, "level_kind": level_kind, "enabled": False, "speculator": None, "method": None,
                "draft": None, "enable": {"min_prompt_tokens": None, limit: None, "rests_on": []},
                "k_by_bucket": [], "breaker": None, "vllm": None,
                "notes": [f"no cell has a {figure} speedup: nothing to recommend"]}
    spec = max(sorted(scores), key=lambda s: scores[s])
    chosen = next(p for (s, _), p in best.items() if s == spec)
    others = ", ".join(f"{s} {v:.2f}" for s, v in sorted(scores.items()) if s != spec)
    notes.append(f"speculator {spec}: mean {figure} speedup {scores[spec]:.2f} at its best k per bucket at "
                 f"{level_kind} {lowest:g}" + (f" (others: {others})" if others else ""))

    rows = []
    for lo_tokens, bucket in buckets:
        p = best.get((spec, bucket))
        if p is None:
            continue
        along = [q for q in points if q["speculator"] == spec and q["bucket"] == bucket and q["k"] == p["k"]]
        be = break_even((q["level"], q["speedup"]) for q in along)
        rows.append({"bucket": bucket, "min_prompt_tokens": p["min_prompt_tokens"],
                     "max_prompt_tokens": p["max_prompt_tokens"], "k": p["k"], "speedup": p["speedup"],
                     "low": p["low"], "high": p["high"], "enabled": pays_off(p["speedup"]),
                     "confident": _confident([p], pays_off(p["speedup"])), "break_even": be,
                     "rests_on": sorted({c for q in along for c in q["cells"]} |
                                        {c for q in points if q["speculator"] == spec and q["bucket"] == bucket
                                         and q["level"] == lowest for c in q["cells"]})})
    # enable above N prompt tokens: the shortest bucket from which on every longer one pays off
    start = len(rows)
    while start > 0 and rows[start - 1]["enabled"]:
        start -= 1
    enabled_rows = rows[start:]
    for r in rows[:start]:
        if r["enabled"]:
            notes.append(f"bucket {r['bucket']} pays off but a longer bucket does not: left disabled "
                         f"(one prompt-length threshold)")
            r["enabled"] = False
    enabled = bool(enabled_rows)
    min_tokens = enabled_rows[0]["min_prompt_tokens"] if enabled else None
    lasts = [r["break_even"]["last_win"] for r in enabled_rows]
    max_level = None if not enabled or any(x is None for x in lasts) else min(lasts)
    crosses = [r for r in enabled_rows if r["break_even"]["state"] == "crosses"]
    if enabled and not crosses:
        notes.append(f"speculation paid off at every measured {level_kind} of the enabled buckets: "
                     f"{limit} is the highest measured level, not a measured boundary")
    if not enabled:
        notes.append(f"no prompt-length bucket pays off at {level_kind} {lowest:g}: keep speculation off")

    breaker = _breaker(cells, figure, spec, [r["k"] for r in enabled_rows], soft_margin)
    vllm = None
    if enabled:
        k_main = max((r["k"] for r in enabled_rows), key=lambda k: sum(r["k"] == k for r in enabled_rows))
        sc: dict[str, Any] = {"method": chosen["method"], "num_speculative_tokens": k_main}
        if chosen["draft"]:
            sc["model"] = chosen["draft"]
        if level_kind == "concurrency" and max_level is not None and crosses:
            sc["disable_by_batch_size"] = int(max_level)
        vllm = {"speculative_config": sc,
                "note": "vLLM takes one k and a batch-size limit; the prompt-length threshold and k per bucket are "
                        "for a router or a per-request policy"}
    return {"figure": figure, "level_kind": level_kind, "enabled": enabled, "speculator": spec,
            "method": chosen["method"], "draft": chosen["draft"],
            "enable": {"min_prompt_tokens": min_tokens, limit: max_level,
                       "rests_on": sorted({c for r in enabled_rows for c in r["rests_on"]})},
            "k_by_bucket": rows, "breaker": breaker, "vllm": vllm, "notes": notes}


def _breaker(cells: Sequence[dict[str, Any]], figure: str, spec: str, ks: Sequence[int],
             soft_margin: float) -> dict[str, Any] | None:
    """Breaker thresholds from every cell's (acceptance rate, speedup) (module doc)."""
    pts = [(c.get("acceptance_rate"), _fig(c, figure).get("speedup"), c["id"]) for c in cells]
    pts = [p for p in pts if p[0] is not None and p[1] is not None]
    a = acceptance_threshold((acc, s) for acc, s, _ in pts)
    if a is None:
        return None
    hard = round(1.0 - a, 3)
    k_main = max(ks) if ks else max(int(c["k"]) for c in cells if c["speculator"] == spec)
    smaller = sorted({int(c["k"]) for c in cells if int(c["k"]) < k_main})
    soft = round(hard - soft_margin, 3) if smaller and hard - soft_margin > 0 else None
    return {"hard_rejection": hard, "soft_rejection": soft,
            "soft_num_speculative_tokens": smaller[-1] if soft is not None else None,
            "acceptance_threshold": round(a, 3), "rests_on": sorted(i for _, _, i in pts)}

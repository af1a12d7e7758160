"""A speculation policy from a sweep's cells: the theoretical bound, each cell's verdict,
break-even, best k and the recommendation.

Pure functions over plain data (no server, no file): a *cell* is one point of a sweep
(:mod:`harness.experiment.sweep`) with speculative decoding measured against plain decoding
on the same workload, as a dict::

    {"id": "exact-k4-c2-short-greedy", "speculator": "exact", "method": "draft_model",
     "draft": "draft-exact", "k": 4, "level": 2, "bucket": "short",
     "min_prompt_tokens": 16, "max_prompt_tokens": 60, "sampling": "greedy",
     "acceptance_rate": 0.93, "mean_acceptance_length": 4.7,            # client side
     "vllm_acceptance_rate": 0.95, "vllm_mean_acceptance_length": 4.8,  # vLLM's counters
     "draft_cost": {"c": 0.08, "measured": true, ...},
     "speedup": {"throughput": {"speedup": 1.8, "low": 1.6, "high": 2.0}, "tpot_p50": {...}, ...}}

``speedup`` is speculative over plain for throughput and goodput (higher is better) and
plain over speculative for a latency (so > 1 always means speculation helps; < 1 a net
loss); ``low``/``high`` its bootstrap interval (:mod:`harness.metrics.sweep`). ``level`` is
the load level: concurrency (requests in flight per server) or arrival rate (requests/s).

**The bound** (Leviathan, Kalman & Matias, *Fast Inference from Transformers via
Speculative Decoding*, ICML 2023, Theorem 3.8): with a per-token acceptance probability α,
``k`` drafted tokens per step and a draft costing ``c`` of a target step, the expected
wall-time gain of speculative over plain decoding is at most
``(1 − α^(k+1)) / ((1 − α)(kc + 1))`` (:func:`speedup_bound`). The numerator is the expected
tokens per target step. What a run measures is the mean acceptance length ``L`` (tokens per
step, ``1 + k × accepted ÷ drafted``); α is the one whose expected tokens per step equal it
(:func:`alpha_from_length`, solved numerically): putting accepted ÷ drafted itself in the
formula would understate the tokens per step (``α + … + α^k ≤ kα``) and call honest cells
implausible. The cell's ``L`` is the larger of the client's and vLLM's (the generous side).
``c`` is measured (:func:`draft_cost`): a speculative step drafts ``k`` tokens and
verifies them, so its time is ``(kc + 1)`` target steps; the median engine step of the
speculative streams (per request, its decode time over its chunks: one chunk per step,
:func:`harness.metrics.sweep.step_s`) over the plain streams' (one token per step), at the
same concurrency, gives ``c = (gap_spec ÷ gap_plain − 1) ÷ k``
(floored at 0) — an *effective* draft cost that includes the extra cost of verifying
``k + 1`` tokens. The bound uses the low end of its interval (``c_low``, from the step
p50's bootstrap interval), so that noise in the gaps never tightens the bound. A cell without a measurable gap on either side gets ``c = 0``, the most
generous bound, and says so.

**A cell's verdict** for the policy's figure (:func:`cell_verdict`), first match wins:

* ``implausible``: the interval of a checked figure (the decision figure and
  :data:`BOUNDED_FIGURES`) lies
  entirely above the cell's bound — above 1 where the bound is below 1
  (:func:`plausibility`): the cell measured something else (two servers sharing cores, a
  threshold effect); the policy never rests on it;
* ``unmeasured``: no speedup (too few requests on a side);
* ``no acceptance``: the speculator accepted nothing (α = 0 on both counts): never enabled,
  whatever the figure says;
* ``loss``: the interval lies wholly below 1;
* ``inconclusive``: the interval straddles 1 (or has an open end): no evidence to enable;
* ``gain``: the interval lies wholly above 1.

Rules (each a function below, each with a known-answer test):

* **pays off** (:func:`combine_sampling`): a setting pays off for a workload where every
  sampling class of the sweep is a ``gain`` (vLLM cannot switch speculation per request's
  sampling, so a mix pays off only where each part does); the point carries the worst
  class's verdict and interval.
* **break-even** (:func:`break_even`): along the load levels of one setting and bucket,
  the last level that still pays off before the first that does not, and the level where
  the speedup crosses 1, linearly interpolated between those two (point estimates: where
  the crossing lies, not whether a level is enabled).
* **best k** (:func:`best_k`): the k with the highest speedup (ties: the smaller k, fewer
  wasted draft tokens).
* **policy** (:func:`derive_policy`), in the shape vLLM and the field use: the speculator
  (method and draft) with the most enabled buckets at the lowest level (ties: the highest
  mean speedup); per bucket the best k among its ``gain`` points; a decision per bucket ×
  level with its verdict and the cells it rests on; *enable above N prompt tokens* — the
  shortest bucket from which on every longer bucket is a ``gain`` at the lowest level;
  *below concurrency C* — the smallest level over the enabled buckets up to which every
  level is a ``gain`` (vLLM's ``speculative_config.disable_by_batch_size``); *breaker
  thresholds* from the bound (:func:`break_even_alpha`): the acceptance at which the bound
  crosses 1 for the measured ``c`` — tokens per step ``kc + 1``, i.e. accepted ÷ drafted =
  ``c`` — as the hard trip at rejection ``1 − c``, the soft trip ``soft_margin`` below it
  to the next smaller k of the sweep (the shape of ``stack.breaker``,
  :class:`harness.stack.breaker.BreakerConfig`). Without a measured ``c`` the bound never
  falls below 1 and there is no threshold to derive: no breaker, with a note.
"""

from __future__ import annotations

from collections import defaultdict
from statistics import mean, median
from typing import Any, Iterable, Sequence

__all__ = ["FIGURES", "BOUNDED_FIGURES", "VERDICTS", "checked_figures", "speedup_bound", "expected_tokens", "alpha_from_length",
           "break_even_alpha", "draft_cost", "cell_bound", "plausibility", "cell_verdict", "pays_off", "break_even",
           "best_k", "combine_sampling", "derive_policy"]

#: The figures a cell's speedup is given for, the policy's default first.
FIGURES = ("throughput", "tpot_p50", "tpot_p99", "itl_p50", "itl_p99", "ttft_p50", "ttft_p99", "goodput")
#: The figures a cell is checked against its bound on besides the policy's own (a cell above
#: its bound on any is implausible): the rates a decision can rest on (goodput included: a
#: goodput ratio above the bound is a threshold effect, not speculation). A per-token median
#: is checked only when it decides: measured on the fake engine (10 ms steps), the plain
#: streams' per-chunk overhead put a TPOT p50 speedup at 5.23 [5.12, 5.42], above k + 1 = 5.
BOUNDED_FIGURES = ("throughput", "goodput")
#: A cell's (and a policy decision's) verdicts, most severe first (module doc).
VERDICTS = ("implausible", "unmeasured", "no acceptance", "loss", "inconclusive", "gain")
_BISECT_STEPS = 200


def expected_tokens(alpha: float, k: int) -> float:
    """Expected tokens per target step with per-token acceptance ``alpha`` and ``k`` drafted
    tokens: ``1 + α + … + α^k = (1 − α^(k+1)) / (1 − α)`` (``k + 1`` at α = 1).

    Raises:
        ValueError: ``alpha`` outside [0, 1] or ``k`` < 1.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    return float(k + 1) if alpha == 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def speedup_bound(alpha: float, k: int, c: float) -> float:
    """Leviathan et al. (2023)'s expected wall-time gain ``(1 − α^(k+1)) / ((1 − α)(kc + 1))``.

    Args:
        alpha: per-token acceptance probability in [0, 1].
        k: drafted tokens per step (``num_speculative_tokens``).
        c: a draft step's cost as a fraction of a target step (≥ 0).

    Raises:
        ValueError: an argument out of range.
    """
    if c < 0:
        raise ValueError(f"c must be at least 0, got {c}")
    return expected_tokens(alpha, k) / (k * c + 1.0)


def _solve(f: Any, target: float) -> float:
    """The α in [0, 1] where the increasing ``f`` reaches ``target`` (bisection)."""
    lo, hi = 0.0, 1.0
    for _ in range(_BISECT_STEPS):
        mid = (lo + hi) / 2
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def alpha_from_length(length: float, k: int) -> float:
    """The per-token acceptance α whose expected tokens per step (:func:`expected_tokens`)
    equal a measured mean acceptance length (tokens per step), clipped to [1, k + 1]:
    0 at 1, 1 at ``k + 1``; solved numerically (bisection, 1e-12 or better)."""
    if length <= 1.0:
        return 0.0
    if length >= k + 1:
        return 1.0
    return _solve(lambda a: expected_tokens(a, k), length)


def break_even_alpha(k: int, c: float) -> float:
    """The per-token acceptance α at which :func:`speedup_bound` crosses 1 for ``k`` and
    ``c``: where the expected tokens per step equal ``kc + 1`` (solved numerically; 0 at
    ``c = 0``, where no acceptance makes the bound fall below 1; 1 when ``c ≥ 1``: no
    acceptance pays a draft as dear as the target)."""
    return alpha_from_length(k * c + 1.0, k)


def draft_cost(spec_gap_s: float | None, plain_gap_s: float | None, k: int,
               ratio_low: float | None = None) -> dict[str, Any]:
    """The measured draft cost ``c`` of a cell (module doc).

    Args:
        spec_gap_s: median engine step of the speculative streams (seconds; one chunk per
            verified step), None when not measured.
        plain_gap_s: the same over the plain streams (one token per step).
        k: drafted tokens per step.
        ratio_low: the low end of the interval of ``spec_gap_s ÷ plain_gap_s`` (None: the
            point ratio): gives ``c_low``, the cost the bound uses (noise in the gaps must
            not tighten the bound).

    Returns:
        ``{"c", "c_low", "measured": bool, "spec_gap_s", "plain_gap_s", "note"}``; ``c``
        and ``c_low`` ≥ 0, both 0 (the most generous bound) when a gap is missing, with the
        note saying so.
    """
    if not spec_gap_s or not plain_gap_s or k < 1:
        return {"c": 0.0, "c_low": 0.0, "measured": False, "spec_gap_s": spec_gap_s, "plain_gap_s": plain_gap_s,
                "note": "draft cost not measured (no chunk gap on a side): the bound uses c = 0, the most generous"}
    ratio = spec_gap_s / plain_gap_s
    c = max(0.0, (ratio - 1.0) / k)
    c_low = max(0.0, (min(ratio, ratio_low if ratio_low is not None else ratio) - 1.0) / k)
    return {"c": c, "c_low": c_low, "measured": True, "spec_gap_s": spec_gap_s, "plain_gap_s": plain_gap_s,
            "note": f"c = (spec chunk gap {spec_gap_s * 1e3:.2f} ms / plain {plain_gap_s * 1e3:.2f} ms - 1) / k"}


def _lengths(cell: dict[str, Any]) -> list[float]:
    return [float(x) for x in (cell.get("mean_acceptance_length"), cell.get("vllm_mean_acceptance_length"))
            if x is not None]


def _rates(cell: dict[str, Any]) -> list[float]:
    return [float(x) for x in (cell.get("acceptance_rate"), cell.get("vllm_acceptance_rate")) if x is not None]


def cell_bound(cell: dict[str, Any]) -> dict[str, Any]:
    """The cell's bound (module doc) at ``draft_cost["c_low"]`` (else ``["c"]``; neither: 0):
    ``{"alpha", "k", "c", "c_measured", "tokens_per_step",
    "speedup_bound", "note"}``; ``speedup_bound`` None when neither the client nor vLLM
    measured acceptance (then nothing bounds the cell)."""
    k = int(cell["k"])
    dc = cell.get("draft_cost") or {}
    c = float(dc.get("c_low", dc.get("c")) or 0.0)
    lengths = _lengths(cell)
    rates = _rates(cell)
    if not lengths and rates:
        lengths = [1.0 + k * max(rates)]
    if not lengths:
        return {"alpha": None, "k": k, "c": c, "c_measured": bool(dc.get("measured")), "tokens_per_step": None,
                "speedup_bound": None, "note": "no acceptance measured: the cell is not bounded"}
    length = max(lengths)
    alpha = alpha_from_length(length, k)
    notes = [] if dc.get("measured") else ["c not measured: c = 0, the most generous bound"]
    return {"alpha": alpha, "k": k, "c": c, "c_measured": bool(dc.get("measured")), "tokens_per_step": length,
            "speedup_bound": speedup_bound(alpha, k, c), "note": "; ".join(notes)}


def checked_figures(figure: str) -> tuple[str, ...]:
    """The figures :func:`plausibility` checks for a policy deciding on ``figure``."""
    return tuple(dict.fromkeys((*BOUNDED_FIGURES, figure)))


def plausibility(cell: dict[str, Any], figures: Sequence[str] = BOUNDED_FIGURES) -> dict[str, Any]:
    """Whether the cell's measured speedups can happen (module doc).

    Returns:
        ``{"state": "plausible"|"implausible"|"unchecked", "reasons": [str]}``: implausible
        when the interval of one of ``figures`` lies entirely above the cell's bound (its
        ``low`` above :func:`cell_bound`'s ``speedup_bound``, or above 1 where the bound is
        below 1: a figure that also holds time speculation does not touch — prefill,
        queueing — lands between a decode bound below 1 and 1, so only a gain is
        impossible there); unchecked without a bound.
    """
    b = cell_bound(cell)
    bound = b["speedup_bound"]
    if bound is None:
        return {"state": "unchecked", "reasons": [b["note"]]}
    ceiling = max(bound, 1.0)
    reasons = []
    for f in figures:
        fig = _fig(cell, f)
        low = fig.get("low")
        if low is not None and low > ceiling:
            reasons.append(f"{f} speedup {fig.get('speedup'):.2f} [{low:.2f}, {_num(fig.get('high'))}] lies above "
                           f"the bound {bound:.2f} (alpha {b['alpha']:.2f}, k {b['k']}, c {b['c']:.2f}"
                           f"{'' if b['c_measured'] else ' not measured'}"
                           f"{'' if bound >= 1.0 else '; above 1, where a bound below 1 stops'})")
    return {"state": "implausible" if reasons else "plausible", "reasons": reasons}


def _num(x: float | None) -> str:
    return "?" if x is None else f"{x:.2f}"


def _fig(cell: dict[str, Any] | None, figure: str) -> dict[str, Any]:
    return ((cell or {}).get("speedup") or {}).get(figure) or {}


def _no_acceptance(cell: dict[str, Any]) -> bool:
    rates = _rates(cell)
    return bool(rates) and max(rates) == 0.0


def cell_verdict(cell: dict[str, Any], figure: str) -> tuple[str, str]:
    """The cell's verdict for ``figure`` (one of :data:`VERDICTS`, module doc) and why; its
    ``plausibility`` as recorded, else :func:`plausibility` on :data:`BOUNDED_FIGURES` and ``figure``."""
    pl = cell.get("plausibility") or plausibility(cell, checked_figures(figure))
    f = _fig(cell, figure)
    s, lo, hi = f.get("speedup"), f.get("low"), f.get("high")
    if pl["state"] == "implausible":
        return "implausible", "; ".join(pl["reasons"])
    if s is None:
        return "unmeasured", f"no {figure} speedup (too few requests on a side)"
    if _no_acceptance(cell):
        return "no acceptance", f"acceptance 0 ({figure} speedup {s:.2f}): speculation accepted nothing"
    ci = f"{figure} speedup {s:.2f} [{_num(lo)}, {_num(hi)}]"
    if hi is not None and hi < 1.0:
        return "loss", f"{ci} lies below 1"
    if lo is None or hi is None or lo <= 1.0:
        return "inconclusive", f"{ci} straddles 1: no evidence to enable"
    return "gain", f"{ci} lies above 1"


def pays_off(verdict: str) -> bool:
    """Speculation is enabled on this verdict: only a ``gain``."""
    return verdict == "gain"


def break_even(points: Iterable[tuple[float, float | None]]) -> dict[str, Any]:
    """Where speculation stops paying off along the load levels of one setting, by point
    estimate (a speedup of at least 1 pays off here).

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
        if s < 1.0:
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


def combine_sampling(cells: Sequence[dict[str, Any]], figure: str) -> list[dict[str, Any]]:
    """One point per setting × level × bucket over the sampling classes (module doc:
    *pays off*): the most severe verdict over the classes (:data:`VERDICTS`), ties by the
    smallest speedup, with that cell's speedup and interval. Returns ``[{"speculator",
    "method", "draft", "k", "level", "bucket", "min_prompt_tokens", "max_prompt_tokens",
    "speedup", "low", "high", "verdict", "reason", "cells": [ids]}]``."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for c in cells:
        groups[(c["speculator"], c["k"], c["level"], c["bucket"])].append(c)
    out = []
    for (spec, k, level, bucket), members in groups.items():
        judged = [(VERDICTS.index(cell_verdict(c, figure)[0]), _fig(c, figure).get("speedup"), c) for c in members]
        worst = min(judged, key=lambda j: (j[0], float("inf") if j[1] is None else j[1]))[2]
        verdict, reason = cell_verdict(worst, figure)
        f = _fig(worst, figure)
        first = members[0]
        out.append({"speculator": spec, "method": first.get("method"), "draft": first.get("draft"), "k": k,
                    "level": level, "bucket": bucket, "min_prompt_tokens": first.get("min_prompt_tokens"),
                    "max_prompt_tokens": first.get("max_prompt_tokens"), "speedup": f.get("speedup"),
                    "low": f.get("low"), "high": f.get("high"), "verdict": verdict,
                    "reason": f"{worst['id']}: {reason}", "cells": sorted(c["id"] for c in members)})
    return out


def _pick_k(pts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Among one bucket's points at one level: the best k among gains, else among the
    points that are not implausible, else any."""
    for pool in ([p for p in pts if pays_off(p["verdict"])], [p for p in pts if p["verdict"] != "implausible"], pts):
        k = best_k((p["k"], p["speedup"]) for p in pool)
        if k is not None:
            return next(p for p in pool if p["k"] == k)
    return pts[0] if pts else None


def derive_policy(cells: Sequence[dict[str, Any]], figure: str = "throughput", soft_margin: float = 0.1,
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
        "speedup", "low", "high", "verdict", "reason", "enabled", "max_level",
        "break_even", "decisions": [{"level", "k", "verdict", "reason", "speedup", "low",
        "high", "rests_on"}], "rests_on"}], "breaker": {"hard_rejection", "soft_rejection",
        "soft_num_speculative_tokens", "acceptance_threshold", "alpha_break_even", "k", "c",
        "rests_on"} | None, "vllm": {"speculative_config": {...}} | None, "notes": [str],
        "others": {speculator: [{"bucket", "k", "verdict", "decisions"}]}}``;
        ``rests_on`` lists cell ids; ``others``: per speculator not chosen, its buckets'
        k, verdict and decisions. ``enabled`` false (with a note) when no bucket is a
        ``gain`` at the lowest level.

    Raises:
        ValueError: an unknown ``figure``, or no cell.
    """
    if figure not in FIGURES:
        raise ValueError(f"unknown figure {figure!r} (known: {', '.join(FIGURES)})")
    if not cells:
        raise ValueError("no cell to derive a policy from")
    points = combine_sampling(cells, figure)
    levels = sorted({p["level"] for p in points})
    lowest = levels[0]
    buckets = sorted({(p["min_prompt_tokens"] or 0, p["bucket"]) for p in points})
    notes: list[str] = []
    limit = f"max_{level_kind}"

    def rows_of(spec: str) -> list[dict[str, Any]]:
        rows = []
        for _, bucket in buckets:
            mine = [p for p in points if p["speculator"] == spec and p["bucket"] == bucket]
            p = _pick_k([q for q in mine if q["level"] == lowest])
            if p is None:
                continue
            along = sorted((q for q in mine if q["k"] == p["k"]), key=lambda q: q["level"])
            decisions = [{"level": q["level"], "k": q["k"], "verdict": q["verdict"], "reason": q["reason"],
                          "speedup": q["speedup"], "low": q["low"], "high": q["high"], "rests_on": q["cells"]}
                         for q in along]
            max_level = None
            for d in decisions:
                if not pays_off(d["verdict"]):
                    break
                max_level = d["level"]
            rows.append({"bucket": bucket, "min_prompt_tokens": p["min_prompt_tokens"],
                         "max_prompt_tokens": p["max_prompt_tokens"], "k": p["k"], "speedup": p["speedup"],
                         "low": p["low"], "high": p["high"], "verdict": p["verdict"], "reason": p["reason"],
                         "enabled": pays_off(p["verdict"]), "max_level": max_level,
                         "break_even": break_even((q["level"], q["speedup"]) for q in along),
                         "decisions": decisions,
                         "rests_on": sorted({c for q in along for c in q["cells"]} |
                                            {c for q in mine if q["level"] == lowest for c in q["cells"]})})
        return rows

    by_spec = {spec: rows_of(spec) for spec in sorted({p["speculator"] for p in points})}

    def score(spec: str) -> tuple[int, float]:
        on = [r["speedup"] for r in by_spec[spec] if r["enabled"]]
        return len(on), mean(on) if on else -1.0

    spec = max(sorted(by_spec), key=score)
    rows = by_spec[spec]
    first = next(p for p in points if p["speculator"] == spec)
    others = ", ".join(f"{s} {score(s)[0]}" for s in sorted(by_spec) if s != spec)
    notes.append(f"speculator {spec}: {score(spec)[0]} bucket(s) with a {figure} gain at {level_kind} {lowest:g}"
                 + (f" (others: {others})" if others else ""))
    for r in rows:
        for d in r["decisions"]:
            if d["verdict"] != "gain":
                notes.append(f"{r['bucket']} at {level_kind} {d['level']:g} (k={d['k']}): {d['verdict']}: {d['reason']}")

    # enable above N prompt tokens: the shortest bucket from which on every longer one is a gain
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
    max_level = min(r["max_level"] for r in enabled_rows) if enabled else None
    bounded = enabled and max_level != levels[-1]
    if enabled and not bounded:
        notes.append(f"speculation paid off at every measured {level_kind} of the enabled buckets: "
                     f"{limit} is the highest measured level, not a measured boundary")
    if not enabled:
        notes.append(f"no prompt-length bucket shows a {figure} gain at {level_kind} {lowest:g}: keep speculation off")

    breaker = _breaker(cells, spec, enabled_rows, soft_margin, notes) if enabled else None
    vllm = None
    if enabled:
        k_main = max((r["k"] for r in enabled_rows), key=lambda k: sum(r["k"] == k for r in enabled_rows))
        sc: dict[str, Any] = {"method": first["method"], "num_speculative_tokens": k_main}
        if first["draft"]:
            sc["model"] = first["draft"]
        if level_kind == "concurrency" and max_level is not None and bounded:
            sc["disable_by_batch_size"] = int(max_level)
        vllm = {"speculative_config": sc,
                "note": "vLLM takes one k and a batch-size limit; the prompt-length threshold and k per bucket are "
                        "for a router or a per-request policy"}
    return {"figure": figure, "level_kind": level_kind, "enabled": enabled, "speculator": spec,
            "method": first["method"], "draft": first["draft"],
            "enable": {"min_prompt_tokens": min_tokens, limit: max_level,
                       "rests_on": sorted({c for r in enabled_rows for d in r["decisions"]
                                           if pays_off(d["verdict"]) for c in d["rests_on"]})},
            "k_by_bucket": rows, "breaker": breaker, "vllm": vllm, "notes": notes,
            "others": {s: [{"bucket": r["bucket"], "k": r["k"], "verdict": r["verdict"],
                            "decisions": [{"level": d["level"], "verdict": d["verdict"], "reason": d["reason"]}
                                          for d in r["decisions"]]} for r in rs]
                       for s, rs in by_spec.items() if s != spec}}


def _breaker(cells: Sequence[dict[str, Any]], spec: str, rows: Sequence[dict[str, Any]], soft_margin: float,
             notes: list[str]) -> dict[str, Any] | None:
    """Breaker thresholds from the bound at the measured draft cost (module doc)."""
    k_main = max((r["k"] for r in rows), key=lambda k: sum(r["k"] == k for r in rows))
    ids = {c for r in rows if r["k"] == k_main for d in r["decisions"] if pays_off(d["verdict"]) for c in d["rests_on"]}
    measured = [(float(c["draft_cost"]["c"]), c["id"]) for c in cells
                if c["id"] in ids and (c.get("draft_cost") or {}).get("measured")]
    if not measured:
        notes.append("breaker: no measured draft cost among the enabled cells; at c = 0 the bound never falls "
                     "below 1, so there is no acceptance threshold to derive")
        return None
    c = median(v for v, _ in measured)
    alpha = break_even_alpha(k_main, c)
    rate = min(1.0, c)   # tokens per step k*c + 1 = 1 + k * (accepted / drafted)
    if rate <= 0.0:
        notes.append(f"breaker: the measured draft cost is 0 at k={k_main}: the bound never falls below 1")
        return None
    hard = round(1.0 - rate, 3)
    smaller = sorted({int(x["k"]) for x in cells if x["speculator"] == spec and int(x["k"]) < k_main})
    soft = round(hard - soft_margin, 3) if smaller and hard - soft_margin > 0 else None
    notes.append(f"breaker: at k={k_main} and measured c={c:.3f} the bound crosses 1 at alpha {alpha:.3f} "
                 f"(accepted/drafted {rate:.3f}): hard trip at rejection {hard:.3f}")
    return {"hard_rejection": hard, "soft_rejection": soft,
            "soft_num_speculative_tokens": smaller[-1] if soft is not None else None,
            "acceptance_threshold": round(rate, 3), "alpha_break_even": round(alpha, 4), "k": k_main,
            "c": round(c, 4), "rests_on": sorted(i for _, i in measured)}

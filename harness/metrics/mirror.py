"""Speculative vs plain decoding in the same run (mirror mode): pure functions of records.

In mirror mode (``load.mirror``) every load request goes to the speculative server
(records ``server == "spec"``) and, interleaved, the same request to the non-speculative
reference server (``server == "ref"``). Here both sides are compared per
**phase × prompt-length bucket × sampling class**: TTFT, TPOT and E2E percentiles of each
(defined as in vLLM's serving benchmark, :mod:`harness.metrics.latency`, over *complete*
requests only), and

* ``ratio``: speculative ÷ plain, per metric and percentile (``tpot_p50`` 0.5 means the
  speculative server spends half the time per output token; > 1 means speculation costs);
* ``speedup``: plain ÷ speculative median TPOT (how many times faster the speculative
  server decodes; the inverse of ``ratio.tpot_p50``), and ``e2e_speedup``: plain ÷
  speculative median E2E (how much sooner a whole request completes).

A ratio is None when either side has no value (never 0 or 1 by default: a missing
measurement must not look like a result).
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from harness.load.records import RequestRecord, is_complete
from harness.metrics.latency import e2e_s, percentiles, tpot_s, ttft_s

__all__ = ["ALL", "METRICS", "side_stats", "ratios", "compare", "mirror_groups"]

#: The bucket name of a row that pools every prompt-length bucket.
ALL = "all"
#: The latency metrics compared, by report key, with the per-request function of each.
METRICS = {"ttft_s": ttft_s, "tpot_s": tpot_s, "e2e_s": e2e_s}
_QS = (50, 95)


def side_stats(records: Iterable[RequestRecord]) -> dict[str, Any]:
    """One server's side of a comparison.

    Returns:
        ``{"requests": n sent, "complete": n complete, "ttft_s": {"p50","p95"},
        "tpot_s": {...}, "e2e_s": {...}}`` in seconds (TPOT per output token), over the
        complete requests; percentiles None without data.
    """
    records = list(records)
    complete = [r for r in records if is_complete(r)[0]]
    out: dict[str, Any] = {"requests": len(records), "complete": len(complete)}
    for key, fn in METRICS.items():
        out[key] = percentiles((fn(r) for r in complete), _QS)
    return out


def _div(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def ratios(spec: dict[str, Any], ref: dict[str, Any]) -> dict[str, float | None]:
    """Speculative ÷ plain for every metric and percentile of :func:`side_stats`, keyed
    ``"<metric>_<pct>"`` without the unit, e.g. ``{"ttft_p50", "ttft_p95", "tpot_p50", ...}``."""
    out: dict[str, float | None] = {}
    for key in METRICS:
        name = key.removesuffix("_s")
        for q in _QS:
            p = f"p{q}"
            out[f"{name}_{p}"] = _div(spec[key][p], ref[key][p])
    return out


def compare(spec: Iterable[RequestRecord], ref: Iterable[RequestRecord]) -> dict[str, Any]:
    """Both sides of one group and how they compare.

    Returns:
        ``{"spec": side_stats, "ref": side_stats, "ratio": ratios (spec ÷ plain),
        "speedup": plain ÷ spec median TPOT, "e2e_speedup": plain ÷ spec median E2E}``.
    """
    s, r = side_stats(spec), side_stats(ref)
    return {"spec": s, "ref": r, "ratio": ratios(s, r),
            "speedup": _div(r["tpot_s"]["p50"], s["tpot_s"]["p50"]),
            "e2e_speedup": _div(r["e2e_s"]["p50"], s["e2e_s"]["p50"])}


def _ordered(names: Iterable[str], first: Sequence[str]) -> list[str]:
    seen = list(dict.fromkeys(names))
    return [n for n in first if n in seen] + sorted(n for n in seen if n not in first)


def mirror_groups(
    spec_members: dict[str, list[RequestRecord]],
    ref_members: dict[str, list[RequestRecord]],
    *,
    buckets: Sequence[str] = (),
    sampling: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Speculative vs plain per phase × bucket × sampling class.

    Args:
        spec_members: ``{phase: records}`` of the speculative server
            (:func:`harness.metrics.phases.assign_phases`).
        ref_members: the same for the reference server's mirror-mode records.
        buckets: bucket names in display order (configured order); names that occur in
            the records but are not listed follow, sorted.
        sampling: sampling class names in display order, likewise.

    Returns:
        One row per phase (in ``spec_members``' order), per bucket that occurs plus
        :data:`ALL` (every bucket pooled), per sampling class that occurs (never pooled:
        greedy and sampled speculation behave too differently to mix)::

            {"phase", "bucket", "sampling", **compare(spec, ref)}
    """
    rows: list[dict[str, Any]] = []
    for phase, spec_recs in spec_members.items():
        ref_recs = ref_members.get(phase, [])
        both = spec_recs + ref_recs
        names = _ordered((r.prompt_class for r in both), buckets)
        classes = _ordered((r.sampling for r in both), sampling)
        for bucket in [*names, ALL]:
            for cls in classes:
                def pick(recs: list[RequestRecord]) -> list[RequestRecord]:
                    return [r for r in recs if r.sampling == cls and (bucket == ALL or r.prompt_class == bucket)]
                s, r = pick(spec_recs), pick(ref_recs)
                if not s and not r:
                    continue
                rows.append({"phase": phase, "bucket": bucket, "sampling": cls, **compare(s, r)})
    return rows

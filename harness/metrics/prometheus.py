"""Reading a vLLM server's ``/metrics`` (Prometheus text format) with prometheus_client's
own parser, never a hand parser."""

from __future__ import annotations

import functools
import re
from typing import Iterable

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["sample_total", "families_of"]

#: The suffixes a sample or a ``# TYPE``/``# HELP`` line adds to its family's base name.
_SUFFIXES = ("_total", "_created", "_bucket", "_sum", "_count")


def _base_names(name: str) -> tuple[str, ...]:
    """``name`` and ``name`` without one of :data:`_SUFFIXES`."""
    return (name, *(name[: -len(x)] for x in _SUFFIXES if name.endswith(x)))


def families_of(text: str, names: Iterable[str]):
    """The metric families of Prometheus exposition ``text`` that ``names`` need, parsed by
    prometheus_client (an iterator of ``prometheus_client.Metric``).

    ``names`` are sample or family names (``vllm:generation_tokens_total``,
    ``vllm:time_to_first_token_seconds``). Before parsing, the page is cut down to the
    lines of those families (samples, matched by the name before ``{`` or whitespace with
    or without one suffix ``_total``, ``_created``, ``_bucket``, ``_sum``, ``_count``; and
    ``# HELP`` / ``# TYPE`` lines naming one of them or one of them without a suffix):
    prometheus_client's parser is pure Python and vLLM's page has ~100 families (53 KB,
    ~14 ms a parse on a loaded core; the wanted ones are a tenth of that), and the
    scraper parses every server's page twice a second. The cut is one regular expression
    over the page (:func:`_line_filter`: 0.44 ms on vLLM's page where a loop over its lines
    in Python took 2.4 ms, measured side by side on a loaded core). When no line is kept from a page that has samples, the whole
    page is parsed, so a page that is not Prometheus text still raises.

    Raises:
        ValueError: the kept lines (or the whole page) are not valid exposition format.
    """
    return text_string_to_metric_families(_cut(text, names))


def _cut(text: str, names: Iterable[str]) -> str:
    """The text :func:`families_of` hands to prometheus_client: the kept lines, or the
    whole page when none is kept from a page with samples."""
    kept = _line_filter(frozenset(names)).findall("\n" + text)
    if not kept and _SAMPLE_LINE.search(text):
        return text
    return "\n".join(kept) + "\n"


#: A line that is neither blank nor a comment: a sample.
_SAMPLE_LINE = re.compile(r"^[ \t]*[^#\s]", re.M)


@functools.lru_cache(maxsize=16)
def _line_filter(names: frozenset[str]) -> re.Pattern[str]:
    """The regular expression whose ``findall`` over ``"\\n" + page`` gives the lines
    :func:`families_of` keeps. It starts with a literal newline rather than a multi-line
    ``^``, so the regex engine jumps from line start to line start instead of trying every
    character of the page (2x faster)."""
    wanted = sorted({b for n in names for b in _base_names(n)}, key=lambda n: (-len(n), n))
    alt = "|".join(map(re.escape, wanted)) or r"(?!)"
    suffix = "|".join(map(re.escape, _SUFFIXES))
    return re.compile(rf"\n((?:#[ \t]+(?:HELP|TYPE)[ \t]+(?:{alt})(?=[ \t\n]|\Z)"
                      rf"|(?:{alt})(?:{suffix})?(?=[{{ \t]))[^\n]*)")


def sample_total(text: str, name: str) -> float | None:
    """Sum of every sample called ``name`` (all label sets) in Prometheus exposition ``text``,
    e.g. ``"vllm:generation_tokens_total"`` (a counter's sample carries the ``_total``
    suffix its family name lacks); None when no sample has that name.

    Raises:
        ValueError: ``text`` is not valid Prometheus exposition format.
    """
    values = [s.value for family in families_of(text, [name]) for s in family.samples if s.name == name]
    return float(sum(values)) if values else None


#: Counters a scrape keeps, as vLLM exposes the samples (with ``_total``): speculative
#: decoding (drafts, draft tokens, accepted tokens), preemptions, tokens, finished requests.
COUNTERS = (
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
)
#: The per-position accepted-tokens counter (label ``position``: 0 = the first draft token).
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
#: Gauges a scrape keeps: running and waiting requests, KV-cache usage (a fraction, 1 = full;
#: ``gpu_cache_usage_perc`` is its name before vLLM 0.10) and the API process's start time
#: (epoch s, prometheus_client's process collector: it changes when the server restarted).
GAUGES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "process_start_time_seconds",
)
#: Histograms a scrape keeps (family names, seconds): vLLM's TTFT, ITL (named
#: ``time_per_output_token_seconds`` before vLLM 0.10) and E2E request latency.
HISTOGRAMS = (
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:time_per_output_token_seconds",
    "vllm:e2e_request_latency_seconds",
)

__all__ += ["COUNTERS", "PER_POSITION", "GAUGES", "HISTOGRAMS", "parse_page"]

_WANTED = (*COUNTERS, PER_POSITION, *GAUGES, *HISTOGRAMS)


def parse_page(text: str) -> dict:
    """The samples of one ``/metrics`` page that speculation health needs, summed over
    every label set except the ones kept (``engine``, ``model_name``, ``finished_reason``
    are summed; ``position`` and a histogram's ``le`` are kept).

    Returns:
        ``{"counters": {sample name: value}, "per_position": {"0": accepted at position 0,
        ...}, "gauges": {name: value}, "histograms": {family name: {"buckets": {le: count}
        (cumulative, as exposed; ``le`` as written, e.g. ``"0.02"``, ``"+Inf"``), "sum": s,
        "count": n}}}`` with only what the page has: a metric the page lacks is absent,
        never 0. Names from :data:`COUNTERS`, :data:`PER_POSITION`, :data:`GAUGES`,
        :data:`HISTOGRAMS`.

    Raises:
        ValueError: ``text`` is not valid Prometheus exposition format.

    Pages whose wanted lines are the same as one of the last few pages' (an idle server:
    the reference server between its reference fetch and the end of the run, any server
    between requests) are not parsed again: the result is a copy of that page's.
    """
    return _copy(_parse_cut(_cut(text, _WANTED)))


def _copy(page: dict) -> dict:
    """A copy of a :func:`parse_page` result sharing no dict with it (the cache keeps the original)."""
    return {"counters": dict(page["counters"]), "per_position": dict(page["per_position"]),
            "gauges": dict(page["gauges"]),
            "histograms": {k: {**v, "buckets": dict(v["buckets"])} for k, v in page["histograms"].items()}}


@functools.lru_cache(maxsize=8)
def _parse_cut(cut: str) -> dict:
    """:func:`parse_page` of the lines :func:`_cut` kept (cached: module doc of parse_page)."""
    counters: dict[str, float] = {}
    per_position: dict[str, float] = {}
    gauges: dict[str, float] = {}
    histograms: dict[str, dict] = {}
    for family in text_string_to_metric_families(cut):
        hist = histograms.setdefault(family.name, {"buckets": {}, "sum": 0.0, "count": 0.0}) \
            if family.name in HISTOGRAMS else None
        for s in family.samples:
            if s.name in COUNTERS:
                counters[s.name] = counters.get(s.name, 0.0) + float(s.value)
            elif s.name == PER_POSITION and "position" in s.labels:
                pos = s.labels["position"]
                per_position[pos] = per_position.get(pos, 0.0) + float(s.value)
            elif s.name in GAUGES:
                gauges[s.name] = gauges.get(s.name, 0.0) + float(s.value)
            elif hist is not None:
                if s.name == family.name + "_bucket" and "le" in s.labels:
                    le = s.labels["le"]
                    hist["buckets"][le] = hist["buckets"].get(le, 0.0) + float(s.value)
                elif s.name == family.name + "_sum":
                    hist["sum"] += float(s.value)
                elif s.name == family.name + "_count":
                    hist["count"] += float(s.value)
    histograms = {k: v for k, v in histograms.items() if v["buckets"] or v["count"]}
    return {"counters": counters,
            "per_position": dict(sorted(per_position.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0)),
            "gauges": gauges, "histograms": histograms}

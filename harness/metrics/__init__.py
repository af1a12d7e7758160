"""Metrics: pure functions from request records (+ a phase window) to numbers.

Definitions follow vLLM's serving benchmark (``vllm bench serve``): TTFT, TPOT, ITL (per
chunk, and per token under its own name), E2E, request and output token throughput and
goodput. See :mod:`.latency` (per request), :mod:`.phases` (per phase window and prompt
bucket) and :mod:`.availability` (unavailability as time, logical requests).
"""

from harness.metrics.availability import overlap_s, request_counts, tries_by_logical, unavailable_intervals
from harness.metrics.latency import distribution, e2e_s, itl_per_token_s, itl_s, percentiles, tpot_s, ttft_s
from harness.metrics.phases import (PHASES, assign_phases, is_good, latency_metrics, phase_metrics, phase_windows,
                                    records_in)

__all__ = [
    "ttft_s",
    "e2e_s",
    "tpot_s",
    "itl_s",
    "itl_per_token_s",
    "percentiles",
    "distribution",
    "PHASES",
    "phase_windows",
    "records_in",
    "assign_phases",
    "phase_metrics",
    "latency_metrics",
    "is_good",
    "unavailable_intervals",
    "overlap_s",
    "request_counts",
    "tries_by_logical",
]

"""Metrics: pure functions from request records (+ a phase window) to numbers.

Definitions follow vLLM's serving benchmark (``vllm bench serve``): TTFT, TPOT, ITL (per
chunk and per token), E2E, request throughput and goodput. See :mod:`.latency` (per
request) and :mod:`.phases` (per phase window).
"""

from harness.metrics.latency import e2e_s, itl_per_token_s, itl_s, percentiles, tpot_s, ttft_s
from harness.metrics.phases import PHASES, assign_phases, is_good, phase_metrics, phase_windows, records_in

__all__ = [
    "ttft_s",
    "e2e_s",
    "tpot_s",
    "itl_s",
    "itl_per_token_s",
    "percentiles",
    "PHASES",
    "phase_windows",
    "records_in",
    "assign_phases",
    "phase_metrics",
    "is_good",
]

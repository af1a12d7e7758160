"""What the fault families read from a server's own Prometheus endpoint while a fault acts:
the engine's output-token counter and running-request gauge, as evidence that a frozen,
throttled, limited or swapped engine produced (or did not produce) tokens.

Below the fault families (none imports another for it). Parsing is
:func:`harness.metrics.prometheus.sample_total` (prometheus_client's text parser).
"""

from __future__ import annotations

import httpx

from harness.metrics.prometheus import sample_total

#: The counter of output tokens the evidence reads (vLLM v1, per engine and model).
TOKENS_METRIC = "vllm:generation_tokens_total"
#: The gauge of requests in the engine's running batch, reported next to the evidence.
RUNNING_METRIC = "vllm:num_requests_running"
#: Seconds one read of ``/metrics`` may take by default.
METRICS_TIMEOUT_S = 1.0


def read_metrics(base_url: str, timeout_s: float = METRICS_TIMEOUT_S,
                 names: tuple[str, ...] = (TOKENS_METRIC, RUNNING_METRIC)) -> dict[str, float | None] | None:
    """``{name: float|None}`` for each of ``names`` (default :data:`TOKENS_METRIC` and
    :data:`RUNNING_METRIC`; summed over labels, None where absent) from ``base_url``'s
    ``/metrics`` (a loopback URL of the stack), or None when it did not answer 200
    within ``timeout_s`` seconds. Every fault that reads a server's counters uses it."""
    try:
        with httpx.Client(trust_env=False, verify=False, timeout=timeout_s) as client:   # loopback: no proxy, no TLS
            r = client.get(f"{base_url}/metrics")
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    return {name: sample_total(r.text, name) for name in names}

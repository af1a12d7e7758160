"""Reading a vLLM server's ``/metrics`` (Prometheus text format) with prometheus_client's
own parser, never a hand parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["sample_total"]


def sample_total(text: str, name: str) -> float | None:
    """Sum of every sample called ``name`` (all label sets) in Prometheus exposition ``text``,
    e.g. ``"vllm:generation_tokens_total"`` (a counter's sample carries the ``_total``
    suffix its family name lacks); None when no sample has that name.

    Raises:
        ValueError: ``text`` is not valid Prometheus exposition format.
    """
    values = [s.value for family in text_string_to_metric_families(text) for s in family.samples if s.name == name]
    return float(sum(values)) if values else None

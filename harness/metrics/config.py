"""Per-request goodput limits, owned by the metrics layer (goodput is a metric).

As ``vllm bench serve --goodput ttft:MS tpot:MS e2el:MS``: a request is *good* when it
completed and met every limit that is set; goodput is good requests per second. Limits
here are seconds. With no limit set, goodput is not computed (None), as in vLLM.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["GoodputConfig", "ScrapeConfig", "MetricsConfig"]


class GoodputConfig(BaseModel):
    """Per-request limits (seconds) for goodput; None = that metric is not constrained."""

    model_config = ConfigDict(extra="forbid")

    ttft_s: float | None = Field(None, gt=0)
    tpot_s: float | None = Field(None, gt=0)
    e2e_s: float | None = Field(None, gt=0)

    @property
    def enabled(self) -> bool:
        """At least one limit is set."""
        return any(v is not None for v in (self.ttft_s, self.tpot_s, self.e2e_s))


class ScrapeConfig(BaseModel):
    """The vLLM metrics scraper (:mod:`harness.metrics.scraper`): every server's ``/metrics``
    every ``interval_s`` seconds (default 0.5: 2 Hz); a scrape slower than ``timeout_s``
    seconds is recorded as a gap."""

    model_config = ConfigDict(extra="forbid")

    interval_s: float = Field(0.5, gt=0, le=60)
    timeout_s: float = Field(2.0, gt=0, le=60)


class MetricsConfig(BaseModel):
    """How per-phase figures are computed (the ``metrics`` block of an experiment).

    * ``min_samples``: a phase's latency figures (and those of a prompt-length bucket)
      rest on this many complete requests at least; below it the summary prints ``n=K``
      instead of percentiles and the SLO/degradation checks of that phase are not judged
      (reported with the reason, neither passed nor failed). Default 10.
    * ``itl_group_gap_s``: output events arriving less than this many seconds apart are
      one arrival for ITL per token (:func:`harness.metrics.latency.itl_per_token_s`);
      default 0.001 (1 ms), 0 = every SSE event on its own.
    """

    model_config = ConfigDict(extra="forbid")

    min_samples: int = Field(10, ge=1)
    itl_group_gap_s: float = Field(0.001, ge=0, le=1)

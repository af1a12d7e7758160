"""Per-request goodput limits, owned by the metrics layer (goodput is a metric).

As ``vllm bench serve --goodput ttft:MS tpot:MS e2el:MS``: a request is *good* when it
completed and met every limit that is set; goodput is good requests per second. Limits
here are seconds. With no limit set, goodput is not computed (None), as in vLLM.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["GoodputConfig", "ScrapeConfig"]


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

"""The ``load`` block of an experiment's configuration, owned by the load layer.

Streaming load driven by locust, closed loop: each user sends a request, waits for its
end (and ``think_time_s``), sends again. Bounded in count (``max_requests``) and time
(the runner's locust ``--run-time``). Durations are seconds.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["LoadConfig"]


class LoadConfig(BaseModel):
    """Load shape and prompt set. Prompt counts per length class: ``short`` (< 64 tokens),
    ``medium`` (~128), ``long`` (~512); ``seed`` fixes prompts and each user's walk."""

    model_config = ConfigDict(extra="forbid")

    users: int = Field(4, ge=1, le=256)
    spawn_rate: float = Field(4.0, gt=0)
    seed: int = 1234
    short_prompts: int = Field(12, ge=0)
    medium_prompts: int = Field(8, ge=0)
    long_prompts: int = Field(4, ge=0)
    max_tokens: int = Field(32, ge=1)
    ignore_eos: bool = False
    request_timeout_s: float = Field(30.0, gt=0)
    max_requests: int = Field(20000, ge=1)
    think_time_s: float = Field(0.0, ge=0)
    error_backoff_s: float = Field(0.25, ge=0)

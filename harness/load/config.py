"""The ``load`` block of an experiment's configuration, owned by the load layer.

Streaming load driven by locust, closed loop: each user sends a request, waits for its
end (and ``think_time_s``), sends again. Bounded in count (``max_requests``) and time
(the runner's locust ``--run-time``). Durations are seconds.

Three workload options shape what a request is:

* ``buckets``: the prompt-length buckets of the prompt set, an ordered list of
  ``{name, min_prompt_tokens, max_prompt_tokens, count}`` (token counts as vLLM's
  ``usage.prompt_tokens``); the bucket's name is each request's ``prompt_class``. Default:
  today's three, ``short`` (16..60 tokens, ``short_prompts`` of them), ``medium`` (~128,
  ``medium_prompts``) and ``long`` (~512, ``long_prompts``).
* ``sampling``: the sampling classes, ``{name, temperature, top_p, weight}``; each request
  draws one (seeded, by weight). Default: ``greedy`` only (temperature 0). Only greedy
  requests can be compared token for token with the reference.
* ``mirror``: send the same seeded workload to the speculative and the reference server,
  interleaved (needs ``stack.reference``), so speculative and plain latency are measured
  in the same run.

Scale-out: ``workers`` (default 0, one locust process) runs locust's own distributed mode
instead, one master and ``workers`` worker processes on 127.0.0.1, the users spread over
the workers; ``max_requests`` still bounds the requests of all workers together.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["LoadConfig", "PromptBucket", "SamplingClass", "DEFAULT_BUCKETS", "GREEDY"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")
_NAME_HINT = "1-32 characters: letters, digits, '_', '.', '-' (it names report rows and checks)"


def _check_name(v: str) -> str:
    if not _NAME.match(v):
        raise ValueError(f"name {v!r} is not allowed: {_NAME_HINT}")
    return v


class PromptBucket(BaseModel):
    """One prompt-length bucket: ``count`` prompts whose length in tokens (the target's
    tokenizer, special tokens included, as vLLM's ``usage.prompt_tokens``) lies in
    ``[min_prompt_tokens, max_prompt_tokens]``; each prompt draws its own target length
    uniformly in that range. ``name`` becomes the requests' ``prompt_class``."""

    model_config = ConfigDict(extra="forbid")

    name: str
    min_prompt_tokens: int = Field(ge=8)
    max_prompt_tokens: int = Field(ge=8)
    count: int = Field(ge=0)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _check_name(v)

    @model_validator(mode="after")
    def _range(self) -> "PromptBucket":
        if self.max_prompt_tokens < self.min_prompt_tokens:
            raise ValueError(f"max_prompt_tokens {self.max_prompt_tokens} < min_prompt_tokens "
                             f"{self.min_prompt_tokens}")
        return self


class SamplingClass(BaseModel):
    """One sampling setting of the workload, as the OpenAI completions API takes it:
    ``temperature`` (0 = greedy), ``top_p`` (nucleus mass in (0, 1]); ``weight`` is its
    relative share of the requests (> 0)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    weight: float = Field(1.0, gt=0)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _check_name(v)

    @property
    def greedy(self) -> bool:
        """Greedy decoding (temperature 0): the only class whose output is deterministic
        and comparable with the reference server's."""
        return self.temperature == 0

    def body(self) -> dict[str, float]:
        """The completion body's sampling fields: ``temperature`` and, unless 1, ``top_p``."""
        out: dict[str, float] = {"temperature": self.temperature}
        if self.top_p != 1.0:
            out["top_p"] = self.top_p
        return out


#: The default sampling class: greedy (temperature 0), as the load always was.
GREEDY = SamplingClass(name="greedy", temperature=0.0)

#: The default buckets' (lowest target, highest target, accepted min, accepted max)
#: tokens: each prompt's target is drawn in the first range and the prompt accepted in the
#: second (kept exactly as before buckets were configurable, so the default prompt set is
#: unchanged for a given seed).
DEFAULT_BUCKETS: dict[str, tuple[int, int, int, int]] = {
    "short": (16, 60, 16, 60),
    "medium": (124, 132, 120, 136),
    "long": (504, 520, 496, 528),
}


#: The default buckets' count fields and their defaults.
_LEGACY_COUNTS = {"short_prompts": 12, "medium_prompts": 8, "long_prompts": 4}


class LoadConfig(BaseModel):
    """Load shape, prompt set and sampling (see module doc). ``short_prompts``,
    ``medium_prompts``, ``long_prompts`` are the counts of the default buckets (< 64,
    ~128, ~512 tokens) and may not be combined with ``buckets``; ``seed`` fixes prompts,
    each user's walk and its sampling draws."""

    model_config = ConfigDict(extra="forbid")

    users: int = Field(4, ge=1, le=256)
    spawn_rate: float = Field(4.0, gt=0)
    seed: int = 1234
    #: Counts of the default buckets (12, 8 and 4 when not given; None with ``buckets``).
    short_prompts: int | None = Field(None, ge=0)
    medium_prompts: int | None = Field(None, ge=0)
    long_prompts: int | None = Field(None, ge=0)
    max_tokens: int = Field(32, ge=1)
    ignore_eos: bool = False
    request_timeout_s: float = Field(30.0, gt=0)
    max_requests: int = Field(20000, ge=1)
    think_time_s: float = Field(0.0, ge=0)
    error_backoff_s: float = Field(0.25, ge=0)
    buckets: list[PromptBucket] | None = None
    sampling: list[SamplingClass] = Field(default_factory=lambda: [GREEDY.model_copy()], min_length=1)
    mirror: bool = False
    # --- distributed load (issue 10, deliverable 9): locust's own master/worker mode on
    # loopback; 0 = one locust process as always. See harness.load.locust_process.
    workers: int = Field(0, ge=0, le=64)

    @field_validator("buckets")
    @classmethod
    def _ordered(cls, v: list[PromptBucket] | None) -> list[PromptBucket] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("needs at least one bucket (or leave buckets out for the default three)")
        seen: set[str] = set()
        for i, b in enumerate(v):
            if b.name in seen:
                raise ValueError(f"bucket name {b.name!r} is used twice")
            seen.add(b.name)
            if i and b.min_prompt_tokens <= v[i - 1].max_prompt_tokens:
                p = v[i - 1]
                raise ValueError(f"buckets must be in increasing order without overlap: [{i}] {b.name} "
                                 f"({b.min_prompt_tokens}..{b.max_prompt_tokens} tokens) starts at or below the end "
                                 f"of [{i - 1}] {p.name} ({p.min_prompt_tokens}..{p.max_prompt_tokens})")
        return v

    @field_validator("sampling")
    @classmethod
    def _unique(cls, v: list[SamplingClass]) -> list[SamplingClass]:
        names = [s.name for s in v]
        for n in names:
            if names.count(n) > 1:
                raise ValueError(f"sampling class name {n!r} is used twice")
        return v

    @model_validator(mode="after")
    def _buckets_or_counts(self) -> "LoadConfig":
        legacy = [n for n in _LEGACY_COUNTS if getattr(self, n) is not None]
        if self.buckets is not None and legacy:
            raise ValueError(f"buckets replaces {', '.join(legacy)}: give the counts in the buckets "
                             f"and remove {', '.join(legacy)}")
        if self.buckets is None:
            for name, default in _LEGACY_COUNTS.items():
                if getattr(self, name) is None:
                    setattr(self, name, default)
        return self

    @model_validator(mode="after")
    def _workers_have_users(self) -> "LoadConfig":
        if self.workers > self.users:
            raise ValueError(f"workers ({self.workers}) exceeds users ({self.users}): each locust worker "
                             f"needs at least one user")
        return self

    def bucket_specs(self) -> list[tuple[str, int, int, int, int, int]]:
        """The prompt set's buckets in order, as ``(name, target_lo, target_hi, accept_lo,
        accept_hi, count)`` in tokens (see :func:`harness.load.prompts.build_prompt_set`)."""
        if self.buckets is None:
            counts = {"short": self.short_prompts, "medium": self.medium_prompts, "long": self.long_prompts}
            return [(n, *DEFAULT_BUCKETS[n], counts[n]) for n in DEFAULT_BUCKETS]
        return [(b.name, b.min_prompt_tokens, b.max_prompt_tokens, b.min_prompt_tokens, b.max_prompt_tokens, b.count)
                for b in self.buckets]

    def bucket_names(self) -> list[str]:
        """Bucket names in their configured order."""
        return [s[0] for s in self.bucket_specs()]

    def longest_prompt_tokens(self) -> int:
        """The longest prompt a bucket with prompts may hold, in tokens."""
        return max((s[4] for s in self.bucket_specs() if s[5] > 0), default=0)

    def greedy_classes(self) -> set[str]:
        """Names of the greedy sampling classes (temperature 0)."""
        return {s.name for s in self.sampling if s.greedy}

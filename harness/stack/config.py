"""The ``stack`` block of an experiment's configuration, owned by the stack layer.

What to start (a speculative server and an optional non-speculative reference on one
target), where (loopback host and ports) and how to supervise it. Validated with
pydantic; unknown fields are errors. Durations are seconds (``*_s``), sizes GiB
(``*_gib``). The rule "which methods need a draft model" is :func:`needs_draft`, used by
validation and by every launcher.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from harness.errors import SpecchaosError
from harness.net import LOOPBACK_HINT, is_loopback_host
from harness.stack.launchers import launcher_class, launcher_names
from harness.stack.vllm import HARNESS_FLAGS

__all__ = ["METHODS", "DRAFTLESS_METHODS", "needs_draft", "RestartPolicy", "StackConfig"]

#: Speculative methods a stack may declare (vLLM's ``--speculative-config`` ``method``).
METHODS = ("draft_model", "ngram", "eagle", "eagle3", "mtp")
#: Methods that draft without a separate draft model: ``ngram`` looks tokens up in the
#: prompt, ``mtp`` uses the target's own multi-token-prediction heads.
DRAFTLESS_METHODS = ("ngram", "mtp")


def needs_draft(method: str) -> bool:
    """Whether speculative ``method`` needs a draft model directory (``stack.draft``):
    every method but :data:`DRAFTLESS_METHODS` (``draft_model``, ``eagle``, ``eagle3``)."""
    return method not in DRAFTLESS_METHODS


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RestartPolicy(_Strict):
    """Supervisor policy for a server that exits unexpectedly (any exit code): at most
    ``max_restarts`` restarts, back-off ``backoff_s`` doubling up to ``backoff_max_s``."""

    max_restarts: int = Field(3, ge=0)
    backoff_s: float = Field(1.0, ge=0)
    backoff_max_s: float = Field(10.0, ge=0)


class StackConfig(_Strict):
    """What to start: a speculative server (``spec``) and a non-speculative reference
    (``ref``) on one target. ``launcher`` names an entry of
    :data:`harness.stack.launchers.LAUNCHERS` (checked there, so a launcher registered
    later is accepted). Ports 0 pick free ones."""

    launcher: str = "local"
    models_dir: str = "models"
    target: str = "target"
    draft: str | None = "draft-exact"
    method: Literal["draft_model", "ngram", "eagle", "eagle3", "mtp"] = "draft_model"
    num_speculative_tokens: int = Field(4, ge=1, le=16)
    reference: bool = True
    host: str = "127.0.0.1"
    spec_port: int = Field(0, ge=0, le=65535)
    ref_port: int = Field(0, ge=0, le=65535)
    max_model_len: int = Field(1024, ge=64)
    max_num_seqs: int = Field(16, ge=1)
    kv_cache_gib: float = Field(1.0, gt=0)
    enforce_eager: bool = True
    #: float32 by default: the tiny CPU models have many near-ties between top logits, and in
    #: bfloat16 the speculative verification (k+1 positions in one pass) rounds differently
    #: from plain decoding, so greedy outputs can really diverge (measured here: 1 of 24
    #: prompts, token 14, deterministically); float32 gave 0 of 24. Set ``bfloat16`` (or
    #: ``auto``) for real models on GPU hosts.
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = "float32"
    seed: int = 0
    extra_args: list[str] = Field(default_factory=list)
    startup_timeout_s: float = Field(300.0, gt=0)
    restart: RestartPolicy = Field(default_factory=RestartPolicy)

    @field_validator("host")
    @classmethod
    def _loopback_only(cls, v: str) -> str:
        if not is_loopback_host(v):
            raise ValueError(f"must be a loopback address (127.0.0.0/8, ::1 or localhost): {LOOPBACK_HINT}")
        return v

    @field_validator("launcher")
    @classmethod
    def _known_launcher(cls, v: str, info: ValidationInfo) -> str:
        if (info.context or {}).get("recorded"):   # re-judging saved data starts nothing
            return v
        known = launcher_names()
        if v not in known:
            raise ValueError(f"unknown launcher {v!r}; known: {', '.join(known)}")
        try:
            launcher_class(v)   # load it now: a launcher that cannot be imported fails validation
        except SpecchaosError as exc:
            raise ValueError(exc.message) from None
        return v

    @field_validator("extra_args")
    @classmethod
    def _no_harness_flags(cls, v: list[str]) -> list[str]:
        for arg in v:
            flag = arg.split("=", 1)[0]
            if flag in HARNESS_FLAGS:
                raise ValueError(f"{flag} is set by the harness (from host, ports, target and the speculative "
                                 f"settings) and may not be overridden in extra_args")
        return v

    @model_validator(mode="after")
    def _rules(self) -> "StackConfig":
        if self.reference and self.spec_port and self.spec_port == self.ref_port:
            raise ValueError(f"spec_port and ref_port are both {self.spec_port}: use two ports (or 0 for a free one)")
        if needs_draft(self.method) and not self.draft:
            raise ValueError(f"method {self.method} needs a draft model: set stack.draft "
                             f"(e.g. draft-exact), or use a method without one ({', '.join(DRAFTLESS_METHODS)})")
        return self

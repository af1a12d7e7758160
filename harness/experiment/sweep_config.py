"""The sweep file of ``specchaos sweep FILE``: a base experiment and a matrix of cells.

::

    version: 1
    title: When does speculation pay off on the tiny models?
    base: soak.yaml                     # an experiment file, relative to this file
    set:                                # overrides of its configuration.specchaos, every cell
      phases: {warmup_s: 3, baseline_s: 10, after_s: 10}
    matrix:
      speculators:                      # method (and draft) per speculator, named
        - {name: exact, method: draft_model, draft: draft-exact}
        - {name: ngram, method: ngram, k: [4]}   # its own k values (default: matrix.k)
      k: [2, 4]                         # num_speculative_tokens
      concurrency: [1, 4]               # requests in flight per server (or rate: [2, 8] req/s)
      buckets: [short, long]            # prompt-length buckets of the base's load (default: all)
      sampling: [greedy, sampled]       # sampling classes of the base's load (default: all)
    mix: [buckets]                      # dimensions mixed in one run and split per cell (default: none)
    pairing: blocks                     # A/B blocks (default) or mirror
    blocks: 3                           # A/B blocks per run
    seed: 0                             # draws each block's order
    policy: {figure: throughput}

Each *cell* (speculator × k × level × bucket × sampling class) is measured against plain
decoding on the same workload, on one started stack holding the speculative server and
the non-speculative reference server on the same target (``stack.reference``):

* ``pairing: blocks`` (default, for speed): ``blocks`` A/B blocks, each an experiment run
  with the load on the speculative server alone and one with the same load on the plain
  server alone (``load.target: ref``), the order of the two drawn per block from ``seed``;
  the other server idles meanwhile, so neither changes the other's speed. Intervals come
  from the blocks (:mod:`harness.metrics.sweep`).
* ``pairing: mirror`` (for integrity): one run in mirror mode (``load.mirror``), the same
  seeded requests sent to both servers interleaved, paired request by request — both
  servers under load at once, sharing the host's cores, so each one's speed depends on
  the other's: not a speed measurement.

Cells of one speculator and k share one started stack (:class:`harness.stack.pool.StackPool`);
only the load changes between them.

Validated like an experiment: every unknown or mistyped field is an
:class:`~harness.errors.ExperimentError` naming the file and the field; the base with each
run's overrides is validated by :func:`harness.experiment.validate.load_experiment` before
anything starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from harness.errors import ExperimentError, first_error
from harness.load.config import Name
from harness.metrics.policy import FIGURES
from harness.stack.config import METHODS
from harness.stack.vllm import needs_draft

__all__ = ["Speculator", "Matrix", "PolicyOptions", "SweepConfig", "load_sweep_file", "MEASURED_PHASES"]

#: The phases whose requests a cell measures by default: the steady ones.
MEASURED_PHASES = ("baseline", "after")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Speculator(_Strict):
    """One speculative setting: ``method`` and, for a method that needs one, ``draft`` (a
    directory or a name in ``stack.models_dir``; default ``draft-exact``, as ``stack.draft``);
    ``k``: its own ``num_speculative_tokens`` values instead of the matrix's."""

    name: Name
    method: Literal["draft_model", "ngram", "eagle", "eagle3", "mtp"] = "draft_model"
    draft: str | None = None
    k: list[int] | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _draft_rule(self) -> "Speculator":
        if self.method in METHODS and not needs_draft(self.method) and self.draft is not None:
            raise ValueError(f"speculator {self.name!r}: method {self.method} takes no draft (remove draft)")
        if self.k is not None and (any(not 1 <= k <= 16 for k in self.k) or len(set(self.k)) < len(self.k)):
            raise ValueError(f"speculator {self.name!r}: k must be distinct values in 1..16, got {self.k}")
        return self


class Matrix(_Strict):
    """The dimensions of the sweep; the cells are their product. Exactly one of
    ``concurrency`` (closed loop: requests in flight per server) and ``rate`` (open loop:
    requests/s to each server). ``buckets`` and ``sampling`` name the base experiment's
    ``load.buckets`` (default: short, medium, long) and ``load.sampling`` classes; not
    given: all of them."""

    speculators: list[Speculator] = Field(min_length=1)
    k: list[int] = Field(min_length=1)
    concurrency: list[int] | None = None
    rate: list[float] | None = None
    buckets: list[Name] | None = Field(None, min_length=1)
    sampling: list[Name] | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _rules(self) -> "Matrix":
        names = [s.name for s in self.speculators]
        for what, values in (("speculators", names), ("k", self.k), ("concurrency", self.concurrency or []),
                             ("rate", self.rate or []), ("buckets", self.buckets or []),
                             ("sampling", self.sampling or [])):
            dup = sorted({str(v) for v in values if values.count(v) > 1})
            if dup:
                raise ValueError(f"{what}: {dup[0]} is listed twice")
        if any(not 1 <= k <= 16 for k in self.k):
            raise ValueError(f"k: each num_speculative_tokens must be in 1..16, got {self.k}")
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("give exactly one of concurrency (closed loop) and rate (open loop)")
        if self.concurrency is not None and (not self.concurrency or any(c < 1 or c > 128 for c in self.concurrency)):
            raise ValueError(f"concurrency: each level must be in 1..128, got {self.concurrency}")
        if self.rate is not None and (not self.rate or any(not 0 < r <= 1000 for r in self.rate)):
            raise ValueError(f"rate: each level must be in (0, 1000] requests/s, got {self.rate}")
        return self

    def ks(self, speculator: Speculator) -> list[int]:
        """The k values of ``speculator``: its own, else the matrix's."""
        return list(speculator.k or self.k)

    @property
    def level_kind(self) -> str:
        """``concurrency`` or ``rate``."""
        return "concurrency" if self.concurrency is not None else "rate"

    @property
    def levels(self) -> list[float]:
        """The load levels, in the order given."""
        return list(self.concurrency if self.concurrency is not None else self.rate or [])


class PolicyOptions(_Strict):
    """How cells become a policy (:func:`harness.metrics.policy.derive_policy`) and how
    their intervals are computed (:func:`harness.metrics.compare.bootstrap_changes`)."""

    figure: Literal["throughput", "tpot_p50", "tpot_p99", "itl_p50", "itl_p99", "ttft_p50", "ttft_p99",
                    "goodput"] = "throughput"
    soft_margin: float = Field(0.1, ge=0, le=1)
    confidence: float = Field(0.95, gt=0, lt=1)
    resamples: int = Field(1000, ge=10, le=100000)
    seed: int = 0
    min_values: int = Field(10, ge=1)


assert PolicyOptions.model_fields["figure"].default in FIGURES


class SweepConfig(_Strict):
    """A sweep file (module doc). ``base`` is relative to the sweep file; ``set`` maps
    dotted paths of ``configuration.specchaos`` to values (as ``--set``), applied to every
    cell before the cell's own settings; ``measure_phases`` are the phases whose requests
    the cells measure; ``mix`` the workload dimensions (``buckets``, ``sampling``) that
    share one run, whose records are split into cells afterwards (default none: one run
    per cell; :mod:`harness.experiment.sweep`); ``pairing``, ``blocks`` and ``seed`` how
    speculative and plain decoding are paired (module doc)."""

    version: Literal[1] = 1
    title: str = Field(min_length=1)
    description: str = ""
    base: str = Field(min_length=1)
    set: dict[str, Any] = Field(default_factory=dict)
    matrix: Matrix
    mix: list[Literal["buckets", "sampling"]] = Field(default_factory=list)
    pairing: Literal["blocks", "mirror"] = "blocks"
    blocks: int = Field(3, ge=1, le=50)
    seed: int = 0
    measure_phases: list[Literal["baseline", "fault", "recovery", "after"]] = Field(
        default_factory=lambda: list(MEASURED_PHASES), min_length=1)
    policy: PolicyOptions = Field(default_factory=PolicyOptions)


def load_sweep_file(path: str | Path) -> SweepConfig:
    """Read and validate a sweep file (YAML or JSON).

    Raises:
        ExperimentError: unreadable, not a mapping, or a field invalid (named as ``FILE: field.path``).
    """
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ExperimentError("no such sweep file", where=str(p)) from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ExperimentError(f"not a readable YAML file: {type(exc).__name__}", where=str(p)) from None
    if not isinstance(raw, dict):
        raise ExperimentError("a sweep file is a mapping (title, base, matrix, ...)", where=str(p))
    try:
        return SweepConfig.model_validate(raw)
    except ValidationError as exc:
        loc, msg, kind = first_error(exc)
        if kind == "extra_forbidden" and loc:
            msg = f"unknown field {loc.split('.')[-1]!r}"
        raise ExperimentError(msg, where=f"{p}: {loc}" if loc else str(p)) from None

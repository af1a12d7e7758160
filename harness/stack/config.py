"""The ``stack`` block of an experiment's configuration, owned by the stack layer.

What to start (a speculative server and an optional non-speculative reference on one
target), where (loopback host and ports) and how to supervise it. Validated with
pydantic; unknown fields are errors. Durations are seconds (``*_s``), sizes GiB
(``*_gib``). The speculative settings' rules (which methods need a draft model, which
refuse one, ngram's prompt lookup window) are :func:`harness.stack.vllm.speculative_problems`,
used by validation here (each problem at its field) and by
:func:`harness.stack.vllm.speculative_config`, which every launcher calls.
"""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from harness.errors import SpecchaosError
from harness.net import LOOPBACK_HINT, is_loopback_host
from harness.stack.breaker import BreakerConfig
from harness.stack.launchers import launcher_class, launcher_names
from harness.stack.vllm import (DRAFTLESS_METHODS, HARNESS_FLAGS, METHODS, NGRAM_PROMPT_LOOKUP, needs_draft,
                                speculative_problems)

__all__ = ["EXTERNAL", "DOCKER", "DockerConfig", "METHODS", "DRAFTLESS_METHODS", "NGRAM_PROMPT_LOOKUP", "DEFAULT_DRAFT", "needs_draft", "RestartPolicy",
           "StackConfig"]

#: The launcher that attaches to servers the harness did not start (:mod:`harness.stack.external`).
EXTERNAL = "external"

#: The launcher that runs each server in Docker containers (:mod:`harness.stack.container`).
DOCKER = "docker"

#: The draft of a method that needs one when ``stack.draft`` is not given.
DEFAULT_DRAFT = "draft-exact"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RestartPolicy(_Strict):
    """Supervisor policy for a server that exits unexpectedly (any exit code): at most
    ``max_restarts`` restarts, back-off ``backoff_s`` doubling up to ``backoff_max_s``."""

    max_restarts: int = Field(3, ge=0)
    backoff_s: float = Field(1.0, ge=0)
    backoff_max_s: float = Field(10.0, ge=0)


class DockerConfig(_Strict):
    """Launcher ``docker`` only (:mod:`harness.stack.container`): how each server's containers run."""

    #: The image (tag or id, already on the engine: no registry is asked). Not given: the
    #: tiny host-root image built locally, run with read-only mounts of this machine's
    #: Python, venv and checkout (:func:`harness.stack.docker_engine.ensure_image`). On GPU
    #: hosts e.g. ``vllm/vllm-openai:v0.11.0`` with ``gpus: all``.
    image: str | None = None
    #: The interpreter inside the container; not given: this venv's (host-root image) or ``python3``.
    python: str | None = None
    #: ``host``: the host's network, vLLM bound to ``stack.host`` (loopback); ``bridge``:
    #: the container's own network, its port published on ``stack.host`` only.
    network: Literal["host", "bridge"] = "host"
    #: ``/dev/shm`` size (vLLM needs more than Docker's default 64 MB), e.g. ``1g``.
    shm_size: str = Field("1g", pattern=r"^[0-9]+[bkmgBKMG]?$")
    #: CPUs the containers may run on (``--cpuset-cpus``, e.g. ``"0"`` or ``"0-3"``); not given: all.
    cpuset_cpus: str | None = Field(None, pattern=r"^[0-9]+([-,][0-9]+)*$")
    #: GPUs given to each container (device requests): 0 none, a count, or ``"all"``.
    gpus: int | Literal["all"] = Field(0)

    @field_validator("cpuset_cpus", mode="before")
    @classmethod
    def _one_cpu_as_number(cls, v: object) -> object:
        """``cpuset_cpus: 1`` (YAML or ``--set``, a number) means CPU ``"1"``."""
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v

    def cpus(self) -> set[int]:
        """The CPU numbers :attr:`cpuset_cpus` names (``"0-2,5"`` → {0, 1, 2, 5}); empty when not given."""
        out: set[int] = set()
        for part in (self.cpuset_cpus or "").split(","):
            if part:
                lo, _, hi = part.partition("-")
                out.update(range(int(lo), int(hi or lo) + 1))
        return out


class StackConfig(_Strict):
    """What to start: a speculative server (``spec``) and a non-speculative reference
    (``ref``) on one target. ``launcher`` names an entry of
    :data:`harness.stack.launchers.LAUNCHERS` (checked there, so a launcher registered
    later is accepted). Ports 0 pick free ones."""

    launcher: str = "local"
    models_dir: str = "models"
    target: str = "target"
    method: Literal["draft_model", "ngram", "eagle", "eagle3", "mtp"] = "draft_model"
    #: The draft model (a directory, or a name in ``models_dir``). Not given: ``draft-exact``
    #: for a method that needs one (``draft_model``, ``eagle``, ``eagle3``), none for
    #: ``ngram`` and ``mtp``; given with those two it is an error (vLLM would ignore it).
    draft: str | None = None
    num_speculative_tokens: int = Field(4, ge=1, le=16)
    #: ``ngram`` only: the prompt lookup window in tokens (vLLM's ``prompt_lookup_min`` /
    #: ``prompt_lookup_max``), 1 <= min <= max; not given: 2 and 4 (``NGRAM_PROMPT_LOOKUP``).
    prompt_lookup_min: int | None = Field(None, ge=1)
    prompt_lookup_max: int | None = Field(None, ge=1, validate_default=True)   # checked against min when not given
    reference: bool = True
    #: Hosts besides loopback that ``spec_url``/``reference_url`` may name (launcher
    #: ``external``): written by the user, never inferred. Load and fault traffic then goes there.
    allow_hosts: list[str] = Field(default_factory=list)
    #: Launcher ``external`` only: the speculative server to attach to (``http(s)://host:port``,
    #: no path), one the harness does not start. Loopback unless its host is in ``allow_hosts``.
    spec_url: str | None = None
    #: Launcher ``external`` only: the non-speculative reference on the same target (optional;
    #: without it integrity is not judged). Not given: ``reference`` is false.
    reference_url: str | None = None
    host: str = "127.0.0.1"
    spec_port: int = Field(0, ge=0, le=65535)
    ref_port: int = Field(0, ge=0, le=65535)
    max_model_len: int = Field(1024, ge=64)
    max_num_seqs: int = Field(16, ge=1)
    kv_cache_gib: float = Field(1.0, gt=0)
    #: The KV cache's size in blocks (vLLM's ``--num-gpu-blocks-override``; applies to both
    #: servers): a small cache makes long prompts at high concurrency preempt (KV-cache
    #: pressure). vLLM refuses to start when it cannot hold one ``max_model_len`` sequence.
    kv_cache_blocks: int | None = Field(None, ge=1)
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
    #: The speculation circuit breaker (:mod:`harness.stack.breaker`), off by default.
    breaker: BreakerConfig = Field(default_factory=BreakerConfig)
    #: Launcher ``docker``: how the containers run (:class:`DockerConfig`); other launchers
    #: ignore it, so one file runs with ``--launcher local`` and ``--launcher docker``.
    docker: DockerConfig = Field(default_factory=DockerConfig)

    @model_validator(mode="before")
    @classmethod
    def _default_draft(cls, data: Any) -> Any:
        """``draft`` not given: ``draft-exact`` where the method needs a draft, else none."""
        if isinstance(data, dict) and "draft" not in data:
            method = data.get("method", "draft_model")
            if isinstance(method, str) and method in METHODS and needs_draft(method):
                data = dict(data, draft=DEFAULT_DRAFT)
        return data

    @field_validator("draft", "prompt_lookup_min", "prompt_lookup_max")
    @classmethod
    def _speculative_rules(cls, v: Any, info: ValidationInfo) -> Any:
        method = info.data.get("method")
        if method is None:   # the method itself was invalid: reported there
            return v
        settings: dict[str, Any] = {"draft": info.data.get("draft"),
                                    "prompt_lookup_min": info.data.get("prompt_lookup_min"),
                                    "prompt_lookup_max": info.data.get("prompt_lookup_max"), str(info.field_name): v}
        if info.field_name == "prompt_lookup_min":
            settings["prompt_lookup_max"] = None   # not validated yet: judged at its own field
        for field, message in speculative_problems(method, **settings):
            if field != info.field_name:
                continue
            if (info.context or {}).get("recorded") and field == "draft" and not needs_draft(method):
                return None   # a run saved before drafts were refused with ngram/mtp: it ran without one
            raise ValueError(message)
        return v

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

    @model_validator(mode="before")
    @classmethod
    def _external_reference(cls, data: Any) -> Any:
        """Launcher ``external``: ``reference`` follows ``reference_url`` when not given."""
        if isinstance(data, dict) and data.get("launcher") == EXTERNAL and "reference" not in data:
            data = dict(data, reference=bool(data.get("reference_url")))
        return data

    @field_validator("spec_url", "reference_url")
    @classmethod
    def _url(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return v
        parts = urlsplit(v.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path.strip("/") or parts.query \
                or parts.fragment or parts.username is not None or parts.port == 0:
            raise ValueError(f"{v!r} is not a server root URL: give http(s)://host:port (no path, query, fragment, "
                             f"user or port 0)")
        allowed = {h.strip().strip("[]").lower() for h in info.data.get("allow_hosts") or []}
        if not is_loopback_host(parts.hostname) and parts.hostname.lower() not in allowed:
            raise ValueError(f"host {parts.hostname!r} is not loopback and not in stack.allow_hosts: add it to "
                             f"stack.allow_hosts to send load and faults there")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        return f"{parts.scheme}://{host}:{port}"

    @model_validator(mode="after")
    def _rules(self) -> "StackConfig":
        if self.launcher == EXTERNAL:
            if not self.spec_url:
                raise ValueError("launcher external attaches to a running server: set stack.spec_url "
                                 "(e.g. --set stack.spec_url=http://127.0.0.1:8000)")
            if self.reference and not self.reference_url:
                raise ValueError("reference: true with launcher external needs stack.reference_url (the "
                                 "non-speculative server), or set reference: false (integrity is then not judged)")
        elif self.spec_url or self.reference_url:
            raise ValueError(f"spec_url/reference_url are for launcher external; launcher {self.launcher!r} starts "
                             f"its own servers: remove them, or use --launcher external")
        if self.reference and self.spec_port and self.spec_port == self.ref_port:
            raise ValueError(f"spec_port and ref_port are both {self.spec_port}: use two ports (or 0 for a free one)")
        b = self.breaker
        if b.enabled and b.fallback == "route" and b.route_to == "ref" and not self.reference:
            raise ValueError("breaker.route_to: ref needs stack.reference: true (the warm plain server new requests "
                             "go to), or route_to the URL of a running plain server")
        return self

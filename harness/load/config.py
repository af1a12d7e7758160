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
* ``request_classes``: the request classes, ``{name, weight, endpoint, body}``: each
  request draws one (seeded, by weight, beside its sampling class) and is sent to the
  class's endpoint (``completions``: ``/v1/completions``; ``chat``: ``/v1/chat/completions``)
  with the class's ``body`` fields added (stop, max_tokens, ignore_eos, seed, logprobs,
  response_format, structured_outputs, tools...; :mod:`harness.load.endpoints` says what
  each endpoint takes). Default (absent): one implicit ``plain`` completions class with an
  empty body, today's requests. Each class's responses are judged by the integrity
  invariants its body asks for (:mod:`harness.checks.request_classes`).
* ``mirror``: send the same seeded workload to the speculative and the reference server,
  interleaved (needs ``stack.reference``), so speculative and plain latency are measured
  in the same run.
* ``target``: the server the load goes to: ``spec`` (default) or ``ref``, the plain
  reference alone (needs ``stack.reference``; ``specchaos sweep``'s A/B blocks measure plain
  decoding so, on the same started stack as the speculative blocks).

Two options shape when requests are sent and what a failed one does:

* ``profile`` (:class:`ProfileConfig`): closed loop (N users, the default: ``users``) or
  open loop (arrivals at ``rate`` requests/s, Poisson or gamma with ``burstiness`` as in
  ``vllm bench serve --burstiness``), each with an optional linear ``ramp`` and ``steps``.
  The arithmetic is :mod:`harness.load.profiles`.
* ``retry`` (:class:`RetryConfig`): the client's retry policy, exponential backoff with
  jitter as the OpenAI Python SDK by default; each try is its own record (``attempt``,
  ``logical_id``). The arithmetic is :mod:`harness.load.retry`.

Scale-out: ``workers`` (default 0, one locust process) runs locust's own distributed mode
instead, one master and ``workers`` worker processes on 127.0.0.1; ``max_requests`` still
bounds the requests of all workers together. A closed loop's users (also a ramp's or
steps' users, the master runs the shape) are spread over the workers; an open loop runs
one arrival scheduler per worker, worker ``k`` of ``N`` sending the arrivals ``i`` with
``i % N == k`` of the one seeded arrival sequence (so the requests are the single
process's), each allowed its share of ``max_in_flight``.
"""

from __future__ import annotations

import re

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from harness.load.endpoints import HARNESS_FIELDS, Endpoint, body_problem

__all__ = ["LoadConfig", "PromptBucket", "SamplingClass", "RequestClass", "PLAIN", "FOLLOW_UP", "asked_max_tokens",
           "reference_comparable", "ProfileConfig", "RampConfig", "StepConfig", "RetryConfig",
           "DEFAULT_BUCKETS", "GREEDY", "MIN_SYNTHETIC_PROMPT_TOKENS", "source_buckets"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")
_NAME_HINT = "1-32 characters: letters, digits, '_', '.', '-' (it names report rows and checks)"


def _check_name(v: str) -> str:
    if not _NAME.match(v):
        raise ValueError(f"name {v!r} is not allowed: {_NAME_HINT}")
    return v


#: A bucket's, sampling class's or request class's name (it names report rows and checks).
Name = Annotated[str, AfterValidator(_check_name)]


class PromptBucket(BaseModel):
    """One prompt-length bucket: prompts whose length in tokens (the target's tokenizer,
    special tokens included, as vLLM's ``usage.prompt_tokens``) lies in
    ``[min_prompt_tokens, max_prompt_tokens]``. ``name`` becomes the requests' ``prompt_class``.

    For the synthetic prompt set, ``count`` prompts are built, each drawing its own target
    length uniformly in the range; ``count`` is required and ``min_prompt_tokens`` is at
    least :data:`MIN_SYNTHETIC_PROMPT_TOKENS` (the generator's shortest prompt). With a
    traffic source (``load.source``) the bucket only sorts the source's prompts by measured
    length: ``count`` is not needed (the source brings its prompts) and any length from 1
    may be bucketed. ``max_tokens`` (optional) is the output length asked for by this
    bucket's synthetic requests (default: ``load.max_tokens``); with ``load.ignore_eos`` it
    is the output length."""

    model_config = ConfigDict(extra="forbid")

    name: Name
    min_prompt_tokens: int = Field(ge=1)
    max_prompt_tokens: int = Field(ge=1)
    count: int | None = Field(None, ge=0)
    max_tokens: int | None = Field(None, ge=1)

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

    name: Name
    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    weight: float = Field(1.0, gt=0)

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


#: The user's message of every turn after the first of a multi-turn chat class (``turns``).
FOLLOW_UP = "Please continue."

#: Body fields a request class may not set, and who sets them instead.
_NOT_IN_CLASS_BODY = {**{f: "the harness sets it (it names the served model and always streams with usage)"
                         for f in HARNESS_FIELDS},
                      "prompt": "the prompt comes from the prompt set (load.buckets)",
                      "temperature": "sampling comes from load.sampling",
                      "top_p": "sampling comes from load.sampling"}


def asked_max_tokens(body: dict[str, Any]) -> int:
    """The output length a request body asks for at most (chat's ``max_completion_tokens``
    wins over ``max_tokens``, as in vLLM), 0 when neither is set."""
    return int(body.get("max_completion_tokens") or body.get("max_tokens") or 0)


def class_body_problem(endpoint: str, body: dict[str, Any]) -> str | None:
    """The first reason a request class's ``body`` cannot be sent to ``endpoint``, naming
    the field (``"body.tools: belongs to /v1/chat/completions, not /v1/completions"``), or
    None. The prompt (completions) or the user message (chat) is added per request, so a
    placeholder stands for it here; :func:`harness.load.endpoints.body_problem` judges the rest."""
    for field in sorted(set(body) & set(_NOT_IN_CLASS_BODY)):
        return f"body.{field}: not allowed in a request class, {_NOT_IN_CLASS_BODY[field]}"
    filled = dict(body)
    if endpoint == "completions":
        filled["prompt"] = "x"
    elif endpoint == "chat":
        filled["messages"] = [*(body.get("messages") or []), {"role": "user", "content": "x"}] \
            if isinstance(body.get("messages", []), list) else body["messages"]
    problem = body_problem(endpoint, filled)
    return None if problem is None else f"body.{problem}"


class RequestClass(BaseModel):
    """One request class of the workload: ``weight`` is its relative share of the requests
    (> 0); each is sent to ``endpoint`` (``completions`` or ``chat``) with ``body``'s fields
    added to the harness's own (model, prompt or messages, max_tokens, stream with usage,
    ``return_token_ids``, sampling); a field of ``body`` wins over the harness's (e.g.
    ``max_tokens``, ``ignore_eos``). Chat: the prompt is the last user message; ``body``'s
    own ``messages`` (a system prompt, earlier turns) come before it. ``body`` may not set
    ``model``, ``stream``, ``stream_options``, ``prompt``, ``temperature``, ``top_p``
    (:func:`class_body_problem`).

    ``turns`` (chat only): a conversation of that many requests; turn ``n`` > 1 carries every
    earlier turn (the user's message and the answer's text) and asks :data:`FOLLOW_UP`, so
    the server sees a growing shared prefix (prefix caching meets speculation). Each turn is
    its own record (``turn``); a turn that failed ends the conversation."""

    model_config = ConfigDict(extra="forbid")

    name: Name
    weight: float = Field(1.0, gt=0)
    endpoint: Endpoint = "completions"
    body: dict[str, Any] = Field(default_factory=dict)
    turns: int = Field(1, ge=1, le=16)

    @model_validator(mode="after")
    def _sendable(self) -> "RequestClass":
        problem = class_body_problem(self.endpoint, self.body)
        if problem is None and self.turns > 1 and self.endpoint != "chat":
            problem = f"turns: {self.turns} turns need endpoint chat (a conversation is chat messages)"
        if problem is not None:
            raise ValueError(f"request class {self.name!r} ({self.endpoint}): {problem}")
        return self


#: Body fields that leave a completion's greedy output as the plain request's (the
#: reference's): a different ``max_tokens`` is compared as a prefix, the rest change no token.
_OUTPUT_NEUTRAL = frozenset({"max_tokens", "seed", "logprobs", "return_tokens_as_token_ids", "user", "priority",
                             "request_id"})


def reference_comparable(request_class: RequestClass) -> bool:
    """Whether the non-speculative reference (fetched per prompt as a plain greedy
    completion) predicts this class's greedy output: a completions class whose body only
    holds fields that change no output token (:data:`_OUTPUT_NEUTRAL`)."""
    return request_class.endpoint == "completions" and set(request_class.body) <= _OUTPUT_NEUTRAL


#: The implicit request class when ``load.request_classes`` is absent: plain completions.
PLAIN = RequestClass(name="plain")


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


#: The shortest prompt (tokens) a synthetic bucket may ask for: the prompt generator
#: builds prompts of at least 8 words (:func:`harness.load.prompts.build_bucketed_prompt_set`).
MIN_SYNTHETIC_PROMPT_TOKENS = 8
#: The longest prompt (tokens) the derived buckets of a traffic source cover
#: (:func:`source_buckets`); a longer prompt would exceed any ``max_model_len`` served here.
SOURCE_BUCKET_LIMIT = 2**20


def source_buckets(limit: int = SOURCE_BUCKET_LIMIT) -> list[tuple[str, int, int, int, int, int]]:
    """The buckets a traffic source's prompts fall into when ``load.buckets`` is not given:
    contiguous power-of-two ranges ``1-16``, ``17-32``, ``33-64``, … up to ``limit`` tokens,
    named by their range, so every length has exactly one bucket and none is refused. As
    :meth:`LoadConfig.bucket_specs` gives them: ``(name, lo, hi, lo, hi, 0)`` (tokens,
    inclusive; the count unused)."""
    out: list[tuple[str, int, int, int, int, int]] = []
    lo, hi = 1, 16
    while lo <= limit:
        out.append((f"{lo}-{hi}", lo, hi, lo, hi, 0))
        lo, hi = hi + 1, hi * 2
    return out


#: The default buckets' count fields and their defaults.
_LEGACY_COUNTS = {"short_prompts": 12, "medium_prompts": 8, "long_prompts": 4}


class RampConfig(BaseModel):
    """A linear ramp at the load's start: from ``from_users`` (closed loop) or
    ``from_rate`` requests/s (open loop) to the profile's ``users``/``rate`` over
    ``duration_s`` seconds."""

    model_config = ConfigDict(extra="forbid")

    from_users: int | None = Field(None, ge=0, le=256)
    from_rate: float | None = Field(None, ge=0)
    duration_s: float = Field(gt=0)


class StepConfig(BaseModel):
    """A step of the load: from ``at_s`` seconds after the load started, ``users`` (closed
    loop) or ``rate`` requests/s (open loop)."""

    model_config = ConfigDict(extra="forbid")

    at_s: float = Field(ge=0)
    users: int | None = Field(None, ge=0, le=256)
    rate: float | None = Field(None, gt=0)


class ProfileConfig(BaseModel):
    """When requests are sent. Times are seconds since the load started (the warm-up
    starts then too).

    * ``kind: closed`` (default): ``users`` concurrent users (default ``load.users``), each
      sending its next request when the previous one ended (and ``think_time_s`` passed).
    * ``kind: open``: arrivals at ``rate`` requests/s from a seeded generator, independent
      of response times; with a timed traffic source (``load.source.format: mooncake``)
      no ``rate``: the trace's timestamps are the arrivals. Inter-arrival gaps are gamma distributed with shape
      ``burstiness`` and scale ``1 / (rate * burstiness)``: mean ``1 / rate``, coefficient
      of variation ``1 / sqrt(burstiness)``; ``burstiness: 1`` is a Poisson process. This is
      ``vllm bench serve --burstiness`` (vllm/benchmarks/serve.py, ``get_request``). At most
      ``max_in_flight`` requests are in flight; an arrival beyond it is dropped and
      counted, never queued.
    * ``ramp``: linear from ``from_users``/``from_rate`` to ``users``/``rate`` over its
      ``duration_s``; ``steps``: from each ``at_s`` on, its ``users``/``rate`` (in
      increasing ``at_s``, none inside the ramp).
    """

    model_config = ConfigDict(extra="forbid")

    kind: Literal["closed", "open"] = "closed"
    users: int | None = Field(None, ge=1, le=256)
    rate: float | None = Field(None, gt=0, le=10000)
    burstiness: float = Field(1.0, gt=0, le=1000)
    max_in_flight: int = Field(64, ge=1, le=4096)
    ramp: RampConfig | None = None
    steps: list[StepConfig] = Field(default_factory=list)

    def peak_users(self, default_users: int = 1) -> int:
        """Closed loop: the most users the schedule ever asks for (``users``, else
        ``default_users``; the ramp's start; each step's), a linear ramp peaking at an end."""
        values = [self.users or default_users, self.ramp.from_users if self.ramp else None,
                  *(st.users for st in self.steps)]
        return max(v for v in values if v is not None)

    @model_validator(mode="after")
    def _consistent(self) -> "ProfileConfig":
        closed = self.kind == "closed"
        unit, other = ("users", "rate") if closed else ("rate", "users")
        # an open loop without rate takes its arrivals from a timed source (LoadConfig checks that)
        # by value, not by "was it given": a dumped config (config.json) must parse again
        misplaced = [f for f, default in (("burstiness", 1.0), ("max_in_flight", 64))
                     if closed and getattr(self, f) != default]
        misplaced += ["users"] if not closed and self.users is not None else []
        misplaced += ["rate"] if closed and self.rate is not None else []
        if misplaced:
            raise ValueError(f"{', '.join(misplaced)} belong(s) to the other kind of profile than kind: {self.kind}")
        if self.ramp is not None:
            mine, theirs = (self.ramp.from_users, self.ramp.from_rate) if closed else (self.ramp.from_rate,
                                                                                        self.ramp.from_users)
            if mine is None or theirs is not None:
                raise ValueError(f"ramp of a {self.kind}-loop profile needs from_{unit} (and no from_{other})")
        last = self.ramp.duration_s if self.ramp is not None else None
        for i, st in enumerate(self.steps):
            value, wrong = (st.users, st.rate) if closed else (st.rate, st.users)
            if value is None or wrong is not None:
                raise ValueError(f"steps[{i}] of a {self.kind}-loop profile needs {unit} (and no {other})")
            if last is not None and st.at_s <= last:
                raise ValueError(f"steps[{i}].at_s {st.at_s:g} must be after the ramp and the previous step "
                                 f"({last:g} s)")
            last = st.at_s
        return self


class RetryConfig(BaseModel):
    """The client's retry policy: a failed try that a client would retry (no response
    head: refused, reset or timed out before it; or HTTP 408, 409, 429, 5xx; see
    :func:`harness.load.retry.retryable`) is sent again, the same prompt and sampling,
    after a backoff, at most ``max_retries`` times; then the logical request has failed.

    ``backoff: exponential``: before retry ``n`` (1-based) wait
    ``min(initial_s * multiplier**(n-1), max_s)`` seconds, jittered: ``openai`` multiplies
    it by ``1 - 0.25 * U`` (U uniform in [0, 1)), ``full`` draws uniformly in ``[0, wait]``
    (AWS's "full jitter"), ``none`` keeps it. ``backoff: fixed`` waits ``initial_s`` each
    time (jitter still applies). Defaults are the OpenAI Python SDK's (openai/_constants.py:
    ``DEFAULT_MAX_RETRIES = 2``, ``INITIAL_RETRY_DELAY = 0.5``, ``MAX_RETRY_DELAY = 8.0``;
    openai/_base_client.py ``_calculate_retry_timeout``: doubling, ``1 - 0.25 * random()``
    jitter). ``max_retries: 0`` turns retries off. Bounded: at most ``max_retries`` extra
    tries of at most ``max_s`` seconds' wait each.
    """

    model_config = ConfigDict(extra="forbid")

    max_retries: int = Field(2, ge=0, le=10)
    backoff: Literal["exponential", "fixed"] = "exponential"
    initial_s: float = Field(0.5, ge=0, le=60)
    max_s: float = Field(8.0, ge=0, le=120)
    multiplier: float = Field(2.0, ge=1, le=10)
    jitter: Literal["openai", "full", "none"] = "openai"

    @model_validator(mode="after")
    def _bounds(self) -> "RetryConfig":
        if self.max_s < self.initial_s:
            raise ValueError(f"max_s {self.max_s:g} < initial_s {self.initial_s:g}")
        return self


class SourceConfig(BaseModel):
    """A traffic source (``load.source``): requests read from a file instead of the seeded
    synthetic prompt set (readers in :mod:`harness.load.sources`). ``path`` is relative to
    the working directory (as ``stack.models_dir``; ``chaos run`` does not tell the control
    where the experiment file is), or absolute. ``speedup`` divides a timed trace's
    arrival times (seconds; mooncake); ``chat`` sends vllm-custom prompts to
    ``/v1/chat/completions``; ``max_tokens`` is the output length where a record gives
    none; ``limit`` takes at most that many requests; ``order`` keeps the file's order or
    shuffles it (seeded by ``load.seed``). ``category_field`` names the record field that
    carries a request's content category (openai, sharegpt, vllm-custom; default
    ``category``): it becomes the request class of its records, so acceptance, latency and
    integrity are reported per category (acceptance also per category × bucket), and
    ``acceptance_floor.request_classes`` can hold a floor per category."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["openai", "sharegpt", "vllm-custom", "mooncake"]
    path: str = Field(min_length=1)
    speedup: float = Field(1.0, gt=0)
    chat: bool = False
    max_tokens: int | None = Field(None, ge=1)
    limit: int | None = Field(None, ge=1)
    order: Literal["file", "shuffled"] = "file"
    category_field: str = Field("category", min_length=1)

    @model_validator(mode="after")
    def _timed_in_order(self) -> "SourceConfig":
        if self.format == "mooncake" and self.order == "shuffled":
            raise ValueError("a mooncake trace is replayed at its timestamps: order must be file")
        return self


class LoadConfig(BaseModel):
    """Load shape, prompt set and sampling (see module doc). ``short_prompts``,
    ``medium_prompts``, ``long_prompts`` are the counts of the default buckets (< 64,
    ~128, ~512 tokens) and may not be combined with ``buckets``; ``seed`` fixes prompts,
    each user's walk, its sampling draws, the open loop's arrivals and the retry jitter.
    ``error_backoff_s`` is the wait after a logical request failed (all its tries), before
    the user's next one (closed loop)."""

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
    #: Also record when the client parsed each chunk (user space, as ``vllm bench serve``
    #: stamps), beside the kernel arrival stamps: records' ``read_offsets_s`` and
    #: ``e2e_read_s``. A diagnostic (``bench/accuracy.py`` compares both stamps); metrics
    #: and checks always use the arrival stamps.
    read_stamps: bool = False
    request_timeout_s: float = Field(30.0, gt=0)
    max_requests: int = Field(20000, ge=1)
    think_time_s: float = Field(0.0, ge=0)
    error_backoff_s: float = Field(0.25, ge=0)
    buckets: list[PromptBucket] | None = None
    sampling: list[SamplingClass] = Field(default_factory=lambda: [GREEDY.model_copy()], min_length=1)
    #: The request classes (:class:`RequestClass`), each request drawing one by weight
    #: (seeded); absent: plain completions only, the implicit class ``plain``.
    request_classes: list[RequestClass] | None = None
    #: A traffic source (:class:`SourceConfig`) replacing the synthetic prompts and the
    #: request classes; absent: the seeded prompt set.
    source: SourceConfig | None = None
    mirror: bool = False
    target: Literal["spec", "ref"] = "spec"
    profile: ProfileConfig = Field(default_factory=ProfileConfig)
    retry: RetryConfig = Field(default_factory=RetryConfig)
    # --- distributed load: locust's own master/worker mode on loopback; 0 = one locust
    # process. See harness.load.locust_process.
    workers: int = Field(0, ge=0, le=64)
    #: The pacer's lag limit (seconds): with an open loop or a trace replay, the 99th
    #: percentile of how late arrivals were sent after their planned instants
    #: (``load_stats.json``, :mod:`harness.load.lag`) must not exceed it, since a late
    #: pacer changes the load under test (check ``pacing.lag_p99_s``). None: the lag is
    #: reported, not judged.
    max_lag_p99_s: float | None = Field(None, gt=0)

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

    @field_validator("request_classes")
    @classmethod
    def _classes(cls, v: list[RequestClass] | None) -> list[RequestClass] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("needs at least one request class (or leave request_classes out for plain completions)")
        names = [c.name for c in v]
        for n in names:
            if names.count(n) > 1:
                raise ValueError(f"request class name {n!r} is used twice")
        return v

    @model_validator(mode="before")
    @classmethod
    def _trace_implies_open_loop(cls, data: Any) -> Any:
        """A timed source without a profile is replayed open loop (``profile: {kind: open}``)."""
        if isinstance(data, dict) and "profile" not in data and isinstance(data.get("source"), dict) \
                and data["source"].get("format") == "mooncake":
            data = {**data, "profile": {"kind": "open"}}
        return data

    @model_validator(mode="after")
    def _arrivals_from_rate_or_trace(self) -> "LoadConfig":
        p = self.profile
        timed = self.source is not None and self.source.format == "mooncake"
        if timed:
            given = [f for f, bad in (("rate", p.rate is not None), ("ramp", p.ramp is not None),
                                      ("steps", bool(p.steps)), ("burstiness", p.burstiness != 1.0)) if bad]
            if p.kind != "open" or given:
                wrong = f"kind: {p.kind}" if p.kind != "open" else "profile." + ", profile.".join(given)
                raise ValueError(f"a mooncake trace is replayed open loop at its own timestamps, so {wrong} "
                                 f"contradicts it: set profile to {{kind: open}} (max_in_flight allowed) or leave "
                                 f"profile out; load.source.speedup scales the trace's pace")
        elif p.kind == "open" and p.rate is None:
            raise ValueError("an open-loop profile needs rate (requests/s > 0); only a timed source "
                             "(load.source.format: mooncake) brings its own arrivals")
        return self

    @model_validator(mode="after")
    def _source_excludes_synthetic(self) -> "LoadConfig":
        if self.source is None:
            return self
        # the counts by value, not by "was it given": a dumped config (config.json) holds the
        # defaults filled in below and must parse again
        clash = ["request_classes"] if self.request_classes is not None else []
        clash += [n for n, default in _LEGACY_COUNTS.items() if getattr(self, n) not in (None, default)]
        if clash:
            raise ValueError(f"source replaces the synthetic prompts: remove {', '.join(clash)} "
                             f"(load.buckets still bucket the source's prompts; their counts are unused)")
        return self

    @model_validator(mode="after")
    def _synthetic_buckets(self) -> "LoadConfig":
        if self.source is not None or self.buckets is None:
            return self
        for i, b in enumerate(self.buckets):
            if b.count is None:
                raise ValueError(f"buckets[{i}] ({b.name}): count is required for the synthetic prompt set "
                                 f"(only a load.source brings its own prompts)")
            if b.min_prompt_tokens < MIN_SYNTHETIC_PROMPT_TOKENS:
                raise ValueError(f"buckets[{i}] ({b.name}): min_prompt_tokens {b.min_prompt_tokens} is below "
                                 f"{MIN_SYNTHETIC_PROMPT_TOKENS}, the shortest synthetic prompt (a load.source's "
                                 f"buckets may start at 1)")
        return self

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
        p = self.profile
        if self.workers > self.max_requests:
            raise ValueError(f"workers ({self.workers}) exceeds max_requests ({self.max_requests}): each locust "
                             f"worker gets a share of the request bound, and a share of 0 would end the run at once")
        if p.kind == "open":
            if self.workers > p.max_in_flight:
                raise ValueError(f"workers ({self.workers}) exceeds profile.max_in_flight ({p.max_in_flight}): "
                                 f"each locust worker needs a share of at least one request in flight")
            return self
        peak = p.peak_users(self.users)
        if self.workers > peak:
            what = "the profile's most users" if p.ramp or p.steps or p.users else "users"
            raise ValueError(f"workers ({self.workers}) exceeds {what} ({peak}): each locust worker "
                             f"needs at least one user")
        return self

    def bucket_specs(self) -> list[tuple[str, int, int, int, int, int]]:
        """The prompt set's buckets in order, as ``(name, target_lo, target_hi, accept_lo,
        accept_hi, count)`` in tokens (see :func:`harness.load.prompts.build_prompt_set`);
        a traffic source without ``buckets`` gets :func:`source_buckets`, and a source's
        buckets count 0 (the source brings its own prompts)."""
        if self.buckets is None:
            if self.source is not None:
                return source_buckets()
            counts = {"short": self.short_prompts, "medium": self.medium_prompts, "long": self.long_prompts}
            return [(n, *DEFAULT_BUCKETS[n], counts[n]) for n in DEFAULT_BUCKETS]
        return [(b.name, b.min_prompt_tokens, b.max_prompt_tokens, b.min_prompt_tokens, b.max_prompt_tokens,
                 0 if self.source is not None else (b.count or 0)) for b in self.buckets]

    def bucket_names(self) -> list[str]:
        """Bucket names in their configured order."""
        return [s[0] for s in self.bucket_specs()]

    def longest_prompt_tokens(self) -> int:
        """The longest prompt a bucket with prompts may hold, in tokens."""
        return max((s[4] for s in self.bucket_specs() if s[5] > 0), default=0)

    def bucket_max_tokens(self) -> dict[str, int]:
        """``max_tokens`` of each bucket's requests (its own, else ``load.max_tokens``)."""
        if self.buckets is None:
            return {n: self.max_tokens for n in DEFAULT_BUCKETS}
        return {b.name: b.max_tokens or self.max_tokens for b in self.buckets}

    def longest_request_tokens(self) -> tuple[str, int, int]:
        """The bucket whose longest prompt plus its ``max_tokens`` is largest, as
        ``(name, prompt tokens, max_tokens)`` (``("", 0, 0)`` if no bucket has prompts)."""
        out = max(((s[0], s[4], self.bucket_max_tokens()[s[0]]) for s in self.bucket_specs() if s[5] > 0),
                  key=lambda t: t[1] + t[2], default=("", 0, 0))
        return out

    def longest_conversation_tokens(self) -> tuple[str, int, int, int]:
        """The request class whose longest request is longest, as ``(name, prompt tokens,
        turns, max_tokens)``: the longest prompt of the buckets, and the class's own output
        length (``max_completion_tokens``/``max_tokens`` of its body, else the buckets'
        largest). Its last turn holds at least ``prompt + turns * max_tokens`` tokens (the
        earlier answers and this one; the chat template and follow-ups come on top).
        ``("", 0, 0, 0)`` without request classes or prompts."""
        longest, bucket_out = self.longest_prompt_tokens(), max(self.bucket_max_tokens().values(), default=0)
        if not longest or not self.request_classes:
            return "", 0, 0, 0
        c = max(self.request_classes, key=lambda c: c.turns * (asked_max_tokens(c.body) or bucket_out))
        return c.name, longest, c.turns, asked_max_tokens(c.body) or bucket_out

    def closed_users(self) -> int:
        """The closed loop's (final) user count: ``profile.users``, else ``users``."""
        return self.profile.users or self.users

    def classes(self) -> list[RequestClass]:
        """The request classes: ``request_classes``, else the implicit :data:`PLAIN`."""
        return list(self.request_classes) if self.request_classes is not None else [PLAIN]

    def comparable_classes(self) -> set[str]:
        """Names of the request classes whose greedy output the plain reference predicts
        (:func:`reference_comparable`; the implicit plain class is one)."""
        return {c.name for c in self.classes() if reference_comparable(c)}

    def greedy_classes(self) -> set[str]:
        """Names of the greedy sampling classes (temperature 0); with a traffic source also
        :data:`GREEDY`'s name, which a source request that sets ``temperature: 0`` itself is
        recorded under (:func:`harness.load.client.sampling_name`)."""
        names = {s.name for s in self.sampling if s.greedy}
        return names | {GREEDY.name} if self.source is not None else names

"""What a request body may hold for each endpoint the load sends to: one set of rules for
every place a body comes from (a traffic source's lines, :mod:`harness.load.sources`; the
workload's request classes, :class:`harness.load.config.RequestClass`), so a field that
belongs to the other endpoint or a value vLLM would refuse is named before anything starts.

Endpoints (the OpenAI API as vLLM 0.32 serves it): ``"completions"`` (``/v1/completions``,
``prompt``: a string or token ids) and ``"chat"`` (``/v1/chat/completions``, ``messages``).
The fields only one of them takes were read from vLLM 0.32's ``CompletionRequest`` and
``ChatCompletionRequest`` (``vllm/entrypoints/openai/{completion,chat_completion}/protocol.py``);
the ones the harness judges are typed here (``max_tokens`` ≥ 1, ``n`` = 1, completions'
``logprobs`` an integer ≥ 0, chat's ``logprobs`` a boolean and ``top_logprobs`` ≥ 0); every
other field passes through unread.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError, field_validator

from harness.errors import first_error

__all__ = ["ENDPOINTS", "HARNESS_FIELDS", "ONLY", "Endpoint", "body_problem", "endpoint_of", "passed_through"]

Endpoint = Literal["completions", "chat"]

#: URL path of each endpoint.
ENDPOINTS: dict[str, str] = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}

#: Body fields the harness sets itself (it names the served model and always streams with
#: usage): a body's own are dropped (:func:`passed_through`).
HARNESS_FIELDS = ("model", "stream", "stream_options")

#: Fields only one endpoint takes (vLLM 0.32), by endpoint.
ONLY: dict[str, frozenset[str]] = {
    "completions": frozenset({"prompt", "prompt_embeds", "suffix"}),
    "chat": frozenset({"messages", "tools", "tool_choice", "parallel_tool_calls", "top_logprobs",
                       "max_completion_tokens", "add_generation_prompt", "continue_final_message", "chat_template",
                       "chat_template_kwargs", "documents", "include_reasoning", "reasoning_effort"}),
}


class _Message(BaseModel):
    """A chat message: a role and content (a string, content parts, or none beside tool calls)."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None


class _Common(BaseModel):
    """Fields every body may carry that the harness must be able to judge."""

    model_config = ConfigDict(extra="allow")

    max_tokens: int | None = Field(None, ge=1)
    n: int = 1

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v: int) -> int:
        if v != 1:
            raise ValueError(f"must be 1, not {v}: the harness judges one choice per request")
        return v


class _CompletionBody(_Common):
    prompt: Any
    logprobs: StrictInt | None = Field(None, ge=0)

    @field_validator("prompt")
    @classmethod
    def _text_or_ids(cls, v: Any) -> str | list[int]:
        ids = isinstance(v, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in v)
        if not (isinstance(v, str) or ids) or not v:
            raise ValueError("must be a non-empty string or a non-empty list of token ids (integers >= 0)")
        return v


class _ChatBody(_Common):
    messages: list[_Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = Field(None, ge=0)


_MODELS: dict[str, type[BaseModel]] = {"completions": _CompletionBody, "chat": _ChatBody}


def endpoint_of(body: Mapping[str, Any]) -> Endpoint | None:
    """``"completions"`` for a body with ``prompt``, ``"chat"`` for one with ``messages``,
    None for neither or both."""
    if ("prompt" in body) == ("messages" in body):
        return None
    return "completions" if "prompt" in body else "chat"


def body_problem(endpoint: str, body: Mapping[str, Any]) -> str | None:
    """The first reason ``endpoint`` would not take ``body``, in words naming the field
    (``"tools: belongs to /v1/chat/completions, not /v1/completions"``), or None.

    Checks: the endpoint's own input (``prompt`` or ``messages``) is there, no field that
    only the other endpoint takes, and the judged fields' types and ranges (module doc).
    """
    if endpoint not in ENDPOINTS:
        return f"unknown endpoint {endpoint!r} (one of {sorted(ENDPOINTS)})"
    other = next(e for e in ENDPOINTS if e != endpoint)
    for field in sorted(ONLY[other] & set(body)):
        return f"{field}: belongs to {ENDPOINTS[other]}, not {ENDPOINTS[endpoint]}"
    try:
        _MODELS[endpoint].model_validate(dict(body))
    except ValidationError as exc:
        loc, msg, kind = first_error(exc)
        if kind == "missing":
            return f"missing field {loc!r}"
        return f"{loc}: {msg}" if loc else msg
    return None


def passed_through(body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` less :data:`HARNESS_FIELDS`: what is sent as the source gave it."""
    return {k: v for k, v in body.items() if k not in HARNESS_FIELDS}

"""Traffic sources: a user's file of requests turned into request specs the load can send.

Four formats, each a reader registered by name in :data:`READERS`:

* ``"openai"`` (:func:`read_openai_requests`): JSONL, one OpenAI request body per line, a
  completions body (``prompt``: a string or a list of token ids) or a chat body
  (``messages``); or the same body wrapped as a line of the OpenAI Batch API's input file
  (``{"custom_id", "method", "url": "/v1/chat/completions", "body": {...}}``). Every other
  field (``stop``, ``max_tokens``, ``logprobs``, ``response_format``, ``tools``, vLLM's
  ``guided_choice``...) is passed through as it is.
* ``"sharegpt"`` (:func:`read_sharegpt`): ShareGPT-style conversations
  (``{"id", "conversations": [{"from": "human"|"gpt"|"system", "value": "..."}]}``), a JSON
  array (as ``vllm bench serve --dataset-name sharegpt`` reads it) or JSONL. Each human turn
  becomes one chat request carrying every earlier turn (the recorded answers as assistant
  messages), so a conversation's requests share growing prefixes.
* ``"vllm-custom"`` (:func:`read_vllm_custom`): the vLLM benchmark custom dataset
  (``vllm bench serve --dataset-name custom``, ``vllm/benchmarks/datasets/datasets.py``
  ``CustomDataset``): JSONL with a ``prompt`` string and an optional integer
  ``output_tokens`` (the request's ``max_tokens``). Sent as a completions prompt; with
  ``chat=True`` as one user message to the chat endpoint (``vllm bench serve`` applies the
  chat template to it unless ``--custom-skip-chat-template``).
* ``"mooncake"`` (:func:`read_mooncake_trace`): a timed trace in the Mooncake trace format
  (kvcache-ai/Mooncake, ``FAST25-release/traces``): JSONL of ``{"timestamp": ms,
  "input_length": tokens, "output_length": tokens, "hash_ids": [int, ...]}``. Replayed
  open loop: each request's ``arrival_s`` is ``(timestamp - first timestamp) / 1000 /
  speedup`` seconds. The prompt is synthesised as token ids (a completions ``prompt`` list,
  as ``vllm bench serve``'s ``timed-trace`` dataset does): each hash id stands for one
  block of ``block_tokens`` tokens (Mooncake: 512), drawn from the tokenizer's non-special
  ids with a generator seeded by ``(seed, hash id)``, so two requests sharing hash ids share
  that prefix token for token; the last block is a prefix of its hash id's block.

Every reader returns :class:`RequestSpec` in file order. Any defect is a
:class:`~harness.errors.SourceError` whose ``where`` is ``FILE:LINE`` (1-based): a line that
is not JSON, a missing or mistyped field, an empty file. What a reader cannot know (the
prompt's length in tokens) is measured afterwards: :func:`measure` (with
:func:`prompt_token_counter`, the target's tokenizer), :func:`check_model_len` (a prompt
plus its ``max_tokens`` longer than ``max_model_len``) and :func:`bucket` (the prompt-length
buckets of :mod:`harness.load.prompts`, by measured length); :func:`load_source` does all.

The harness owns ``model``, ``stream`` and ``stream_options`` (it names the served model
and always streams with usage): a reader drops them from the body (:data:`HARNESS_FIELDS`).
What a body may hold for its endpoint is :mod:`harness.load.endpoints`'s.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.errors import ModelError, SourceError, first_error
from harness.load.endpoints import ENDPOINTS, HARNESS_FIELDS, Endpoint, body_problem, endpoint_of, passed_through
from harness.load.prompts import load_token_counter

__all__ = [
    "ENDPOINTS",
    "HARNESS_FIELDS",
    "MOONCAKE_BLOCK_TOKENS",
    "READERS",
    "RequestSpec",
    "bucket",
    "check_model_len",
    "load_source",
    "measure",
    "plain_token_ids",
    "prompt_token_counter",
    "read_mooncake_trace",
    "read_openai_requests",
    "read_sharegpt",
    "read_source",
    "read_vllm_custom",
]

log = logging.getLogger(__name__)

#: Tokens per hash id in the Mooncake trace format (its traces' block size).
MOONCAKE_BLOCK_TOKENS = 512


@dataclass(frozen=True)
class RequestSpec:
    """One request of a traffic source.

    Fields:
        endpoint: ``"completions"`` (body has ``prompt``) or ``"chat"`` (body has ``messages``);
            the URL path is ``ENDPOINTS[endpoint]``.
        body: the OpenAI request body without :data:`HARNESS_FIELDS`; every other field as the
            source gave it.
        origin: ``"FILE:LINE"`` of the line (JSON array: of the item's first line) it came from.
        arrival_s: timed traces only: seconds after the replay's start at which to send it
            (already divided by the speed-up factor); None for untimed sources.
        conversation: multi-turn sources: the conversation's id; None otherwise.
        turn: multi-turn sources: the turn's index in its conversation (0-based, counting
            requests); 0 otherwise.
        prompt_tokens: the prompt's measured length in tokens (as vLLM's
            ``usage.prompt_tokens``), None until :func:`measure`.
        prompt_class: the prompt-length bucket, None until :func:`bucket`.
        category: the record's content category (``load.source.category_field``, default
            ``category``: e.g. ``code``, ``json``, ``chat``, ``prose``), which becomes the
            request class its records carry; None when the record has none.
    """

    endpoint: Endpoint
    body: dict[str, Any]
    origin: str
    arrival_s: float | None = None
    conversation: str | None = None
    turn: int = 0
    prompt_tokens: int | None = None
    prompt_class: str | None = None
    category: str | None = None

    @property
    def path(self) -> str:
        """The endpoint's URL path, e.g. ``"/v1/chat/completions"``."""
        return ENDPOINTS[self.endpoint]

    @property
    def max_tokens(self) -> int | None:
        """The output bound asked for: ``max_tokens``, else chat's ``max_completion_tokens``, else None."""
        v = self.body.get("max_tokens")
        if v is None and self.endpoint == "chat":
            v = self.body.get("max_completion_tokens")
        return v


# ------------------------------------------------------------------------------ reading
def _fail(where: str, message: str, hint: str | None = None) -> SourceError:
    return SourceError(message, where=where, hint=hint)


#: How many bad lines a source error lists before it says "and N more".
MAX_LISTED_PROBLEMS = 20


class _BadLines:
    """The bad lines of one source file, collected so one error names every one of them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.errors: list[SourceError] = []

    def add(self, exc: SourceError) -> None:
        self.errors.append(exc)

    def check(self) -> None:
        """Raise what was collected: the error itself for one bad line; for several, one
        error naming the file and how many, whose ``details`` list each as
        ``FILE:LINE: reason`` (the first :data:`MAX_LISTED_PROBLEMS`, then "and N more")."""
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            lines = [e.one_line() for e in self.errors[:MAX_LISTED_PROBLEMS]]
            if len(self.errors) > MAX_LISTED_PROBLEMS:
                lines.append(f"and {len(self.errors) - MAX_LISTED_PROBLEMS} more")
            raise SourceError(f"{len(self.errors)} bad lines, each named below", where=str(self.path),
                              hint="fix or remove them", details=lines)


def _read_text(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _fail(str(path), "no such file", "give the path of the traffic source file") from None
    except UnicodeDecodeError as exc:
        raise _fail(str(path), f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise _fail(str(path), f"cannot read: {exc.strerror or exc}") from None
    if not text.strip():
        raise _fail(str(path), "empty file: no requests", "a source needs at least one line")
    return text


def _jsonl(path: Path, text: str, bad: _BadLines) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for every non-blank line of a JSONL text; a line that is
    not a JSON object goes to ``bad`` and the reading goes on."""
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            bad.add(_fail(f"{path}:{n}", f"not JSON: {getattr(exc, 'msg', exc)} (column {getattr(exc, 'colno', '?')})",
                          "each line must be one JSON object (JSONL)"))
            continue
        if not isinstance(obj, dict):
            bad.add(_fail(f"{path}:{n}", f"a JSON {type(obj).__name__}, not an object"))
            continue
        yield n, obj


def _json_array(path: Path, text: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line of the item's start, object)`` for each item of a JSON array text."""
    dec = json.JSONDecoder()
    i = text.index("[") + 1

    def skip(j: int) -> int:
        while j < len(text) and text[j] in " \t\r\n":
            j += 1
        return j

    i = skip(i)
    if i < len(text) and text[i] == "]":
        raise _fail(str(path), "empty JSON array: no conversations")
    while True:
        line = text.count("\n", 0, i) + 1
        try:
            obj, i = dec.raw_decode(text, i)
        except ValueError as exc:
            raise _fail(f"{path}:{getattr(exc, 'lineno', line)}", f"not JSON: {getattr(exc, 'msg', exc)}") from None
        if not isinstance(obj, dict):
            raise _fail(f"{path}:{line}", f"a JSON {type(obj).__name__}, not an object")
        yield line, obj
        i = skip(i)
        if i < len(text) and text[i] == ",":
            i = skip(i + 1)
            continue
        if i < len(text) and text[i] == "]" and not text[i + 1:].strip():
            return
        raise _fail(f"{path}:{text.count(chr(10), 0, i) + 1}", "not JSON: expected ',' or the array's closing ']'")


def _records(path: Path, text: str, bad: _BadLines) -> Iterator[tuple[int, dict[str, Any]]]:
    """A JSON array's items if the text is one (a syntax error ends the reading: the rest
    cannot be parsed), else JSONL lines."""
    return _json_array(path, text) if text.lstrip().startswith("[") else _jsonl(path, text, bad)


def _validation(where: str, exc: ValidationError) -> SourceError:
    loc, msg, kind = first_error(exc)
    if kind == "missing":
        return _fail(where, f"missing field {loc!r}")
    return _fail(where, f"{loc}: {msg}" if loc else msg)


#: The record field that carries a request's content category unless
#: ``load.source.category_field`` names another.
CATEGORY_FIELD = "category"
_CATEGORY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")


def _category(where: str, obj: dict[str, Any], field: str) -> str | None:
    """The record's category (popped from ``obj``: it is the harness's, never sent), None
    without one.

    Raises:
        SourceError: a category that is not a name (1-32 letters, digits, ``_ . -``: it
            names report rows and checks).
    """
    value = obj.pop(field, None)
    if value is None:
        return None
    if not isinstance(value, str) or not _CATEGORY.match(value):
        raise _fail(where, f"{field} {value!r} is not a category name",
                    "1-32 characters: letters, digits, '_', '.', '-' (it names report rows and checks)")
    return value


# ------------------------------------------------------------------------- OpenAI bodies
def _body(where: str, raw: dict[str, Any], url: str | None = None) -> tuple[Endpoint, dict[str, Any]]:
    """Validate one OpenAI body (:func:`harness.load.endpoints.body_problem`); the endpoint
    from ``url`` (Batch API lines) or from its shape."""
    if url is not None:
        endpoint = next((e for e in ("completions", "chat") if ENDPOINTS[e] == url.rstrip("/")), None)
        if endpoint is None:
            raise _fail(where, f"url {url!r} is not one of {sorted(ENDPOINTS.values())}")
    else:
        endpoint = endpoint_of(raw)
        if endpoint is None:
            raise _fail(where, "needs exactly one of 'prompt' (completions) and 'messages' (chat)"
                        if "prompt" not in raw else "has both 'prompt' and 'messages': one request is one endpoint")
    problem = body_problem(endpoint, raw)
    if problem is not None:
        raise _fail(where, problem)
    return endpoint, passed_through(raw)


def read_openai_requests(path: str | os.PathLike, *, category_field: str = CATEGORY_FIELD) -> list[RequestSpec]:
    """Read a JSONL file of OpenAI request bodies (module doc).

    Each line is a completions body (``prompt``: a non-empty string or list of token ids) or
    a chat body (``messages``: a non-empty list of ``{role, content}``), or an OpenAI Batch
    API input line whose ``url`` names the endpoint and whose ``body`` is the request. The
    body is kept as given, less :data:`HARNESS_FIELDS`; ``n`` must be 1 (one choice per
    request is judged), ``max_tokens`` ≥ 1 when given, and a field only the other endpoint
    takes (``tools`` in a completions body) is refused
    (:func:`harness.load.endpoints.body_problem`). A line's ``category_field`` (on the line
    or in a Batch API line's ``body``) is taken out of the body as the request's category.

    Returns:
        One spec per non-blank line, in file order.

    Raises:
        SourceError: missing or empty file, a line that is not a JSON object, a body with
            neither or both of ``prompt`` and ``messages``, a mistyped field; ``where`` is
            ``FILE:LINE``.
    """
    p = Path(path)
    out: list[RequestSpec] = []
    bad = _BadLines(p)
    for n, obj in _jsonl(p, _read_text(p), bad):
        where = f"{p}:{n}"
        try:
            category = _category(where, obj, category_field)
            url = None
            if "body" in obj and "url" in obj:   # an OpenAI Batch API input line
                url, obj = obj["url"], obj["body"]
                if not isinstance(obj, dict) or not isinstance(url, str):
                    raise _fail(where, "a Batch API line needs 'url' (a string) and 'body' (an object)")
                category = _category(where, obj, category_field) or category
            endpoint, body = _body(where, obj, url)
        except SourceError as exc:
            bad.add(exc)
            continue
        out.append(RequestSpec(endpoint, body, where, category=category))
    bad.check()
    return out


# ------------------------------------------------------------------------------ ShareGPT
#: ShareGPT speaker names → chat roles.
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "bard": "assistant", "bing": "assistant", "model": "assistant",
                  "system": "system"}


def read_sharegpt(path: str | os.PathLike, *, max_tokens: int | None = None,
                  extra: Mapping[str, Any] | None = None, category_field: str = CATEGORY_FIELD) -> list[RequestSpec]:
    """Read ShareGPT-style conversations into multi-turn chat requests (module doc).

    Args:
        path: a JSON array of conversations (as ShareGPT dumps and ``vllm bench serve`` use)
            or JSONL, one conversation per line. Each has ``conversations``: a list of
            ``{"from": speaker, "value": text}`` (speakers: :data:`SHAREGPT_ROLES`) and
            optionally ``id``.
        max_tokens: the ``max_tokens`` of every request (None: leave it to the workload).
        extra: further body fields for every request (e.g. ``{"temperature": 0}``).
        category_field: the conversation's field naming its content category (every turn's).

    Returns:
        One chat spec per human turn, conversation by conversation: turn ``k``'s
        ``messages`` are every turn before it (answers as ``assistant``) plus its own;
        ``conversation`` is the ``id`` (else ``"line N"``), ``turn`` the request's index.

    Raises:
        SourceError: missing or empty file, not JSON, no ``conversations`` list, a turn
            without ``from``/``value`` strings, an unknown speaker, a conversation with no
            human turn; ``where`` is ``FILE:LINE`` of the conversation.
    """
    p = Path(path)
    out: list[RequestSpec] = []
    bad = _BadLines(p)
    for n, obj in _records(p, _read_text(p), bad):
        try:
            category = _category(f"{p}:{n}", obj, category_field)
            out += [dataclasses.replace(r, category=category)
                    for r in _sharegpt_conversation(f"{p}:{n}", n, obj, max_tokens, extra)]
        except SourceError as exc:
            bad.add(exc)
    bad.check()
    return out


def _sharegpt_conversation(where: str, n: int, obj: dict[str, Any], max_tokens: int | None,
                           extra: Mapping[str, Any] | None) -> list[RequestSpec]:
    """One ShareGPT conversation's requests (:func:`read_sharegpt`)."""
    out: list[RequestSpec] = []
    turns = obj.get("conversations")
    if not isinstance(turns, list) or not turns:
        raise _fail(where, "missing field 'conversations' (a non-empty list of {from, value})"
                    if turns is None else "'conversations' must be a non-empty list of {from, value}")
    conv = str(obj.get("id", f"line {n}"))
    messages: list[dict[str, str]] = []
    asked = 0
    for i, t in enumerate(turns):
        if not isinstance(t, dict) or not isinstance(t.get("from"), str) or not isinstance(t.get("value"), str):
            raise _fail(where, f"conversations[{i}] needs 'from' and 'value' strings")
        role = SHAREGPT_ROLES.get(t["from"].lower())
        if role is None:
            raise _fail(where, f"conversations[{i}]: unknown speaker {t['from']!r}",
                        f"one of {sorted(SHAREGPT_ROLES)}")
        messages.append({"role": role, "content": t["value"]})
        if role == "user":
            body: dict[str, Any] = {**(extra or {}), "messages": [dict(m) for m in messages]}
            if max_tokens is not None:
                body["max_tokens"] = max_tokens
            out.append(RequestSpec("chat", body, where, conversation=conv, turn=asked))
            asked += 1
    if not asked:
        raise _fail(where, "conversation has no human turn: nothing to ask")
    return out


# ------------------------------------------------------------------------- vLLM custom
def read_vllm_custom(path: str | os.PathLike, *, chat: bool = False, max_tokens: int | None = None,
                     extra: Mapping[str, Any] | None = None, category_field: str = CATEGORY_FIELD) -> list[RequestSpec]:
    """Read a ``vllm bench serve`` custom dataset (JSONL of ``{"prompt": str, "output_tokens": int}``).

    Args:
        path: the JSONL file (vLLM's ``CustomDataset``; ``output_tokens`` optional).
        chat: send each prompt as one user message to the chat endpoint (what
            ``vllm bench serve`` does without ``--custom-skip-chat-template``); default: a
            completions ``prompt``.
        max_tokens: ``max_tokens`` of a line without ``output_tokens`` (None: leave it to the
            workload); a line's ``output_tokens`` wins.
        extra: further body fields for every request.
        category_field: the line's field naming its content category.

    Raises:
        SourceError: missing or empty file, not JSON, no ``prompt`` string, an
            ``output_tokens`` that is not an integer ≥ 1; ``where`` is ``FILE:LINE``.
    """
    p = Path(path)
    out: list[RequestSpec] = []
    bad = _BadLines(p)
    for n, obj in _jsonl(p, _read_text(p), bad):
        where = f"{p}:{n}"
        try:
            category = _category(where, obj, category_field)
        except SourceError as exc:
            bad.add(exc)
            continue
        prompt = obj.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            bad.add(_fail(where, "missing field 'prompt'" if prompt is None else "'prompt' must be a non-empty string"))
            continue
        out_tokens = obj.get("output_tokens", max_tokens)
        if out_tokens is not None and (isinstance(out_tokens, bool) or not isinstance(out_tokens, int)
                                       or out_tokens < 1):
            bad.add(_fail(where, f"'output_tokens' must be an integer >= 1, not {out_tokens!r}"))
            continue
        body: dict[str, Any] = dict(extra or {})
        if chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if out_tokens is not None:
            body["max_tokens"] = out_tokens
        out.append(RequestSpec("chat" if chat else "completions", body, where, category=category))
    bad.check()
    return out


# ------------------------------------------------------------------------ Mooncake trace
class _TraceLine(BaseModel):
    model_config = ConfigDict(extra="allow")

    timestamp: float = Field(ge=0)
    input_length: int = Field(ge=1)
    output_length: int = Field(ge=1)
    hash_ids: list[int] = Field(default_factory=list)


def read_mooncake_trace(path: str | os.PathLike, *, vocab: Sequence[int], speedup: float = 1.0, seed: int = 0,
                        block_tokens: int = MOONCAKE_BLOCK_TOKENS, ignore_eos: bool = True,
                        extra: Mapping[str, Any] | None = None) -> list[RequestSpec]:
    """Read a timed trace in the Mooncake trace format and synthesise its prompts (module doc).

    Args:
        path: JSONL of ``{"timestamp": ms, "input_length": tokens, "output_length": tokens,
            "hash_ids": [int, ...]}`` (``hash_ids`` optional), timestamps non-decreasing.
        vocab: the token ids prompts are drawn from (:func:`plain_token_ids`: the target's
            ids less its special tokens).
        speedup: replay this many times faster (> 0): ``arrival_s = (timestamp -
            first timestamp) / 1000 / speedup`` seconds.
        seed: the same seed, trace and vocab give the same prompts.
        block_tokens: tokens per hash id (Mooncake: 512). ``hash_ids`` must hold exactly
            ``ceil(input_length / block_tokens)`` ids; without ``hash_ids`` the prompt is
            unique to its line.
        ignore_eos: set ``ignore_eos`` so each request generates ``output_length`` tokens
            (as a trace replay should); False leaves it out.
        extra: further body fields for every request.

    Returns:
        Completions specs, prompt = ``input_length`` token ids, ``max_tokens`` =
        ``output_length``, ``prompt_tokens`` already set (vLLM adds no special token to a
        token-id prompt), ``arrival_s`` set.

    Raises:
        SourceError: missing or empty file, not JSON, a missing or mistyped field, a
            timestamp earlier than the line before, ``hash_ids`` that do not fit
            ``input_length`` at ``block_tokens``; ``where`` is ``FILE:LINE``. ``speedup`` ≤ 0,
            ``block_tokens`` < 1 or an empty ``vocab`` name the file only.
    """
    p = Path(path)
    if not speedup > 0:
        raise _fail(str(p), f"speed-up factor must be > 0, not {speedup!r}")
    if block_tokens < 1:
        raise _fail(str(p), f"block_tokens must be >= 1, not {block_tokens!r}")
    if not vocab:
        raise _fail(str(p), "no token ids to draw prompts from")
    ids = sorted({int(t) for t in vocab})
    blocks: dict[int | str, list[int]] = {}

    def block(key: int | str) -> list[int]:
        if key not in blocks:   # random.Random(str) seeds from the string's SHA-512: stable across processes
            blocks[key] = random.Random(f"{seed}:{key}").choices(ids, k=block_tokens)
        return blocks[key]

    out: list[RequestSpec] = []
    first: float | None = None
    last = 0.0
    bad = _BadLines(p)
    for n, obj in _jsonl(p, _read_text(p), bad):
        where = f"{p}:{n}"
        try:
            line = _TraceLine.model_validate(obj)
        except ValidationError as exc:
            bad.add(_validation(where, exc))
            continue
        if first is None:
            first = line.timestamp
        elif line.timestamp < last:
            bad.add(_fail(where, f"timestamp {line.timestamp:g} ms is before the line before's ({last:g} ms)",
                          "a trace is replayed in time order: sort it by timestamp"))
            continue
        last = line.timestamp
        need = -(-line.input_length // block_tokens)
        if line.hash_ids and len(line.hash_ids) != need:
            bad.add(_fail(where, f"input_length {line.input_length} needs {need} block(s) of {block_tokens} tokens, "
                          f"hash_ids has {len(line.hash_ids)}", "set block_tokens to the trace's block size"))
            continue
        keys: list[int | str] = list(line.hash_ids) or [f"line{n}.{b}" for b in range(need)]
        prompt: list[int] = []
        for k in keys:
            prompt += block(k)[: line.input_length - len(prompt)]
        body: dict[str, Any] = {**(extra or {}), "prompt": prompt, "max_tokens": line.output_length}
        if ignore_eos:
            body["ignore_eos"] = True
        out.append(RequestSpec("completions", body, where, arrival_s=(line.timestamp - first) / 1000.0 / speedup,
                               prompt_tokens=len(prompt)))
    bad.check()
    return out


#: The readers by source kind (``load.source.kind`` once the load path reads sources).
READERS: dict[str, Callable[..., list[RequestSpec]]] = {
    "openai": read_openai_requests,
    "sharegpt": read_sharegpt,
    "vllm-custom": read_vllm_custom,
    "mooncake": read_mooncake_trace,
}


def read_source(kind: str, path: str | os.PathLike, **options: Any) -> list[RequestSpec]:
    """Read ``path`` with the reader registered as ``kind`` in :data:`READERS`, passing
    ``options`` (the reader's keyword arguments).

    Raises:
        SourceError: an unknown ``kind``, or the reader's own errors.
    """
    reader = READERS.get(kind)
    if reader is None:
        raise _fail(str(path), f"unknown source kind {kind!r}", f"one of {sorted(READERS)}")
    return reader(path, **options)


# ---------------------------------------------------------------- measuring and bucketing
def plain_token_ids(tokenizer_dir: str | os.PathLike) -> list[int]:
    """The ids of the tokenizer in ``tokenizer_dir`` (its ``tokenizer.json``) that are not
    special (added special tokens such as BOS/EOS/UNK left out), ascending: what a
    synthesised prompt (:func:`read_mooncake_trace`) is drawn from.

    Raises:
        ModelError: no loadable ``tokenizer.json``.
    """
    f = Path(tokenizer_dir) / "tokenizer.json"
    try:
        from tokenizers import Tokenizer  # deferred: only needed to synthesise a trace's prompts

        tok = Tokenizer.from_file(str(f))
    except Exception as exc:  # tokenizers raises its own Exception subclasses
        raise ModelError(f"cannot load tokenizer.json: {type(exc).__name__}: {exc}"[:300], where=str(f)) from None
    special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    return sorted(i for i in tok.get_vocab(with_added_tokens=True).values() if i not in special)


def prompt_token_counter(tokenizer_dir: str | os.PathLike,
                         count_text: Callable[[str], int] | None = None) -> Callable[[RequestSpec], int]:
    """A function spec -> prompt length in tokens, as vLLM counts ``usage.prompt_tokens``.

    * completions, a text prompt: the target's tokenizer with its special tokens (e.g. BOS),
      :func:`harness.load.prompts.load_token_counter` (or ``count_text``);
    * completions, token ids: their number (vLLM adds nothing to a token-id prompt);
    * chat: ``transformers``' ``apply_chat_template(messages, add_generation_prompt=True,
      tokenize=True)`` with the target's chat template, loaded on the first chat spec (the
      template's own text is all vLLM adds; it tokenises the rendered prompt without
      special tokens). ``tools``, when the body has them, are passed to the template.

    Raises (from the returned function):
        ModelError: the tokenizer cannot be loaded, or has no chat template for a chat spec.
    """
    text_counter = count_text
    chat_tok: list[Any] = []

    def count(spec: RequestSpec) -> int:
        nonlocal text_counter
        if spec.endpoint == "completions":
            prompt = spec.body["prompt"]
            if isinstance(prompt, list):
                return len(prompt)
            if text_counter is None:
                text_counter = load_token_counter(tokenizer_dir)
            return text_counter(prompt)
        if not chat_tok:
            chat_tok.append(_chat_tokenizer(tokenizer_dir))
        ids = chat_tok[0].apply_chat_template(spec.body["messages"], tools=spec.body.get("tools"),
                                              add_generation_prompt=True, tokenize=True)
        return len(ids["input_ids"] if isinstance(ids, Mapping) else ids)

    return count


def _chat_tokenizer(tokenizer_dir: str | os.PathLike) -> Any:
    try:
        from transformers import AutoTokenizer  # deferred: heavy (about 10 s of imports), only for chat sources

        tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    except Exception as exc:  # transformers raises many types here
        raise ModelError(f"cannot load tokenizer: {type(exc).__name__}: {exc}"[:300], where=str(tokenizer_dir)) from None
    if not getattr(tok, "chat_template", None):
        raise ModelError("the tokenizer has no chat template, so chat requests cannot be measured",
                         where=str(tokenizer_dir), hint="send the source to the completions endpoint")
    return tok


def measure(specs: Sequence[RequestSpec], count: Callable[[RequestSpec], int]) -> list[RequestSpec]:
    """The specs with ``prompt_tokens`` set to ``count(spec)`` where it is not set yet."""
    return [s if s.prompt_tokens is not None else dataclasses.replace(s, prompt_tokens=count(s)) for s in specs]


def check_model_len(specs: Sequence[RequestSpec], max_model_len: int, default_max_tokens: int) -> None:
    """Refuse a request vLLM would refuse: its prompt plus its ``max_tokens`` (a spec without
    one gets ``default_max_tokens``) longer than ``max_model_len`` tokens.

    Raises:
        SourceError: at the first such spec, ``where`` its ``FILE:LINE``.
        ValueError: a spec not measured yet (:func:`measure` first): a bug, not an input error.
    """
    for s in specs:
        if s.prompt_tokens is None:
            raise ValueError(f"{s.origin}: prompt not measured")
        out = s.max_tokens or default_max_tokens
        if s.prompt_tokens + out > max_model_len:
            raise _fail(s.origin, f"prompt of {s.prompt_tokens} tokens plus max_tokens {out} exceeds "
                        f"max_model_len {max_model_len}", "shorten the prompt, lower max_tokens or raise "
                        "stack.max_model_len")


def bucket(specs: Sequence[RequestSpec],
           buckets: Sequence[tuple[str, int, int, int, int, int]]) -> tuple[list[RequestSpec], list[RequestSpec]]:
    """Put each measured spec into the prompt-length bucket whose accepted range holds its
    ``prompt_tokens``.

    Args:
        specs: measured specs (:func:`measure`).
        buckets: ``(name, target_lo, target_hi, accept_lo, accept_hi, count)`` per bucket
            (:meth:`harness.load.config.LoadConfig.bucket_specs`); ranges in tokens,
            inclusive; ``count`` is not used (a source brings its own prompts).

    Returns:
        ``(bucketed, outside)``: the specs with ``prompt_class`` set, in input order; and
        those no bucket holds (``prompt_class`` None), for the caller to refuse or drop.

    Raises:
        ValueError: a spec not measured yet: a bug, not an input error.
    """
    inside: list[RequestSpec] = []
    outside: list[RequestSpec] = []
    for s in specs:
        if s.prompt_tokens is None:
            raise ValueError(f"{s.origin}: prompt not measured")
        name = next((b[0] for b in buckets if b[3] <= s.prompt_tokens <= b[4]), None)
        if name is None:
            outside.append(s)
        else:
            inside.append(dataclasses.replace(s, prompt_class=name))
    return inside, outside


def load_source(kind: str, path: str | os.PathLike, *, tokenizer_dir: str | os.PathLike, max_model_len: int,
                default_max_tokens: int, buckets: Sequence[tuple[str, int, int, int, int, int]],
                count: Callable[[RequestSpec], int] | None = None,
                **options: Any) -> tuple[list[RequestSpec], list[RequestSpec]]:
    """Read, measure, length-check and bucket a source: :func:`read_source`,
    :func:`measure` (``count``, default :func:`prompt_token_counter` of ``tokenizer_dir``),
    :func:`check_model_len`, :func:`bucket`. A Mooncake trace without ``vocab`` draws from
    :func:`plain_token_ids` of ``tokenizer_dir``.

    Returns:
        :func:`bucket`'s ``(bucketed, outside)``.

    Raises:
        SourceError: the first defect, naming ``FILE:LINE``.
        ModelError: the tokenizer cannot be loaded.
    """
    if kind == "mooncake" and "vocab" not in options:
        options["vocab"] = plain_token_ids(tokenizer_dir)
    specs = measure(read_source(kind, path, **options), count or prompt_token_counter(tokenizer_dir))
    check_model_len(specs, max_model_len, default_max_tokens)
    inside, outside = bucket(specs, buckets)
    log.debug("%s: %d requests, %d outside every bucket", path, len(inside) + len(outside), len(outside))
    return inside, outside

"""A fixed, seeded prompt set of mixed lengths, measured with the target model's tokenizer.

Prompts come in length buckets (token counts as the server counts them, i.e. with the
tokenizer's special tokens such as BOS, so ``Prompt.prompt_tokens`` equals vLLM's
``usage.prompt_tokens``). By default three:

* ``"short"``: 16..60 tokens (each prompt draws its own target in that range),
* ``"medium"``: 128 +- 8 tokens,
* ``"long"``: 512 +- 16 tokens;

``load.buckets`` configures any ordered list instead (:class:`harness.load.config.PromptBucket`;
:func:`build_bucketed_prompt_set`), the bucket's name being the prompt's ``prompt_class``.

Text comes from a seeded word generator (plain English words in sentences), so the same
seed and tokenizer give the same prompt set byte for byte. Ids are ``0..n-1``: bucket by
bucket, in bucket order (shorts first, then mediums, then longs by default).

A traffic source (``load.source``, :mod:`harness.load.sources`) becomes a prompt set too
(:func:`harness.load.source_prep.source_prompts`): one prompt per source request, ids
``0..n-1`` in the source's order, ``prompt_class`` its measured bucket, carrying the
request's ``endpoint``, ``body`` (sent as the source gave it), ``origin`` (``FILE:LINE``)
and, for a timed trace, ``arrival_s``.

The set is saved as ``OUT/prompts.json``::

    {"format": "specchaos-prompts/1", "prompts": [{"prompt_id", "prompt_class", "text",
     "prompt_tokens", "max_tokens"[, "endpoint", "body", "origin", "arrival_s"]}, ...]}

(the bracketed fields only for a source's prompts).
"""

from __future__ import annotations

import json
import logging
import os
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from harness.errors import LoadError, ModelError
from harness.load.config import DEFAULT_BUCKETS

log = logging.getLogger(__name__)

FORMAT = "specchaos-prompts/1"

#: The default buckets' names, in order.
PROMPT_CLASSES = tuple(DEFAULT_BUCKETS)

#: (lowest target, highest target, accepted min, accepted max) tokens per default bucket.
CLASS_BOUNDS: dict[str, tuple[int, int, int, int]] = DEFAULT_BUCKETS

_WORDS = (
    "the of and to in is was that for it with as on be at by this had not are but from or "
    "have an they which one you were her all she there would their we him been has when who "
    "will more no if out so said what up its about into than them can only other new some "
    "could time these two may then do first any my now such like our over man me even most "
    "made after also did many before must through back years where much your way well down "
    "should because each just those people how too little state good very make world still "
    "own see men work long get here between both life being under never day same another know "
    "while last might us great old year off come since against go came right used take three "
    "house river garden light water stone city road morning evening winter summer market "
    "window table letter story music paper voice field forest mountain island bridge tower "
    "station engine signal number measure answer question reason result system process "
    "request server token stream model draft target cache memory latency network fault "
    "recovery baseline phase quiet bright heavy simple careful early late small large open "
    "close slowly quickly together always often sometimes again almost already"
).split()


@dataclass(frozen=True)
class Prompt:
    """One prompt of the set.

    Fields:
        prompt_id: index in the set, ``0..n-1``.
        prompt_class: the prompt's length bucket, e.g. ``"short"``, ``"medium"`` or
            ``"long"`` (see module doc).
        text: the prompt text sent as the completion ``prompt``.
        prompt_tokens: its length in tokens with the target's tokenizer (special tokens
            included, as vLLM counts ``usage.prompt_tokens``).
        max_tokens: ``max_tokens`` to ask for (a source body's own ``max_tokens`` or
            ``max_completion_tokens`` wins).
        endpoint: ``"completions"`` or ``"chat"`` (:data:`harness.load.endpoints.ENDPOINTS`).
        body: a traffic source's request body (without the harness's ``model``, ``stream``,
            ``stream_options``), sent with the source's fields winning over the harness's
            defaults (:func:`harness.load.client.completion_body`); None for a generated
            prompt, whose ``text`` is the completions ``prompt``.
        origin: a source's request: ``"FILE:LINE"`` it came from; None otherwise.
        arrival_s: a timed source's request: seconds after the replay's start at which it
            is sent (already divided by ``load.source.speedup``); None otherwise.
        category: a source's request: its content category (``load.source.category_field``),
            the request class its records carry; None otherwise.
    """

    prompt_id: int
    prompt_class: str
    text: str
    prompt_tokens: int
    max_tokens: int
    endpoint: str = "completions"
    body: dict[str, Any] | None = field(default=None, compare=False)
    origin: str | None = None
    arrival_s: float | None = None
    category: str | None = None

    @property
    def deterministic(self) -> bool:
        """Whether the output is fixed by the request (so a reference can predict it): a
        generated prompt, or a source body that leaves ``temperature`` to the harness's
        sampling class or sets it to 0."""
        return self.body is None or self.body.get("temperature", 0) == 0


def _words(rng: random.Random, n: int) -> list[str]:
    """``n`` words in sentences of 5..14 words: capitalised first word, final full stop."""
    out: list[str] = []
    while len(out) < n:
        sentence = [rng.choice(_WORDS) for _ in range(rng.randint(5, 14))]
        sentence[0] = sentence[0].capitalize()
        sentence[-1] += "."
        out.extend(sentence)
    return out[:n]


def load_token_counter(tokenizer_dir: str | os.PathLike) -> Callable[[str], int]:
    """A function text -> token count using the tokenizer in ``tokenizer_dir``, counting the
    special tokens it adds (e.g. BOS), so counts match ``usage.prompt_tokens``.

    A fast tokenizer's ``tokenizer.json`` is read with the ``tokenizers`` library, the one
    behind transformers' fast tokenizers (what vLLM loads): the same ids, post-processor
    included, without importing transformers (about 10 s of imports on these 2-core hosts,
    paid by every run). Without a ``tokenizer.json`` (a slow, SentencePiece-only tokenizer),
    ``transformers.AutoTokenizer``.

    Raises:
        ModelError: the directory has no loadable tokenizer.
    """
    d = Path(tokenizer_dir)
    if not d.is_dir():
        raise ModelError("tokenizer directory does not exist", where=str(d),
                         hint="build the tiny models first (models/manifest.json)")
    if (d / "tokenizer.json").is_file():
        try:
            from tokenizers import Tokenizer  # deferred: only needed to build a prompt set

            fast = Tokenizer.from_file(str(d / "tokenizer.json"))
        except Exception as exc:  # tokenizers raises its own Exception subclasses
            raise ModelError(f"cannot load tokenizer.json: {type(exc).__name__}: {exc}"[:300], where=str(d),
                             hint="the file must be a tokenizers (Hugging Face) tokenizer") from None

        def count_fast(text: str) -> int:
            return len(fast.encode(text, add_special_tokens=True).ids)

        return count_fast
    try:
        from transformers import AutoTokenizer  # deferred: heavy, only for tokenizers without tokenizer.json

        tok = AutoTokenizer.from_pretrained(str(d))
    except Exception as exc:  # transformers raises many types here
        raise ModelError(f"cannot load tokenizer: {type(exc).__name__}: {exc}"[:300], where=str(d),
                         hint="the directory needs tokenizer.json / tokenizer_config.json") from None

    def count(text: str) -> int:
        return len(tok(text, add_special_tokens=True)["input_ids"])

    return count


def load_decoder(tokenizer_dir: str | os.PathLike) -> Callable[[Sequence[int]], str]:
    """A function token ids -> text with the tokenizer in ``tokenizer_dir``, special tokens
    skipped: the text vLLM streams for those ids (vLLM v1 detokenizes a fast tokenizer with
    ``tokenizers``' own decoder, no clean-up of spaces). ``tokenizer.json`` through the
    ``tokenizers`` library; without one, ``transformers.AutoTokenizer`` (clean-up off).

    Raises:
        ModelError: the directory has no loadable tokenizer.
    """
    d = Path(tokenizer_dir)
    if (d / "tokenizer.json").is_file():
        try:
            from tokenizers import Tokenizer  # deferred: only needed to judge text against token ids

            fast = Tokenizer.from_file(str(d / "tokenizer.json"))
        except Exception as exc:  # tokenizers raises its own Exception subclasses
            raise ModelError(f"cannot load tokenizer.json: {type(exc).__name__}: {exc}"[:300], where=str(d)) from None
        return lambda ids: fast.decode(list(ids), skip_special_tokens=True)
    try:
        from transformers import AutoTokenizer  # deferred: heavy, only for tokenizers without tokenizer.json

        tok = AutoTokenizer.from_pretrained(str(d))
    except Exception as exc:  # transformers raises many types here
        raise ModelError(f"cannot load tokenizer: {type(exc).__name__}: {exc}"[:300], where=str(d)) from None
    return lambda ids: tok.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)


def _fit(rng: random.Random, count: Callable[[str], int], target: int, lo: int, hi: int) -> tuple[str, int]:
    """Text whose token count is as close to ``target`` as whole words allow, within [lo, hi]."""
    n = max(8, target)  # words >= tokens - special tokens for any sane tokenizer; grow if not
    words = _words(rng, n)
    while count(" ".join(words)) < target:
        words += _words(rng, n)
        n *= 2
        if n > 64 * max(target, 1):
            raise LoadError(f"cannot reach {target} prompt tokens", where="harness.load.prompts",
                            hint="the tokenizer counts far fewer tokens than words")
    # Largest prefix k with count <= target (token count is non-decreasing in k).
    a, b = 1, len(words)
    while a < b:
        m = (a + b + 1) // 2
        if count(" ".join(words[:m])) <= target:
            a = m
        else:
            b = m - 1
    best: tuple[int, str, int] | None = None
    for k in (a, a + 1):
        if 1 <= k <= len(words):
            text = " ".join(words[:k])
            c = count(text)
            if lo <= c <= hi and (best is None or abs(c - target) < best[0]):
                best = (abs(c - target), text, c)
    if best is None:
        raise LoadError(f"no prompt within {lo}..{hi} tokens (target {target})", where="harness.load.prompts",
                        hint="the tokenizer splits words into too many tokens for these bounds")
    return best[1], best[2]


def build_prompt_set(
    tokenizer_dir: str | os.PathLike,
    *,
    seed: int,
    short: int,
    medium: int,
    long: int,
    max_tokens: int,
    count_tokens: Callable[[str], int] | None = None,
) -> list[Prompt]:
    """Build the seeded prompt set of the three default buckets (see module doc).

    Args:
        tokenizer_dir: the target model directory (its tokenizer measures lengths).
        seed: the same seed and tokenizer give the same set.
        short, medium, long: how many prompts of each bucket.
        max_tokens: ``max_tokens`` of every prompt.
        count_tokens: optional text -> token count to use instead of loading
            ``tokenizer_dir`` (tests).

    Returns:
        ``short + medium + long`` prompts with ids ``0..n-1`` in bucket order.

    Raises:
        ModelError: no tokenizer in ``tokenizer_dir``.
        LoadError: a negative count, or the tokenizer cannot produce a bucket's length.
    """
    counts = {"short": short, "medium": medium, "long": long}
    buckets = [(name, *CLASS_BOUNDS[name], counts[name]) for name in PROMPT_CLASSES]
    return build_bucketed_prompt_set(tokenizer_dir, buckets, seed=seed, max_tokens=max_tokens,
                                     count_tokens=count_tokens)


def build_bucketed_prompt_set(
    tokenizer_dir: str | os.PathLike,
    buckets: Sequence[tuple[str, int, int, int, int, int]],
    *,
    seed: int,
    max_tokens: int,
    count_tokens: Callable[[str], int] | None = None,
    max_tokens_by_bucket: Mapping[str, int] | None = None,
) -> list[Prompt]:
    """Build a seeded prompt set bucket by bucket.

    Args:
        tokenizer_dir: the target model directory (its tokenizer measures lengths).
        buckets: ``(name, target_lo, target_hi, accept_lo, accept_hi, count)`` per bucket, in
            order (:meth:`harness.load.config.LoadConfig.bucket_specs`): ``count`` prompts,
            each aiming at a length drawn uniformly in ``[target_lo, target_hi]`` tokens and
            accepted within ``[accept_lo, accept_hi]``.
        seed: the same seed, buckets and tokenizer give the same set.
        max_tokens: ``max_tokens`` of every prompt whose bucket has none in
            ``max_tokens_by_bucket``.
        count_tokens: optional text -> token count instead of loading ``tokenizer_dir``.
        max_tokens_by_bucket: ``max_tokens`` per bucket name
            (:meth:`harness.load.config.LoadConfig.bucket_max_tokens`); it draws nothing, so
            the texts are the same with or without it.

    Returns:
        The prompts, ids ``0..n-1`` in bucket order, ``prompt_class`` = the bucket's name.

    Raises:
        ModelError: no tokenizer in ``tokenizer_dir``.
        LoadError: a negative count, or the tokenizer cannot produce a bucket's length.
    """
    if any(b[5] < 0 for b in buckets) or max_tokens < 1:
        raise LoadError("prompt counts must be >= 0 and max_tokens >= 1", where="harness.load.prompts")
    count = count_tokens or load_token_counter(tokenizer_dir)
    rng = random.Random(seed)
    prompts: list[Prompt] = []
    per_bucket = dict(max_tokens_by_bucket or {})
    if any(v < 1 for v in per_bucket.values()):
        raise LoadError("max_tokens of every bucket must be >= 1", where="harness.load.prompts")
    for name, t_lo, t_hi, lo, hi, n in buckets:
        for _ in range(n):
            target = rng.randint(t_lo, t_hi)
            text, tokens = _fit(rng, count, target, lo, hi)
            prompts.append(Prompt(len(prompts), name, text, tokens, per_bucket.get(name, max_tokens)))
    log.debug("built %d prompts (seed %d)", len(prompts), seed)
    return prompts


def save_prompt_set(path: str | os.PathLike, prompts: Sequence[Prompt]) -> None:
    """Write the set as JSON (see module doc), replacing ``path``."""
    data = {"format": FORMAT, "prompts": [_saved(p) for p in prompts]}
    Path(path).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


#: The fields every saved prompt has; the others only when a source's prompt sets them.
_BASE_FIELDS = ("prompt_id", "prompt_class", "text", "prompt_tokens", "max_tokens")


def _saved(p: Prompt) -> dict[str, Any]:
    d = asdict(p)
    if p.body is None:
        return {k: d[k] for k in _BASE_FIELDS}
    return {k: v for k, v in d.items() if k in _BASE_FIELDS or v is not None}


def load_prompt_set(path: str | os.PathLike) -> list[Prompt]:
    """Read a set written by :func:`save_prompt_set`.

    Raises:
        LoadError: missing file, not JSON, wrong format, or a malformed prompt.
    """
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LoadError(f"cannot read prompt set: {exc}", where=str(p)) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("prompts"), list):
        raise LoadError(f"not a prompt set (expected format {FORMAT!r})", where=str(p))
    out: list[Prompt] = []
    for i, item in enumerate(data["prompts"]):
        try:
            prompt = Prompt(
                prompt_id=int(item["prompt_id"]),
                prompt_class=str(item["prompt_class"]),
                text=str(item["text"]),
                prompt_tokens=int(item["prompt_tokens"]),
                max_tokens=int(item["max_tokens"]),
                endpoint=str(item.get("endpoint", "completions")),
                body=item.get("body"),
                origin=item.get("origin"),
                arrival_s=None if item.get("arrival_s") is None else float(item["arrival_s"]),
                category=item.get("category"),
            )
            if prompt.body is not None and not isinstance(prompt.body, dict):
                raise TypeError("body is not an object")
        except (KeyError, TypeError, ValueError) as exc:
            raise LoadError(f"malformed prompt: {exc!r}", where=f"{p}: prompts[{i}]") from None
        if not prompt.prompt_class:
            raise LoadError("empty prompt_class", where=f"{p}: prompts[{i}]")
        out.append(prompt)
    return out

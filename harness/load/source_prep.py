"""Prepare ``load.source`` before anything starts: read the file, measure each prompt with
the target's tokenizer, check it against ``max_model_len`` and bucket it by measured length
into the prompt-length buckets (:mod:`harness.load.sources` does each step; this module
resolves the path and the options from the config).

Called by ``specchaos validate`` and by the run's pre-flight (:func:`prepare_source`), so a
bad source is one line naming ``FILE:LINE`` (exit 2) and nothing is started. The run then
sends the prepared requests as its prompt set (:func:`source_prompts`, saved as
``prompts.json`` for the locust process).
"""

from __future__ import annotations

import random
from pathlib import Path

from harness.errors import SourceError
from harness.load.config import LoadConfig
from harness.load.prompts import Prompt
from harness.load.sources import RequestSpec, load_source

__all__ = ["bucket_table", "prepare_source", "source_path", "source_prompts"]


def source_path(load: LoadConfig, base_dir: str | Path) -> Path:
    """``load.source.path`` made absolute: relative paths are taken from ``base_dir`` (the
    working directory at validate and run, as ``stack.models_dir``: plain ``chaos run`` does
    not tell the control where the experiment file is, so one rule serves both entry
    points). Raises nothing; a missing file is the reader's SourceError."""
    assert load.source is not None
    p = Path(load.source.path)
    return p if p.is_absolute() else Path(base_dir) / p


def prepare_source(load: LoadConfig, base_dir: str | Path, *, tokenizer_dir: str | Path,
                   max_model_len: int) -> list[RequestSpec]:
    """The source's requests, measured (``prompt_tokens``, tokens of the target's tokenizer)
    and bucketed (``prompt_class``), in file order or shuffled (seeded by ``load.seed``), at
    most ``load.source.limit`` of them.

    Raises:
        SourceError: the first defect, naming ``FILE:LINE`` (missing or empty file, not
            JSON, missing fields, prompt plus output longer than ``max_model_len``), or a
            prompt that no bucket holds (hint: widen ``load.buckets``).
        ModelError: the target's tokenizer cannot be loaded.
    """
    src = load.source
    assert src is not None
    path = source_path(load, base_dir)
    options: dict = {}
    if src.format != "mooncake":
        options["category_field"] = src.category_field
    if src.format in ("sharegpt", "vllm-custom"):
        options["max_tokens"] = src.max_tokens
    if src.format == "vllm-custom":
        options["chat"] = src.chat
    if src.format == "mooncake":
        options.update(speedup=src.speedup, seed=load.seed)
    inside, outside = load_source(src.format, path, tokenizer_dir=tokenizer_dir, max_model_len=max_model_len,
                                  default_max_tokens=src.max_tokens or load.max_tokens,
                                  buckets=load.bucket_specs(), **options)
    if outside:
        s = outside[0]
        ranges = ", ".join(f"{b[0]} {b[3]}-{b[4]}" for b in load.bucket_specs())
        raise SourceError(f"prompt of {s.prompt_tokens} tokens is in no prompt-length bucket ({ranges}); "
                          f"{len(outside)} such prompts", where=s.origin,
                          hint="widen load.buckets to cover the source's prompt lengths, or leave load.buckets "
                               "out: a source is then bucketed by power-of-two ranges that cover every length",
                          details=[f"{o.origin}: {o.prompt_tokens} tokens" for o in outside[:20]]
                          + ([f"and {len(outside) - 20} more"] if len(outside) > 20 else []))
    if src.order == "shuffled":
        random.Random(load.seed).shuffle(inside)
    return inside[:src.limit] if src.limit else inside


def bucket_table(specs: list[RequestSpec], load: LoadConfig) -> list[tuple[str, int, int, int, int, int]]:
    """The buckets a prepared source fell into, for ``specchaos validate`` to print: per
    bucket that holds any prompt, in bucket order, ``(name, lo, hi, prompts, shortest,
    longest)`` (tokens; ``lo``/``hi`` the bucket's range, ``shortest``/``longest`` the
    measured prompts')."""
    lengths: dict[str, list[int]] = {}
    for s in specs:
        if s.prompt_class is not None and s.prompt_tokens is not None:
            lengths.setdefault(s.prompt_class, []).append(s.prompt_tokens)
    return [(name, lo, hi, len(lengths[name]), min(lengths[name]), max(lengths[name]))
            for name, _tlo, _thi, lo, hi, _n in load.bucket_specs() if name in lengths]


def source_prompts(specs: list[RequestSpec], load: LoadConfig) -> list[Prompt]:
    """The prepared requests (:func:`prepare_source`) as the run's prompt set: prompt ``i``
    is request ``i`` (ids in the source's order), its bucket, measured length, endpoint,
    body, ``FILE:LINE`` origin, arrival time and category carried over; ``text`` the completions
    prompt when it is text (else ``""``: the body holds token ids or messages);
    ``max_tokens`` the request's own, else ``load.source.max_tokens``, else
    ``load.max_tokens``.

    Raises:
        ValueError: a spec not measured or bucketed (:func:`prepare_source` does both): a bug.
    """
    assert load.source is not None
    default = load.source.max_tokens or load.max_tokens
    out: list[Prompt] = []
    for i, s in enumerate(specs):
        if s.prompt_tokens is None or s.prompt_class is None:
            raise ValueError(f"{s.origin}: not measured and bucketed")
        prompt = s.body.get("prompt")
        out.append(Prompt(i, s.prompt_class, prompt if isinstance(prompt, str) else "", s.prompt_tokens,
                          s.max_tokens or default, endpoint=s.endpoint, body=dict(s.body), origin=s.origin,
                          arrival_s=s.arrival_s, category=s.category))
    return out

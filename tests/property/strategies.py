"""Hypothesis strategies for completion requests.

Prompts mix three kinds of text: words of the tiny models' training list (what the
models produce and most stop strings will match), arbitrary unicode (any category but
surrogates, so non-BMP characters, combining marks, controls, quotes and backslashes
all occur), and explicit non-BMP / combining-mark runs; long prompts repeat words up to
the server's context. Lengths are bounded by the caller's ``max_model_len`` through
:func:`fits` (the tokenizer decides, as vLLM counts).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from harness.stack.models import WORDS

#: Most output tokens a request asks for (keeps each request well under a second).
MAX_TOKENS = 64

words = st.sampled_from(WORDS)
non_bmp = st.characters(min_codepoint=0x10000, max_codepoint=0x10FFFF, exclude_categories=("Cs", "Cn"))
combining = st.characters(categories=("Mn", "Mc", "Me"))
unicode_run = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=12)
marked = st.builds(lambda base, marks: base + "".join(marks), st.characters(categories=("L",)),
                   st.lists(combining, min_size=1, max_size=3))

piece = st.one_of(words.map(lambda w: w + " "), unicode_run, st.text(non_bmp, min_size=1, max_size=4), marked)
short_prompts = st.lists(piece, min_size=1, max_size=12).map("".join).filter(lambda s: s.strip())
long_prompts = st.builds(lambda ws, tail: " ".join(ws) + tail,
                         st.lists(words, min_size=150, max_size=700), st.text(max_size=8))
prompts = st.one_of(short_prompts, short_prompts, short_prompts, long_prompts)

#: Stop strings that rarely occur (random unicode) — a stop string that never matches
#: must change nothing.
random_stops = st.lists(st.text(min_size=1, max_size=4), min_size=1, max_size=3)


@st.composite
def requests(draw: st.DrawFn, *, stop: bool = True, stream: bool | None = None, long: bool = True) -> dict[str, Any]:
    """A greedy completion body without ``model`` (the caller adds the served name):
    ``prompt``, ``max_tokens`` (1..:data:`MAX_TOKENS`), ``temperature`` 0,
    ``return_token_ids``, maybe ``logprobs`` (0..5), ``stop`` (random strings, when
    ``stop``), ``ignore_eos``, ``stream`` (drawn unless given) with or without
    ``stream_options.include_usage``; ``long=False``: short prompts only (they always
    fit the context)."""
    body: dict[str, Any] = {
        "prompt": draw(prompts if long else short_prompts),
        "max_tokens": draw(st.integers(1, MAX_TOKENS)),
        "temperature": 0,
        "return_token_ids": True,
    }
    if draw(st.booleans()):
        body["logprobs"] = draw(st.integers(0, 5))
    if stop and draw(st.booleans()):
        body["stop"] = draw(random_stops)
    if draw(st.booleans()):
        body["ignore_eos"] = True
    streamed = draw(st.booleans()) if stream is None else stream
    if streamed:
        body["stream"] = True
        if draw(st.booleans()):
            body["stream_options"] = {"include_usage": True}
    return body


def stops_from(draw: st.DrawFn, text: str) -> list[str]:
    """One to three stop strings, at least one a substring (1..6 chars) of ``text`` (so it
    is met), the others maybe random; ``text`` must be non-empty."""
    start = draw(st.integers(0, len(text) - 1))
    size = draw(st.integers(1, min(6, len(text) - start)))
    stops = [text[start:start + size]]
    if draw(st.booleans()):
        stops += draw(st.lists(st.one_of(st.text(min_size=1, max_size=3), words), max_size=2))
    return draw(st.permutations(stops))

"""Semantic rewrites of one streamed completion's SSE events: the ``corrupt`` toxic's modes
that change what an event *means* (:mod:`faults.toxics`), each aimed at one request-class
invariant of :mod:`harness.checks.request_classes`.

The proxy sees only the response stream, so each rewrite keys on what the events carry:

================== ============================================================ ==============
mode               what changes                                                 breaks
================== ============================================================ ==============
append_after_stop  the finish event of a response ended by a stop string        ``stop``
                   (``finish_reason "stop"``, ``stop_reason`` a string): the
                   stop string and :data:`OVERRUN` are appended to its text, so
                   the text runs on past where the server stopped
drop_token_text    the ``k``-th event carrying token ids and text (``k`` drawn  ``text``
                   per response): its last token's text is removed (the text
                   from its last space on; all of it when it has one token id
                   or no space after its first character); ids, logprobs and
                   usage are left alone
break_json         the first event with text (not only whitespace) of a         ``structured``
                   response, when that text starts with ``{`` or ``[``:
                   :data:`STRAY` is inserted after that bracket, so the output
                   no longer parses
zero_logprobs      every event with logprobs: each chosen token's logprob (and  ``logprobs``
                   every ``top_logprobs`` value) set to 0.0
================== ============================================================ ==============

"Text" is a completions chunk's ``choices[0].text`` or a chat chunk's
``choices[0].delta.content`` (tool-call arguments are never touched); logprobs are
completions' ``logprobs.token_logprobs``/``top_logprobs`` or chat's
``logprobs.content[i].logprob``/``top_logprobs[j].logprob``. Token ids, ``usage`` and
``finish_reason`` are never changed, so the client's token counts (``usage``,
``integrity.malformed``) still agree. An event a mode does not change is returned as the
same bytes; a changed one is re-serialised (compact JSON, UTF-8). Every function here is
pure over bytes; :class:`ResponseRewrite` holds the one response's state a mode needs.
"""

from __future__ import annotations

import json
import random
from typing import Any

__all__ = ["MODES", "OVERRUN", "STRAY", "ResponseRewrite", "append_after_stop", "drop_token_text",
           "break_json", "zero_logprobs", "parse_event", "text_of"]

MODES = ("append_after_stop", "drop_token_text", "break_json", "zero_logprobs")
#: What ``append_after_stop`` writes after the stop string (the text a server that did not
#: stop would have sent on).
OVERRUN = " [specchaos: text after the stop]"
#: What ``break_json`` inserts after the output's opening bracket.
STRAY = "#"


def parse_event(event: bytes) -> tuple[list[str], int, dict[str, Any]] | None:
    """``(lines, index of the data line, payload)`` of an SSE event whose data is a JSON
    object, else None (``[DONE]``, a comment, non-JSON data)."""
    lines = event.decode("utf-8", "replace").split("\n")
    for i, line in enumerate(lines):
        if line.startswith("data:"):
            try:
                payload = json.loads(line[5:].strip())
            except ValueError:
                return None
            return (lines, i, payload) if isinstance(payload, dict) else None
    return None


def _dump(lines: list[str], i: int, payload: dict[str, Any]) -> bytes:
    lines = list(lines)
    lines[i] = "data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return "\n".join(lines).encode()


def _choice(payload: dict[str, Any]) -> dict[str, Any] | None:
    choices = payload.get("choices")
    c0 = choices[0] if isinstance(choices, list) and choices else None
    return c0 if isinstance(c0, dict) else None


def text_of(choice: dict[str, Any]) -> str | None:
    """The text of a choice: chat ``delta.content``, completions ``text`` (None: none)."""
    if isinstance(choice.get("delta"), dict):
        t = choice["delta"].get("content")
    else:
        t = choice.get("text")
    return t if isinstance(t, str) else None


def _set_text(choice: dict[str, Any], text: str) -> None:
    if isinstance(choice.get("delta"), dict):
        choice["delta"]["content"] = text
    else:
        choice["text"] = text


def append_after_stop(event: bytes) -> bytes | None:
    """The event with the stop string and :data:`OVERRUN` appended to its text when it is
    the finish event of a stop-string finish (``finish_reason "stop"``, ``stop_reason`` a
    non-empty string); None otherwise (nothing to change)."""
    parsed = parse_event(event)
    c0 = None if parsed is None else _choice(parsed[2])
    if c0 is None or c0.get("finish_reason") != "stop":
        return None
    stop = c0.get("stop_reason")
    if not isinstance(stop, str) or not stop:
        return None
    _set_text(c0, (text_of(c0) or "") + stop + OVERRUN)
    return _dump(parsed[0], parsed[1], parsed[2])        # type: ignore[index]


def carries_token_text(event: bytes) -> bool:
    """Whether the event's choice carries token ids and non-empty text (what
    ``drop_token_text`` counts)."""
    parsed = parse_event(event)
    c0 = None if parsed is None else _choice(parsed[2])
    return c0 is not None and bool(c0.get("token_ids")) and bool(text_of(c0))


def drop_token_text(event: bytes) -> bytes | None:
    """The event with its last token's text removed (module doc), token ids and logprobs
    unchanged; None when it carries no token ids or no text."""
    parsed = parse_event(event)
    c0 = None if parsed is None else _choice(parsed[2])
    if c0 is None or not c0.get("token_ids") or not text_of(c0):
        return None
    text = text_of(c0) or ""
    cut = text.rfind(" ") if len(c0["token_ids"]) > 1 else 0
    _set_text(c0, text[:max(cut, 0)])
    return _dump(parsed[0], parsed[1], parsed[2])        # type: ignore[index]


def break_json(event: bytes) -> bytes | None:
    """The event with :data:`STRAY` inserted after the opening ``{`` or ``[`` of its text
    (leading whitespace kept); None when its text (stripped) does not start with one."""
    parsed = parse_event(event)
    c0 = None if parsed is None else _choice(parsed[2])
    text = None if c0 is None else text_of(c0)
    if not text or text.lstrip()[:1] not in ("{", "["):
        return None
    at = len(text) - len(text.lstrip()) + 1
    _set_text(c0, text[:at] + STRAY + text[at:])          # type: ignore[arg-type]
    return _dump(parsed[0], parsed[1], parsed[2])        # type: ignore[index]


def zero_logprobs(event: bytes) -> bytes | None:
    """The event with every logprob of its choice set to 0.0 (module doc); None when it
    carries no logprob, or every one is already 0."""
    parsed = parse_event(event)
    c0 = None if parsed is None else _choice(parsed[2])
    lp = None if c0 is None else c0.get("logprobs")
    if not isinstance(lp, dict):
        return None
    changed = False

    def zero(v: Any) -> Any:
        nonlocal changed
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v != 0:
            changed = True
            return 0.0
        return v

    if isinstance(lp.get("token_logprobs"), list):
        lp["token_logprobs"] = [zero(v) for v in lp["token_logprobs"]]
    if isinstance(lp.get("top_logprobs"), list):
        lp["top_logprobs"] = [{k: zero(v) for k, v in pos.items()} if isinstance(pos, dict) else pos
                              for pos in lp["top_logprobs"]]
    for entry in lp.get("content") or []:
        if isinstance(entry, dict):
            entry["logprob"] = zero(entry.get("logprob"))
            for top in entry.get("top_logprobs") or []:
                if isinstance(top, dict):
                    top["logprob"] = zero(top.get("logprob"))
    return _dump(parsed[0], parsed[1], parsed[2]) if changed else None    # type: ignore[index]


class ResponseRewrite:
    """One mode over one response's events in order: :meth:`event` returns the rewritten
    event, or None when it leaves the event alone. ``drop_token_text`` acts on the ``k``-th
    event carrying token text, ``k`` drawn from ``rng`` in [0, ``max_event``] at the
    response's start (a response with fewer such events is left alone); ``break_json`` only
    looks at the response's first event with text that is not only whitespace; the other
    two act wherever they apply."""

    def __init__(self, mode: str, rng: random.Random, max_event: int):
        if mode not in MODES:
            raise ValueError(f"unknown rewrite mode {mode!r} (known: {', '.join(MODES)})")
        self.mode = mode
        self._k = rng.randint(0, max_event) if mode == "drop_token_text" else 0
        self._seen = 0              # events counted (drop_token_text: with token text; break_json: with text)

    def event(self, event: bytes) -> bytes | None:
        if self.mode == "append_after_stop":
            return append_after_stop(event)
        if self.mode == "zero_logprobs":
            return zero_logprobs(event)
        if self.mode == "drop_token_text":
            if not carries_token_text(event):
                return None
            self._seen += 1
            return drop_token_text(event) if self._seen - 1 == self._k else None
        parsed = parse_event(event)                       # break_json
        c0 = None if parsed is None else _choice(parsed[2])
        if c0 is None or not (text_of(c0) or "").strip() or self._seen:
            return None
        self._seen = 1
        return break_json(event)

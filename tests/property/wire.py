"""One completion request, recorded whole: what the property tests send and judge.

:func:`send` posts one ``/v1/completions`` body (OpenAI completions API as vLLM serves it)
to a loopback server, streamed or not, and returns a :class:`Completion` with everything
the invariants (:mod:`tests.property.invariants`) need: text, token ids (vLLM's
``return_token_ids`` extension), finish and stop reason, usage, logprobs, and for a stream
every chunk in order. Streams are parsed with ``httpx-sse`` as the harness's client does
(:mod:`harness.load.client`); the harness's client itself only sends its fixed load body
(no stop strings, no logprobs, always streamed), so the property tests send their own.

:func:`curl_line` prints a request as a shell command that replays it exactly.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any

import httpx
from httpx_sse import EventSource
from hypothesis import currently_in_test_context, note

from harness.load.client import COMPLETIONS_PATH, check_loopback_url, error_message


@dataclass
class Completion:
    """One exchange, as received. Chunk texts and token ids are concatenated in order.

    Fields:
        url: the URL posted to; body: the JSON body sent.
        status: HTTP status; error: the server's error message (HTTP error body or an
            in-stream error event), else None.
        text: the completion text (streamed: every chunk's ``text`` joined).
        token_ids: output token ids (``choices[0].token_ids``; streamed: joined), None
            when the server sent none.
        prompt_token_ids: the prompt's token ids as the server tokenised it, or None.
        finish_reason, stop_reason: as sent (``stop_reason``: the stop string, a stop
            token id, or None).
        usage: the ``usage`` object (streamed: the one usage event), or None.
        logprobs: ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`` (lists,
            streamed: joined), or None when none were sent.
        chunks: streamed only: ``[{"text", "token_ids", "finish_reason"}]`` per event
            carrying a choice; empty for a non-streamed request.
        usage_events: streamed only: indexes (0-based, among the JSON events) of events
            carrying ``usage``; events: number of JSON events; done: ``data: [DONE]``
            seen (always True for a non-streamed request answered 200).
    """

    url: str
    body: dict[str, Any]
    status: int = 0
    error: str | None = None
    text: str = ""
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    usage: dict[str, Any] | None = None
    logprobs: dict[str, list] | None = None
    chunks: list[dict[str, Any]] = field(default_factory=list)
    usage_events: list[int] = field(default_factory=list)
    events: int = 0
    done: bool = False

    @property
    def streamed(self) -> bool:
        return bool(self.body.get("stream"))

    def curl(self) -> str:
        """This request as a replayable ``curl`` command (see :func:`curl_line`)."""
        return curl_line(self.url, self.body)


def curl_line(url: str, body: dict[str, Any]) -> str:
    """A shell command that replays ``POST url`` with JSON ``body`` exactly.

    ``curl -sN -X POST URL -H 'Content-Type: application/json' -d BODY``: the body is
    ``json.dumps`` with ASCII escapes (so every prompt, whatever its characters, survives a
    terminal's copy and paste), each argument quoted with :func:`shlex.quote`. ``-N``
    shows a stream as it arrives.
    """
    data = json.dumps(body, ensure_ascii=True, separators=(",", ":"))
    return " ".join(["curl", "-sN", "-X", "POST", shlex.quote(url), "-H",
                     shlex.quote("Content-Type: application/json"), "-d", shlex.quote(data)])


def expect(problems: list[str], *sent: Completion) -> None:
    """Assert that there are no ``problems``; the failure lists each of them and a replay
    line per request in ``sent`` (inside a hypothesis test the lines are also noted, so
    they are printed with the falsifying example).

    Raises:
        AssertionError: ``problems`` is not empty.
    """
    replay = [f"# {c.url}\n{c.curl()}" for c in sent]
    if currently_in_test_context():
        for line in replay:
            note(line)
    assert not problems, "\n".join(problems) + "\nreplay:\n" + "\n".join(replay)


def send(client: httpx.Client, base_url: str, body: dict[str, Any], *, timeout_s: float = 120.0) -> Completion:
    """POST ``body`` to ``base_url`` + ``/v1/completions`` and record the answer.

    Args:
        client: an ``httpx.Client`` (``trust_env=False``: loopback traffic, no proxy).
        base_url: e.g. ``"http://127.0.0.1:8000"``; loopback only.
        body: the JSON body; ``body["stream"]`` decides how the answer is read.
        timeout_s: per read, seconds.

    Returns:
        The :class:`Completion`. HTTP errors and in-stream errors are recorded in
        ``status``/``error``, never raised.

    Raises:
        LoadError: ``base_url`` is not a loopback http(s) URL.
        httpx.HTTPError: a transport failure (connection refused, timeout).
    """
    check_loopback_url(base_url)
    c = Completion(url=base_url.rstrip("/") + COMPLETIONS_PATH, body=body)
    if not body.get("stream"):
        r = client.post(c.url, json=body, timeout=timeout_s)
        c.status = r.status_code
        payload = _json(r.text)
        if r.status_code != 200:
            c.error = error_message(payload) or r.text[:300]
            return c
        c.done, c.events = True, 1
        choice = (payload.get("choices") or [{}])[0]
        c.text = choice.get("text") or ""
        c.token_ids = choice.get("token_ids")
        c.prompt_token_ids = choice.get("prompt_token_ids")
        c.finish_reason, c.stop_reason = choice.get("finish_reason"), choice.get("stop_reason")
        c.usage = payload.get("usage")
        c.logprobs = _logprobs(choice.get("logprobs"), None)
        return c
    with client.stream("POST", c.url, json=body, timeout=timeout_s,
                       headers={"Accept": "text/event-stream"}) as r:
        c.status = r.status_code
        if r.status_code != 200:
            r.read()
            c.error = error_message(_json(r.text)) or r.text[:300]
            return c
        texts: list[str] = []
        for event in EventSource(r).iter_sse():
            data = event.data.strip()
            if data == "[DONE]":
                c.done = True
                break
            if not data:
                continue
            payload = _json(data)
            index = c.events
            c.events += 1
            message = error_message(payload)
            if message:
                c.error = message
                continue
            if payload.get("usage") is not None:
                c.usage_events.append(index)
                c.usage = payload["usage"]
            for choice in payload.get("choices") or []:
                if choice.get("index", 0) != 0:
                    continue
                ids = choice.get("token_ids")
                c.chunks.append({"text": choice.get("text") or "", "token_ids": ids,
                                 "finish_reason": choice.get("finish_reason")})
                texts.append(choice.get("text") or "")
                if ids is not None:
                    c.token_ids = (c.token_ids or []) + list(ids)
                if choice.get("prompt_token_ids") is not None:
                    c.prompt_token_ids = choice["prompt_token_ids"]
                if choice.get("finish_reason") is not None:
                    c.finish_reason, c.stop_reason = choice["finish_reason"], choice.get("stop_reason")
                c.logprobs = _logprobs(choice.get("logprobs"), c.logprobs)
        c.text = "".join(texts)
    return c


def _json(text: str) -> dict[str, Any]:
    try:
        out = json.loads(text)
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}


def _logprobs(part: dict[str, Any] | None, acc: dict[str, list] | None) -> dict[str, list] | None:
    if part is None:
        return acc
    acc = acc or {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for key in acc:
        acc[key].extend(part.get(key) or [])
    return acc

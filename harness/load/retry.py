"""The client's retry policy as pure arithmetic (``load.retry``,
:class:`harness.load.config.RetryConfig`).

Which failed tries a client retries follows the OpenAI Python SDK
(openai/_base_client.py, ``_should_retry`` and the request loop): connection errors and
timeouts (here: no response head arrived — refused, reset, or timed out before it) and
HTTP 408, 409, 429 and 5xx. A stream that began (HTTP 200) and broke is not retried: the
SDK hands the stream to the caller before it breaks. A try that the client itself
interrupted (``other:*``, e.g. locust stopping) is never retried.

Waits (:func:`backoff_s`): before retry ``n`` (1-based), ``min(initial_s *
multiplier**(n-1), max_s)`` seconds (``backoff: fixed``: ``initial_s``), then jitter —
``openai``: × ``(1 - 0.25 U)`` as the SDK's ``_calculate_retry_timeout``; ``full``: uniform
in ``[0, wait]`` (AWS Architecture Blog, "Exponential Backoff And Jitter", 2015);
``none``. ``U`` comes from the caller's seeded generator.
"""

from __future__ import annotations

import random
from typing import Any

from harness.load.config import RetryConfig
from harness.load.records import RequestRecord

__all__ = ["RETRY_STATUSES", "retryable", "backoff_s", "backoff_schedule", "describe"]

#: HTTP statuses below 500 that are retried (the OpenAI SDK's): request timeout,
#: conflict, too many requests.
RETRY_STATUSES = (408, 409, 429)


def retryable(rec: RequestRecord) -> bool:
    """Whether a client under this policy would send ``rec``'s request again (see module doc)."""
    if rec.ok:
        return False
    if rec.error is not None and rec.error.startswith("other:"):
        return False
    if rec.status is None:
        return rec.error is not None
    return rec.status in RETRY_STATUSES or rec.status >= 500


def backoff_s(policy: RetryConfig, retry: int, rng: random.Random) -> float:
    """Seconds to wait before retry number ``retry`` (1-based), jittered with ``rng``
    (one draw unless ``jitter`` is ``none``).

    Raises:
        ValueError: ``retry`` < 1.
    """
    if retry < 1:
        raise ValueError(f"retry numbers start at 1, got {retry}")
    if policy.backoff == "fixed":
        wait = policy.initial_s
    else:
        wait = min(policy.initial_s * policy.multiplier ** min(retry - 1, 1000), policy.max_s)
    if policy.jitter == "openai":
        return wait * (1.0 - 0.25 * rng.random())
    if policy.jitter == "full":
        return rng.uniform(0.0, wait)
    return wait


def backoff_schedule(policy: RetryConfig, rng: random.Random) -> list[float]:
    """The waits before retries ``1 .. max_retries``, in seconds."""
    return [backoff_s(policy, n, rng) for n in range(1, policy.max_retries + 1)]


def describe(policy: RetryConfig) -> dict[str, Any]:
    """The effective policy for ``report.json``: its fields, the un-jittered waits before
    each retry (``waits_s``), their sum (``max_total_wait_s``: the most a logical request
    waits between tries), and what is retried."""
    waits = [backoff_s(policy, n, _NoJitter()) for n in range(1, policy.max_retries + 1)]
    return {**policy.model_dump(), "waits_s": waits, "max_total_wait_s": sum(waits),
            "retried": "no response head (connect, reset, timeout before it); HTTP 408, 409, 429, 5xx",
            "source": "defaults of the OpenAI Python SDK (openai/_constants.py, openai/_base_client.py)"}


class _NoJitter(random.Random):
    """A generator whose draws leave a wait as it is (the un-jittered schedule)."""

    def random(self) -> float:
        return 0.0

    def uniform(self, a: float, b: float) -> float:
        return b

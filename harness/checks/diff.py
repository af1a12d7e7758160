"""Where two outputs first differ: the one comparison the integrity checks share
(:mod:`harness.checks.integrity` over whole responses, :mod:`harness.checks.request_classes`
over texts and token ids)."""

from __future__ import annotations

from typing import Sequence

__all__ = ["divergence_index"]


def divergence_index(got: Sequence, expected: Sequence) -> int | None:
    """Index of the first position where two sequences differ, ``None`` if equal.

    A strict prefix diverges at the shorter length."""
    for i, (a, b) in enumerate(zip(got, expected)):
        if a != b:
            return i
    if len(got) != len(expected):
        return min(len(got), len(expected))
    return None

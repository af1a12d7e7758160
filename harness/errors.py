"""One exception hierarchy for everything a user can meet.

The CLI turns any :class:`SpecchaosError` into one line on stderr and exit code 2.
Anything else escaping is a bug and keeps its traceback.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # typing only: pydantic is not needed to raise these errors
    from pydantic import ValidationError


class SpecchaosError(Exception):
    """A user-facing error: says what went wrong, where, and what to do next.

    Args:
        message: what went wrong, one sentence.
        where: the file/field/endpoint concerned (e.g. ``"experiments/x.yaml: method[1].provider.arguments.role"``).
        hint: what to do about it.
        details: further lines, one problem each, for an error that stands for several
            (e.g. every bad line of a traffic source as ``FILE:LINE: reason``); the CLI
            prints them below the one line, indented.
    """

    def __init__(self, message: str, where: str | None = None, hint: str | None = None,
                 details: list[str] | None = None):
        super().__init__(message)
        self.message = message
        self.where = where
        self.hint = hint
        self.details = list(details or [])

    def one_line(self) -> str:
        """The error as a single line: ``where: message (hint)``."""
        text = f"{self.where}: {self.message}" if self.where else self.message
        if self.hint:
            text += f" ({self.hint})"
        return " ".join(text.split())


class ExperimentError(SpecchaosError):
    """The experiment file is malformed, or names an unknown fault, role or option."""


class ModelError(SpecchaosError):
    """A model directory is missing, partial or unusable."""


class StackError(SpecchaosError):
    """A server could not be started, reached, or stopped (port in use, crash at start...)."""


class LoadError(SpecchaosError):
    """The load generator (locust) could not be started or died."""


class SourceError(SpecchaosError):
    """A traffic source (a file of requests, conversations or a timed trace) is unreadable or
    malformed; ``where`` is ``FILE:LINE`` (1-based) of the first bad line, or ``FILE``."""


class FaultError(SpecchaosError):
    """A fault could not be injected, or left no evidence that it acted."""


def first_error(exc: "ValidationError") -> tuple[str, str, str]:
    """The first error of a pydantic validation as ``(dotted field path, message, type)``.

    The message loses pydantic's ``"Value error, "`` prefix; the path is ``""`` for an
    error at model level. Used wherever a pydantic model meets user input (experiment
    configuration, fault arguments, a saved ``config.json``), so every such error reads
    the same.
    """
    err = exc.errors()[0]
    return ".".join(str(p) for p in err["loc"]), str(err["msg"]).removeprefix("Value error, "), err["type"]

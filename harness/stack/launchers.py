"""Launchers by name, in the spirit of the fault registry: a session builds its stack with
:func:`make_stack` from ``stack.launcher``, so a new launcher (docker, an external server)
is one new module plus one line in :data:`LAUNCHERS`.

An entry is a class implementing :class:`harness.stack.base.Stack`, or the
``"module:attribute"`` path of one (imported on first use, so naming a launcher never
imports the others' dependencies, e.g. the Docker SDK).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from harness.errors import SpecchaosError
from harness.timeline import Timeline

__all__ = ["LAUNCHERS", "launcher_names", "register_launcher", "launcher_class", "make_stack"]

#: ``stack.launcher`` name → Stack class (or its ``"module:attribute"`` path).
LAUNCHERS: dict[str, Any] = {
    "local": "harness.stack.local:LocalStack",
}


def launcher_names() -> list[str]:
    """The registered launcher names, sorted."""
    return sorted(LAUNCHERS)


def register_launcher(name: str, stack_class: Any) -> None:
    """Add (or replace) launcher ``name``: a Stack class or its ``"module:attribute"`` path."""
    LAUNCHERS[name] = stack_class


def launcher_class(name: str) -> type:
    """The Stack class registered as ``name``.

    Raises:
        SpecchaosError: unknown name, or its module cannot be imported.
    """
    try:
        entry = LAUNCHERS[name]
    except KeyError:
        raise SpecchaosError(f"unknown launcher {name!r}", where="configuration.specchaos.stack.launcher",
                             hint=f"known: {', '.join(launcher_names())}") from None
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        try:
            entry = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise SpecchaosError(f"launcher {name!r} cannot be loaded from {LAUNCHERS[name]!r}: {exc}",
                                 where="configuration.specchaos.stack.launcher") from None
        LAUNCHERS[name] = entry
    return entry


def make_stack(cfg: Any, run_dir: str | os.PathLike, timeline: Timeline | None = None) -> Any:
    """A not yet started stack for ``cfg`` (a :class:`~harness.stack.config.StackConfig`),
    built by the launcher ``cfg.launcher``; its servers write ``run_dir/logs/`` and
    ``stack`` events to ``timeline``.

    Raises:
        SpecchaosError: unknown launcher (see :func:`launcher_class`).
    """
    return launcher_class(cfg.launcher)(cfg, run_dir, timeline=timeline)

"""Launchers by name, in the spirit of the fault registry: a session builds its stack with
:func:`make_stack` from ``stack.launcher``, so a new launcher (docker, an external server)
is one new module plus one line in :data:`LAUNCHERS`.

An entry is a class implementing :class:`harness.stack.base.Stack`, or the
``"module:attribute"`` path of one (imported on first use, so naming a launcher never
imports the others' dependencies, e.g. the Docker SDK). Launchers kept outside this
package are added with :func:`register_launcher`, or for every process of a run (the CLI,
a CI job) with the environment variable ``SPECCHAOS_LAUNCHERS``:
``"name=module:attribute[,name=module:attribute...]"``.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, cast

from harness.errors import SpecchaosError
from harness.stack.base import Stack
from harness.timeline import Timeline

__all__ = ["LAUNCHERS", "ENV_VAR", "launcher_names", "register_launcher", "launcher_class", "make_stack"]

#: Environment variable naming extra launchers (see module doc).
ENV_VAR = "SPECCHAOS_LAUNCHERS"

#: ``stack.launcher`` name → Stack class (or its ``"module:attribute"`` path).
LAUNCHERS: dict[str, Any] = {
    "local": "harness.stack.local:LocalStack",
    "external": "harness.stack.external:ExternalStack",
    "docker": "harness.stack.container:DockerStack",
}


def _from_environment() -> None:
    """Register the launchers named in ``$SPECCHAOS_LAUNCHERS`` (not already registered).

    Raises:
        SpecchaosError: an entry is not ``name=module:attribute``.
    """
    for item in filter(None, (x.strip() for x in os.environ.get(ENV_VAR, "").split(","))):
        name, sep, path = item.partition("=")
        if not sep or ":" not in path or not name.strip():
            raise SpecchaosError(f"malformed entry {item!r}", where=f"${ENV_VAR}",
                                 hint="use name=module:attribute, comma-separated")
        LAUNCHERS.setdefault(name.strip(), path.strip())


def launcher_names() -> list[str]:
    """The registered launcher names (with those of ``$SPECCHAOS_LAUNCHERS``), sorted."""
    _from_environment()
    return sorted(LAUNCHERS)


def register_launcher(name: str, stack_class: Any) -> None:
    """Add (or replace) launcher ``name``: a Stack class or its ``"module:attribute"`` path."""
    LAUNCHERS[name] = stack_class


def launcher_class(name: str) -> "type[Stack]":
    """The Stack class registered as ``name``.

    Raises:
        SpecchaosError: unknown name, or its module cannot be imported.
    """
    _from_environment()
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
    return cast("type[Stack]", entry)


def make_stack(cfg: Any, run_dir: str | os.PathLike, timeline: Timeline | None = None) -> Any:
    """A not yet started stack for ``cfg`` (a :class:`~harness.stack.config.StackConfig`),
    built by the launcher ``cfg.launcher``; its servers write ``run_dir/logs/`` and
    ``stack`` events to ``timeline``.

    Raises:
        SpecchaosError: unknown launcher (see :func:`launcher_class`).
    """
    return launcher_class(cfg.launcher)(cfg, run_dir, timeline=timeline)

"""The experiments shipped with specchaos, and ``specchaos init DIR`` that copies them.

They are package data: ``harness/experiments_data`` (in a checkout, a link to the
repository's ``experiments/``, their one copy; in a wheel, the files), with the request
files they and the workload guide name (``sources/``: ``trace-replay.yaml``'s Mooncake
trace, an example of every request format). The self-test experiments (``selftest/``, which
must fail) stay behind: they test the harness, not a stack.
"""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

from harness.errors import SpecchaosError

__all__ = ["DEFAULT_EXPERIMENT", "SOURCES", "shipped_experiments", "shipped_sources", "init_experiments"]

#: The experiment to start with (``make run`` runs it): SIGKILL of the drafting worker under load.
DEFAULT_EXPERIMENT = "kill-draft-worker.yaml"
#: The request files' directory beside the experiments; the shipped files name it by its
#: path in the repository (relative to the working directory, as ``stack.models_dir``).
SOURCES = "sources"
_REPO_SOURCES = f"experiments/{SOURCES}/"


def _data() -> Path:
    return Path(str(resources.files("harness") / "experiments_data"))


def shipped_experiments() -> list[Path]:
    """The shipped experiment files, sorted by name.

    Raises:
        SpecchaosError: the installation has none (a broken install).
    """
    root = _data()
    files = sorted((p for p in root.iterdir() if p.name.endswith(".yaml")), key=lambda p: p.name) \
        if root.is_dir() else []
    if not files:
        raise SpecchaosError("this installation of specchaos ships no experiments", where=str(root),
                             hint="reinstall specchaos (the wheel holds harness/experiments_data/*.yaml)")
    return files


def shipped_sources() -> list[Path]:
    """The shipped request files (``experiments_data/sources/*``), sorted by name; empty if none."""
    root = _data() / SOURCES
    return sorted((p for p in root.iterdir() if p.is_file()), key=lambda p: p.name) if root.is_dir() else []


def init_experiments(target: str | Path, force: bool = False) -> list[Path]:
    """Copy the shipped experiments into ``target`` (created when missing), and the request
    files they name into ``target/sources/``: each experiment's ``experiments/sources/...``
    path becomes ``<target>/sources/...`` as ``target`` was given (relative to the working
    directory, as the experiments' ``stack.models_dir: models`` is), so every experiment
    validates and runs from the directory ``init`` ran in.

    Args:
        target: the directory to fill.
        force: also write into a non-empty directory (files of the same name are replaced,
            others are left alone).

    Returns:
        The experiment files written (the request files under ``sources/`` not listed).

    Raises:
        SpecchaosError: ``target`` is a file, or a non-empty directory without ``force``, or
            cannot be written.
    """
    d = Path(target)
    if d.exists() and not d.is_dir():
        raise SpecchaosError("exists and is not a directory", where=str(d), hint="name a new or empty directory")
    if d.is_dir() and any(d.iterdir()) and not force:
        raise SpecchaosError("the directory is not empty", where=str(d),
                             hint="name a new or empty directory, or add --force to write the experiments into it")
    written = []
    try:
        d.mkdir(parents=True, exist_ok=True)
        sources = shipped_sources()
        if sources:
            (d / SOURCES).mkdir(exist_ok=True)
        for src in sources:
            shutil.copyfile(src, d / SOURCES / src.name)
        here = f"{d.as_posix()}/{SOURCES}/"
        for src in shipped_experiments():
            text = src.read_text(encoding="utf-8").replace(_REPO_SOURCES, here)
            (d / src.name).write_text(text, encoding="utf-8")
            written.append(d / src.name)
    except OSError as exc:
        raise SpecchaosError(f"cannot write the experiments: {exc.strerror or exc}", where=str(d)) from None
    return written

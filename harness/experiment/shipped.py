"""The experiments shipped with specchaos, and ``specchaos init DIR`` that copies them.

They are package data: ``harness/experiments_data`` (in a checkout, a link to the
repository's ``experiments/``, their one copy; in a wheel, the files). The self-test
experiments (``selftest/``, which must fail) stay behind: they test the harness, not a stack.
"""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

from harness.errors import SpecchaosError

__all__ = ["DEFAULT_EXPERIMENT", "shipped_experiments", "init_experiments"]

#: The experiment to start with (``make run`` runs it): SIGKILL of the drafting worker under load.
DEFAULT_EXPERIMENT = "kill-draft-worker.yaml"


def shipped_experiments() -> list[Path]:
    """The shipped experiment files, sorted by name.

    Raises:
        SpecchaosError: the installation has none (a broken install).
    """
    root = resources.files("harness") / "experiments_data"
    files = sorted((Path(str(root)) / p.name for p in root.iterdir() if p.name.endswith(".yaml")),
                   key=lambda p: p.name) if root.is_dir() else []
    if not files:
        raise SpecchaosError("this installation of specchaos ships no experiments", where=str(root),
                             hint="reinstall specchaos (the wheel holds harness/experiments_data/*.yaml)")
    return files


def init_experiments(target: str | Path, force: bool = False) -> list[Path]:
    """Copy the shipped experiments into ``target`` (created when missing).

    Args:
        target: the directory to fill.
        force: also write into a non-empty directory (files of the same name are replaced,
            others are left alone).

    Returns:
        The files written.

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
        for src in shipped_experiments():
            written.append(Path(shutil.copyfile(src, d / src.name)))
    except OSError as exc:
        raise SpecchaosError(f"cannot write the experiments: {exc.strerror or exc}", where=str(d)) from None
    return written

"""Run an experiment through chaostoolkit-lib, with signal handling and a strict verdict.

Chaos Toolkit alone exits 0 when the steady-state hypothesis is missed before the
method (it just skips the method). Here every tolerance miss, before or after the
method, fails the run (:mod:`harness.checks.steady_state`); any activity that raised,
an interruption, or a fault without evidence makes it an error:

    exit 0 = pass, 1 = fail or aborted (a safeguard stopped the method),
    2 = error (also: bad input, nothing started).

Validation (:func:`harness.experiment.validate.load_experiment`) happens before
anything starts; the verdict is the judge's (:mod:`harness.report.judge`), computed once.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from pathlib import Path
from typing import Any, Sequence

from chaoslib.experiment import run_experiment

from harness.checks.verdict import EXIT_CODES
from harness.errors import SpecchaosError
from harness.experiment import session as sess
from harness.experiment.control import signals_deferred
from harness.experiment.progress import start_progress
from harness.experiment.overrides import Override
from harness.experiment.validate import load_experiment, run_meta

log = logging.getLogger(__name__)

__all__ = ["EXIT_CODES", "run", "prepare_out_dir"]


#: Chaos Toolkit settings of a run: rollbacks always play (they clear every fault, and
#: clearing is idempotent). The "default" strategy skips them after a failed or
#: interrupted run, which is exactly when a fault may be left behind.
RUN_SETTINGS: dict[str, Any] = {"runtime": {"rollbacks": {"strategy": "always"}}}


def run(path: str | Path, out_dir: str | Path, progress: bool = False,
        overrides: Sequence[Override] = ()) -> tuple[int, dict[str, Any] | None]:
    """Run an experiment file and write ``journal.json`` and ``report.json`` into ``out_dir``.
    ``progress``: show the run's progress on stderr (:mod:`harness.experiment.progress`).
    ``overrides``: applied to ``configuration.specchaos`` before it is validated
    (:mod:`harness.experiment.overrides`); ``experiment.json`` and ``config.json`` hold the
    result, ``report.json``'s ``overrides`` lists them.

    Returns:
        (exit code, report) — 0 pass, 1 fail, 2 error.

    Raises:
        SpecchaosError: bad input found before anything started (nothing was started).
    """
    exp = load_experiment(path, overrides=overrides)
    out = prepare_out_dir(out_dir)
    s = sess.open_session(sess.RunInfo(title=exp.title, source=str(exp.path), out_dir=out, cfg=exp.cfg,
                                       faults=exp.faults, method_hold_s=exp.method_hold_s, meta=run_meta(exp),
                                       requests=exp.requests))
    (out / "experiment.json").write_text(json.dumps(exp.doc, indent=2, default=str))
    (out / "config.json").write_text(exp.cfg.model_dump_json(indent=2))
    journal: dict | None = None
    monitor = start_progress(s) if progress else None

    def on_sigint(signum: int, frame: Any) -> None:
        s.note_interrupt("SIGINT")
        raise KeyboardInterrupt

    previous_sigint = signal.signal(signal.SIGINT, on_sigint) if _main_thread() else None
    try:
        with _quiet_rollback_notice():
            journal = run_experiment(exp.doc, settings=RUN_SETTINGS)
    except (KeyboardInterrupt, SystemExit):
        if not s.aborted:   # a safeguard's abort (SIGUSR1) is no interruption
            s.note_interrupt("a signal")
    except Exception as exc:
        log.exception("the experiment runner failed")
        s.errors.append(f"runner failed: {type(exc).__name__}: {exc}")
    finally:
        if previous_sigint is not None:
            signal.signal(signal.SIGINT, previous_sigint)
        if monitor is not None:
            monitor.stop()
        with signals_deferred():
            if journal is not None:
                (out / "journal.json").write_text(json.dumps(journal, indent=2, default=str))
            s.close()
            report = s.judge(journal=journal)   # the final journal (rollbacks included)
            log.info("verdict: %s (%d checks, %d failed)", report["verdict"], len(report["checks"]),
                     sum(c["passed"] is False for c in report["checks"]))
    return EXIT_CODES.get(report["verdict"], 2), report


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def prepare_out_dir(out_dir: str | Path) -> Path:
    """Create the run directory (``--out``) or check that an existing one is usable.

    Raises:
        SpecchaosError: it exists and is not a directory, or cannot be created/written.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise SpecchaosError("the output path exists and is not a directory", where=f"--out {out}")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".specchaos-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise SpecchaosError(f"cannot write the output directory: {exc.strerror or exc}",
                             where=f"--out {out}") from None
    return out


class _RollbackNotice(logging.Filter):
    """Drops Chaos Toolkit's "Rollbacks were explicitly requested to be played" warning,
    logged on every run with the ``always`` strategy this runner sets on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Rollbacks were explicitly requested" not in record.getMessage()


class _quiet_rollback_notice:
    def __enter__(self) -> None:
        self._filter = _RollbackNotice()
        logging.getLogger("chaostoolkit").addFilter(self._filter)

    def __exit__(self, *exc: Any) -> None:
        logging.getLogger("chaostoolkit").removeFilter(self._filter)

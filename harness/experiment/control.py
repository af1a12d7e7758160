"""The ``specchaos`` Chaos Toolkit control: it brackets the experiment.

Declare it in the experiment (``controls: [{name: specchaos, provider: {type: python,
module: harness.experiment.control}}]``). Chaos Toolkit then calls:

* ``configure_control`` once: opens the session (when run by plain ``chaos run``,
  the run directory is ``$SPECCHAOS_OUT`` or ``results/chaos-<epoch>``);
* ``before_experiment_control``: starts the stack, reference, load, warm-up and the
  baseline phase, so the steady-state hypothesis *before* the method judges a real
  baseline. Any failure interrupts the experiment (rollbacks still run);
* ``before_method_control`` / ``after_method_control``: arm and disarm the continuous
  safeguards (``configuration.specchaos.safeguards``, :mod:`harness.experiment.safeguards`),
  which abort the method on a breach;
* ``after_experiment_control``: stops the load, clears every fault, stops the stack,
  and, under plain ``chaos run``, judges the recorded data into ``report.json``
  (``specchaos run`` judges itself once Chaos Toolkit returns the final journal).

Under plain ``chaos run`` the verdict is also Chaos Toolkit's: ``configure_control``
validates the document as ``specchaos validate`` does, with the configuration as Chaos
Toolkit resolved it and the overrides of ``configuration.specchaos_set`` (``chaos run --var
'specchaos_set=load.users=8'``) and ``SPECCHAOS_SET_*`` applied (a bad experiment
interrupts the run before anything starts, with the one-line error), and ``after_experiment_control``
writes the journal *as judged* into the run directory (``specchaos report DIR``
re-judges from it), then sets the ``status``/``deviated`` of the journal Chaos Toolkit
hands it (the same object that ``chaos run`` saves, ``chaostoolkit/commands/run.py``,
and whose ``status != "completed" or deviated`` makes ``chaos`` exit 1) from the verdict
(:data:`VERDICT_JOURNAL`, :func:`apply_verdict`), plus a ``specchaos`` key naming it.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import signal
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from chaoslib.exceptions import InterruptExecution

from harness.clock import now
from harness.errors import SpecchaosError
from harness.experiment import safeguards
from harness.experiment import session as sess
from harness.experiment.overrides import env_overrides
from harness.experiment.validate import check_experiment, run_meta

log = logging.getLogger(__name__)

#: ``RunInfo.source`` of a session opened by this control (plain ``chaos run``).
CHAOS_RUN = "chaos run"

#: Chaos Toolkit's logger: what is logged to it shows in ``chaos``'s console and log file.
ctk_log = logging.getLogger("chaostoolkit")

__all__ = ["configure_control", "before_experiment_control", "before_method_control", "after_method_control",
           "after_experiment_control", "cleanup_control", "VERDICT_JOURNAL", "apply_verdict"]

#: The journal's ``(status, deviated)`` for each verdict under plain ``chaos run``
#: (None: left as Chaos Toolkit set it). ``chaos run`` exits 1 when ``status`` is not
#: ``completed`` or ``deviated`` is true, else 0; it has no exit 2, so an error is
#: ``failed`` (``interrupted`` kept when a signal or a refused experiment interrupted it).
#: A failed check is Chaos Toolkit's "deviated" (a weakness found); a safeguard's stop is
#: its ``aborted`` (a method stopped by a continuous check, ``chaoslib/run.py``).
VERDICT_JOURNAL: dict[str, tuple[str | None, bool | None]] = {
    "pass": ("completed", False),
    "fail": (None, True),
    "aborted": ("aborted", None),
    "error": ("failed", None),
}

#: The one-line error of an experiment this control refused under plain ``chaos run``
#: (Chaos Toolkit ignores exceptions of ``configure_control``, so it is raised at the next hook).
_refused: str | None = None


def configure_control(configuration: dict | None = None, experiment: dict | None = None, **_: Any) -> None:
    """Open a session if the runner did not (plain ``chaos run``), after validating the
    experiment as ``specchaos validate`` does; a refusal is logged as one line and
    interrupts the run at ``before_experiment_control``, before anything starts."""
    global _refused
    _refused = None
    s = sess.peek()
    if s is not None and not s.closed:
        return
    doc = experiment or {}
    try:
        label = f"experiment {str(doc.get('title', ''))!r}"
        # the configuration as Chaos Toolkit resolved it (`chaos run --var` included), with the
        # SPECCHAOS_SET_* environment and configuration.specchaos_set applied
        exp = check_experiment(doc, label, overrides=env_overrides(),
                               configuration=configuration if configuration and "specchaos" in configuration else None)
        out = _run_dir(Path(os.environ.get("SPECCHAOS_OUT") or f"results/chaos-{int(now())}"))
    except SpecchaosError as exc:
        _refused = exc.one_line()   # Chaos Toolkit logs it when the run is interrupted
        return
    sess.open_session(sess.RunInfo(title=exp.title, source=CHAOS_RUN, out_dir=out, cfg=exp.cfg, faults=exp.faults,
                                   method_hold_s=exp.method_hold_s, meta=run_meta(exp), requests=exp.requests))
    # as `specchaos run` writes them: `specchaos report DIR` re-judges from these
    (out / "experiment.json").write_text(json.dumps(exp.doc, indent=2, default=str))
    (out / "config.json").write_text(exp.cfg.model_dump_json(indent=2))
    ctk_log.info("specchaos: run directory %s", out)


def _run_dir(out: Path) -> Path:
    """Create the run directory of a plain ``chaos run``.

    Raises:
        SpecchaosError: it cannot be created (or is a file).
    """
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecchaosError(f"cannot create the run directory: {exc.strerror or exc}",
                             where=f"SPECCHAOS_OUT={out}") from None
    return out


def before_experiment_control(context: dict, configuration: dict | None = None, **_: Any) -> None:
    """Start everything and run warm-up + baseline. Raises InterruptExecution on failure
    (and at once for an experiment ``configure_control`` refused)."""
    if _refused is not None:
        raise InterruptExecution(f"specchaos refused the experiment: {_refused}")
    s = sess.current()
    _note_sigterm(s)
    try:
        s.start()
    except SpecchaosError as exc:
        s.errors.append(exc.one_line())
        raise InterruptExecution(exc.one_line()) from exc
    except (KeyboardInterrupt, InterruptExecution, SystemExit):
        s.note_interrupt("a signal")
        raise
    except Exception as exc:  # a bug, but the run must still end cleanly and say why
        log.exception("starting the experiment failed")
        s.errors.append(f"start failed: {type(exc).__name__}: {exc}")
        raise InterruptExecution(str(exc)) from exc


def before_method_control(context: dict, configuration: dict | None = None, **_: Any) -> None:
    """Arm the continuous safeguards for the method (none configured: nothing runs)."""
    s = sess.peek()
    if s is not None and not s.closed:
        safeguards.arm(s)


def after_method_control(context: dict, state: Any = None, configuration: dict | None = None, **_: Any) -> None:
    """Disarm the safeguards: the method is over (also when a safeguard ended it)."""
    s = sess.peek()
    if s is not None:
        safeguards.disarm(s)


def after_experiment_control(context: dict, state: dict | None = None, configuration: dict | None = None,
                             **_: Any) -> None:
    """Tear down and judge. ``state`` is the Chaos Toolkit journal; under plain ``chaos
    run`` it is updated in place from the verdict (see the module doc)."""
    if _refused is not None:   # plain `chaos run` of a refused experiment: nothing started
        if state is not None:
            apply_verdict(state, {"verdict": "error", "errors": [_refused], "checks": []})
        return
    s = sess.peek()
    if s is None:
        return
    with signals_deferred():
        safeguards.disarm(s)
        if state and state.get("status") == "interrupted" and not s.errors and not s.aborted:
            s.note_interrupt("a signal")
        s.close()
        if s.info.source != CHAOS_RUN:
            return
        judged = copy.deepcopy(state) if state is not None else None   # the journal as Chaos Toolkit ended it
        try:
            if judged is not None:
                (s.out_dir / "journal.json").write_text(json.dumps(judged, indent=2, default=str))
            report = s.judge(journal=judged)
        except Exception as exc:  # a bug in judging: the run must still not pass
            log.exception("judging the run failed")
            report = {"verdict": "error", "errors": [f"judging failed: {type(exc).__name__}: {exc}"], "checks": []}
        if state is not None:
            apply_verdict(state, report, report_path=s.out_dir / "report.json")
        failed = [c["name"] for c in report.get("checks", []) if c.get("passed") is False]
        ctk_log.log(logging.INFO if report["verdict"] == "pass" else logging.ERROR,
                    "specchaos verdict: %s (%d checks, %d failed%s%s); report: %s", report["verdict"],
                    len(report.get("checks", [])), len(failed), ": " + ", ".join(failed[:5]) if failed else "",
                    "; errors: " + "; ".join(report.get("errors") or []) if report.get("errors") else "",
                    s.out_dir / "report.json")


def apply_verdict(journal: dict, report: dict, report_path: Path | None = None) -> None:
    """Make a Chaos Toolkit journal say the specchaos verdict (plain ``chaos run``).

    Sets ``status``/``deviated`` as :data:`VERDICT_JOURNAL` says (an error keeps
    ``interrupted``), and adds ``journal["specchaos"]``: ``verdict``, the names of the
    ``failed_checks``, the run ``errors``, the ``report`` path (or None), and what Chaos
    Toolkit itself had said (``chaostoolkit_status``, ``chaostoolkit_deviated``).

    Args:
        journal: the journal Chaos Toolkit passes ``after_experiment_control``; changed in place.
        report: a specchaos report (``verdict``, ``checks``, ``errors``; see
            :mod:`harness.report.json_report`).
    """
    verdict = report.get("verdict", "error")
    status, deviated = VERDICT_JOURNAL.get(verdict, VERDICT_JOURNAL["error"])
    before = {"chaostoolkit_status": journal.get("status"), "chaostoolkit_deviated": bool(journal.get("deviated"))}
    if status is not None and not (verdict == "error" and journal.get("status") == "interrupted"):
        journal["status"] = status
    if deviated is not None:
        journal["deviated"] = deviated
    journal["specchaos"] = {
        "verdict": verdict,
        "failed_checks": [c["name"] for c in report.get("checks", []) if c.get("passed") is False],
        "errors": list(report.get("errors") or []),
        "report": str(report_path) if report_path is not None else None,
        **before,
    }


def _note_sigterm(s: sess.Session) -> None:
    """Chain a SIGTERM handler that records the signal on the session before Chaos
    Toolkit's own handler interrupts the experiment (Chaos Toolkit restores its
    predecessor when the run ends). Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: Any) -> None:
        s.note_interrupt("SIGTERM")
        if callable(previous):
            previous(signum, frame)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)


@contextmanager
def signals_deferred():
    """Ignore SIGINT/SIGTERM while tearing down (main thread only), so a second Ctrl-C
    cannot leave a server or a fault behind. Restores the previous handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def cleanup_control() -> None:
    """Last resort: make sure nothing is left running when Chaos Toolkit unloads controls."""
    s = sess.peek()
    if s is not None and not s.closed:
        with signals_deferred():
            safeguards.disarm(s)
            s.close()

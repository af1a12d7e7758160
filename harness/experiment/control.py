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
"""

from __future__ import annotations

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
from harness.experiment.config import parse_config
from harness.experiment.validate import fault_activities, method_hold_s

log = logging.getLogger(__name__)

#: ``RunInfo.source`` of a session opened by this control (plain ``chaos run``).
CHAOS_RUN = "chaos run"

__all__ = ["configure_control", "before_experiment_control", "before_method_control", "after_method_control",
           "after_experiment_control", "cleanup_control"]


def configure_control(configuration: dict | None = None, experiment: dict | None = None, **_: Any) -> None:
    """Open a session if the runner did not (plain ``chaos run``)."""
    s = sess.peek()
    if s is not None and not s.closed:
        return
    cfg = parse_config((configuration or {}).get("specchaos"))
    out = Path(os.environ.get("SPECCHAOS_OUT") or f"results/chaos-{int(now())}")
    title = (experiment or {}).get("title", "experiment")
    faults = [f for _, _, f in fault_activities(experiment or {})]
    sess.open_session(sess.RunInfo(title=title, source=CHAOS_RUN, out_dir=out, cfg=cfg, faults=faults,
                                   method_hold_s=method_hold_s(experiment or {})))


def before_experiment_control(context: dict, configuration: dict | None = None, **_: Any) -> None:
    """Start everything and run warm-up + baseline. Raises InterruptExecution on failure."""
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
    """Tear down and judge. ``state`` is the Chaos Toolkit journal."""
    s = sess.peek()
    if s is None:
        return
    with signals_deferred():
        safeguards.disarm(s)
        if state and state.get("status") == "interrupted" and not s.errors and not s.aborted:
            s.note_interrupt("a signal")
        s.close()
        if s.info.source == CHAOS_RUN:
            s.judge(journal=state)


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

"""Hypothesis profiles of the property suite against the running stack.

* ``ci`` (default): a small example budget (the suite takes a few minutes on the shared
  stack), ``derandomize=True`` (the same examples on every run, so a CI failure replays
  locally), no example database, no deadline (server latency is not under test here).
* ``nightly``: many more examples, random, with hypothesis's example database (a failure
  found at night is tried first the next time).

Select with ``HYPOTHESIS_PROFILE=nightly`` or ``pytest --hypothesis-profile nightly``
(see :func:`active`). The stack tests take their settings from :func:`stack_settings`,
never from the global default, so the other hypothesis tests of the suite keep theirs.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

#: Default examples per test per profile (each test sets its own budget, see :func:`stack_settings`).
EXAMPLES = {"ci": 12, "nightly": 300}
#: Steps of one state machine run per profile.
STATEFUL_STEPS = {"ci": 6, "nightly": 25}
_SUPPRESS = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large]


def register() -> None:
    """Register ``ci`` and ``nightly`` (idempotent)."""
    # parent "default": under CI=true hypothesis loads its own built-in "ci" profile (derandomized),
    # which would otherwise be the parent of a profile registered without one
    default = settings.get_profile("default")
    settings.register_profile("ci", parent=default, max_examples=EXAMPLES["ci"], deadline=None, derandomize=True,
                              database=None, print_blob=True, suppress_health_check=_SUPPRESS,
                              stateful_step_count=STATEFUL_STEPS["ci"])
    settings.register_profile("nightly", parent=default, max_examples=EXAMPLES["nightly"], deadline=None,
                              derandomize=False, print_blob=True,
                              suppress_health_check=_SUPPRESS, stateful_step_count=STATEFUL_STEPS["nightly"])


def active() -> str:
    """``HYPOTHESIS_PROFILE`` if set, else the profile loaded with ``--hypothesis-profile``
    when it is one of ours, else ``ci``.

    Raises:
        ValueError: ``HYPOTHESIS_PROFILE`` names no profile of this suite (one line,
            naming the variable and the known profiles).
    """
    name = os.environ.get("HYPOTHESIS_PROFILE")
    if name is not None:
        if name not in EXAMPLES:
            raise ValueError(f"HYPOTHESIS_PROFILE={name!r}: unknown profile; known: {', '.join(EXAMPLES)}")
        return name
    current = settings.get_current_profile_name()
    return current if current in EXAMPLES else "ci"


def stack_settings(max_examples: int | None = None, nightly_examples: int | None = None) -> settings:
    """The active profile's settings with this test's budget: ``max_examples`` in ``ci``,
    ``nightly_examples`` (default 25 × ``max_examples``) in ``nightly``."""
    register()
    name = active()
    base = settings.get_profile(name)
    if max_examples is None:
        return base
    if name == "ci":
        return settings(base, max_examples=max_examples)
    return settings(base, max_examples=nightly_examples or max_examples * 25)

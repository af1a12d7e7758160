"""Assertions shared by the tests of checks and reports.

A check's ``passed`` is True, False, or None (not judged). A failing-case test must ask for
False: ``assert not check.passed`` is also true for None, so a check that stopped judging
(and so stopped counting in the verdict) would keep such a test green. tests/test_lint.py
rejects that form in tests/.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def assert_failed(check: Any) -> None:
    """Assert that ``check`` failed: its ``passed`` is False, never None (not judged).

    ``check``: a :class:`~harness.checks.base.CheckResult` or a report's check dict
    (``{"name", "passed", "observed", "limit", "detail", ...}``). Raises AssertionError
    showing the check when ``passed`` is True or None (KeyError: a dict without
    ``passed``).
    """
    passed = check["passed"] if isinstance(check, Mapping) else check.passed
    assert passed is False, f"expected a failed check (passed is False), got passed={passed!r}: {check!r}"

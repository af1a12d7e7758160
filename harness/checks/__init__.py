"""Checks: pure functions from recorded data (records, timeline, phase metrics) to
:class:`~harness.checks.base.CheckResult`. Checks never talk to servers."""

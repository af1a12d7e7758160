"""Errors a linter finds before a test run does: undefined names, syntax errors, invalid
comparisons (ruff's E9, F63, F7, F82 — the selection flake8's docs call the serious ones).

A renamed helper whose last caller still used the old name once reached CI this way: the
property tests that called it fail only against a running stack, 40 minutes in.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SELECT = "E9,F63,F7,F82"
SOURCES = ("harness", "faults", "chaosspecchaos", "tests", "bench", "ci", "docs")


def ruff() -> list[str]:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if exe is None:
        pytest.skip("ruff is not installed (the test extra installs it)")
    return [exe]


def check(paths: list[Path | str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*ruff(), "check", "--no-cache", "--isolated", "--select", SELECT,
                           "--output-format", "concise", *map(str, paths)],
                          cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_sources_have_no_undefined_names_or_syntax_errors():
    proc = check([p for p in SOURCES if (ROOT / p).exists()], ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_check_can_fail(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(payload):\n    return _error(payload)\n")
    proc = check([bad], tmp_path)
    assert proc.returncode == 1
    assert "F821" in proc.stdout and "_error" in proc.stdout


# --- failing-case assertions must ask for False -------------------------------------------------
# A check's ``passed`` is True, False or None (not judged). ``assert not c.passed`` and
# ``.get("passed")`` are also true for None: a check that must fail but stopped judging keeps such
# a test green while the verdict flips to pass. tests/asserts.py: ``assert_failed(c)``.

def _is_passed(node: ast.AST) -> bool:
    """``X.passed`` or ``X["passed"]``."""
    if isinstance(node, ast.Attribute):
        return node.attr == "passed"
    return isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "passed"


def _loose(node: ast.AST) -> bool:
    """``not X.passed`` / ``not X["passed"]``, or ``not any(<X.passed> for ...)``."""
    if not (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)):
        return False
    inner = node.operand
    if _is_passed(inner):
        return True
    return (isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id == "any"
            and len(inner.args) == 1 and isinstance(inner.args[0], ast.GeneratorExp) and _is_passed(inner.args[0].elt))


def loose_failure_assertions(source: str, filename: str = "<string>") -> list[str]:
    """``FILE:LINE: text`` for each loose failing-case assertion in ``source``: a ``not`` over a
    ``passed`` inside an ``assert``'s condition (its message is free), or ``.get("passed")``
    anywhere."""
    tree = ast.parse(source, filename)
    lines = source.splitlines()
    found: set[int] = set()
    for node in ast.walk(tree):
        loose_assert = isinstance(node, ast.Assert) and any(_loose(n) for n in ast.walk(node.test))
        get_passed = (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                      and bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "passed")
        if loose_assert or get_passed:
            found.add(node.lineno)
    return [f"{filename}:{n}: {lines[n - 1].strip()}" for n in sorted(found)]


def test_failing_case_assertions_ask_for_false():
    found = [hit for path in sorted((ROOT / "tests").rglob("*.py"))
             for hit in loose_failure_assertions(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    assert not found, ("true for a check that was not judged (passed None) too; use tests.asserts.assert_failed(c) "
                       "or `passed is False`:\n" + "\n".join(found))


@pytest.mark.parametrize("probe", [
    "assert not c.passed",
    "assert not by_name(checks)['x.y'].passed and c.observed == 1",
    "assert n == 1 and not rep['checks'][0]['passed']",
    "assert checks and not any(c.passed for c in checks)",
    "assert not c.get('passed')",
    "failed = [c for c in checks if not c.get('passed')]",
])
def test_the_loose_assertion_lint_can_fail(probe, tmp_path):
    probe_file = tmp_path / "test_probe.py"
    probe_file.write_text(f"def test_probe(c, checks, rep, n):\n    {probe}\n")
    assert loose_failure_assertions(probe_file.read_text(), probe_file.name) == [f"test_probe.py:2: {probe}"]


@pytest.mark.parametrize("fine", [
    "assert c.passed is False and c.observed == 1",
    "assert_failed(c)",
    "assert all(c.passed is False for c in checks)",
    "assert rep['verdict'] == 'pass', [c for c in checks if not c['passed']]",   # the message is free
    "assert c.passed is None and not c.judged",
])
def test_the_loose_assertion_lint_lets_strict_ones_pass(fine):
    assert loose_failure_assertions(f"def test_probe(c, checks, rep):\n    {fine}\n") == []

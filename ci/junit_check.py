#!/usr/bin/env python3
"""The closing lines of ci/test.sh, read from the JUnit XML of each test group.

    python ci/junit_check.py JUNIT_DIR [--allowed-skips FILE] [--require-listed]

Prints ``total: N passed, N failed, N skipped`` over every ``*.xml`` in JUNIT_DIR, then one
line per skipped test (``skipped: NODE-ID: MESSAGE``) that the allow-list does not name. With
``--require-listed`` (``.ci/run`` sets ``SPECCHAOS_REQUIRE_LISTED_SKIPS=1``, which ci/test.sh
turns into it) those skips are a failure: exit 1. Exit 2: an allow-list line without a reason,
or a JUnit file that cannot be read.

The allow-list (default ``tests/allowed-skips.txt``): one skip that may happen in CI a line,
``NODE-ID-PATTERN | REASON``: an :mod:`fnmatch` pattern of the pytest node id
(``tests/faults/test_x.py::test_y[param]``) and the text the skip's message must contain (so a
test listed for one reason cannot skip silently for another). ``#`` starts a comment line;
say above each entry why the skip is legitimate in CI. An xfail is not a skip.
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = ROOT / "tests" / "allowed-skips.txt"


@dataclass(frozen=True)
class Skip:
    """One skipped test case: its pytest node id and the skip's message."""

    node_id: str
    message: str


@dataclass(frozen=True)
class Allowed:
    """One allow-list entry: a node id pattern and the text the skip's message contains."""

    pattern: str
    reason: str

    def covers(self, skip: Skip) -> bool:
        return fnmatch.fnmatchcase(skip.node_id, self.pattern) and self.reason in skip.message


def node_id(classname: str, name: str, root: Path = ROOT) -> str:
    """The pytest node id of a JUnit test case (``classname`` ``tests.a.test_b.TestC``, ``name``
    ``test_d[x]`` → ``tests/a/test_b.py::TestC::test_d[x]``): the longest dotted prefix of
    ``classname`` that is a ``.py`` file under ``root`` is the module; none: ``classname::name``."""
    parts = classname.split(".")
    for i in range(len(parts), 0, -1):
        path = "/".join(parts[:i]) + ".py"
        if (root / path).is_file():
            return "::".join([path, *parts[i:], name])
    return f"{classname}::{name}"


def read_groups(junit_dir: Path, root: Path = ROOT) -> tuple[dict[str, int], list[Skip]]:
    """(totals ``{"tests", "failures", "errors", "skipped"}`` from the suites' attributes, the
    skipped test cases (xfails left out)) over every ``*.xml`` in ``junit_dir``.

    Raises:
        ET.ParseError, OSError: a JUnit file that cannot be read.
    """
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    skips: list[Skip] = []
    for f in sorted(Path(junit_dir).glob("*.xml")):
        for suite in ET.parse(f).getroot().iter("testsuite"):
            for k in totals:
                totals[k] += int(suite.get(k, 0))
            for case in suite.iter("testcase"):
                for skipped in case.findall("skipped"):
                    if skipped.get("type") != "pytest.xfail":
                        skips.append(Skip(node_id(case.get("classname", ""), case.get("name", ""), root),
                                          skipped.get("message") or (skipped.text or "")))
    return totals, skips


def read_allowed(path: Path) -> list[Allowed]:
    """The entries of the allow-list at ``path`` (none when it does not exist).

    Raises:
        ValueError: a line that is not ``PATTERN | REASON`` with both parts given (its number).
    """
    if not path.is_file():
        return []
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        pattern, sep, reason = (s.strip() for s in line.partition("|"))
        if not (sep and pattern and reason):
            raise ValueError(f"{path}:{n}: expected 'NODE-ID-PATTERN | REASON' (the skip's message), got {line!r}")
        out.append(Allowed(pattern, reason))
    return out


def unlisted(skips: list[Skip], allowed: list[Allowed]) -> list[Skip]:
    """The skips that no allow-list entry covers."""
    return [s for s in skips if not any(a.covers(s) for a in allowed)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("junit_dir", type=Path)
    ap.add_argument("--allowed-skips", type=Path, default=ALLOWED)
    ap.add_argument("--require-listed", action="store_true",
                    help="exit 1 when a test skipped that the allow-list does not name")
    args = ap.parse_args(argv)
    try:
        totals, skips = read_groups(args.junit_dir)
        allowed = read_allowed(args.allowed_skips)
    except (ET.ParseError, OSError, ValueError) as exc:
        print(f"ci/junit_check.py: {exc}", file=sys.stderr)
        return 2
    failed = totals["failures"] + totals["errors"]
    print(f"total: {totals['tests'] - failed - totals['skipped']} passed, {failed} failed, {totals['skipped']} skipped")
    bad = unlisted(skips, allowed)
    for s in bad:
        print(f"skipped: {s.node_id}: {s.message}")
    if bad and args.require_listed:
        print(f"{len(bad)} skipped test(s) not in {args.allowed_skips} (NODE-ID-PATTERN | REASON): "
              f"in CI every test runs unless listed there with its reason", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

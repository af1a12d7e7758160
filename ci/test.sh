#!/usr/bin/env bash
# The test tiers (README, "Tests"; docs/explanation/testing.md). Each group is one pytest session; its wall time is
# printed at the end, with every group's, so a change that slows the suite shows in CI.
#
#   ci/test.sh fast      the tests that need no real stack (-m "not stack and not nightly"), in parallel
#                        (pytest-xdist, $SPECCHAOS_TEST_WORKERS workers, default 4): make test-fast
#   ci/test.sh stack     the real-stack tests (-m stack), serially, on the session's one shared
#                        stack; ends with the line `real-stack coverage: FAMILY ...` and fails
#                        when a fault family did not act against the real vLLM
#   ci/test.sh all       fast, then stack (never at the same time): make test
#   ci/test.sh nightly   the nightly tier (-m "nightly or budget", hypothesis profile
#                        nightly): make test-nightly
#
# Extra pytest options: $PYTEST_ARGS (word-split). $SPECCHAOS_JUNIT_DIR keeps each group's JUnit XML. Exit: 0 when every group passed, else the
# first failing group's pytest exit code (5, no test collected, included); with $SPECCHAOS_REQUIRE_LISTED_SKIPS=1,
# 1 when a test skipped that tests/allowed-skips.txt does not name (ci/junit_check.py).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${SPECCHAOS_PYTHON:-.venv/bin/python}"
WORKERS="${SPECCHAOS_TEST_WORKERS:-4}"
read -r -a EXTRA <<< "${PYTEST_ARGS:-}"

status=0
summary=()
# each group's JUnit XML (per-test times): kept in $SPECCHAOS_JUNIT_DIR when set, else a temporary dir
if [ -n "${SPECCHAOS_JUNIT_DIR:-}" ]; then
  junit="$SPECCHAOS_JUNIT_DIR"; mkdir -p "$junit"
else
  junit="$(mktemp -d)"
  trap 'rm -rf "$junit"' EXIT
fi
group() {   # group NAME PYTEST-ARGS...
  local name="$1"; shift
  local t0=$SECONDS rc
  echo "=== test group: $name: pytest $*" >&2
  "$PY" -m pytest "$@" "${EXTRA[@]}" --junitxml "$junit/$name.xml"
  rc=$?
  summary+=("$(printf '%-8s %5d s  exit %d' "$name" $((SECONDS - t0)) "$rc")")
  if [ "$rc" != 0 ] && [ "$status" = 0 ]; then status=$rc; fi
}

t_all=$SECONDS
case "${1:-all}" in
  fast)    group fast -m "not stack and not nightly" -n "$WORKERS" --dist worksteal ;;
  stack)   group stack -m "stack and not nightly" --real-stack-coverage ;;
  all)     group fast -m "not stack and not nightly" -n "$WORKERS" --dist worksteal
           group stack -m "stack and not nightly" --real-stack-coverage ;;
  nightly) HYPOTHESIS_PROFILE=nightly group nightly -m "nightly or budget" ;;
  *)       echo "ci/test.sh: unknown tier '${1}' (fast, stack, all, nightly)" >&2; exit 2 ;;
esac
echo "=== test tiers: wall time (this machine: $(nproc) cores)"
for line in "${summary[@]}"; do echo "  $line"; done
echo "  total    $((SECONDS - t_all)) s"
# one closing line over every group (from their JUnit XML), then each skipped test that
# tests/allowed-skips.txt does not name; with SPECCHAOS_REQUIRE_LISTED_SKIPS=1 (.ci/run) such a
# skip fails the run (ci/junit_check.py)
require=()
if [ "${SPECCHAOS_REQUIRE_LISTED_SKIPS:-}" = 1 ]; then require=(--require-listed); fi
"$PY" ci/junit_check.py "$junit" "${require[@]}"
rc=$?
if [ "$rc" != 0 ] && [ "$status" = 0 ]; then status=$rc; fi
exit "$status"

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
# first failing group's pytest exit code (5, no test collected, included).
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
# one closing line over every group (from their JUnit XML)
"$PY" - "$junit" <<'PY'
import sys, pathlib, xml.etree.ElementTree as ET
n = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
for f in pathlib.Path(sys.argv[1]).glob("*.xml"):
    for suite in ET.parse(f).getroot().iter("testsuite"):
        for k in n:
            n[k] += int(suite.get(k, 0))
failed = n["failures"] + n["errors"]
print(f"total: {n['tests'] - failed - n['skipped']} passed, {failed} failed, {n['skipped']} skipped")
PY
exit "$status"

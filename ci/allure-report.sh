#!/usr/bin/env bash
# Generate the Allure HTML report of a results directory, keeping history (trend):
#   ci/allure-report.sh RESULTS_DIR REPORT_DIR
# REPORT_DIR/history (from the report generated last time) is copied into RESULTS_DIR/history
# first, so reports generated again into one REPORT_DIR show the trend across runs.
# The Allure command line (npm package allure-commandline; needs Java): $ALLURE_CLI or $ALLURE
# (as ci/gate.sh sets it), else `allure` on PATH, else node_modules/.bin/allure (the
# workflows' npm install), else .cache/allure/node_modules/.bin/allure, else installed there
# with npm. Missing and not installable: one line on stderr, exit 2.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if [ $# -ne 2 ]; then
  echo "usage: ci/allure-report.sh RESULTS_DIR REPORT_DIR" >&2
  exit 2
fi
RESULTS="$1"
REPORT="$2"
if [ ! -d "$RESULTS" ]; then
  echo "allure-report: error: results directory $RESULTS does not exist" >&2
  exit 2
fi
if ! ls "$RESULTS"/*-result.json >/dev/null 2>&1; then
  echo "allure-report: error: no Allure results (*-result.json) in $RESULTS" >&2
  exit 2
fi

# allure generate --clean empties REPORT_DIR first: refuse a directory that is not a report
if [ -d "$REPORT" ] && [ -n "$(ls -A "$REPORT" 2>/dev/null)" ] && [ ! -f "$REPORT/index.html" ]; then
  echo "allure-report: error: $REPORT exists and is no Allure report (no index.html): it would be emptied; name a new or a report directory" >&2
  exit 2
fi

GIVEN="${ALLURE_CLI:-${ALLURE:-}}"
find_allure() {
  if [ -n "$GIVEN" ]; then
    command -v "$GIVEN" 2>/dev/null && return 0
    return 1
  fi
  command -v allure 2>/dev/null && return 0
  local b
  for b in "$ROOT/node_modules/.bin/allure" "$ROOT/.cache/allure/node_modules/.bin/allure"; do
    [ -x "$b" ] && { echo "$b"; return 0; }
  done
  return 1
}

if ! BIN="$(find_allure)"; then
  if [ -n "$GIVEN" ]; then
    echo "allure-report: error: $GIVEN (\$ALLURE_CLI or \$ALLURE) is not an executable Allure command line" >&2
    exit 2
  fi
  if command -v npm >/dev/null 2>&1; then
    echo "allure-report: installing the Allure command line (npm allure-commandline) into .cache/allure" >&2
    mkdir -p "$ROOT/.cache/allure"
    npm install --silent --no-audit --no-fund --prefix "$ROOT/.cache/allure" allure-commandline >&2 || true
  fi
  if ! BIN="$(find_allure)"; then
    echo "allure-report: error: the Allure command line is missing and could not be installed (needs npm and the npm registry: npm install --prefix .cache/allure allure-commandline; or set ALLURE=/path/to/allure)" >&2
    exit 2
  fi
fi
if ! command -v java >/dev/null 2>&1 && [ -z "${JAVA_HOME:-}" ]; then
  echo "allure-report: error: the Allure command line needs Java (java not on PATH, JAVA_HOME unset)" >&2
  exit 2
fi

if [ -d "$REPORT/history" ]; then
  rm -rf "$RESULTS/history"
  cp -r "$REPORT/history" "$RESULTS/history"
fi
"$BIN" generate "$RESULTS" -o "$REPORT" --clean >&2
if [ ! -f "$REPORT/index.html" ]; then
  echo "allure-report: error: allure generate wrote no $REPORT/index.html" >&2
  exit 1
fi
echo "$REPORT/index.html"

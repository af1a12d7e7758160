"""tests/ci: the pytest plugin, ci/gate.sh and the workflow files.

``experiments/`` here holds experiment files used as test fixtures; with the plugin
installed (the ``specchaos`` entry point), ``pytest tests/ci`` would otherwise collect them
as experiments and start real stacks."""

collect_ignore = ["experiments"]

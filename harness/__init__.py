"""specchaos: chaos and resilience testing for speculative-decoding vLLM stacks.

The package is laid out as rooms with one job each (see docs/explanation/architecture.md):
``stack`` owns processes, ``load`` drives requests and writes records,
``metrics`` and ``checks`` are pure functions over recorded data,
``experiment`` orders time through Chaos Toolkit, ``report`` writes results.
Fault families live in the sibling top-level package ``faults``.
"""

__version__ = "0.1.0"

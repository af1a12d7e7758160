"""The Chaos Toolkit extension entry point of specchaos (``chaos discover specchaos``).

Chaos Toolkit finds an extension's ``discover`` function in the first top-level package
of its distribution; by the ``chaos<name>`` convention of Chaos Toolkit extensions, that
is this package. It lists the harness's activities: one typed action per fault family
(:mod:`harness.experiment.actions`, generated from :data:`faults.registry.REGISTRY`),
the phase and rollback actions, and the steady-state probes
(:mod:`harness.experiment.probes`). The experiment control is
:mod:`harness.experiment.control`.
"""

from __future__ import annotations

from importlib.metadata import version

from chaoslib.discovery.discover import discover_actions, discover_probes, initialize_discovery_result
from chaoslib.types import Discovery

__all__ = ["discover", "ACTIONS_MODULE", "PROBES_MODULE", "CONTROL_MODULE"]

ACTIONS_MODULE = "harness.experiment.actions"
PROBES_MODULE = "harness.experiment.probes"
CONTROL_MODULE = "harness.experiment.control"


def discover(discover_system: bool = True) -> Discovery:
    """Chaos Toolkit discovery: the extension's name and version and its activities
    (``discover_system`` is accepted for the protocol; specchaos reports no system info)."""
    result = initialize_discovery_result("specchaos", version("specchaos"), "specchaos")
    result["activities"].extend(discover_actions(ACTIONS_MODULE) + discover_probes(PROBES_MODULE))
    return result

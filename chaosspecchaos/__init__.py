"""The Chaos Toolkit extension entry point of specchaos (``chaos discover specchaos``), and
nothing else: the harness is :mod:`harness`, the fault families :mod:`faults`.

Why a top-level package of its own, and why this name: ``chaos discover specchaos`` asks
``importlib.metadata.packages_distributions()`` for the distribution's top-level packages
and imports the first one (chaoslib's ``get_importname_from_package``: one top-level
package per extension is all it supports), then calls its ``discover()``. The specchaos
distribution has three (``chaosspecchaos``, ``faults``, ``harness``, listed sorted), so the
entry point must sort before ``faults``; the ``chaos<name>`` name of Chaos Toolkit
extensions (chaosk8s, chaosaws, chaosprometheus) does, and tells a Chaos Toolkit user what
it is. Without it, discovery would import ``faults``, which has no ``discover()``
(``tests/test_discover.py`` runs the real ``chaos discover``). It lists the harness's
activities: one typed action per fault family
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

"""Fault families: one module per family, one protocol (:class:`faults.base.Fault`),
a registry by name (:data:`faults.registry.REGISTRY`)."""

"""Loopback rules, in one place: load and fault traffic go to 127.0.0.0/8, ``::1`` or
``localhost`` only. Used by the stack configuration (where servers listen) and by the
load client (where requests go)."""

from __future__ import annotations

import ipaddress

__all__ = ["is_loopback_host", "LOOPBACK_HINT"]

LOOPBACK_HINT = "specchaos sends load and faults to 127.0.0.0/8, ::1 or localhost only"


def is_loopback_host(host: str) -> bool:
    """True for an address in 127.0.0.0/8, ``::1`` (brackets allowed) and ``localhost``."""
    host = host.strip().strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

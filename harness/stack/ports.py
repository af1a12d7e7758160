"""Loopback TCP ports for the servers: is one free, pick free ones, wait until one is free."""

from __future__ import annotations

import contextlib
import socket
import time


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def port_in_use(host: str, port: int) -> bool:
    """True if a server could not listen on ``host:port`` now (something listens there).

    Binds with ``SO_REUSEADDR`` like uvicorn does, so connections of a previous server
    lingering in TIME_WAIT do not count as "in use".
    """
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def free_ports(host: str, n: int) -> list[int]:
    """``n`` distinct ports the OS reports free on ``host`` right now (all probed together)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(n):
            s = stack.enter_context(socket.socket(_family(host), socket.SOCK_STREAM))
            s.bind((host, 0))
            ports.append(s.getsockname()[1])
        return ports


def wait_port_free(host: str, port: int, timeout_s: float, interval_s: float = 0.25) -> bool:
    """Poll until ``host:port`` is free (True) or ``timeout_s`` seconds passed (False)."""
    deadline = time.monotonic() + timeout_s
    while port_in_use(host, port):
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
    return True

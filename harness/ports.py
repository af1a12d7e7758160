"""Loopback TCP ports for the servers, the fault proxy and the locust master: is one free,
pick free ones (outside the kernel's ephemeral range), wait until one is free."""

from __future__ import annotations

import contextlib
import random
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


#: Lowest port :func:`free_ports` picks (below it: registered services people run locally).
PICK_FLOOR = 20000


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int] | None:
    """The kernel's range of ports for outgoing connections (Linux: ``(32768, 60999)`` by
    default), or None where it cannot be read."""
    try:
        lo, hi = (int(x) for x in open(path).read().split())
    except (OSError, ValueError):
        return None
    return lo, hi


def free_ports(host: str, n: int, *, rng: random.Random | None = None) -> list[int]:
    """``n`` distinct ports free on ``host`` right now, **outside the ephemeral range**.

    A port the OS hands out for ``bind(0)`` lies in the range it also uses for outgoing
    connections: while a server restarts (its port unbound for the seconds vLLM takes to
    import), any client connection — locust's, the harness's, vLLM's own — may be given
    that port as its local end and hold it, and the restarted server then cannot bind it.
    So ports are drawn at random from ``[PICK_FLOOR, ephemeral low)`` and probed with
    :func:`port_in_use`. Where that range is empty or unknown (another OS, a widened
    ephemeral range), the OS picks (``bind(0)``), as before.

    Raises:
        OSError: no ``n`` free ports were found in 200 draws per port.
    """
    eph = ephemeral_range()
    if eph is None or eph[0] - PICK_FLOOR < 100 * n:
        with contextlib.ExitStack() as stack:
            ports = []
            for _ in range(n):
                s = stack.enter_context(socket.socket(_family(host), socket.SOCK_STREAM))
                s.bind((host, 0))
                ports.append(s.getsockname()[1])
            return ports
    rng = rng or random.Random()
    picked: list[int] = []
    for _ in range(200 * n):
        port = rng.randrange(PICK_FLOOR, eph[0])
        if port not in picked and not port_in_use(host, port):
            picked.append(port)
            if len(picked) == n:
                return picked
    raise OSError(f"no {n} free TCP ports on {host} in {PICK_FLOOR}-{eph[0] - 1}")


def wait_port_free(host: str, port: int, timeout_s: float, interval_s: float = 0.25) -> bool:
    """Poll until ``host:port`` is free (True) or ``timeout_s`` seconds passed (False)."""
    deadline = time.monotonic() + timeout_s
    while port_in_use(host, port):
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
    return True

"""Loopback rules, in one place: load and fault traffic go to 127.0.0.0/8, ``::1`` or
``localhost`` only. Used by the stack configuration (where servers listen) and by the
load client (where requests go)."""

from __future__ import annotations

import http.client
import ipaddress
from urllib.parse import urlsplit

__all__ = ["is_loopback_host", "LOOPBACK_HINT", "LoopbackGet", "UPSTREAM_HEADER"]

#: The response header by which the harness's load router (:mod:`harness.stack.router`) names
#: the upstream that served a request; the load client records it
#: (:attr:`harness.load.records.RequestRecord.served_by`).
UPSTREAM_HEADER = "x-specchaos-upstream"

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


class LoopbackGet:
    """A minimal keep-alive ``GET`` client for one loopback server, on the standard
    library's ``http.client``: the health sampler and the ``/metrics`` scraper poll
    several times a second, and one ``httpx`` GET costs about 0.4 ms of CPU for ``/health``
    and 1.1 ms for vLLM's 53 KB ``/metrics`` page where ``http.client`` costs 0.1 and
    0.3 ms (measured side by side on this machine).

    A request on a kept connection that the server closed meanwhile (a restart) is sent
    again once on a new connection, so a stale connection never reads as a failure.

    Args:
        base_url: ``http://host:port`` of a loopback server.
        timeout_s: bound on connecting and on each read, seconds.

    Raises:
        ValueError: ``base_url`` is not ``http://`` to a loopback host.
    """

    #: A kept connection the server closed: worth one retry on a fresh connection.
    _STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)

    def __init__(self, base_url: str, timeout_s: float):
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname or not is_loopback_host(parts.hostname):
            raise ValueError(f"not an http:// URL to a loopback host: {base_url!r}")
        self.base_url = base_url
        self.host, self.port = parts.hostname, parts.port or 80
        self.timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None

    def get(self, path: str) -> tuple[int, bytes]:
        """``(status, body)`` of ``GET path``.

        Raises:
            OSError: refused, unreachable, timed out (``TimeoutError``), cut.
            http.client.HTTPException: a malformed answer.
        """
        for _ in range(2):
            fresh = self._conn is None
            if fresh:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
            conn = self._conn
            try:
                conn.request("GET", path)
                resp = conn.getresponse()
                body = resp.read()
            except self._STALE:
                self.close()
                if fresh:
                    raise
                continue
            except BaseException:
                self.close()
                raise
            if resp.will_close:
                self.close()
            return resp.status, body
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> "LoopbackGet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""Loopback rules, in one place: load and fault traffic go to 127.0.0.0/8, ``::1`` or
``localhost`` only. Used by the stack configuration (where servers listen) and by the
load client (where requests go).

The one exception is a host the user allows in writing: an external server
(``stack.launcher: external``) on another host is reached only when its host is in
``stack.allow_hosts``. A run that allows hosts puts them in the environment variable
:data:`ALLOW_HOSTS_ENV` (:func:`allow_hosts`), so its child processes (locust, the fault
proxy) apply the same list; :func:`is_allowed_host` is the check every traffic path makes.
"""

from __future__ import annotations

import http.client
import ipaddress
import os
from collections.abc import Iterable
from urllib.parse import urlsplit

__all__ = ["is_loopback_host", "is_allowed_host", "allow_hosts", "allowed_hosts", "ALLOW_HOSTS_ENV", "LOOPBACK_HINT",
           "LoopbackGet", "UPSTREAM_HEADER"]

#: The response header by which the harness's load router (:mod:`harness.stack.router`) names
#: the upstream that served a request; the load client records it
#: (:attr:`harness.load.records.RequestRecord.served_by`).
UPSTREAM_HEADER = "x-specchaos-upstream"

LOOPBACK_HINT = ("specchaos sends load and faults to 127.0.0.0/8, ::1 or localhost only, and to a host listed in "
                 "stack.allow_hosts")

#: Environment variable holding the hosts a run allows besides loopback (comma-separated).
ALLOW_HOSTS_ENV = "SPECCHAOS_ALLOW_HOSTS"


def _norm(host: str) -> str:
    return host.strip().strip("[]").lower()


def is_loopback_host(host: str) -> bool:
    """True for an address in 127.0.0.0/8, ``::1`` (brackets allowed) and ``localhost``."""
    host = _norm(host)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def allowed_hosts() -> frozenset[str]:
    """The hosts allowed besides loopback (:data:`ALLOW_HOSTS_ENV`), normalised (lower
    case, no brackets)."""
    return frozenset(filter(None, (_norm(h) for h in os.environ.get(ALLOW_HOSTS_ENV, "").split(","))))


def allow_hosts(hosts: Iterable[str]) -> None:
    """Allow ``hosts`` besides loopback for this process and the processes it starts from
    now on (sets :data:`ALLOW_HOSTS_ENV`; an empty list removes it)."""
    names = sorted({_norm(h) for h in hosts if _norm(h)})
    if names:
        os.environ[ALLOW_HOSTS_ENV] = ",".join(names)
    else:
        os.environ.pop(ALLOW_HOSTS_ENV, None)


def is_allowed_host(host: str) -> bool:
    """True for a loopback host (:func:`is_loopback_host`) or one in :func:`allowed_hosts`."""
    return is_loopback_host(host) or _norm(host) in allowed_hosts()


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
        if parts.scheme != "http" or not parts.hostname or not is_allowed_host(parts.hostname):
            raise ValueError(f"not an http:// URL to a loopback (or allowed) host: {base_url!r}")
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

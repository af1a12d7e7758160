"""Arrival instants of what the streaming client reads, stamped by the kernel.

A chunk's arrival instant is the moment its last byte reached this host's TCP stack, not
the moment the client got round to it: with ``SO_TIMESTAMPNS`` on the socket, every
``recvmsg`` returns the kernel's receive time (``CLOCK_REALTIME``) of the newest data it
copied (Linux ``tcp_recv_timestamp``: the last segment read). So the time the load
process waits for a core (a busy host's run queue), for its turn in gevent's loop (other
users' chunks parsed first) and the parsing itself (h11, httpx, httpx-sse, JSON) are no
longer added to TTFT, ITL and E2E. Measured by ``bench/loadgen_capacity.py`` (timing
error against the server's send instants; docs/benchmarks.md).

:func:`make_transport` is an ``httpx.HTTPTransport`` whose connections are
:class:`StampedStream`\\ s (the network backend wraps httpcore's own ``SyncBackend``, so
connect, write, TLS and errors are httpcore's); a response's
``extensions["network_stream"]`` is then the stream and :func:`last_rx_s` reads its
stamp. Where the kernel gives no stamp (not Linux, the option refused, a TLS stream)
the stream stamps the return of each read in user space (``time.time_ns()`` right
after it), which still leaves the parsing out.

Linux turns receive stamping on for the whole host a moment after the first socket asks
for it (a static key flipped from a work queue) and off again when the last such socket
closes, so the first segments a fresh load process reads may come unstamped: those reads
get the user-space stamp.

Where the httpx internals this relies on (``HTTPTransport._pool``) are not as expected,
:func:`make_transport` returns a plain transport and :func:`last_rx_s` None: the client
then stamps as before (after the event is parsed). ``tests/load/test_rxstamp.py`` fails
in that case, so an httpx upgrade that changes them is noticed.
"""

from __future__ import annotations

import logging
import platform
import socket
import struct
import sys
import time
from typing import Any, Iterable

import httpcore
import httpx

log = logging.getLogger(__name__)

__all__ = ["StampedStream", "StampingBackend", "make_transport", "last_rx_s", "KERNEL_STAMPS"]

#: ``SO_TIMESTAMPNS`` (= ``SCM_TIMESTAMPNS``) of Linux's generic socket ABI (asm-generic/socket.h:
#: ``SO_TIMESTAMPNS_OLD`` 35, a ``struct timespec`` of two native longs); Python's socket
#: module does not export it. Other ABIs (alpha, mips, parisc, sparc) use other numbers.
_SO_TIMESTAMPNS = 35
_TIMESPEC = struct.Struct("@ll")
_ANC_SIZE = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0
#: Whether this platform gets kernel receive stamps (else: user-space stamps at each read's return).
KERNEL_STAMPS = (sys.platform == "linux" and _ANC_SIZE > 0
                 and platform.machine().lower() in ("x86_64", "amd64", "aarch64", "arm64", "riscv64"))


class StampedStream(httpcore.NetworkStream):
    """An httpcore network stream whose reads record when their data arrived.

    Attributes:
        last_rx_ns: epoch nanoseconds (``CLOCK_REALTIME``) at which the data of the latest
            non-empty read arrived: the kernel's stamp, or the read's return when the kernel
            gave none; None before the first read.
        kernel: whether the socket has ``SO_TIMESTAMPNS`` on.
    """

    def __init__(self, inner: httpcore.NetworkStream, sock: socket.socket | None, kernel: bool):
        self._inner = inner
        self._sock = sock
        self.kernel = kernel and sock is not None
        self.last_rx_ns: int | None = None

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if not self.kernel:
            data = self._inner.read(max_bytes, timeout)
            if data:
                self.last_rx_ns = time.time_ns()
            return data
        sock = self._sock
        assert sock is not None
        try:
            sock.settimeout(timeout)
            data, anc, _flags, _addr = sock.recvmsg(max_bytes, _ANC_SIZE)
        except socket.timeout as exc:   # as httpcore's SyncStream.read maps them
            raise httpcore.ReadTimeout(exc) from exc
        except OSError as exc:
            raise httpcore.ReadError(exc) from exc
        if data:
            stamp = None
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(payload) >= _TIMESPEC.size:
                    sec, nsec = _TIMESPEC.unpack_from(payload)
                    stamp = sec * 1_000_000_000 + nsec
            self.last_rx_ns = stamp if stamp else time.time_ns()
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        # TLS records are decrypted in user space: user-space stamps from here on
        return StampedStream(self._inner.start_tls(ssl_context, server_hostname, timeout), None, False)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class StampingBackend(httpcore.NetworkBackend):
    """httpcore's ``SyncBackend`` with ``SO_TIMESTAMPNS`` on every TCP socket (where
    :data:`KERNEL_STAMPS`) and every stream a :class:`StampedStream`."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(host, port, timeout=timeout, local_address=local_address,
                                         socket_options=socket_options)
        sock = stream.get_extra_info("socket")
        kernel = False
        if KERNEL_STAMPS and sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
                kernel = True
            except OSError as exc:
                log.debug("SO_TIMESTAMPNS refused (%s): user-space stamps", exc)
        return StampedStream(stream, sock, kernel)

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        return StampedStream(self._inner.connect_unix_socket(path, timeout=timeout, socket_options=socket_options),
                             None, False)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def make_transport(limits: httpx.Limits) -> httpx.HTTPTransport:
    """An ``httpx.HTTPTransport`` (no proxy, HTTP/1.1, ``limits``) whose connections are
    :class:`StampedStream`\\ s; a plain one where httpx's internals differ (module doc)."""
    # verify=False: plain HTTP to loopback, never TLS; loading the CA bundle would cost
    # ~45 ms of CPU per client (measured here) for nothing
    transport = httpx.HTTPTransport(limits=limits, trust_env=False, verify=False)
    if not isinstance(getattr(transport, "_pool", None), httpcore.ConnectionPool):
        log.warning("httpx %s: no connection pool to stamp; chunks are stamped after parsing", httpx.__version__)
        return transport
    transport._pool = httpcore.ConnectionPool(
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=StampingBackend(),
    )
    return transport


def last_rx_s(network_stream: Any) -> float | None:
    """Epoch seconds at which the data of ``network_stream``'s latest read arrived (a
    response's ``extensions["network_stream"]``); None when it is not a
    :class:`StampedStream` or has read nothing."""
    ns = getattr(network_stream, "last_rx_ns", None)
    return ns / 1e9 if ns is not None else None

"""The fault proxy on one server's load path, shared by the families that act through it
(``network``: a toxic; ``client-abort``: streams closed by the client side): the proxy
process (:mod:`faults.proxy`, or a real toxiproxy server through its HTTP API), its API
client, and :class:`ProxiedFault`, the base that puts the proxy in front of the server at
``prepare`` (pointing ``ctx.load_urls[server]`` at it), ends it at ``release`` and after a
crash, and waits for the proxy's own measurement of a toxic as evidence.

Below the fault families: neither family imports the other.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import httpx
import psutil
from pydantic import AfterValidator, Field

from faults.base import Evidence, Fault, FaultContext, FaultParams
from harness import state as run_state
from harness.errors import FaultError
from harness.ports import port_in_use
from harness.proc import end_process, start_announced
from harness.stack.procs import same_process, send_signal_exact

log = logging.getLogger(__name__)

#: Seconds to wait for the proxy's ready line.
START_TIMEOUT_S = 10.0
_POLL_S = 0.1
_HTTP_TIMEOUT_S = 5.0


def listen_port_free(v: int) -> int:
    """Validator of a fault's ``listen_port``: 0 (any free port) or a loopback port
    nothing listens on now (:func:`harness.ports.port_in_use`, which binds with
    ``SO_REUSEADDR`` as the proxy does).

    Raises:
        ValueError: the port is in use.
    """
    if v and port_in_use("127.0.0.1", v):
        raise ValueError(f"port {v} on 127.0.0.1 is already in use; pick another or 0 for any free port")
    return v


#: A fault's ``listen_port`` (the proxy's port on 127.0.0.1): 0 for any free port, else
#: one nothing listens on now.
ListenPort = Annotated[int, Field(ge=0, le=65535), AfterValidator(listen_port_free)]


# -------------------------------------------------------------------- the proxy's API client

class ProxyClient:
    """toxiproxy's HTTP API (the subset the harness uses), for :mod:`faults.proxy` and for a
    real toxiproxy server alike. ``api``: the API's base URL (loopback)."""

    def __init__(self, api: str):
        self.api = api.rstrip("/")

    def _call(self, method: str, path: str, body: Any = None) -> httpx.Response:
        with httpx.Client(trust_env=False, timeout=_HTTP_TIMEOUT_S) as c:   # loopback: never through a proxy
            return c.request(method, self.api + path, json=body)

    def create_proxy(self, name: str, listen: str, upstream: str) -> dict[str, Any]:
        r = self._call("POST", "/proxies", {"name": name, "listen": listen, "upstream": upstream, "enabled": True})
        if r.status_code not in (200, 201):
            raise FaultError(f"toxiproxy refused the proxy: HTTP {r.status_code} {r.text[:200]}", where=self.api)
        return r.json()

    def delete_proxy(self, name: str) -> None:
        self._call("DELETE", f"/proxies/{name}")

    def add_toxic(self, proxy: str, toxic: dict[str, Any]) -> dict[str, Any]:
        """Raises FaultError when refused (the API's error text in the message)."""
        r = self._call("POST", f"/proxies/{proxy}/toxics", toxic)
        if r.status_code not in (200, 201):
            raise FaultError(f"the proxy refused toxic {toxic.get('name')}: HTTP {r.status_code} {r.text[:200]}",
                             where=self.api)
        return r.json()

    def update_toxic(self, proxy: str, name: str, toxicity: float | None = None,
                     attributes: dict[str, Any] | None = None) -> dict[str, Any]:
        """Change a toxic in place. Raises FaultError when refused."""
        body = {k: v for k, v in (("toxicity", toxicity), ("attributes", attributes)) if v is not None}
        r = self._call("POST", f"/proxies/{proxy}/toxics/{name}", body)
        if r.status_code != 200:
            raise FaultError(f"the proxy refused to update toxic {name}: HTTP {r.status_code} {r.text[:200]}",
                             where=self.api)
        return r.json()

    def remove_toxic(self, proxy: str, name: str) -> bool:
        """True when removed, False when it was not there."""
        r = self._call("DELETE", f"/proxies/{proxy}/toxics/{name}")
        return r.status_code in (200, 204)

    def toxics(self, proxy: str) -> list[dict[str, Any]]:
        return self._call("GET", f"/proxies/{proxy}/toxics").json()

    def stats(self) -> dict[str, Any] | None:
        """The fault proxy's measurements (``GET /stats``), None where the server has none."""
        try:
            r = self._call("GET", "/stats")
        except httpx.HTTPError:
            return None
        return r.json() if r.status_code == 200 else None


# -------------------------------------------------------------------- the proxy process

class ProxyProcess:
    """A running :mod:`faults.proxy` process: ``pid``, ``create_time``, ``listen`` and
    ``control`` (``host:port``), and its :class:`ProxyClient`."""

    def __init__(self, popen: subprocess.Popen, listen: str, control: str):
        self.popen, self.listen, self.control = popen, listen, control
        self.pid = popen.pid
        self.create_time = _create_time(popen.pid)
        self.client = ProxyClient(f"http://{control}")

    @classmethod
    def start(cls, name: str, upstream: str, seed: int, listen_port: int = 0,
              timeout_s: float = START_TIMEOUT_S) -> "ProxyProcess":
        """Start ``python -m faults.proxy`` (loopback only), wait for its ready line, and
        register it in the run state (role ``proxy``).

        Raises:
            FaultError: it did not start (port in use, not loopback, no ready line in time).
        """
        cmd = [sys.executable, "-m", "faults.proxy", "--name", name, "--listen", f"127.0.0.1:{listen_port}",
               "--upstream", upstream, "--seed", str(seed)]
        popen, ready = start_announced(cmd, Path(__file__).resolve().parents[1], timeout_s)
        if "listen" not in ready:
            end_process(popen)
            why = ready.get("error") or f"no ready line within {timeout_s:g} s"
            raise FaultError(f"the fault proxy did not start: {why}", where=f"network proxy for {name}",
                             hint="listen_port: pick a free port or 0")
        proc = cls(popen, ready["listen"], ready["control"])
        run_state.register_process(proc.pid, "proxy")
        log.info("fault proxy for %s: %s -> %s (pid %d, control %s)", name, proc.listen, upstream, proc.pid,
                 proc.control)
        return proc

    def stop(self) -> None:
        """End the process (SIGTERM, then SIGKILL) and forget it in the run state. Idempotent."""
        end_process(self.popen)
        run_state.unregister_process(self.pid)


def _create_time(pid: int) -> float:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return 0.0


# -------------------------------------------------------------------- the base of the proxied families

@dataclass(frozen=True)
class ProxyRoute:
    """Where and how a proxied fault puts its proxy: ``server`` (whose load path),
    ``seed`` (every random draw of the proxy), ``listen_port`` (on 127.0.0.1; 0: any free
    port), ``backend`` (``proxy``: :mod:`faults.proxy`; ``toxiproxy``: a server at
    ``toxiproxy_url``, loopback) and ``toxic_name`` (the name of the fault's toxic on it)."""

    server: str
    seed: int
    listen_port: int
    toxic_name: str
    backend: str = "proxy"
    toxiproxy_url: str | None = None


class ProxiedFault(Fault):
    """A fault that acts through a fault proxy on one server's load path (module doc).
    Subclasses give their :class:`ProxyRoute` to ``__init__``, add or arm their toxic at
    ``inject`` (:meth:`proxy_facts` for the facts), and judge the proxy's counters of it
    in ``evidence`` (:meth:`wait_for_evidence`)."""

    def __init__(self, params: FaultParams, route: ProxyRoute):
        super().__init__(params)
        self.route = route
        self.proxy: ProxyProcess | None = None
        self.client: ProxyClient | None = None
        self.proxy_name = route.server
        self.upstream: str | None = None
        self.listen: str | None = None
        self.toxic_name = route.toxic_name
        self.before: dict[str, Any] | None = None
        self.facts: dict[str, Any] | None = None

    def prepare(self, ctx: FaultContext) -> None:
        """Start the proxy (or create it on toxiproxy) and route the load through it.

        Raises:
            FaultError: unknown server; the proxy did not start.
        """
        r = self.route
        if r.server not in ctx.load_urls:
            raise FaultError(f"unknown server {r.server!r}", where=self.describe_target(ctx),
                             hint=f"known: {', '.join(sorted(ctx.load_urls))}")
        up = urlsplit(ctx.load_urls[r.server])
        self.upstream = f"{up.hostname}:{up.port or (443 if up.scheme == 'https' else 80)}"
        if r.backend == "toxiproxy":
            port = r.listen_port or _free_port()
            self.client = ProxyClient(str(r.toxiproxy_url))
            self.proxy_name = f"specchaos-{r.server}-{os.getpid()}"
            self.client.create_proxy(self.proxy_name, f"127.0.0.1:{port}", self.upstream)
            self.listen = f"127.0.0.1:{port}"
        else:
            self.proxy = ProxyProcess.start(r.server, self.upstream, r.seed, r.listen_port)
            self.client, self.listen = self.proxy.client, self.proxy.listen
        ctx.load_urls[r.server] = f"http://{self.listen}"
        ctx.timeline.emit("fault", "proxy_started", server=r.server, listen=self.listen, upstream=self.upstream,
                          backend=r.backend, pid=self.proxy.pid if self.proxy else None)

    def release(self, ctx: FaultContext) -> None:
        """End the proxy (idempotent)."""
        if self.proxy is not None:
            self.proxy.stop()
            ctx.timeline.emit("fault", "proxy_stopped", server=self.route.server, pid=self.proxy.pid)
            self.proxy = None
        elif self.client is not None and self.route.backend == "toxiproxy":
            try:
                self.client.delete_proxy(self.proxy_name)
            except httpx.HTTPError as exc:
                log.error("deleting toxiproxy proxy %s failed: %s", self.proxy_name, exc)
        self.client = None

    def proxy_client(self, ctx: FaultContext, why: str) -> ProxyClient:
        """The proxy's API client; ``why`` completes the hint when there is none.

        Raises:
            FaultError: no proxy on the load path (the fault was not prepared before the load).
        """
        if self.client is None:
            raise FaultError("no fault proxy on the load path", where=self.describe_target(ctx), hint=why)
        return self.client

    def proxy_facts(self, toxic: dict[str, Any]) -> dict[str, Any]:
        """The facts :meth:`recover` needs: ``{"toxic", "listen", "upstream", "backend",
        "proxy_pid", "proxy_create_time", "control", "proxy_name"}``."""
        return {"toxic": toxic, "listen": self.listen, "upstream": self.upstream, "backend": self.route.backend,
                "proxy_pid": self.proxy.pid if self.proxy else None,
                "proxy_create_time": self.proxy.create_time if self.proxy else None,
                "control": self.client.api if self.client else None, "proxy_name": self.proxy_name}

    def toxic_stats(self) -> dict[str, Any]:
        """This fault's toxic's counters in the proxy's ``/stats`` (``{}`` when none)."""
        st = self.client.stats() if self.client is not None else None
        return (st or {}).get("toxics", {}).get(self.toxic_name) or {}

    def wait_for_evidence(self, timeout_s: float, judge: Callable[[dict[str, Any]], Evidence]) -> Evidence:
        """``judge`` the toxic's counters (:meth:`toxic_stats`) every 0.1 s until it says
        acted or ``timeout_s`` seconds passed; its last answer."""
        deadline = time.monotonic() + timeout_s
        while True:
            ev = judge(self.toxic_stats())
            if ev.acted or time.monotonic() >= deadline:
                return ev
            time.sleep(_POLL_S)

    def proxy_gone(self) -> bool:
        """Whether the proxy process (backend ``proxy``) has ended: a toxic that cannot be
        reached then counts as cleared."""
        return self.proxy is None or self.proxy.popen.poll() is not None

    @classmethod
    def recover(cls, entry: dict[str, Any]) -> None:
        """After a crash: end the proxy process recorded in the facts (that removes every
        toxic with it); for toxiproxy, remove the toxic through its API.

        Raises:
            RuntimeError: the toxiproxy server did not answer.
        """
        facts = entry.get("facts") or {}
        pid, ct = facts.get("proxy_pid"), facts.get("proxy_create_time")
        if pid and ct and same_process(int(pid), float(ct)):
            send_signal_exact(int(pid), float(ct), signal.SIGKILL)
        elif facts.get("backend") == "toxiproxy" and facts.get("control") and facts.get("toxic"):
            try:
                ProxyClient(facts["control"]).remove_toxic(facts["proxy_name"], facts["toxic"]["name"])
            except httpx.HTTPError as exc:
                raise RuntimeError(f"toxiproxy at {facts['control']} unreachable: {exc}") from None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

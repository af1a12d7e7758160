"""vLLM metrics scraper: every server's ``/metrics`` polled (default 2 Hz) into the run's
``metrics.jsonl`` while the run lasts — recorded first, judged later
(:mod:`harness.metrics.speculation` and the ``speculation`` / ``server_memory`` checks read
the file; nothing here judges).

``metrics.jsonl``: one JSON object per scrape per server, in the order written::

    {"t": epoch s (when the answer arrived), "server": "spec"|"ref", "ok": true,
     "counters": {"vllm:spec_decode_num_drafts_total": x, "vllm:spec_decode_num_draft_tokens_total": x,
                  "vllm:spec_decode_num_accepted_tokens_total": x, "vllm:num_preemptions_total": x, ...},
     "per_position": {"0": accepted at draft position 0, "1": ...},
     "gauges": {"vllm:num_requests_running": n, "vllm:num_requests_waiting": n,
                "vllm:kv_cache_usage_perc": fraction, "process_start_time_seconds": epoch s},
     "histograms": {"vllm:time_to_first_token_seconds": {"buckets": {le: n}, "sum": s, "count": n}, ...},
     "rss_bytes": int|None, "tree_pids": [int], "pid": int|None, "incarnation": int|None, "latency_s": s}

    {"t": ..., "server": ..., "ok": false, "error": "one line", "rss_bytes": int|None, "tree_pids": [int],
     "pid": int|None, "incarnation": int|None}

Counter names as vLLM exposes the samples (with ``_total``), summed over label sets (see
:func:`harness.metrics.prometheus.parse_page`); a metric the page lacks is absent, never 0.
A scrape that fails — refused, timed out, non-200, unparsable — is a *gap* line
(``ok: false``), never zeros. ``rss_bytes`` is the resident set size summed over the
server's process tree (API process and every descendant, psutil; shared pages count once
per process, as ``ps`` shows them), None when the server has no live API process;
``tree_pids`` the processes it summed (a tree that lost its worker shows here), ``pid``
the API process, ``incarnation`` the supervisor's incarnation number of that process (0
first, +1 per restart; None where the server has no supervisor, or when a restart began
while the line was read). They are read on every line, gaps included (a frozen or busy
server still has memory). Every figure that spans time on one server is judged per
incarnation from these markers (:func:`harness.metrics.speculation.incarnation`).

Subscribers (:meth:`MetricsScraper.subscribe`) get every line dict as it is written, on
the scraper's thread of that server — e.g. a speculation circuit breaker, which must not
poll ``/metrics`` itself.

Loopback only: a server URL whose host is not loopback is refused. Bounded: one daemon
thread per server, stopped by :meth:`MetricsScraper.stop` (the session calls it on every
exit) and dying with the harness in any case.
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, runtime_checkable
from urllib.parse import urlsplit

import httpx
import psutil

from harness.clock import now
from harness.errors import SpecchaosError
from harness.metrics.prometheus import parse_page
from harness.net import LOOPBACK_HINT, LoopbackGet, is_allowed_host
from harness.stack.capabilities import ProcessRoles
from harness.timeline import Timeline

__all__ = ["METRICS_FILE", "DEFAULT_INTERVAL_S", "DEFAULT_TIMEOUT_S", "ScrapedServer", "MetricsScraper",
           "tree_memory", "tree_rss_bytes", "scrape_line", "TreeCache"]

log = logging.getLogger(__name__)

#: The run file the lines go to.
METRICS_FILE = "metrics.jsonl"
#: Seconds between two scrapes of one server (2 Hz).
DEFAULT_INTERVAL_S = 0.5
#: Seconds one scrape may take before it is a gap.
DEFAULT_TIMEOUT_S = 2.0

Line = dict[str, Any]


class ScrapedServer(Protocol):
    """What the scraper needs of a server: its URL. A server with process ids
    (:class:`harness.stack.capabilities.ProcessRoles`) also gets its tree's RSS recorded."""

    base_url: str


def tree_memory(api: psutil.Process | None,
                procs: list[psutil.Process] | None = None) -> tuple[int | None, list[int]]:
    """``(rss_bytes, pids)``: RSS summed over ``api`` and all its live descendants (or the
    ``procs`` already found), and their pids (sorted); ``(None, [])`` when ``api`` is None
    or gone. Processes that vanish while being read, and zombies (exited, not yet reaped by
    their parent: their RSS reads 0), are skipped, so a tree that is dying — vLLM's API
    process still answering ``/metrics`` while its killed engine awaits reaping — shows fewer
    ``tree_pids`` and is a different tree to the memory checks, not a swing of this one."""
    if api is None:
        return None, []
    if procs is None:
        try:
            procs = [api, *api.children(recursive=True)]
        except psutil.Error:
            return None, []
    total, pids = 0, []
    for p in procs:
        try:
            if p.status() == psutil.STATUS_ZOMBIE:   # exited, not yet reaped: no memory, not a member
                continue
            total += p.memory_info().rss
            pids.append(p.pid)
        except psutil.Error:
            continue
    return (total, sorted(pids)) if pids else (None, [])


@runtime_checkable
class Incarnated(Protocol):
    """A server that counts its incarnations (a supervised one: 0 first, +1 per restart)."""

    incarnation: int


class TreeCache:
    """The members of one server's process tree, found by walking the host's processes
    (``children(recursive=True)`` reads every process: 2-5 ms with ~100 on the host) only
    when the API process changed, a known member is gone, or ``refresh_s`` passed; in
    between, :meth:`memory` reads the known members' RSS alone. A scraping thread keeps one
    per server (vLLM's tree is fixed between restarts, and a restart changes the API pid).
    """

    def __init__(self, refresh_s: float = 5.0):
        self.refresh_s = refresh_s
        self._api: psutil.Process | None = None
        self._procs: list[psutil.Process] = []
        self._at = float("-inf")

    def memory(self, api: psutil.Process | None) -> tuple[int | None, list[int]]:
        """As :func:`tree_memory`: ``(rss_bytes, pids)`` of ``api``'s tree, ``(None, [])`` when down."""
        if api is None:
            self._api, self._procs = None, []
            return None, []
        stale = (self._api is None or self._api.pid != api.pid or time.monotonic() - self._at >= self.refresh_s)
        if not stale:
            total, pids = 0, []
            for p in self._procs:
                try:
                    if p.status() == psutil.STATUS_ZOMBIE:
                        stale = True    # a member exited (a dying tree): walk again
                        break
                    total += p.memory_info().rss
                    pids.append(p.pid)
                except psutil.Error:
                    stale = True    # a member went away: walk again
                    break
            if not stale:
                return (total, sorted(pids)) if pids else (None, [])
        try:
            self._procs = [api, *api.children(recursive=True)]
        except psutil.Error:
            self._api, self._procs = None, []
            return None, []
        self._api, self._at = api, time.monotonic()
        return tree_memory(api, self._procs)


def tree_rss_bytes(api: psutil.Process | None) -> int | None:
    """RSS (bytes) summed over ``api`` and all its live descendants (:func:`tree_memory`)."""
    return tree_memory(api)[0]


def _incarnation(server: object) -> int | None:
    """The server's incarnation number now, None without a supervisor counting them."""
    return int(server.incarnation) if isinstance(server, Incarnated) else None


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return " ".join(text.split())[:300]


def scrape_line(client: httpx.Client | LoopbackGet, name: str, server: ScrapedServer,
                tree: TreeCache | None = None) -> Line:
    """Scrape ``server`` once and return its ``metrics.jsonl`` line (module doc): ``ok``
    with the parsed page, or a gap with the reason. Never raises for a server that fails.
    ``client``: an ``httpx.Client``, or the scraping thread's :class:`harness.net.LoopbackGet`
    for ``server.base_url`` (cheaper: module doc of that class).
    ``tree``: the thread's :class:`TreeCache` for this server (None: walk the tree now)."""
    inc = _incarnation(server)
    try:   # process ids only where the launcher has them (an external server: no RSS)
        api = server.api_process() if isinstance(server, ProcessRoles) else None
    except Exception:   # noqa: BLE001 - a server object mid-restart
        api = None
    if inc is not None and _incarnation(server) != inc:   # a restart began meanwhile: which one is api?
        inc = None
    pid = api.pid if api is not None else None
    t0 = time.perf_counter()
    line: Line
    try:
        if isinstance(client, LoopbackGet):
            status, body = client.get("/metrics")
            text = body.decode("utf-8") if status == 200 else ""
        else:
            resp = client.get(f"{server.base_url}/metrics")
            status, text = resp.status_code, resp.text if resp.status_code == 200 else ""
        if status != 200:
            line = {"t": now(), "server": name, "ok": False, "error": f"HTTP {status} from /metrics"}
        else:
            line = {"t": now(), "server": name, "ok": True, **parse_page(text)}
    except (httpx.HTTPError, OSError, http.client.HTTPException, ValueError) as exc:
        # ValueError: an unparsable page (UnicodeDecodeError is one)
        line = {"t": now(), "server": name, "ok": False, "error": _one_line(exc)}
    line["rss_bytes"], line["tree_pids"] = tree_memory(api) if tree is None else tree.memory(api)
    line["pid"] = pid
    line["incarnation"] = inc
    if line["ok"]:
        line["latency_s"] = round(time.perf_counter() - t0, 6)
    return line


class MetricsScraper:
    """Scrapes every server's ``/metrics`` every ``interval_s`` into ``path`` (module doc)
    between :meth:`start` and :meth:`stop`.

    Args:
        path: the ``metrics.jsonl`` file (appended to).
        servers: ``{"spec": server, "ref": server}``; each needs ``base_url``
            (:class:`ScrapedServer`); one with process ids has ``api_process()`` read again
            on every scrape, so a restarted server is followed.
        interval_s: seconds between the starts of two scrapes of one server (> 0).
        timeout_s: seconds one scrape may take (> 0); a slower one is a gap.
        timeline: where the ``metrics_scraper`` start event goes (source ``metrics``:
            ``servers``, ``interval_s``, ``path``); None: nowhere.

    Raises:
        SpecchaosError: a server's URL is not on loopback (nor on a host the run allows:
            :func:`harness.net.is_allowed_host`).
        ValueError: ``interval_s`` or ``timeout_s`` not > 0.
    """

    def __init__(self, path: str | Path, servers: Mapping[str, ScrapedServer], interval_s: float = DEFAULT_INTERVAL_S,
                 timeout_s: float = DEFAULT_TIMEOUT_S, timeline: Timeline | None = None):
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError("interval_s and timeout_s must be > 0")
        for name, server in servers.items():
            host = urlsplit(server.base_url).hostname or ""
            if not is_allowed_host(host):
                raise SpecchaosError(f"server {name!r} is at {server.base_url}: not loopback", where="metrics scraper",
                                     hint=LOOPBACK_HINT)
        self.path = Path(path)
        self.servers = dict(servers)
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.timeline = timeline
        self._subscribers: list[Callable[[Line], None]] = []
        self._failed_subscribers: set[int] = set()
        self._lock = threading.Lock()   # one writer at a time; subscribers in write order per server
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.lines_written = 0

    def subscribe(self, callback: Callable[[Line], None]) -> None:
        """Call ``callback(line)`` with every line dict (module doc) right after it is
        written, on the scraping thread of that line's server; a callback that raises is
        logged and called again with the next line."""
        with self._lock:
            self._subscribers.append(callback)

    def start(self) -> None:
        """Start one scraping thread per server."""
        if self.timeline is not None:
            self.timeline.emit("metrics", "metrics_scraper", servers=sorted(self.servers), interval_s=self.interval_s,
                               path=self.path.name)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for name, server in self.servers.items():
            th = threading.Thread(target=self._loop, args=(name, server), name=f"metrics-{name}", daemon=True)
            self._threads.append(th)
            th.start()

    def write(self, line: Line) -> None:
        """Append ``line`` to the file and hand it to every subscriber."""
        with self._lock:
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(line) + "\n")
            self.lines_written += 1
            subscribers = list(self._subscribers)
        for cb in subscribers:
            try:
                cb(line)
            except Exception:   # noqa: BLE001 - a subscriber's bug must not stop the recording
                if id(cb) not in self._failed_subscribers:
                    self._failed_subscribers.add(id(cb))
                    log.exception("metrics subscriber %r raised (logged once; it keeps getting lines)", cb)

    def _loop(self, name: str, server: ScrapedServer) -> None:
        tree = TreeCache()
        client: LoopbackGet | None = None
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    if client is None or client.base_url != server.base_url:   # a server moved: follow it
                        if client is not None:
                            client.close()
                        client = LoopbackGet(server.base_url, self.timeout_s)
                    self.write(scrape_line(client, name, server, tree))
                except Exception as exc:   # noqa: BLE001 - e.g. the disk is full: say so, keep going
                    log.error("metrics scrape of %s failed to record: %s", name, exc)
                self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))
        finally:
            if client is not None:
                client.close()

    def stop(self) -> None:
        """Stop every scraping thread (idempotent; waits at most ``timeout_s`` + 1 s each)."""
        self._stop.set()
        for th in self._threads:
            if th.is_alive():
                th.join(timeout=self.timeout_s + 1.0)

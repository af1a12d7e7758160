"""Samplers of the stack's health: ``GET /health`` polled into the timeline.

Health alone can lie (a frozen engine still answers 200), so recovery is also judged
from real generations in the load records; this sampler only records what ``/health``
said, when, and how fast.
"""

from __future__ import annotations

import threading
import time

import httpx

from harness.timeline import Timeline

__all__ = ["HealthSampler"]


class HealthSampler:
    """Polls ``GET /health`` of one server every ``interval_s`` and writes ``health``
    timeline events (``status`` None when no HTTP answer came; ``latency_s`` seconds).
    Health alone can lie (a frozen engine still answers 200), so recovery is also
    judged from real generations in the load records."""

    def __init__(self, timeline: Timeline, server_name: str, base_url: str, interval_s: float):
        self.timeline = timeline
        self.server_name = server_name
        self.base_url = base_url
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"health-{server_name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        with httpx.Client(timeout=max(0.5, min(2.0, self.interval_s * 4))) as client:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                status: int | None
                try:
                    status = client.get(f"{self.base_url}/health").status_code
                except httpx.HTTPError:
                    status = None
                self.timeline.emit("health", "health", server=self.server_name, status=status,
                                   latency_s=round(time.perf_counter() - t0, 6))
                self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

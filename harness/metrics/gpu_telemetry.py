"""GPU telemetry sampler: every GPU's temperature, clocks, throttle reasons, memory used,
power, ECC error counts, utilisation, PCIe throughput and XID / ECC events, sampled through
NVML (:mod:`harness.gpu`) into the run's ``gpu.jsonl`` while the run lasts — recorded
first, judged later by :mod:`harness.checks.gpu` (and the GPU memory swing of
:mod:`harness.checks.server_memory`).

``gpu.jsonl``: one JSON object per GPU per sample, ``{"t": epoch s, "index", "name",
"temperature_c", "sm_clock_mhz", "mem_clock_mhz", "throttle_reasons_mask",
"throttle_reasons": [str], "memory_used_bytes", "memory_total_bytes", "power_w",
"power_limit_w", "ecc_corrected", "ecc_uncorrected", "gpu_util_pct", "memory_util_pct",
"pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "pcie_link_gen", "pcie_link_width",
"events": [{"type", "xid"}] | None, "sample_wall_ms", "sample_cpu_ms"}`` (units in the
names; None where the GPU does not support a reading; ``events`` None where it reports no
XID events; see :func:`harness.gpu.sample`). ``sample_wall_ms`` / ``sample_cpu_ms`` are the
sampler's own cost of reading that GPU once.

Timeline: one ``gpu_telemetry`` event at start, ``{"available": bool, "gpus": int,
"interval_s", "path", "events_supported": {index: bool}}`` or, on a host without an NVIDIA
GPU, ``{"available": false, "note": "no NVIDIA GPU on this host (...)"}`` — then nothing
is sampled and the run goes on.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

from harness import gpu
from harness.clock import now
from harness.jsonl import read_objects
from harness.timeline import Timeline

__all__ = ["GpuSampler", "GPU_FILE", "DEFAULT_INTERVAL_S", "read_gpu_series"]

log = logging.getLogger(__name__)

#: The run file the samples go to.
GPU_FILE = "gpu.jsonl"
#: Seconds between two samples.
DEFAULT_INTERVAL_S = 1.0


class GpuSampler:
    """Samples every GPU every ``interval_s`` seconds into ``path`` (see module doc)
    between :meth:`start` and :meth:`stop`; on a host without an NVIDIA GPU it only
    records the note."""

    def __init__(self, timeline: Timeline, path: str | Path, interval_s: float = DEFAULT_INTERVAL_S):
        self.timeline = timeline
        self.path = Path(path)
        self.interval_s = interval_s
        self.note: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Record whether there are GPUs; if so, start sampling."""
        self.note = gpu.unavailable()
        if self.note is not None:
            log.info("GPU telemetry: %s", self.note)
            self.timeline.emit("gpu", "gpu_telemetry", available=False, note=self.note)
            return
        with gpu.session():
            n = len(gpu.sample())
            watch = gpu.EventWatch()
            supported = dict(watch.supported)
            watch.close()
        self.timeline.emit("gpu", "gpu_telemetry", available=True, gpus=n, interval_s=self.interval_s,
                           path=self.path.name, events_supported={str(k): v for k, v in supported.items()})
        self._thread = threading.Thread(target=self._loop, name="gpu-telemetry", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            with gpu.session(), self.path.open("a", encoding="utf-8") as fh:
                watch = gpu.EventWatch()
                try:
                    while not self._stop.is_set():
                        t = now()
                        for s in gpu.sample(watch):
                            fh.write(json.dumps({"t": t, **s}) + "\n")
                        fh.flush()
                        self._stop.wait(self.interval_s)
                finally:
                    watch.close()
        except Exception as exc:   # noqa: BLE001 - telemetry must not end the run; the note says why
            log.error("GPU telemetry stopped: %s", exc)
            self.timeline.emit("gpu", "gpu_telemetry_stopped", error=f"{type(exc).__name__}: {exc}")

    def stop(self) -> None:
        """Stop sampling (idempotent)."""
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=5)


def read_gpu_series(path: str | Path) -> list[dict]:
    """The lines of a ``gpu.jsonl`` file in time order (see module doc); a missing file is
    empty, a line that is not a JSON object with a numeric ``t`` is skipped."""
    out = [ln for ln in read_objects(path) if isinstance(ln.get("t"), (int, float))]
    out.sort(key=lambda ln: (ln["t"], ln.get("index", 0)))
    return out

"""A stand-in for the ``pynvml`` module (``nvidia-ml-py``), driven by a scripted series, so
the GPU telemetry path — :mod:`harness.gpu` → :class:`harness.metrics.gpu_telemetry.GpuSampler`
→ ``gpu.jsonl`` → :mod:`harness.checks.gpu` — runs end to end on a host without a GPU.

Only tests use it, by putting it where :mod:`harness.gpu` keeps its NVML module
(:func:`install`: ``monkeypatch.setattr(harness.gpu, "pynvml", FakeNvml(script))``); the
harness itself imports nothing from here, so production reads the real NVML only.

A script is plain data (a dict, or a JSON file: :meth:`FakeNvml.from_file`)::

    {"gpus": [{"name": "NVIDIA H200",
               "temperature_c": [[0, 50], [60, 56]],    # piecewise linear over seconds
               "ecc_corrected": [[0, 0], [10, 0], [11, 10]],
               "throttle_reasons": [[5, 9, ["SwThermalSlowdown"]]],   # [from_s, to_s, names]
               "events": [[3, "xid", 79]],              # [at_s, type, xid]
               "pcie_tx_bytes_per_s": 2.0e9,             # a constant
               "power_w": None}],                        # None: NVML_ERROR_NOT_SUPPORTED
     "init_error": None}                                 # e.g. "library_not_found"

Field names are ``gpu.jsonl``'s, in its units (bytes/s, W, °C, MHz); the fake hands NVML's
own units to the caller (KB/s, mW). Time runs from the first ``nvmlInit`` (or the
``clock`` given: a callable returning seconds). A series is held at its first value before
its first point and at its last value after its last point. NVML returns integers for
temperatures, clocks, counts, percentages and link readings; so does the fake. Events are
delivered by every event set once their time has passed (``nvmlEventSetWait_v2``), each
once per set; ``events_supported: false`` makes the GPU refuse event registration.
Any field left out takes :data:`HEALTHY`'s value.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

from harness import gpu

__all__ = ["FakeNvml", "HEALTHY", "install", "REASON_BITS"]

#: A healthy H200-like GPU under steady load.
HEALTHY: dict[str, Any] = {
    "name": "NVIDIA H200", "temperature_c": 55, "sm_clock_mhz": 1980, "mem_clock_mhz": 3201,
    "memory_used_bytes": 40 * 2**30, "memory_total_bytes": 141 * 2**30, "power_w": 450.0, "power_limit_w": 700.0,
    "ecc_corrected": 0, "ecc_uncorrected": 0, "gpu_util_pct": 70, "memory_util_pct": 35,
    "pcie_tx_bytes_per_s": 2.0e9, "pcie_rx_bytes_per_s": 1.0e9, "pcie_link_gen": 5, "pcie_link_width": 16,
    "throttle_reasons": [], "events": [], "events_supported": True,
}

#: NVML's clock event (throttle) reason bits (``nvmlClocksEventReason*``).
REASON_BITS = {"GpuIdle": 0x1, "ApplicationsClocksSetting": 0x2, "SwPowerCap": 0x4, "HwSlowdown": 0x8,
               "SyncBoost": 0x10, "SwThermalSlowdown": 0x20, "HwThermalSlowdown": 0x40,
               "HwPowerBrakeSlowdown": 0x80, "DisplayClockSetting": 0x100}

_EVENT_BITS = {"ecc_single_bit": 0x1, "ecc_double_bit": 0x2, "xid": 0x8}
_INIT_ERRORS = {"library_not_found": 12, "driver_not_loaded": 9, "no_permission": 4}
_MESSAGES = {3: "Not Supported", 4: "Insufficient Permissions", 9: "Driver Not Loaded", 10: "Timeout",
             12: "NVML Shared Library Not Found"}


class NVMLError(Exception):
    """As pynvml's: ``value`` is the NVML return code; ``str()`` NVML's message."""

    def __init__(self, value: int):
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML error {self.value}")


class _Handle:
    def __init__(self, index: int):
        self.index = index


class _EventSet:
    def __init__(self) -> None:
        self.gpus: dict[int, int] = {}     # index -> registered type mask
        self.delivered: set[tuple[int, int]] = set()


def _at(series: Any, t: float) -> Any:
    """The value of a series at ``t``: a constant, or piecewise linear over ``[[t, v], ...]``."""
    if not isinstance(series, list):
        return series
    if not series:
        return None
    pts = sorted((float(a), b) for a, b in series)
    if t <= pts[0][0]:
        return pts[0][1]
    for (t0, v0), (t1, v1) in zip(pts, pts[1:]):
        if t <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return pts[-1][1]


class FakeNvml:
    """The subset of the ``pynvml`` module :mod:`harness.gpu` uses (module doc).

    Args:
        script: ``{"gpus": [gpu fields], "init_error": None | "library_not_found" | ...}``.
        clock: seconds since the start of the script; default: since the first ``nvmlInit``.
    """

    NVMLError = NVMLError
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_TIMEOUT = 10
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1
    nvmlEventTypeSingleBitEccError = _EVENT_BITS["ecc_single_bit"]
    nvmlEventTypeDoubleBitEccError = _EVENT_BITS["ecc_double_bit"]
    nvmlEventTypeXidCriticalError = _EVENT_BITS["xid"]

    def __init__(self, script: dict[str, Any], clock: Callable[[], float] | None = None):
        self.gpus = [{**HEALTHY, **g} for g in script.get("gpus", [])]
        self.init_error = script.get("init_error")
        self._clock = clock
        self._t0: float | None = None
        self._handles = [_Handle(i) for i in range(len(self.gpus))]
        self._lock = threading.Lock()
        #: ``nvmlInit`` minus ``nvmlShutdown`` calls, and NVML calls per function name.
        self.inits = 0
        self.calls: dict[str, int] = {}
        for name, bit in REASON_BITS.items():
            setattr(self, f"nvmlClocksEventReason{name}", bit)
        self.nvmlClocksEventReasonNone = 0
        self.nvmlClocksEventReasonAll = sum(REASON_BITS.values())

    @classmethod
    def from_file(cls, path: str | Path, **kw: Any) -> "FakeNvml":
        """A fake driven by a JSON script file."""
        return cls(json.loads(Path(path).read_text(encoding="utf-8")), **kw)

    # ------------------------------------------------------------------ time and values
    def now(self) -> float:
        """Seconds into the script."""
        if self._clock is not None:
            return self._clock()
        return 0.0 if self._t0 is None else time.monotonic() - self._t0

    def _value(self, h: _Handle, field: str) -> Any:
        self._count(field)
        v = _at(self.gpus[h.index][field], self.now())
        if v is None:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return v

    def _count(self, name: str) -> None:
        with self._lock:
            self.calls[name] = self.calls.get(name, 0) + 1

    # ------------------------------------------------------------------ life cycle
    def nvmlInit(self) -> None:
        if self.init_error:
            raise NVMLError(_INIT_ERRORS[self.init_error])
        with self._lock:
            self.inits += 1
            if self._t0 is None:
                self._t0 = time.monotonic()

    def nvmlShutdown(self) -> None:
        with self._lock:
            self.inits -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> _Handle:
        return self._handles[i]

    def nvmlDeviceGetIndex(self, h: _Handle) -> int:
        return h.index

    # ------------------------------------------------------------------ readings
    def nvmlDeviceGetName(self, h: _Handle) -> str:
        return str(self._value(h, "name"))

    def nvmlDeviceGetTemperature(self, h: _Handle, sensor: int) -> int:
        return int(self._value(h, "temperature_c"))

    def nvmlDeviceGetClockInfo(self, h: _Handle, kind: int) -> int:
        return int(self._value(h, "sm_clock_mhz" if kind == self.NVML_CLOCK_SM else "mem_clock_mhz"))

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: _Handle) -> int:
        self._count("throttle_reasons")
        spec, t = self.gpus[h.index]["throttle_reasons"], self.now()
        if spec is None:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        names = spec if spec and isinstance(spec[0], str) else \
            [n for t0, t1, ns in spec if float(t0) <= t < float(t1) for n in ns]
        mask = 0
        for n in names:
            mask |= REASON_BITS[n]
        return mask

    def nvmlDeviceGetMemoryInfo(self, h: _Handle) -> SimpleNamespace:
        used, total = int(self._value(h, "memory_used_bytes")), int(self._value(h, "memory_total_bytes"))
        return SimpleNamespace(used=used, total=total, free=total - used)

    def nvmlDeviceGetPowerUsage(self, h: _Handle) -> int:
        return int(self._value(h, "power_w") * 1000)

    def nvmlDeviceGetPowerManagementLimit(self, h: _Handle) -> int:
        return int(self._value(h, "power_limit_w") * 1000)

    def nvmlDeviceGetTotalEccErrors(self, h: _Handle, kind: int, counter: int) -> int:
        return int(self._value(h, "ecc_corrected" if kind == self.NVML_MEMORY_ERROR_TYPE_CORRECTED
                               else "ecc_uncorrected"))

    def nvmlDeviceGetUtilizationRates(self, h: _Handle) -> SimpleNamespace:
        return SimpleNamespace(gpu=int(self._value(h, "gpu_util_pct")), memory=int(self._value(h, "memory_util_pct")))

    def nvmlDeviceGetPcieThroughput(self, h: _Handle, counter: int) -> int:
        field = "pcie_tx_bytes_per_s" if counter == self.NVML_PCIE_UTIL_TX_BYTES else "pcie_rx_bytes_per_s"
        return int(self._value(h, field) / 1024)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: _Handle) -> int:
        return int(self._value(h, "pcie_link_gen"))

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: _Handle) -> int:
        return int(self._value(h, "pcie_link_width"))

    # ------------------------------------------------------------------ events
    def nvmlEventSetCreate(self) -> _EventSet:
        return _EventSet()

    def nvmlDeviceGetSupportedEventTypes(self, h: _Handle) -> int:
        if not self.gpus[h.index]["events_supported"]:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return sum(_EVENT_BITS.values())

    def nvmlDeviceRegisterEvents(self, h: _Handle, types: int, es: _EventSet) -> None:
        if not self.gpus[h.index]["events_supported"]:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        es.gpus[h.index] = es.gpus.get(h.index, 0) | types

    def nvmlEventSetWait_v2(self, es: _EventSet, timeout_ms: int) -> SimpleNamespace:
        t = self.now()
        for index, types in sorted(es.gpus.items()):
            for k, ev in enumerate(self.gpus[index]["events"]):
                at, kind = float(ev[0]), ev[1]
                if at <= t and (index, k) not in es.delivered and types & _EVENT_BITS[kind]:
                    es.delivered.add((index, k))
                    return SimpleNamespace(device=self._handles[index], eventType=_EVENT_BITS[kind],
                                           eventData=int(ev[2]) if len(ev) > 2 else 0,
                                           gpuInstanceId=0, computeInstanceId=0)
        raise NVMLError(self.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, es: _EventSet) -> None:
        es.gpus.clear()


def install(monkeypatch: Any, script: dict[str, Any] | FakeNvml, **kw: Any) -> FakeNvml:
    """Make :mod:`harness.gpu` use a fake NVML for this test (``monkeypatch`` undoes it);
    returns the fake."""
    fake = script if isinstance(script, FakeNvml) else FakeNvml(script, **kw)
    monkeypatch.setattr(gpu, "pynvml", fake)
    return fake

"""NVIDIA GPUs through NVML (the ``pynvml`` module of the ``nvidia-ml-py`` distribution):
whether there are any, one telemetry sample per GPU, and the opt-in clock and power limits
of the ``cpu-throttle`` fault (always restored).

On a host without an NVIDIA GPU (no driver, no NVML library, no device, or pynvml not
installed) :func:`unavailable` returns one line starting with :data:`NO_GPU` saying why,
and nothing here raises on import.

Units: temperatures °C, clocks MHz, memory bytes, power W (NVML reports mW; converted
here), ECC errors counts since the driver loaded (volatile), utilisation percent, PCIe
throughput bytes/s.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

try:
    import pynvml
except ImportError:   # the GPU extra is not installed: every GPU path reports it
    pynvml = None

__all__ = ["NO_GPU", "unavailable", "session", "sample", "EventWatch", "EVENT_TYPES", "lock_clocks", "reset_clocks",
           "power_limit_w", "set_power_limit_w"]

#: How every "not available on this host" line starts.
NO_GPU = "no NVIDIA GPU"

_lock = threading.Lock()


def unavailable() -> str | None:
    """None when NVML works and sees at least one GPU; else one line, e.g.
    ``"no NVIDIA GPU on this host (NVML: NVML Shared Library Not Found)"``."""
    if pynvml is None:
        return f"{NO_GPU} support: the pynvml module (distribution nvidia-ml-py) is not installed"
    try:
        with session():
            n = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as exc:
        return f"{NO_GPU} on this host (NVML: {exc})"
    return None if n > 0 else f"{NO_GPU} on this host (NVML sees 0 devices)"


@contextlib.contextmanager
def session() -> Iterator[None]:
    """``nvmlInit`` … ``nvmlShutdown`` (NVML counts its initialisations; nesting is fine).

    Raises:
        pynvml.NVMLError: NVML could not start (no driver or library).
        RuntimeError: pynvml is not installed.
    """
    if pynvml is None:
        raise RuntimeError(f"{NO_GPU} support: the pynvml module (distribution nvidia-ml-py) is not installed")
    with _lock:
        pynvml.nvmlInit()
    try:
        yield
    finally:
        with _lock:
            pynvml.nvmlShutdown()


def _try(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except pynvml.NVMLError:   # not supported on this GPU, or no permission
        return None


_REASON_BITS: "weakref.WeakKeyDictionary[Any, list[tuple[str, int]]]" = weakref.WeakKeyDictionary()


def _reason_bits() -> list[tuple[str, int]]:
    """``(name, bit)`` of every clock event (throttle) reason NVML names
    (``nvmlClocksEventReason*`` and the older ``nvmlClocksThrottleReason*``), read once per
    NVML module: scanning its ~2500 names at every reading would cost 5 ms per GPU."""
    if pynvml not in _REASON_BITS:
        found = set()
        for attr in dir(pynvml):
            for prefix in ("nvmlClocksEventReason", "nvmlClocksThrottleReason"):
                if attr.startswith(prefix) and attr not in (f"{prefix}All", f"{prefix}None"):
                    bit = getattr(pynvml, attr)
                    if isinstance(bit, int) and bit:
                        found.add((attr.removeprefix(prefix), bit))
        _REASON_BITS[pynvml] = sorted(found)
    return _REASON_BITS[pynvml]


def _throttle_reasons(mask: int | None) -> list[str]:
    if mask is None:
        return []
    return sorted({name for name, bit in _reason_bits() if mask & bit})


#: NVML event types watched, by the name ``gpu.jsonl`` gives them.
EVENT_TYPES = {"xid": "nvmlEventTypeXidCriticalError", "ecc_double_bit": "nvmlEventTypeDoubleBitEccError",
               "ecc_single_bit": "nvmlEventTypeSingleBitEccError"}


class EventWatch:
    """An NVML event set on every GPU (inside a :func:`session`): XID critical errors and
    ECC single/double-bit error events (``nvmlEventSetCreate``, ``nvmlDeviceRegisterEvents``
    with the types each GPU supports, ``nvmlDeviceGetSupportedEventTypes``).

    ``supported[i]`` is True when GPU ``i`` reports XID events (NVML does not on every GPU,
    e.g. not under WSL or on some consumer boards); :meth:`drain` then returns what arrived
    since the previous call. :meth:`close` frees the set (idempotent)."""

    def __init__(self) -> None:
        self.supported: dict[int, bool] = {}
        self._set: Any = None
        self._index_of: dict[Any, int] = {}
        n = pynvml.nvmlDeviceGetCount()
        try:
            self._set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError:
            self.supported = {i: False for i in range(n)}
            return
        xid = getattr(pynvml, EVENT_TYPES["xid"])
        wanted = 0
        for attr in EVENT_TYPES.values():
            wanted |= getattr(pynvml, attr, 0)
        for i in range(n):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            self._index_of[_handle_key(h)] = i
            try:
                types = wanted & int(pynvml.nvmlDeviceGetSupportedEventTypes(h))
                if types:
                    pynvml.nvmlDeviceRegisterEvents(h, types, self._set)
                self.supported[i] = bool(types & xid)
            except pynvml.NVMLError:
                self.supported[i] = False

    def drain(self) -> dict[int, list[dict[str, Any]]]:
        """The events waiting, per GPU index: ``{"type": "xid"|"ecc_double_bit"|"ecc_single_bit",
        "xid": int|None}`` (``xid``: the XID number, for ``xid`` events). Never blocks
        (``nvmlEventSetWait_v2`` with a 0 ms timeout until NVML says timeout)."""
        out: dict[int, list[dict[str, Any]]] = {}
        if self._set is None:
            return out
        names = {getattr(pynvml, attr, None): name for name, attr in EVENT_TYPES.items()}
        for _ in range(10_000):   # an event storm is cut here; the next sample drains the rest
            try:
                data = pynvml.nvmlEventSetWait_v2(self._set, 0)
            except pynvml.NVMLError:   # NVML_ERROR_TIMEOUT: nothing left (any other error: stop too)
                break
            index = self._index_of.get(_handle_key(data.device))
            if index is None:
                index = _try(pynvml.nvmlDeviceGetIndex, data.device)
            name = names.get(int(data.eventType), f"0x{int(data.eventType):x}")
            out.setdefault(-1 if index is None else int(index), []).append(
                {"type": name, "xid": int(data.eventData) if name == "xid" else None})
        return out

    def close(self) -> None:
        if self._set is not None:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlEventSetFree(self._set)
            self._set = None


def _handle_key(h: Any) -> Any:
    """A hashable identity of an NVML device handle (a ctypes pointer: its address)."""
    try:
        return ctypes.cast(h, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):   # not a ctypes pointer: the object itself
        return id(h)


def sample(events: EventWatch | None = None) -> list[dict[str, Any]]:
    """One sample of every GPU (inside a :func:`session`)::

        [{"index", "name", "temperature_c", "sm_clock_mhz", "mem_clock_mhz",
          "throttle_reasons_mask", "throttle_reasons": [str], "memory_used_bytes",
          "memory_total_bytes", "power_w", "power_limit_w", "ecc_corrected", "ecc_uncorrected",
          "gpu_util_pct", "memory_util_pct", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s",
          "pcie_link_gen", "pcie_link_width", "events": [event] | None,
          "sample_wall_ms", "sample_cpu_ms"}]

    A value NVML does not support on a GPU is None. ``gpu_util_pct`` and
    ``memory_util_pct`` are NVML's utilisation rates (``nvmlDeviceGetUtilizationRates``:
    the percent of the last sample period in which a kernel ran, and in which device memory
    was read or written; nvidia-smi's GPU-Util and Memory-Util). PCIe throughput is NVML's
    (``nvmlDeviceGetPcieThroughput``, KB/s over a 20 ms window, taken as KiB/s), per
    direction; link generation and width are the current ones. ``events``: what ``events``
    (:class:`EventWatch`) drained for this GPU since the previous sample; None when no
    watch is given or the GPU does not report XID events. ``sample_wall_ms`` and
    ``sample_cpu_ms``: what reading this GPU cost the sampler (wall clock, and CPU time of
    the sampling thread).
    """
    drained = events.drain() if events is not None else {}
    out = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        wall0, cpu0 = time.perf_counter(), time.thread_time()
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        reasons_fn = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        mask = _try(reasons_fn, h)
        mem = _try(pynvml.nvmlDeviceGetMemoryInfo, h)
        power = _try(pynvml.nvmlDeviceGetPowerUsage, h)
        limit = _try(pynvml.nvmlDeviceGetPowerManagementLimit, h)
        name = _try(pynvml.nvmlDeviceGetName, h)
        util = _try(pynvml.nvmlDeviceGetUtilizationRates, h)
        tx = _try(pynvml.nvmlDeviceGetPcieThroughput, h, pynvml.NVML_PCIE_UTIL_TX_BYTES)
        rx = _try(pynvml.nvmlDeviceGetPcieThroughput, h, pynvml.NVML_PCIE_UTIL_RX_BYTES)
        row = {
            "index": i, "name": name.decode() if isinstance(name, bytes) else name,
            "temperature_c": _try(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU),
            "sm_clock_mhz": _try(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": _try(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM),
            "throttle_reasons_mask": mask, "throttle_reasons": _throttle_reasons(mask),
            "memory_used_bytes": getattr(mem, "used", None), "memory_total_bytes": getattr(mem, "total", None),
            "power_w": None if power is None else power / 1000.0,
            "power_limit_w": None if limit is None else limit / 1000.0,
            "ecc_corrected": _try(pynvml.nvmlDeviceGetTotalEccErrors, h, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                  pynvml.NVML_VOLATILE_ECC),
            "ecc_uncorrected": _try(pynvml.nvmlDeviceGetTotalEccErrors, h,
                                    pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC),
            "gpu_util_pct": getattr(util, "gpu", None), "memory_util_pct": getattr(util, "memory", None),
            "pcie_tx_bytes_per_s": None if tx is None else tx * 1024,
            "pcie_rx_bytes_per_s": None if rx is None else rx * 1024,
            "pcie_link_gen": _try(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
            "pcie_link_width": _try(pynvml.nvmlDeviceGetCurrPcieLinkWidth, h),
            "events": drained.get(i, []) if events is not None and events.supported.get(i) else None,
        }
        row["sample_wall_ms"] = round((time.perf_counter() - wall0) * 1000, 4)
        row["sample_cpu_ms"] = round((time.thread_time() - cpu0) * 1000, 4)
        out.append(row)
    return out


def lock_clocks(max_mhz: int) -> list[int]:
    """Lock every GPU's SM clock to at most ``max_mhz`` (``nvmlDeviceSetGpuLockedClocks``
    with 0 as the floor; needs root). Returns the indices locked.

    Raises:
        pynvml.NVMLError: refused (no permission, not supported); GPUs locked before the
            failing one are reset first.
    """
    done: list[int] = []
    with session():
        try:
            for i in range(pynvml.nvmlDeviceGetCount()):
                pynvml.nvmlDeviceSetGpuLockedClocks(pynvml.nvmlDeviceGetHandleByIndex(i), 0, int(max_mhz))
                done.append(i)
        except pynvml.NVMLError:
            reset_clocks(done)
            raise
    return done


def reset_clocks(indices: list[int]) -> None:
    """Undo :func:`lock_clocks` on those GPUs (``nvmlDeviceResetGpuLockedClocks``).

    Raises:
        pynvml.NVMLError: NVML refused.
    """
    with session():
        for i in indices:
            pynvml.nvmlDeviceResetGpuLockedClocks(pynvml.nvmlDeviceGetHandleByIndex(i))


def power_limit_w() -> dict[int, float]:
    """Every GPU's current power limit, W (to restore after :func:`set_power_limit_w`)."""
    with session():
        return {i: pynvml.nvmlDeviceGetPowerManagementLimit(pynvml.nvmlDeviceGetHandleByIndex(i)) / 1000.0
                for i in range(pynvml.nvmlDeviceGetCount())}


def set_power_limit_w(limits: dict[int, float]) -> None:
    """Set each GPU's power limit, W (``nvmlDeviceSetPowerManagementLimit``; needs root).

    Raises:
        pynvml.NVMLError: refused, or outside the GPU's allowed range.
    """
    with session():
        for i, watts in limits.items():
            pynvml.nvmlDeviceSetPowerManagementLimit(pynvml.nvmlDeviceGetHandleByIndex(int(i)), int(watts * 1000))

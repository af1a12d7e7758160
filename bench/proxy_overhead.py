"""Benchmark: what the fault proxy (no toxics) adds between the load and a real vLLM server.

The same server (the speculative server of the local stack, tiny models, CPU) and the same
workload (the harness's prompt set and streaming client, greedy), direct and through
:mod:`faults.proxy` in one run, in alternating rounds so drift of the server hits both
paths alike:

* latency: ``rounds`` × one request per prompt, sequentially, direct then proxied back to
  back (a pair); ``added_p50_ms`` is the median of the pairs' TTFT differences (proxied −
  direct), ``added_p99_ms`` the difference of the two paths' TTFT p99 — both carry the
  server's own noise, which on a shared 2-core machine dwarfs the proxy;
* throughput: ``users`` concurrent closed-loop clients for ``seconds`` per path, output
  tokens/s; ``throughput_ratio`` is proxied ÷ direct;
* the proxy's own measurement of its pass-through delay (arrival → written, per chunk of
  the same workload: ``proxy_passthrough_ms``), free of the server's noise but without the
  extra loopback hop (tens of µs);
* the load average before and after (how shared the machine was).

Not run by CI. Run it under the shared lock (it starts a vLLM server)::

    flock /tmp/specchaos-vllm.lock python bench/proxy_overhead.py [--rounds 6] [--users 4] [--seconds 20]

or against a server already running (no lock, no vLLM: e.g. ``bench/sse_server.py``, whose
answers cost next to nothing, so the proxy's own clock is all that is measured)::

    python bench/sse_server.py --port 18080 --chunks 32 &
    python bench/proxy_overhead.py --upstream 127.0.0.1:18080

Its last line is a JSON object with ``added_p50_ms``, ``added_p99_ms``, ``throughput_ratio``
(targets: ≤ 0.5 ms, ≤ 2 ms, ≥ 0.9) and the raw figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from faults.proxied import ProxyProcess  # noqa: E402
from harness.load.client import make_client, stream_completion  # noqa: E402
from harness.load.prompts import build_prompt_set  # noqa: E402
from harness.stack.config import StackConfig  # noqa: E402
from harness.stack.local import LocalStack  # noqa: E402
from harness.stack.models import build_models  # noqa: E402
from harness.timeline import Timeline  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def throughput(url: str, model: str, prompts: list, users: int, seconds: float) -> float:
    """Output tokens/s of ``users`` closed-loop streaming clients for ``seconds``."""
    tokens = [0] * users
    end = time.monotonic() + seconds

    def user(i: int) -> None:
        with make_client(2) as c:
            k = i
            while time.monotonic() < end:
                r = stream_completion(c, url, model, prompts[k % len(prompts)], timeout_s=60)
                if r.ok and time.monotonic() <= end:
                    tokens[i] += r.output_tokens or 0
                k += users

    t0 = time.monotonic()
    threads = [threading.Thread(target=user, args=(i,)) for i in range(users)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(tokens) / (time.monotonic() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--users", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--upstream", help="host:port of a running completions server to measure against instead of "
                                       "starting the local stack (e.g. bench/sse_server.py)")
    args = ap.parse_args()
    models = ROOT / "models"
    build_models(models)
    prompts = build_prompt_set(models / "target", seed=1234, short=8, medium=4, long=0, max_tokens=32)
    if args.upstream:
        return measure(f"http://{args.upstream}", "bench", prompts, args)
    run_dir = Path(tempfile.mkdtemp(prefix="proxy-bench-"))
    stack = LocalStack(StackConfig(models_dir=str(models), reference=False), run_dir,
                       timeline=Timeline(run_dir / "timeline.jsonl"))
    try:
        stack.start()
        return measure(stack.servers["spec"].base_url, stack.servers["spec"].model, prompts, args)
    finally:
        stack.stop()


def measure(direct: str, model: str, prompts: list, args: argparse.Namespace) -> int:
    """Direct and through a fresh proxy to ``direct`` (module doc); prints the JSON line."""
    proxy = ProxyProcess.start("spec", direct.split("//")[1], 1234)
    try:
        via = f"http://{proxy.listen}"
        load_before = os.getloadavg()
        pairs: list[float] = []
        ttft: dict[str, list[float]] = {"direct": [], "proxy": []}
        e2e: dict[str, list[float]] = {"direct": [], "proxy": []}
        with make_client(2) as c:
            for p in prompts[:2]:                      # warm both paths
                stream_completion(c, direct, model, p, timeout_s=60)
                stream_completion(c, via, model, p, timeout_s=60)
            for _ in range(args.rounds):
                for p in prompts:
                    got = {}
                    for name, url in (("direct", direct), ("proxy", via)):
                        r = stream_completion(c, url, model, p, timeout_s=60)
                        if r.ok:
                            ttft[name].append(r.ttft_s * 1000)
                            e2e[name].append(r.e2e_s * 1000)
                            got[name] = r.ttft_s * 1000
                    if len(got) == 2:
                        pairs.append(got["proxy"] - got["direct"])
        tput = {"direct": [], "proxy": []}
        for _ in range(2):                             # alternate: direct, proxy, direct, proxy
            for name, url in (("direct", direct), ("proxy", via)):
                tput[name].append(throughput(url, model, prompts, args.users, args.seconds / 2))
        inner = proxy.client.stats()["passthrough_ms"]
        result = {
            "added_p50_ms": round(pct(pairs, 50), 3),
            "added_p99_ms": round(pct(ttft["proxy"], 99) - pct(ttft["direct"], 99), 3),
            "throughput_ratio": round(sum(tput["proxy"]) / sum(tput["direct"]), 4),
            "requests_per_path": len(ttft["direct"]),
            "ttft_ms": {k: {"p50": round(pct(v, 50), 3), "p99": round(pct(v, 99), 3)} for k, v in ttft.items()},
            "e2e_ms": {k: {"p50": round(pct(v, 50), 3), "p99": round(pct(v, 99), 3)} for k, v in e2e.items()},
            "added_e2e_p50_ms": round(pct(e2e["proxy"], 50) - pct(e2e["direct"], 50), 3),
            "output_tokens_per_s": {k: [round(x, 1) for x in v] for k, v in tput.items()},
            "proxy_passthrough_ms": inner,
            "loadavg_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        }
        print(json.dumps(result))
        return 0
    finally:
        proxy.stop()


if __name__ == "__main__":
    sys.exit(main())

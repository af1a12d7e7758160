"""Benchmark: how late the open loop's pacer sends its arrivals at a given rate.

No vLLM: the trivial streaming server of :mod:`bench.sse_server` answers every completion
at once with a short vLLM-shaped SSE stream. The client is the harness's real load process
(:class:`harness.load.locust_process.LocustProcess`, locust + gevent) with an open-loop
profile at each ``--rates`` value for ``--seconds``; the pacer records every arrival's lag
(start minus planned instant) in its histogram (:mod:`harness.load.lag`), and this script
prints the figures from ``load_stats.json`` for each rate side by side: lag p50/p95/p99/max
in ms and the share of arrivals later than 1 ms and 10 ms. Target (issue: arrivals on time):
p99 <= 1 ms at 200 req/s on a quiet host. Best run on an otherwise idle machine; on the
shared 2-core machine take the vLLM lock so no vLLM runs meanwhile::

    flock /tmp/specchaos-vllm.lock .venv/bin/python bench/pacer_lag.py [--rates 50,200,500] [--seconds 20]

Its last line is a JSON object: ``{"rates": {RATE: {...figures...}}, "p99_ms_at_200": ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from harness.load.config import LoadConfig  # noqa: E402
from harness.load.locust_process import LocustProcess  # noqa: E402
from harness.load.profiles import read_load_stats  # noqa: E402
from harness.load.prompts import Prompt, save_prompt_set  # noqa: E402
from sse_server import serving  # noqa: E402


def run_rate(url: str, work: Path, rate: float, seconds: float) -> dict[str, Any]:
    d = work / f"rate{rate:g}"
    d.mkdir()
    cfg = LoadConfig(max_tokens=8, request_timeout_s=30, max_requests=10_000_000,
                     profile={"kind": "open", "rate": rate, "max_in_flight": 1024})
    load = LocustProcess(url, prompts_path=work / "prompts.json", records_path=d / "records.jsonl",
                         model="gap:1", cfg=cfg, run_time_s=seconds + 60, log_path=d / "locust.log",
                         stop_timeout_s=5, startup_check_s=0.5)
    load.start()
    try:
        time.sleep(seconds)
    finally:
        load.stop(timeout_s=15)
    stats = read_load_stats(d / "load_stats.json") or {}

    def ms(key: str) -> float | None:
        v = stats.get(key)
        return None if v is None else round(v * 1000, 3)
    return {"arrivals": stats.get("arrivals"), "dropped": stats.get("dropped"),
            "p50_ms": ms("lag_p50_s"), "p95_ms": ms("lag_p95_s"), "p99_ms": ms("lag_p99_s"),
            "max_ms": ms("lag_max_s"), "share_late_1ms": stats.get("share_late_1ms"),
            "share_late_10ms": stats.get("share_late_10ms")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="50,200,500", help="arrival rates per second, comma-separated")
    ap.add_argument("--seconds", type=float, default=20.0, help="load time per rate (default 20)")
    ap.add_argument("--quick", action="store_true", help="3 s at 50 and 200 req/s (tests)")
    args = ap.parse_args()
    if args.quick:
        args.rates, args.seconds = "50,200", 3.0
    try:
        rates = [float(x) for x in args.rates.split(",") if x.strip()]
    except ValueError:
        print(f"--rates: not a list of numbers: {args.rates!r}", file=sys.stderr)
        return 2
    if not rates or any(r <= 0 for r in rates) or args.seconds <= 0:
        print("--rates and --seconds must be > 0", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="pacer-bench-"))
    save_prompt_set(work / "prompts.json", [Prompt(i, "short", f"benchmark prompt {i}", 4, 8) for i in range(16)])
    with serving(2, 4, 1.0) as (url, _srv):
        if url is None:
            return 1
        load_before = os.getloadavg()[0]
        results = {f"{r:g}": run_rate(url, work, r, args.seconds) for r in rates}
    print(f"{'rate/s':>8} {'arrivals':>9} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'max ms':>8} {'>1ms':>7} {'>10ms':>7}")
    for rate, r in results.items():
        def f(v: Any) -> str:
            return "-" if v is None else f"{v:.3f}"

        def pct(v: Any) -> str:
            return "-" if v is None else f"{v * 100:.2f}%"
        print(f"{rate:>8} {r['arrivals'] or 0:>9} {f(r['p50_ms']):>8} {f(r['p95_ms']):>8} {f(r['p99_ms']):>8} "
              f"{f(r['max_ms']):>8} {pct(r['share_late_1ms']):>7} {pct(r['share_late_10ms']):>7}")
    print(json.dumps({"rates": results, "p99_ms_at_200": (results.get("200") or {}).get("p99_ms"),
                      "seconds": args.seconds, "loadavg_1m_before_after": [round(load_before, 2),
                                                                          round(os.getloadavg()[0], 2)],
                      "work_dir": str(work)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

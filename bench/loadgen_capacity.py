"""Benchmark: how many streamed requests per second one harness load process sustains on one
core, and how exactly it timestamps what arrives.

No vLLM: a trivial streaming server (:mod:`bench.sse_server`, asyncio, on its own core)
answers every completion at once with a vLLM-shaped SSE stream of ``--chunks`` output
chunks ``--gap-ms`` apart, each stamped with the server's send time. The client is the
harness's real load process (:class:`harness.load.locust_process.LocustProcess`: locust,
gevent, :func:`harness.load.client.stream_completion`, one record per request appended to
records.jsonl), pinned to one core with ``sched_setaffinity``:

* **capacity**: ``--users`` closed-loop users (enough to keep the client busy), chunks
  ``--gap-ms`` apart, for ``--seconds``. ``requests_per_s_per_core`` = complete requests
  that ended in the window ÷ the load process's CPU seconds in it (user + system, psutil),
  i.e. requests per second of one whole core; on an idle machine the client saturates its
  core and this equals the wall-clock rate (``capacity.requests_per_s``, reported beside it
  with ``client_cpu_percent``); on a shared machine the other processes on that core take
  part of it, and the wall-clock rate understates what a core sustains. The server's CPU
  share says whether it, not the client, was the limit.
* **timing**: ``--timing-users`` users (the default experiment's load: 4) against responses
  paced like the tiny vLLM's (``--timing-gap-ms`` 20 ms between chunks: about 25
  requests/s, the default experiment's rate) for ``--timing-seconds``; for every output
  chunk, the client's arrival instant (its record's ``send_time`` + chunk offset, TTFT for
  the first: the kernel's receive stamp of the chunk's data, :mod:`harness.load.rxstamp`)
  minus the server's send instant (both the same machine's wall clock);
  ``timing_error_ms`` is the median of that lateness, with p99 and max beside it (loopback
  transit included, so never 0). The same figures at capacity are reported as
  ``timing_at_capacity`` (a saturated client queues chunks: that is its limit, not its
  accuracy). The timing run's load process is not pinned (as the harness runs it) unless
  ``--pin-timing``: on a busy machine a pinned process waits for its one core.

Not run by CI (tests/bench runs ``--quick`` and checks the output's shape only). Best run
on an otherwise idle machine; on the shared 2-core machine take the vLLM lock so no vLLM
runs meanwhile::

    flock /tmp/specchaos-vllm.lock .venv/bin/python bench/loadgen_capacity.py [--seconds 20] [--users 32]

Its last line is a JSON object with ``requests_per_s_per_core`` and ``timing_error_ms``
(targets: >= 500 and <= 1 ms) and the detail.
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

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from harness.load.config import LoadConfig  # noqa: E402
from harness.load.locust_process import LocustProcess  # noqa: E402
from harness.load.prompts import Prompt, save_prompt_set  # noqa: E402
from harness.load.records import RequestRecord, read_records  # noqa: E402
from sse_server import send_times_ns, serving  # noqa: E402


def lateness_ms(records: list[RequestRecord]) -> list[float]:
    """Per output chunk of every ok record: client arrival − server send, ms."""
    out: list[float] = []
    for r in records:
        if not r.ok:
            continue
        sent = send_times_ns(r.text)
        if len(sent) != len(r.chunk_offsets_s):
            continue
        out.extend(((r.send_time + off) - ns / 1e9) * 1000.0 for off, ns in zip(r.chunk_offsets_s, sent))
    return out


def timing(records: list[RequestRecord]) -> dict[str, Any]:
    late = lateness_ms(records)
    ttft = [((r.send_time + r.chunk_offsets_s[0]) - send_times_ns(r.text)[0] / 1e9) * 1000.0
            for r in records if r.ok and r.chunk_offsets_s and send_times_ns(r.text)]
    if not late:
        return {"chunks": 0, "p50_ms": None, "p99_ms": None, "max_ms": None, "ttft_p50_ms": None}
    return {"chunks": len(late), "p50_ms": round(float(np.median(late)), 4),
            "p99_ms": round(float(np.percentile(late, 99)), 4), "max_ms": round(max(late), 4),
            "min_ms": round(min(late), 4), "ttft_p50_ms": round(float(np.median(ttft)), 4) if ttft else None}


def cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def run_load(url: str, work: Path, name: str, users: int, seconds: float, warm_s: float, cpu: int | None,
             server: psutil.Process, chunks: int, tpc: int, gap_ms: float) -> dict[str, Any]:
    d = work / name
    d.mkdir()
    cfg = LoadConfig(users=users, spawn_rate=1000, max_tokens=chunks * tpc, request_timeout_s=30,
                     max_requests=10_000_000)
    load = LocustProcess(url, prompts_path=work / "prompts.json", records_path=d / "records.jsonl",
                         model=f"gap:{gap_ms:g}",
                         cfg=cfg, run_time_s=warm_s + seconds + 60, log_path=d / "locust.log",
                         stop_timeout_s=5, startup_check_s=0.5)
    load.start()
    try:
        proc = psutil.Process(load.pid)
        if cpu is not None:
            proc.cpu_affinity([cpu])
        time.sleep(warm_s)
        t0, c0, s0 = time.time(), cpu_s(proc), cpu_s(server)
        time.sleep(seconds)
        t1, c1, s1 = time.time(), cpu_s(proc), cpu_s(server)
    finally:
        load.stop(timeout_s=15)
    records = [r for r in read_records(d / "records.jsonl") if r.source == "load"]
    window = [r for r in records if r.end_time is not None and t0 <= r.end_time < t1]
    ok = [r for r in window if r.ok]
    return {"users": users, "window_s": round(t1 - t0, 3), "requests": len(window), "ok": len(ok),
            "requests_per_s": round(len(ok) / (t1 - t0), 1),
            "requests_per_cpu_s": round(len(ok) / (c1 - c0), 1) if c1 > c0 else None,
            "client_cpu_ms_per_request": round((c1 - c0) * 1000 / len(ok), 3) if ok else None,
            "client_cpu_percent": round((c1 - c0) / (t1 - t0) * 100, 1),
            "server_cpu_percent": round((s1 - s0) / (t1 - t0) * 100, 1),
            "errors": sorted({str(r.error) for r in window if not r.ok}),
            "timing": timing(ok)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="capacity window (default 20)")
    ap.add_argument("--users", type=int, default=32, help="users in the capacity run (default 32)")
    ap.add_argument("--timing-seconds", type=float, default=10.0)
    ap.add_argument("--timing-users", type=int, default=4)
    ap.add_argument("--warm-s", type=float, default=2.0, help="load before each window")
    ap.add_argument("--chunks", type=int, default=8, help="output chunks per response (default 8)")
    ap.add_argument("--tokens-per-chunk", type=int, default=4)
    ap.add_argument("--gap-ms", type=float, default=1.0, help="gap between chunks in the capacity run (default 1)")
    ap.add_argument("--timing-gap-ms", type=float, default=20.0, help="gap between chunks in the timing run (default 20)")
    ap.add_argument("--client-cpu", type=int, default=None, help="core of the load process (default: the last)")
    ap.add_argument("--server-cpu", type=int, default=None, help="core of the server (default: the first)")
    ap.add_argument("--pin-timing", action="store_true",
                    help="pin the timing run's load process too (default: as the harness runs it, unpinned)")
    ap.add_argument("--quick", action="store_true", help="2 s windows, 8 users (tests)")
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.timing_seconds, args.users, args.warm_s = 2.0, 2.0, 8, 1.0
    for name in ("seconds", "users", "timing_seconds", "timing_users", "chunks", "tokens_per_chunk"):
        if getattr(args, name) <= 0:
            print(f"--{name.replace('_', '-')} must be > 0", file=sys.stderr)
            return 2
    cores = sorted(os.sched_getaffinity(0))
    client_cpu = args.client_cpu if args.client_cpu is not None else cores[-1]
    server_cpu = args.server_cpu if args.server_cpu is not None else cores[0]
    if len(cores) < 2:
        client_cpu = server_cpu = None   # one core: nothing to pin apart (the figure then counts both)
    work = Path(tempfile.mkdtemp(prefix="loadgen-bench-"))
    tpc = args.tokens_per_chunk
    save_prompt_set(work / "prompts.json",
                    [Prompt(i, "short", f"benchmark prompt {i}", 4, args.chunks * tpc) for i in range(16)])
    with serving(args.chunks, tpc, args.gap_ms, server_cpu) as (url, srv):
        if url is None:
            return 1
        server = psutil.Process(srv.pid)
        load_before = os.getloadavg()[0]
        cap = run_load(url, work, "capacity", args.users, args.seconds, args.warm_s, client_cpu, server,
                       args.chunks, tpc, args.gap_ms)
        tim = run_load(url, work, "timing", args.timing_users, args.timing_seconds, args.warm_s,
                       client_cpu if args.pin_timing else None, server, args.chunks, tpc, args.timing_gap_ms)
    result = {
        "requests_per_s_per_core": cap["requests_per_cpu_s"],
        "timing_error_ms": tim["timing"]["p50_ms"],
        "timing_error_p99_ms": tim["timing"]["p99_ms"],
        "capacity": {k: v for k, v in cap.items() if k != "timing"},
        "timing": {k: v for k, v in tim.items() if k != "timing"} | tim["timing"],
        "timing_at_capacity": cap["timing"],
        "settings": {"chunks": args.chunks, "tokens_per_chunk": tpc, "gap_ms": args.gap_ms,
                     "timing_gap_ms": args.timing_gap_ms, "timing_pinned": args.pin_timing,
                     "client_cpu": client_cpu, "server_cpu": server_cpu, "cores": len(cores)},
        "loadavg_1m_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "work_dir": str(work),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

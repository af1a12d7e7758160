"""Benchmark: what judging a run costs as its records grow (``specchaos report DIR``).

A template run directory (``--template DIR``, any finished run; default: one short run of the
default experiment on the fake vLLM, made here in seconds) is copied once per size with its
load records repeated to that many (each copy a new request and logical id, the same
instants, so phases and verdict stay the template's), then judged again by
``python -m harness.cli report DIR`` in a child process. For each size it prints the
records, the wall time, the child's peak RSS (``wait4``'s ``ru_maxrss``), seconds per 100k
records and both figures as ratios to the smallest size, side by side in one run (these
machines are shared: compare ratios, not absolute seconds). Issue target: 1M records in
<= 60 s and <= 1 GB RSS on 2 cores, time linear in records.

    .venv/bin/python bench/judge_scale.py [--sizes 10000,100000,1000000,3000000] [--template DIR]

Its last line is JSON: ``{"rows": [{"records", "seconds", "peak_rss_mb", "verdict"}, ...]}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def template_run(work: Path) -> Path:
    """One short run of the default experiment on the fake vLLM (the test suite's fast path)."""
    from harness.experiment.runner import run
    from tests.experiment.fast_e2e import fast_experiment
    exp = fast_experiment(work, "template")
    out = work / "template-run"
    run(str(exp), str(out))
    return out


def grow(template: Path, dest: Path, n: int) -> int:
    """``dest``: the template with its load records repeated to ``n`` (the reference and the
    rest as they are). Returns the records written."""
    shutil.copytree(template, dest, ignore=shutil.ignore_patterns("allure-results", "*.png", "logs"))
    lines = (template / "records.jsonl").read_text(encoding="utf-8").splitlines()
    base = [json.loads(line) for line in lines if line.strip()]
    load = [r for r in base if r.get("source") == "load"] or base
    written = 0
    with open(dest / "records.jsonl", "w", encoding="utf-8") as fh:
        copy = 0
        while written < n:
            for r in load:
                if written >= n:
                    break
                r2 = dict(r, request_id=f"{r['request_id']}-{copy}", logical_id=f"{r.get('logical_id', '')}-{copy}")
                fh.write(json.dumps(r2, separators=(",", ":")) + "\n")
                written += 1
            copy += 1
    return written


def judge(run_dir: Path) -> tuple[float, float, str]:
    """``(seconds, peak RSS in MB, verdict)`` of ``specchaos report run_dir`` in a child."""
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "report", str(run_dir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    _, _status, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    seconds = time.monotonic() - t0
    verdict = json.loads((run_dir / "report.json").read_text()).get("verdict", "?")
    return seconds, usage.ru_maxrss / 1024, verdict


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10000,100000,1000000,3000000", help="record counts, comma-separated")
    ap.add_argument("--template", type=Path, default=None, help="a finished run directory (default: made here)")
    ap.add_argument("--quick", action="store_true", help="2000 and 20000 records (tests)")
    args = ap.parse_args()
    if args.quick:
        args.sizes = "2000,20000"
    try:
        sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    except ValueError:
        print(f"--sizes: not a list of integers: {args.sizes!r}", file=sys.stderr)
        return 2
    if not sizes or any(n <= 0 for n in sizes):
        print("--sizes must be > 0", file=sys.stderr)
        return 2
    if args.template is not None and not (args.template / "records.jsonl").is_file():
        print(f"--template {args.template}: not a run directory (no records.jsonl)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="judge-scale-"))
    try:
        template = args.template or template_run(work)
        rows: list[dict[str, Any]] = []
        for n in sizes:
            d = work / f"n{n}"
            written = grow(template, d, n)
            seconds, rss, verdict = judge(d)
            rows.append({"records": written, "seconds": round(seconds, 2), "peak_rss_mb": round(rss, 1),
                         "verdict": verdict})
            shutil.rmtree(d, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    first = rows[0]
    print(f"{'records':>9} {'seconds':>9} {'peak RSS MB':>12} {'s/100k':>8} {'time x':>7} {'RSS x':>6} verdict")
    for r in rows:
        print(f"{r['records']:>9} {r['seconds']:>9.2f} {r['peak_rss_mb']:>12.1f} "
              f"{r['seconds'] / r['records'] * 1e5:>8.2f} {r['seconds'] / first['seconds']:>7.2f} "
              f"{r['peak_rss_mb'] / first['peak_rss_mb']:>6.2f} {r['verdict']}")
    print(json.dumps({"rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

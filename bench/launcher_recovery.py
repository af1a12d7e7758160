"""Benchmark: recovery from the default kill experiment, Docker launcher against local
processes, measured side by side in one invocation.

Runs ``experiments/kill-draft-worker.yaml`` (in its CI form unless ``--full``: the phases
of :data:`tests.experiment.files.CI_PHASES`) ``--repeat`` times with each launcher, in
turn (local, docker, local, docker...), each run a ``specchaos run`` of its own (the CLI:
its own stack start, real SIGKILL of the VLLM::Worker, the supervisor's restart: a process
tree locally, a new container with docker). Printed per launcher: the verdict, the
supervisor's restart (``restart_seen_after_s`` of the fault's evidence: signal → the new
incarnation ready), the recovery figures of ``report.json`` (``time_to_healthy_s``,
``time_to_first_success_s``, ``time_to_slo_s``: from the fault, seconds) and the stack's
first start (``server_ready`` ``startup_s`` of spec); then the docker ÷ local ratio of each
median. The host is shared and noisy: read ratios, not absolute times.

The last line is a JSON object: ``{"local": {figure: [s...]}, "docker": {...},
"ratios": {figure: docker median / local median}}``. Needs a Docker engine
(``export "$(ci/docker-engine.sh start)"``). Exit 0; 1 when a run did not pass; 2 on bad
arguments or no engine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.errors import StackError  # noqa: E402
from harness.stack.docker_engine import engine_client  # noqa: E402
from tests.experiment.files import ci_form  # noqa: E402

FIGURES = ("restart_seen_after_s", "time_to_healthy_s", "time_to_first_success_s", "time_to_slo_s", "startup_s")


def one_run(tmp: Path, launcher: str, n: int, full: bool) -> dict:
    """One ``specchaos run`` with ``launcher``; its figures (see module doc) and verdict."""
    doc = yaml.safe_load((ROOT / "experiments" / "kill-draft-worker.yaml").read_text())
    if not full:
        ci_form(doc)
    doc["configuration"]["specchaos"]["stack"]["models_dir"] = str(ROOT / "models")
    exp = tmp / f"{launcher}-{n}.yaml"
    exp.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = tmp / f"{launcher}-{n}"
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "harness.cli", "run", str(exp), "--out", str(out), "--launcher", launcher,
                    "--no-progress"], cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1200)
    rep = json.loads((out / "report.json").read_text())
    ev = ((rep.get("faults") or [{}])[0].get("evidence") or {}).get("observations") or {}
    events = [json.loads(line) for line in (out / "timeline.jsonl").read_text().splitlines()]
    startup = next((e.get("startup_s") for e in events if e.get("event") == "server_ready"
                    and e.get("server") == "spec"), None)
    rec = rep.get("recovery") or {}
    return {"verdict": rep.get("verdict"), "wall_s": round(time.monotonic() - t0, 1),
            "restart_seen_after_s": ev.get("restart_seen_after_s"), "time_to_healthy_s": rec.get("time_to_healthy_s"),
            "time_to_first_success_s": rec.get("time_to_first_success_s"), "time_to_slo_s": rec.get("time_to_slo_s"),
            "startup_s": startup}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1, help="runs per launcher (default 1)")
    ap.add_argument("--full", action="store_true", help="the experiment's own phases, not its CI form")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    try:
        engine_client().close()
    except StackError as exc:
        print(f"launcher_recovery: {exc.one_line()}", file=sys.stderr)
        return 2
    results: dict[str, list[dict]] = {"local": [], "docker": []}
    with tempfile.TemporaryDirectory(prefix="specchaos-launcher-bench-") as d:
        for n in range(args.repeat):
            for launcher in ("local", "docker"):
                r = one_run(Path(d), launcher, n, args.full)
                results[launcher].append(r)
                print(f"{launcher:6} run {n + 1}: {r}", flush=True)
    med = {lch: {f: (statistics.median(v) if (v := [r[f] for r in rs if r[f] is not None]) else None)
                 for f in FIGURES} for lch, rs in results.items()}
    ratios = {f: (round(med["docker"][f] / med["local"][f], 3) if med["docker"][f] and med["local"][f] else None)
              for f in FIGURES}
    print(f"{'figure (median s)':28} {'local':>8} {'docker':>8} {'docker/local':>13}")
    def cell(v: float | None, width: int) -> str:
        return f"{v:{width}.2f}" if v is not None else f"{'-':>{width}}"

    for f in FIGURES:
        print(f"{f:28} {cell(med['local'][f], 8)} {cell(med['docker'][f], 8)} {cell(ratios[f], 13)}")
    print(json.dumps({"local": {f: [r[f] for r in results["local"]] for f in FIGURES},
                      "docker": {f: [r[f] for r in results["docker"]] for f in FIGURES}, "ratios": ratios}))
    return 0 if all(r["verdict"] == "pass" for rs in results.values() for r in rs) else 1


if __name__ == "__main__":
    sys.exit(main())

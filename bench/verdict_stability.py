"""Benchmark: does every shipped experiment give the same verdict each time it runs?

Runs each experiment ``--repeats`` times in sequence, each through the real CLI
(``python -m harness.cli run FILE --out DIR/<stem>/<i>``, the command a gate runs), then
reads every run's ``report.json`` and prints, per experiment:

* the verdicts seen (``pass×3``, ``pass×2 fail×1``) and whether they all agree; a run that
  wrote no report counts as **error**;
* the checks that failed in each repeat (``passed: false``) and the first run error;
* the baseline phase's p50 TTFT and p50 TPOT of each repeat (``phases.baseline.ttft_s.p50``,
  ``.tpot_s.p50``, in ms) and their spread across the repeats: ``range`` = (max − min) ÷
  median and ``dev`` = max |x ÷ median − 1|, marked OK when ``dev`` is within ±10 %;
* each repeat's wall time (the CLI subprocess, stack start and stop included; with
  ``--pooled``, the in-process run, a stack start included only where it started one).

``--pooled`` runs every repeat in this process through the runner
(:func:`harness.experiment.runner.run`, as ``ci/gate.sh``'s pytest plugin does) with a
:class:`harness.stack.pool.StackPool` (``DIR/stacks/``) as the session's stack provider: runs
whose ``stack`` blocks have the same pool key (:func:`harness.stack.pool.stack_key`) share a
started stack. The runs are ordered so stacks are reused: experiments grouped by key (in order
of first appearance), every repeat of one key before the next. Each run's line and its
``stability.json`` entry say whether its stack was ``started`` or ``reused`` (the
``stack_pooled`` event of its timeline; ``uses``), and the pool's ``starts`` and ``reuses``
end the output and ``stability.json`` (``pool``). The pool is closed (every stack stopped) at
the end, on Ctrl-C and on SIGTERM. Each run's log (the harness's INFO lines) goes to
``DIR/<stem>/<i>.log``. This is what the nightly tier runs: the gate's way of running, and a
stack start per key rather than per run.

Exit code: 0 when every experiment gave the same verdict in every repeat, 1 when any did
not, 2 on bad input (a missing or invalid experiment file, an ``--out`` that already holds
runs, a bad number) or an interrupted run. The spread is reported, not gated on: a shared
host moves latency without changing what a verdict should be.

``--busy`` loads the machine on purpose: a plain busy-loop child process pinned to one
core (``--busy-core``, default the highest core this process may use) for the whole
duration, killed at the end, on Ctrl-C and on SIGTERM; it also stops by itself when this
script is gone or after ``--busy-max-s``. ``--short`` runs a copy of each experiment with
the short CI phase profile (:data:`SHORT_PHASES`) instead of its own phases; the output
says so on every line that matters, and the nightly tier does not use it.

Not run by CI with real experiments (it starts real vLLM servers; the nightly tier's
``tests/bench/test_verdict_stability.py`` runs it over every shipped experiment, three
repeats). Run it under the shared lock::

    flock /tmp/specchaos-vllm.lock .venv/bin/python bench/verdict_stability.py [--repeats 3] [--out DIR] [--pooled] [--busy] [FILE ...]
    .venv/bin/python bench/verdict_stability.py --summarize DIR     # the table again, from saved runs

Default experiments: every ``experiments/*.yaml`` (not ``experiments/selftest/``), but one for
GPU hosts (``gpu.require``) on a host without an NVIDIA GPU. Default
``--out``: ``results/stability-<date>-<time>``. ``DIR/stability.json`` is rewritten after
every run (settings, each run's exit code, wall time and load average, and the rows);
each run's CLI output goes to ``DIR/<stem>/<i>.log``. Its last line is a JSON object:
``agreed`` (bool) and, per experiment, ``verdicts``, ``agree``, ``ttft_p50_ms``,
``tpot_p50_ms``, their spreads and ``wall_s`` (with ``--pooled`` also ``stack`` per repeat,
and ``pool``: ``starts``, ``reuses``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]

#: The spread of a baseline figure that counts as stable: every repeat within ±10 % of the median.
TARGET_DEV = 0.10
#: ``--short``: the phases of the CI runs on the real stack (tests/experiment/test_network.py's ``short``).
SHORT_PHASES = {"warmup_s": 2, "baseline_s": 10, "after_s": 8}
SHORT_MIN_COMPARED = 10

#: The busy-loop child of ``--busy``: spins until its parent is gone or its time is up.
HOG = """
import os, sys, time
parent, deadline = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
while os.getppid() == parent and time.monotonic() < deadline:
    for _ in range(200000):
        pass
"""


class BadInput(Exception):
    """Bad arguments or files: one line on stderr, exit 2."""


class Interrupted(KeyboardInterrupt):
    """SIGTERM (or SIGINT) while running: a KeyboardInterrupt, so an in-process run (``--pooled``)
    treats it as the interruption it is (the runner judges what was recorded and lets go of
    the stack) rather than as a failing activity."""


# ------------------------------------------------------------------ summary (pure)

def baseline_p50_ms(report: dict[str, Any] | None, metric: str) -> float | None:
    """``phases.baseline.<metric>.p50`` in ms, or None when the report has none."""
    try:
        v = report["phases"]["baseline"][metric]["p50"]  # type: ignore[index]
    except (KeyError, TypeError):
        return None
    return round(v * 1000, 3) if isinstance(v, (int, float)) else None


def spread(values: list[float | None]) -> dict[str, Any]:
    """Spread of one figure across repeats (missing values left out): ``n``, ``median``,
    ``range`` = (max − min) ÷ median, ``dev`` = max |x ÷ median − 1|, ``ok`` = dev ≤
    :data:`TARGET_DEV` (None when fewer than two values or a zero median: not judged)."""
    xs = [float(v) for v in values if v is not None]
    if len(xs) < 2:
        return {"n": len(xs), "median": xs[0] if xs else None, "range": None, "dev": None, "ok": None}
    med = statistics.median(xs)
    if med <= 0:
        return {"n": len(xs), "median": med, "range": None, "dev": None, "ok": None}
    rng = (max(xs) - min(xs)) / med
    dev = max(abs(x / med - 1) for x in xs)
    return {"n": len(xs), "median": round(med, 3), "range": round(rng, 4), "dev": round(dev, 4),
            "ok": dev <= TARGET_DEV + 1e-9}


def verdicts_seen(verdicts: list[str]) -> str:
    """``["pass", "fail", "pass"]`` → ``"pass×2 fail×1"`` (in order of first appearance)."""
    counts: dict[str, int] = {}
    for v in verdicts:
        counts[v] = counts.get(v, 0) + 1
    return " ".join(f"{v}×{n}" for v, n in counts.items())


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs → one row per experiment (in order of first appearance).

    A run is ``{"experiment": str, "repeat": int, "report": dict | None, "wall_s": float |
    None, "exit_code": int | None}``; ``report`` None (the run wrote none) is an **error**
    verdict. A row: ``experiment``, ``repeats``, ``verdicts`` (per repeat), ``seen``,
    ``agree``, ``failing`` (failed check names per repeat), ``errors`` (first run error per
    repeat, or None), ``ttft_p50_ms`` and ``tpot_p50_ms`` (per repeat) with ``ttft_spread``
    and ``tpot_spread`` (:func:`spread`), ``wall_s`` (per repeat), ``stack`` (per repeat:
    ``started``/``reused`` for a pooled run, ``none`` for a pooled run that got no stack, None
    for a run through the CLI)."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by.setdefault(r["experiment"], []).append(r)
    rows = []
    for name, rs in by.items():
        rs = sorted(rs, key=lambda r: r["repeat"])
        verdicts, failing, errors, ttft, tpot = [], [], [], [], []
        for r in rs:
            rep = r.get("report")
            if not isinstance(rep, dict):
                verdicts.append("error")
                failing.append([])
                errors.append("no report.json" + (f" (exit {r['exit_code']})" if r.get("exit_code") is not None else ""))
            else:
                verdicts.append(rep.get("verdict") or "error")
                failing.append([c.get("name", "?") for c in rep.get("checks") or [] if c.get("passed") is False])
                errs = rep.get("errors") or []
                errors.append(str(errs[0]) if errs else None)
            ttft.append(baseline_p50_ms(rep, "ttft_s"))
            tpot.append(baseline_p50_ms(rep, "tpot_s"))
        rows.append({
            "experiment": name, "repeats": len(rs), "verdicts": verdicts, "seen": verdicts_seen(verdicts),
            "agree": len(set(verdicts)) == 1, "failing": failing, "errors": errors,
            "ttft_p50_ms": ttft, "ttft_spread": spread(ttft), "tpot_p50_ms": tpot, "tpot_spread": spread(tpot),
            "wall_s": [None if r.get("wall_s") is None else round(r["wall_s"], 1) for r in rs],
            "stack": [r.get("stack") for r in rs],
        })
    return rows


def _fmt(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}g}" if abs(v) < 10 else f"{v:.1f}"


def _spread_text(s: dict[str, Any]) -> str:
    if s["dev"] is None:
        return "n/a"
    return f"range {s['range'] * 100:.1f}% dev ±{s['dev'] * 100:.1f}% {'OK' if s['ok'] else 'OVER'}"


def render(rows: list[dict[str, Any]], pool: dict[str, int] | None = None) -> str:
    """The table: one line per experiment (a ``stack`` column when any run was pooled), then
    its failing checks and errors per repeat; ``pool`` (``starts``, ``reuses``) ends it."""
    pooled = any(s is not None for r in rows for s in r.get("stack") or [])
    head = ("experiment", "verdicts", "agree", "baseline p50 TTFT ms", "spread", "baseline p50 TPOT ms", "spread",
            "wall s") + (("stack",) if pooled else ())
    body = [(r["experiment"], r["seen"], "yes" if r["agree"] else "NO",
             " ".join(_fmt(v) for v in r["ttft_p50_ms"]), _spread_text(r["ttft_spread"]),
             " ".join(_fmt(v) for v in r["tpot_p50_ms"]), _spread_text(r["tpot_spread"]),
             " ".join(_fmt(v) for v in r["wall_s"]))
            + ((" ".join(s or "-" for s in r.get("stack") or []),) if pooled else ()) for r in rows]
    widths = [max(len(str(x[i])) for x in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(x, widths)).rstrip() for x in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = []
    for r in rows:
        for i, (f, e) in enumerate(zip(r["failing"], r["errors"]), 1):
            parts = ([f"failed {', '.join(f)}"] if f else []) + ([e] if e else [])
            if parts:
                notes.append(f"  {r['experiment']} #{i} {r['verdicts'][i - 1]}: {'; '.join(parts)}")
    if notes:
        lines += ["", "failing checks and errors per repeat:", *notes]
    agreed = sum(r["agree"] for r in rows)
    lines += ["", (f"{agreed}/{len(rows)} experiments gave the same verdict in every repeat; baseline p50 spread "
                   f"target ±{TARGET_DEV * 100:.0f}% of the median (OK/OVER)")]
    if pool is not None:
        lines.append(pool_text(pool))
    return "\n".join(lines)


def pool_text(pool: dict[str, int]) -> str:
    return f"stack pool: {pool['starts']} started, {pool['reuses']} reused"


def last_line(rows: list[dict[str, Any]], pool: dict[str, int] | None = None) -> dict[str, Any]:
    """The JSON object printed last (``pool`` and each experiment's ``stack`` only for pooled runs)."""
    keep = ("verdicts", "agree", "ttft_p50_ms", "ttft_spread", "tpot_p50_ms", "tpot_spread", "wall_s")
    line: dict[str, Any] = {"agreed": all(r["agree"] for r in rows), "experiments": {
        r["experiment"]: {**{k: r[k] for k in keep},
                          **({"stack": r["stack"]} if any(s is not None for s in r.get("stack") or []) else {})}
        for r in rows}}
    if pool is not None:
        line["pool"] = pool
    return line


# ------------------------------------------------------------------ saved runs

def load_runs(out: Path) -> list[dict[str, Any]]:
    """The runs saved under ``out``: ``stability.json``'s list when present (wall times,
    exit codes), each with its ``report.json`` read again; else every ``<stem>/<i>/``."""
    index = out / "stability.json"
    if index.exists():
        try:
            saved = json.loads(index.read_text(encoding="utf-8"))["runs"]
        except (ValueError, KeyError, TypeError) as exc:
            raise BadInput(f"{index}: not a stability.json ({exc})") from None
    else:
        saved = [{"experiment": d.parent.name, "repeat": int(d.name), "dir": str(d)}
                 for d in sorted(out.glob("*/*")) if d.is_dir() and d.name.isdigit()]
    runs = []
    for s in saved:
        path = Path(s["dir"]) / "report.json"
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            report = None
        runs.append({**s, "report": report})
    return runs


def load_pool(out: Path) -> dict[str, int] | None:
    """The pool's ``starts`` and ``reuses`` saved in ``out/stability.json`` (None: not pooled)."""
    try:
        return json.loads((out / "stability.json").read_text(encoding="utf-8")).get("pool")
    except (OSError, ValueError, AttributeError):
        return None


def write_index(out: Path, settings: dict[str, Any], runs: list[dict[str, Any]],
                pool: dict[str, int] | None = None) -> None:
    data = {"settings": settings, "runs": [{k: v for k, v in r.items() if k != "report"} for r in runs],
            "rows": summarize(runs), **({"pool": pool} if pool is not None else {})}
    tmp = out / "stability.json.tmp"
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, out / "stability.json")


# ------------------------------------------------------------------ running

class Hog:
    """A busy-loop child pinned to one core; :meth:`stop` kills it (idempotent)."""

    def __init__(self, core: int, max_s: float):
        self.core = core
        self.proc = subprocess.Popen([sys.executable, "-c", HOG, str(os.getpid()), str(max_s)],
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            os.sched_setaffinity(self.proc.pid, {core})
        except OSError:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def short_copy(src: Path, dest: Path) -> Path:
    """``src`` with :data:`SHORT_PHASES` (and a lower integrity minimum) written to ``dest``."""
    doc = yaml.safe_load(src.read_text(encoding="utf-8"))
    spec = doc["configuration"]["specchaos"]
    spec.setdefault("phases", {}).update(SHORT_PHASES)
    if isinstance(spec.get("integrity"), dict) and "min_compared" in spec["integrity"]:
        spec["integrity"]["min_compared"] = min(spec["integrity"]["min_compared"], SHORT_MIN_COMPARED)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return dest


def cli(*args: str, stdout: Any = subprocess.PIPE) -> subprocess.Popen:
    """``python -m harness.cli ARGS`` from the repository root, in its own session (a Ctrl-C
    at the terminal reaches this script only, which passes it on once: :func:`run_one`)."""
    return subprocess.Popen([sys.executable, "-m", "harness.cli", *args], cwd=ROOT, stdin=subprocess.DEVNULL,
                            stdout=stdout, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))


def validate(files: list[Path]) -> None:
    """``specchaos validate`` on each file; the first refusal is :class:`BadInput`."""
    for f in files:
        p = cli("validate", str(f))
        text, _ = p.communicate(timeout=300)
        if p.returncode != 0:
            lines = [ln for ln in text.splitlines() if ln.strip()]
            raise BadInput(f"specchaos validate {f}: " + (lines[-1] if lines else f"exit {p.returncode}"))


def run_one(file: Path, out_dir: Path, log: Path) -> tuple[int, float]:
    """One ``specchaos run``: (exit code, wall seconds). On :class:`Interrupted` or Ctrl-C the
    run gets the same signal (it tears down and writes its partial report) and is waited for."""
    t0 = time.monotonic()
    with open(log, "w", encoding="utf-8") as fh:
        proc = cli("run", str(file), "--out", str(out_dir), "--no-progress", stdout=fh)
    try:
        return proc.wait(), time.monotonic() - t0
    except BaseException as exc:
        sig = signal.SIGTERM if isinstance(exc, Interrupted) else signal.SIGINT
        if proc.poll() is None:
            proc.send_signal(sig)
        try:
            proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise


def _on_sigterm(signum, frame) -> None:
    raise Interrupted()


# ------------------------------------------------------------------ --pooled: in this process
# The harness is imported here only for --pooled: the CLI mode and --summarize need none of it.

def pool_keys(files: list[Path]) -> dict[Path, str]:
    """Each file's pool key (:func:`harness.stack.pool.stack_key` of its validated ``stack``
    block), validating it in this process as ``specchaos validate`` does; the first refusal is
    :class:`BadInput`."""
    from harness.errors import SpecchaosError
    from harness.experiment.validate import load_experiment
    from harness.stack.pool import stack_key
    keys = {}
    for f in files:
        try:
            keys[f] = stack_key(load_experiment(f).cfg.stack)
        except SpecchaosError as exc:
            raise BadInput(f"specchaos validate {f}: {exc.one_line()}") from None
    return keys


def pool_order(files: list[Path], keys: dict[Path, str]) -> list[Path]:
    """``files`` grouped by pool key (keys in order of first appearance, files in their order
    within a key), so every run of one stack configuration comes before the next one's."""
    first = {k: i for i, k in reversed(list(enumerate(keys[f] for f in files)))}
    return sorted(files, key=lambda f: first[keys[f]])


def stack_use(run_dir: Path) -> tuple[str, int | None]:
    """``("started", 1)`` or ``("reused", uses)`` from the run's ``stack_pooled`` timeline
    event; ``("none", None)`` when the run got no stack."""
    from harness.timeline import read_timeline
    path = run_dir / "timeline.jsonl"
    events = read_timeline(path) if path.exists() else []
    uses = next((e.get("uses") for e in events if e.get("event") == "stack_pooled"), None)
    if not isinstance(uses, int):
        return "none", None
    return ("started" if uses == 1 else "reused"), uses


class PooledRunner:
    """Runs experiments in this process (:func:`harness.experiment.runner.run`) on one
    :class:`harness.stack.pool.StackPool`, the session's stack provider until :meth:`close`."""

    LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"   # the CLI's

    def __init__(self, base_dir: Path):
        from harness.experiment import session
        from harness.stack.pool import StackPool
        self.pool = StackPool(base_dir)
        session.set_stack_provider(self.pool)

    def counts(self) -> dict[str, int]:
        return {"starts": self.pool.starts, "reuses": self.pool.reuses}

    def run(self, file: Path, out_dir: Path, log: Path) -> tuple[int, float, str, int | None]:
        """One run: (exit code, wall seconds, ``started``/``reused``/``none``, uses). Its
        harness log (INFO, as the CLI's) goes to ``log``. Bad input found before anything
        started is exit 2 without a report, as the CLI's. A run that a signal interrupted
        raises :class:`Interrupted` once it has torn down (the runner caught the signal)."""
        from harness.errors import SpecchaosError
        from harness.experiment import runner
        handler = logging.FileHandler(log, encoding="utf-8")
        handler.setFormatter(logging.Formatter(self.LOG_FORMAT))
        root = logging.getLogger()
        root.addHandler(handler)
        levels = {name: logging.getLogger(name).level for name in ("harness", "faults")}
        if not root.isEnabledFor(logging.INFO):
            for name in levels:
                logging.getLogger(name).setLevel(logging.INFO)
        report: dict[str, Any] | None = None
        t0 = time.monotonic()
        try:
            code, report = runner.run(file, out_dir)
        except SpecchaosError as exc:
            logging.getLogger("harness").error("specchaos: error: %s", exc.one_line())
            code = 2
        finally:
            wall = time.monotonic() - t0
            root.removeHandler(handler)
            handler.close()
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)
        if any(str(e).startswith("interrupted by ") for e in (report or {}).get("errors") or []):
            raise Interrupted()
        return (code, wall, *stack_use(out_dir))

    def close(self) -> None:
        """Stop every pooled stack and unset the provider (idempotent); a second signal
        meanwhile is ignored, so no server is left behind."""
        from harness.experiment import session
        from harness.experiment.control import signals_deferred
        with signals_deferred():
            try:
                self.pool.close()
            finally:
                session.set_stack_provider(None)


def needs_gpu(path: Path) -> bool:
    """Whether the experiment declares ``gpu.require`` (it runs on GPU hosts only)."""
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return False   # the validation reports it
    spec = ((doc.get("configuration") or {}) if isinstance(doc, dict) else {}).get("specchaos") or {}
    return bool((spec.get("gpu") or {}).get("require"))


def experiment_files(names: list[str]) -> list[Path]:
    """The files given, or every ``experiments/*.yaml`` that this host can run: one for GPU
    hosts (``gpu.require``) is left out, with a line saying why, where there is no NVIDIA GPU."""
    files = [Path(n) for n in names]
    if not files:
        from harness import gpu   # the harness only when needed (module doc); its NVML probe is light
        no_gpu = gpu.unavailable()
        for f in sorted((ROOT / "experiments").glob("*.yaml")):
            if no_gpu and needs_gpu(f):
                print(f"{f.name}: left out, it runs on GPU hosts only ({no_gpu})", file=sys.stderr)
            else:
                files.append(f)
    if not files:
        raise BadInput("no experiment files given and none in experiments/*.yaml")
    for f in files:
        if not f.is_file():
            raise BadInput(f"experiment file {f}: not found")
    stems = [f.stem for f in files]
    dup = sorted({s for s in stems if stems.count(s) > 1})
    if dup:
        raise BadInput(f"two experiment files named {dup[0]!r}: runs are saved by file name; rename one")
    return [f.resolve() for f in files]


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*", metavar="FILE",
                    help="experiment files (default: every experiments/*.yaml, not experiments/selftest/)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each experiment (default 3)")
    ap.add_argument("--out", type=Path, default=None,
                    help="directory for the runs and stability.json (default results/stability-<date>-<time>)")
    ap.add_argument("--busy", action="store_true",
                    help="keep one core busy with a busy-loop child process for the whole duration")
    ap.add_argument("--busy-core", type=int, default=None,
                    help="the core --busy spins on (default the highest core this process may use)")
    ap.add_argument("--busy-max-s", type=float, default=12 * 3600.0,
                    help="the busy loop stops by itself after this long (default 12 h)")
    ap.add_argument("--short", action="store_true",
                    help="SHORT CI phase profile (warm-up 2 s, baseline 10 s, after 8 s) instead of each "
                         "experiment's own phases; not what the nightly tier runs")
    ap.add_argument("--pooled", action="store_true",
                    help="run in this process on shared stacks (harness.stack.pool.StackPool), as the gate "
                         "does: runs whose stack blocks match reuse one started stack; ordered by stack")
    ap.add_argument("--summarize", type=Path, metavar="DIR", default=None,
                    help="print the table of the runs saved in DIR and exit; runs nothing")
    return ap.parse_args(argv)


def check_args(args: argparse.Namespace) -> None:
    if args.repeats < 1:
        raise BadInput("--repeats must be >= 1")
    if args.busy_max_s <= 0:
        raise BadInput("--busy-max-s must be > 0")
    if args.summarize is not None:
        extra = [n for n, given in (("FILE", args.files), ("--busy", args.busy), ("--short", args.short),
                                    ("--pooled", args.pooled), ("--out", args.out is not None)) if given]
        if extra:
            raise BadInput(f"--summarize runs nothing: drop {', '.join(extra)}")
        if not args.summarize.is_dir():
            raise BadInput(f"--summarize {args.summarize}: no such directory")
    if args.busy_core is not None:
        if not args.busy:
            raise BadInput("--busy-core needs --busy")
        if args.busy_core not in os.sched_getaffinity(0):
            raise BadInput(f"--busy-core {args.busy_core}: not one of this process's cores "
                           f"{sorted(os.sched_getaffinity(0))}")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if not args.pooled:
        return _main(args)
    # In this process, runs see what the CLI subprocesses see: the repository root as the
    # working directory (relative models_dir) and on sys.path (launchers named by
    # $SPECCHAOS_LAUNCHERS); paths given are taken from where the script was started.
    args.files = [os.path.abspath(f) for f in args.files]
    args.out = args.out.resolve() if args.out is not None else None
    cwd, path = os.getcwd(), list(sys.path)
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    try:
        return _main(args)
    finally:
        os.chdir(cwd)
        sys.path[:] = path


def _main(args: argparse.Namespace) -> int:
    try:
        check_args(args)
        if args.summarize is not None:
            runs = load_runs(args.summarize)
            if not runs:
                raise BadInput(f"--summarize {args.summarize}: no runs saved there (no stability.json, no <stem>/<i>/)")
            return report(summarize(runs), load_pool(args.summarize))
        files = experiment_files(args.files)
        out = (args.out or ROOT / "results" / time.strftime("stability-%Y%m%d-%H%M%S")).resolve()
        taken = [str(out / f.stem) for f in files if (out / f.stem).exists()]
        if taken:
            raise BadInput(f"--out {out}: already holds runs ({taken[0]}); choose another --out, or --summarize it")
        if args.pooled:
            files = pool_order(files, pool_keys(files))
        else:
            validate(files)
    except BadInput as exc:
        print(f"verdict_stability: error: {exc}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    core = args.busy_core if args.busy_core is not None else max(os.sched_getaffinity(0))
    settings = {"repeats": args.repeats, "files": [str(f) for f in files], "busy": args.busy,
                "busy_core": core if args.busy else None, "cpus": sorted(os.sched_getaffinity(0)),
                "phases": "short CI profile " + json.dumps(SHORT_PHASES) if args.short else "each experiment's own",
                "pooled": args.pooled, "started_at": time.time()}
    label = (f"{len(files)} experiment(s) × {args.repeats} repeat(s); phases: "
             + ("SHORT CI profile " + json.dumps(SHORT_PHASES) if args.short else "each experiment's own")
             + (f"; busy loop on core {core}" if args.busy else "; no busy loop")
             + ("; pooled stacks in this process, runs ordered by stack" if args.pooled
                else "; a stack per run (CLI subprocesses)"))
    print(label, flush=True)
    runs: list[dict[str, Any]] = []
    hog = None
    pooled: PooledRunner | None = None
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        if args.busy:
            hog = Hog(core, args.busy_max_s)
        if args.pooled:
            pooled = PooledRunner(out / "stacks")
        for f in files:
            (out / f.stem).mkdir(parents=True, exist_ok=True)
            run_file = short_copy(f, out / f.stem / "experiment-short.yaml") if args.short else f
            for i in range(1, args.repeats + 1):
                run_dir = out / f.stem / str(i)
                load_before = os.getloadavg()[0]
                use: tuple[str, int | None] | None = None
                if pooled is not None:
                    code, wall, stack, uses = pooled.run(run_file, run_dir, out / f.stem / f"{i}.log")
                    use = (stack, uses)
                else:
                    code, wall = run_one(run_file, run_dir, out / f.stem / f"{i}.log")
                try:
                    report_ = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    report_ = None
                runs.append({"experiment": f.stem, "repeat": i, "dir": str(run_dir), "exit_code": code,
                             "wall_s": round(wall, 1), "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                             "report": report_})
                if use is not None:
                    runs[-1].update(stack=use[0], stack_uses=use[1])
                write_index(out, settings, runs, pooled.counts() if pooled else None)
                verdict = report_.get("verdict") if report_ else "error (no report.json)"
                how = "" if use is None else f"; stack {use[0]}" + (f" (use {use[1]})" if use[0] == "reused" else "")
                print(f"{f.stem} {i}/{args.repeats}: {verdict} (exit {code}) in {wall:.1f} s{how}", flush=True)
    except (Interrupted, KeyboardInterrupt):
        print(f"verdict_stability: error: interrupted; the finished runs are in {out} (the interrupted one, "
              f"its partial report beside them, is left out)", file=sys.stderr)
        if runs:
            print(render(summarize(runs), pooled.counts() if pooled else None), flush=True)
        return 2
    finally:
        try:
            if pooled is not None:
                pooled.close()
        finally:
            signal.signal(signal.SIGTERM, previous)
            if hog is not None:
                hog.stop()
    print(f"runs: {out}  (again: bench/verdict_stability.py --summarize {out})")
    return report(summarize(runs), pooled.counts() if pooled else None)


def report(rows: list[dict[str, Any]], pool: dict[str, int] | None = None) -> int:
    print(render(rows, pool))
    print(json.dumps(last_line(rows, pool)))
    return 0 if all(r["agree"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

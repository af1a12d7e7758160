"""Load, validate and run an experiment through chaostoolkit-lib, with a strict verdict.

Chaos Toolkit alone exits 0 when the steady-state hypothesis is missed before the
method (it just skips the method). Here every tolerance miss, before or after the
method, fails the run; any activity that raised, an interruption, or a fault without
evidence makes it an error:

    exit 0 = pass, 1 = fail, 2 = error (also: bad input, nothing started).

Validation happens before anything starts, so bad input never half-applies a fault:
the file parses (YAML/JSON, with line numbers), Chaos Toolkit's own validation passes,
``configuration.specchaos`` validates, the ``specchaos`` control is declared, every
``inject_fault`` names a known fault with valid arguments and an existing server,
the models exist, and explicitly configured ports are free.
"""

from __future__ import annotations

import json
import logging
import signal
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.errors import ExperimentError, SpecchaosError, StackError
from harness.experiment.config import SpecchaosConfig, first_error, parse_config

log = logging.getLogger(__name__)

CONTROL_MODULE = "harness.experiment.control"
ACTIONS_MODULE = "harness.experiment.actions"
EXIT_CODES = {"pass": 0, "fail": 1, "error": 2}


@dataclass
class Experiment:
    """A validated experiment: the Chaos Toolkit document and its specchaos config."""

    path: Path
    doc: dict[str, Any]
    cfg: SpecchaosConfig

    @property
    def title(self) -> str:
        return str(self.doc.get("title", self.path.stem))


def parse_file(path: Path) -> dict[str, Any]:
    """Parse an experiment file (YAML or JSON).

    Raises:
        ExperimentError: missing file, syntax error (with line and column), not a mapping.
    """
    if path.is_dir():
        raise ExperimentError("is a directory, not an experiment file", where=str(path),
                              hint="give the path of a Chaos Toolkit experiment, e.g. experiments/kill-draft-worker.yaml")
    if not path.is_file():
        raise ExperimentError("no such experiment file", where=str(path),
                              hint="give the path of a Chaos Toolkit experiment, e.g. experiments/kill-draft-worker.yaml")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ExperimentError(f"cannot read the experiment file: {exc}", where=str(path)) from None
    try:
        if path.suffix == ".json":
            doc = json.loads(text)
        else:
            doc = yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise ExperimentError(f"invalid JSON: {exc.msg}", where=f"{path}:{exc.lineno}:{exc.colno}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ExperimentError(f"invalid YAML: {problem}", where=where) from None
    if not isinstance(doc, dict):
        raise ExperimentError("an experiment must be a mapping (title, description, method...)", where=str(path))
    return doc


def _activities(doc: dict[str, Any]):
    """Yield (location, activity) for every activity of the experiment."""
    ssh = doc.get("steady-state-hypothesis") or {}
    for i, a in enumerate(ssh.get("probes") or []):
        yield f"steady-state-hypothesis.probes[{i}]", a
    for i, a in enumerate(doc.get("method") or []):
        yield f"method[{i}]", a
    for i, a in enumerate(doc.get("rollbacks") or []):
        yield f"rollbacks[{i}]", a


def load_experiment(path: str | Path) -> Experiment:
    """Parse and validate an experiment without starting anything.

    Raises:
        ExperimentError: malformed file, unknown fault/role/argument, missing control.
        ModelError: a model directory named by the configuration is missing.
        StackError: an explicitly configured port is already in use.
    """
    from chaoslib.configuration import load_configuration
    from chaoslib.exceptions import ChaosException
    from chaoslib.experiment import ensure_experiment_is_valid

    from faults.registry import fault_class, make_fault

    path = Path(path)
    doc = parse_file(path)
    try:
        ensure_experiment_is_valid(doc)
    except ChaosException as exc:
        raise ExperimentError(f"not a valid Chaos Toolkit experiment: {exc}", where=str(path)) from None

    controls = doc.get("controls") or []
    if not any(((c or {}).get("provider") or {}).get("module") == CONTROL_MODULE for c in controls):
        raise ExperimentError(f"the experiment does not declare the specchaos control ({CONTROL_MODULE})",
                              where=f"{path}: controls",
                              hint="add {name: specchaos, provider: {type: python, module: harness.experiment.control}}")
    try:
        conf = load_configuration(doc.get("configuration") or {})
    except ChaosException as exc:
        raise ExperimentError(str(exc), where=f"{path}: configuration") from None
    cfg = parse_config(conf.get("specchaos"), where=f"{path}: configuration.specchaos")

    servers = {"spec"} | ({"ref"} if cfg.stack.reference else set())
    for loc, act in _activities(doc):
        prov = act.get("provider") or {}
        if prov.get("module") == ACTIONS_MODULE and prov.get("func") == "inject_fault":
            args = prov.get("arguments") or {}
            where = f"{path}: {loc}.provider.arguments"
            if "kind" not in args:
                raise ExperimentError("inject_fault needs a 'kind'", where=where)
            fault_class(args["kind"], where=f"{where}.kind")
            fault = make_fault(args["kind"], args.get("arguments") or {}, where=where)
            server = getattr(fault.params, "server", None)
            if server is not None and server not in servers:
                raise ExperimentError(f"unknown server '{server}'", where=f"{where}.arguments.server",
                                      hint=f"known: {', '.join(sorted(servers))}")

    injects = [a for a in (doc.get("method") or []) if isinstance(a, dict)
               and (a.get("provider") or {}).get("module") == ACTIONS_MODULE
               and (a.get("provider") or {}).get("func") == "inject_fault"]
    if not injects:
        raise ExperimentError("the method injects no fault, so the run would test nothing",
                              where=f"{path}: method",
                              hint=f"add an action with provider {ACTIONS_MODULE}.inject_fault")

    from harness.errors import ModelError
    from harness.stack.models import resolve_model

    def check_model(field_name: str) -> None:
        name = getattr(cfg.stack, field_name)
        try:
            resolve_model(cfg.stack.models_dir, name)
        except ModelError as exc:
            raise ModelError(f"{field_name} model {name!r} not found in models_dir {cfg.stack.models_dir!r} "
                             f"(looked at {exc.where})", where=f"{path}: configuration.specchaos.stack.{field_name}",
                             hint=exc.hint) from None

    check_model("target")
    if cfg.stack.method == "draft_model":
        if not cfg.stack.draft:
            raise ExperimentError("method draft_model needs a draft model",
                                  where=f"{path}: configuration.specchaos.stack.draft")
        check_model("draft")
    for field in ("spec_port", "ref_port"):
        port = getattr(cfg.stack, field)
        if port and port_in_use(cfg.stack.host, port):
            raise StackError(f"port {port} on {cfg.stack.host} is in use",
                             where=f"{path}: configuration.specchaos.stack.{field}",
                             hint="free it, or set 0 to pick a free port")
    return Experiment(path=path, doc=doc, cfg=cfg)


def port_in_use(host: str, port: int) -> bool:
    """True if ``host:port`` cannot be bound right now (something listens there)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def strict_checks(journal: dict | None) -> list[dict[str, Any]]:
    """Every steady-state probe of the journal as a check: a tolerance miss before or
    after the method fails the run (Chaos Toolkit alone would exit 0 on a missed
    pre-method hypothesis). A hypothesis that never ran is not a check here: the
    interruption or error that stopped it already makes the run an error."""
    out = []
    ss = (journal or {}).get("steady_states") or {}
    for when in ("before", "after"):
        st = ss.get(when)
        if not st:
            continue
        for p in st.get("probes", []):
            name = (p.get("activity") or {}).get("name", "probe")
            met = bool(p.get("tolerance_met")) and p.get("status") == "succeeded"
            tol = (p.get("activity") or {}).get("tolerance")
            if p.get("status") != "succeeded":
                detail = f"probe {name} {p.get('status') or 'did not run'} {when} the method"
            else:
                detail = (f"probe {name} {when} the method returned {_scalar(p.get('output'))!r}: "
                          f"{'within' if met else 'OUT OF'} tolerance {_scalar(tol)!r}")
            out.append({"name": f"steady_state.{when}.{name}", "category": "steady_state", "passed": met,
                        "observed": _scalar(p.get("output")), "limit": _scalar(tol), "detail": detail})
    if journal and journal.get("deviated"):
        out.append({"name": "steady_state.deviated", "category": "steady_state", "passed": False,
                    "observed": True, "limit": False, "detail": "Chaos Toolkit reports a deviation"})
    return out


def _scalar(v: Any) -> Any:
    if v is None or isinstance(v, (int, float, str, bool)):
        return v
    return json.dumps(v, default=str)[:200]


def apply_strict_verdict(report: dict[str, Any], journal: dict | None) -> dict[str, Any]:
    """Add the steady-state checks to ``report`` and recompute its verdict strictly.

    A probe out of tolerance before or after the method is a failed check, so the verdict
    is ``"fail"`` (exit 1) where Chaos Toolkit alone would exit 0 after a missed
    pre-method hypothesis (the judge then marks the report ``method_skipped`` and does not
    count the absent fault as a run error).
    """
    from harness.checks.base import CheckResult
    from harness.checks.verdict import verdict

    existing = {c["name"] for c in report.get("checks", [])}
    report.setdefault("checks", []).extend(c for c in strict_checks(journal) if c["name"] not in existing)
    checks = [CheckResult(**{k: c.get(k, "") if k == "detail" else c.get(k)
                             for k in ("name", "category", "passed", "observed", "limit", "detail")})
              for c in report["checks"]]
    acted = all(f.get("acted", False) for f in report.get("faults", [])) and (
        bool(report.get("faults")) or "method_skipped" in report)
    report["verdict"] = verdict(checks, fault_acted=acted, errors=report.get("errors", []),
                                interrupted=bool(report.get("interrupted")))
    log.info("verdict: %s (%d checks, %d failed)", report["verdict"], len(checks), sum(not c.passed for c in checks))
    return report


def run(path: str | Path, out_dir: str | Path) -> tuple[int, dict[str, Any] | None]:
    """Run an experiment file and write ``journal.json`` and ``report.json`` into ``out_dir``.

    Returns:
        (exit code, report) — 0 pass, 1 fail, 2 error.

    Raises:
        SpecchaosError: bad input found before anything started (nothing was started).
    """
    from chaoslib.experiment import run_experiment

    from harness.experiment import session as sess
    from harness.experiment.control import signals_deferred
    from harness.report.json_report import write_report

    exp = load_experiment(path)
    out = prepare_out_dir(out_dir)
    s = sess.open_session(sess.RunInfo(title=exp.title, source=str(exp.path), out_dir=out, cfg=exp.cfg))
    (out / "experiment.json").write_text(json.dumps(exp.doc, indent=2, default=str))
    (out / "config.json").write_text(exp.cfg.model_dump_json(indent=2))
    journal: dict | None = None

    def on_sigint(signum: int, frame: Any) -> None:
        s.note_interrupt("SIGINT")
        raise KeyboardInterrupt

    previous_sigint = signal.signal(signal.SIGINT, on_sigint) if _main_thread() else None
    try:
        journal = run_experiment(exp.doc, settings={"runtime": {"rollbacks": {"strategy": "always"}}})
    except (KeyboardInterrupt, SystemExit):
        s.note_interrupt("a signal")
    except Exception as exc:
        log.exception("the experiment runner failed")
        s.errors.append(f"runner failed: {type(exc).__name__}: {exc}")
    finally:
        if previous_sigint is not None:
            signal.signal(signal.SIGINT, previous_sigint)
        with signals_deferred():
            if journal is not None:
                (out / "journal.json").write_text(json.dumps(journal, indent=2, default=str))
            s.close()
            report = s.report if s.report is not None else s.judge(journal=journal)
            report = apply_strict_verdict(report, journal)
            write_report(out / "report.json", report)
    return EXIT_CODES.get(report["verdict"], 2), report


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def prepare_out_dir(out_dir: str | Path) -> Path:
    """Create the run directory (``--out``) or check that an existing one is usable.

    Raises:
        SpecchaosError: it exists and is not a directory, or cannot be created/written.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise SpecchaosError("the output path exists and is not a directory", where=f"--out {out}")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".specchaos-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise SpecchaosError(f"cannot write the output directory: {exc.strerror or exc}",
                             where=f"--out {out}") from None
    return out


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SpecchaosError(f"unreadable {what}: {exc}", where=str(path)) from None


def rejudge(run_dir: str | Path) -> dict[str, Any]:
    """Re-judge a finished run from its saved data (``specchaos report DIR``): the
    checks are pure functions of ``records.jsonl``, ``reference.jsonl``, ``timeline.jsonl``
    and the saved ``config.json``/``journal.json``/``run.json``; the report is
    rewritten. Idempotent: re-judging twice gives the same report.

    Raises:
        SpecchaosError: the directory lacks the saved run data, or a saved file is
            unreadable or invalid (named with its field).
    """
    from pydantic import ValidationError

    from harness.report.judge import judge_run
    from harness.report.json_report import write_report

    d = Path(run_dir)
    if not (d / "config.json").is_file() or not (d / "timeline.jsonl").is_file():
        raise SpecchaosError("not a specchaos run directory (config.json or timeline.jsonl missing)", where=str(d))
    try:
        cfg = SpecchaosConfig.model_validate(_read_json(d / "config.json", "run configuration"))
    except ValidationError as exc:
        field_path, msg, _ = first_error(exc)
        raise SpecchaosError(msg, where=f"{d / 'config.json'}: {field_path}") from None
    journal = _read_json(d / "journal.json", "Chaos Toolkit journal") if (d / "journal.json").is_file() else None
    if (d / "run.json").is_file():
        meta = _read_json(d / "run.json", "run metadata")
    else:   # a run directory from before run.json existed
        from harness.experiment.session import journal_errors, steady_state_summary

        doc = _read_json(d / "experiment.json", "experiment") if (d / "experiment.json").is_file() else {}
        old = _read_json(d / "report.json", "report") if (d / "report.json").is_file() else {}
        meta = {"experiment": doc.get("title", d.name), "stack": old.get("stack") or {},
                "errors": journal_errors(journal),
                "interrupted": bool(journal and journal.get("status") == "interrupted"),
                "journal_status": (journal or {}).get("status"), "steady_state": steady_state_summary(journal)}
    if journal is None and not meta.get("interrupted") and not meta.get("errors"):
        # No journal and nothing said why: the harness itself died (e.g. SIGKILL).
        meta["errors"] = ["the run ended without a journal: the harness was killed before it finished"]
        meta["interrupted"] = True
    report = apply_strict_verdict(judge_run(d, cfg, dict(meta)), journal)
    write_report(d / "report.json", report)
    return report

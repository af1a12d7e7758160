"""Allure results of a judged run: one Allure test result per experiment, written with
``allure-python-commons`` (its model and :class:`~allure_commons.logger.AllureFileLogger`;
the JSON schema is the library's, not ours).

Read from the run directory only (as every report): ``report.json`` (or the report
given), the Chaos Toolkit journal (given, else ``journal.json``), ``experiment.json``,
``config.json``, ``timeline.jsonl``, ``logs/*``, and the timeline plot drawn here
(:mod:`harness.report.timeline_plot`).

The result:

* **status** from the verdict: ``pass`` → passed; ``fail`` and ``aborted`` → failed, the
  failing checks (one line each: name, detail) as ``statusDetails.message``; ``error`` →
  broken, the run errors as the message;
* **steps**: one per phase (warm-up, baseline, fault, recovery, after, with their times and
  figures: requests, errors, p95 TTFT/E2E in s, output tokens/s), one per fault (from
  injection to clear, broken when it left no evidence), one per Chaos Toolkit activity
  (steady-state probes before and after the method, method actions, rollbacks, each with
  its status and arguments), one per check (passed, failed, or skipped when not judged);
* **parameters**: launcher, target, draft, method, k (``num_speculative_tokens``), fault
  kinds, seed, vLLM version;
* **labels**: ``epic`` specchaos, ``feature`` per fault family, ``story`` and ``suite``
  the experiment's title (so the overview's Suites widget lists the experiments),
  ``subSuite`` the fault families, ``severity`` (critical for a ``gate``-tagged
  experiment, else normal), a ``tag`` per experiment tag;
* **link** to the experiment file (its blob URL at ``$GITHUB_SHA`` in GitHub Actions);
  **testCaseId**/**historyId** the MD5 of the experiment file's path (relative to the
  working directory when inside it; the title for a run without a file), so Allure's
  history and trend follow one experiment file across runs (Allure 2.46 keys its history
  by the test case and the parameters: a run with another draft or k is another line);
* **description**: the experiment's description and verdict (and why the plot is
  missing, if it is);
* **attachments**: ``timeline.png`` (image/png), the per-phase table (CSV, which Allure
  shows as a table: window, requests, errors, p50/p95/p99 of TTFT, TPOT, ITL, E2E, tokens/s,
  goodput, acceptance), the summary as plain text
  (:func:`harness.report.summary.render_summary`), ``report.json``, the journal, the tail of
  each server log (``logs/*``).

Next to it (:func:`write_results_metadata`): ``environment.properties`` for the overview's
Environment widget: per experiment its verdict with the exit code and the failed checks,
the required checks judged (N of M), and the timeline (phases and faults, seconds from the
first phase's start) (:func:`overview`), then the stack (vLLM version, launcher, method,
draft, k, host, Python); ``categories.json`` (:data:`CATEGORIES`: SLO, integrity,
recovery, liveness and hang, speculation, memory and drift, required check not judged,
harness error, matched on the failing checks' names that every failure message lists) and
``executor.json`` (:func:`executor`: GitHub Actions' run, or this host),
which names the build of each point of the Trend widget.

Where: always ``<run_dir>/allure-results/`` (replaced on every judgement of the run), and
also the directory named by ``$SPECCHAOS_ALLURE_DIR`` when set (added to: results of many
runs gathered for one report). Under pytest with allure-pytest, the experiment's pytest
result is the one result: :func:`merge_into` adds all of the above to it
(:mod:`harness.pytest_plugin`).

The Trend widget needs the ``history/`` of the report generated last time inside the
results directory before ``allure generate``: ``ci/allure-report.sh RESULTS REPORT`` copies
it there.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import platform
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Mapping

from allure_commons.logger import AllureFileLogger
from allure_commons.model2 import (ATTACHMENT_PATTERN, Attachment, Label, Link, Parameter, Status, StatusDetails,
                                   TestResult, TestStepResult)
from allure_commons.types import AttachmentType, LabelType, LinkType, Severity
from allure_commons.utils import md5, uuid4
from rich.console import Console

from faults.registry import REGISTRY
from harness.checks.verdict import EXIT_CODES
from harness.checks.view import Line
from harness.metrics.phases import phase_windows
from harness.report.json_report import read_report
from harness.report.prometheus import model_name
from harness.report.schema import Report, Speculative
from harness.report.summary import family_views, phase_figures, render_summary
from harness.report.timeline_plot import PLOT_FILE, try_plot_timeline
from harness.timeline import read_timeline

__all__ = ["ALLURE_DIR_ENV", "RESULTS_DIR", "STATUS", "CATEGORIES", "allure_result", "write_allure_results",
           "publish_allure", "history_id", "executor", "write_results_metadata", "merge_into", "overview"]

log = logging.getLogger(__name__)

#: Environment variable naming a directory that gathers the Allure results of many runs.
ALLURE_DIR_ENV = "SPECCHAOS_ALLURE_DIR"
#: The run's own results directory, under the run directory.
RESULTS_DIR = "allure-results"
#: Verdict → Allure status.
STATUS = {"pass": Status.PASSED, "fail": Status.FAILED, "aborted": Status.FAILED, "error": Status.BROKEN}
#: Lines (and at most bytes) of each server log attached.
LOG_TAIL_LINES = 200
LOG_TAIL_BYTES = 64 * 1024
_PHASES = ("warm-up", "baseline", "fault", "recovery", "after")


def _checks_named(*prefixes: str) -> str:
    """A ``messageRegex`` (Java, whole message) matching a message with a line that starts
    (after spaces) with a failing check ``<prefix>.<rest>:``, as both the result's message
    (:func:`_status_details`: ``name: detail``) and the pytest item's
    (:func:`harness.pytest_plugin.failure_message`: ``  name: observed X, limit Y``) have it."""
    return r"(?s)(.*\n)?[ \t]*(" + "|".join(prefixes) + r")\.[^\n:]*:.*"


#: Allure's failure categories (``categories.json``): a failed result lands in every
#: category whose ``messageRegex`` its message matches; a broken one (verdict ``error``: the
#: run could not be judged) is a harness error.
CATEGORIES: list[dict[str, Any]] = [
    {"name": "SLO", "description": "latency, error-rate or degradation limits (slo.*, degradation.*, safeguards.*)",
     "matchedStatuses": ["failed"], "messageRegex": _checks_named("slo", "degradation", "safeguards")},
    {"name": "integrity", "description": "outputs that differ from the non-speculative reference, malformed or "
                                         "cut streams called complete (integrity.*)",
     "matchedStatuses": ["failed"], "messageRegex": _checks_named("integrity")},
    {"name": "recovery", "description": "too slow (or no) recovery after the fault, or the steady state missed "
                                        "after the method (recovery.*, steady_state.*)",
     "matchedStatuses": ["failed"], "messageRegex": _checks_named("recovery", "steady_state")},
    {"name": "liveness and hang", "description": "health that lies, streams that stall, requests that hang or "
                                                 "are not failed fast, orphans (liveness.*, hang.*, fail_fast.*, "
                                                 "client_abort.*, orphans.*)",
     "matchedStatuses": ["failed"], "messageRegex": _checks_named("liveness", "hang", "fail_fast", "client_abort",
                                                                  "orphans")},
    {"name": "speculation", "description": "acceptance collapse or floor, speedup over plain decoding, the circuit "
                                           "breaker and fallback (speculation.*, acceptance_floor.*, mirror.*, "
                                           "breaker.*, fallback.*)",
     "matchedStatuses": ["failed"], "messageRegex": _checks_named("speculation", "acceptance_floor", "mirror",
                                                                  "breaker", "fallback")},
    {"name": "memory and drift", "description": "server memory swing, and the soak's canaries: acceptance decay, "
                                                "RSS and KV-cache growth, latency drift, error bursts "
                                                "(server_memory.*, soak.*)",
     "matchedStatuses": ["failed"], "messageRegex": _checks_named("server_memory", "soak")},
    {"name": "required check not judged", "description": "what the experiment exists to judge was not judged "
                                                         "(judge.required; verdict error): the run proves nothing "
                                                         "about it",
     "matchedStatuses": ["broken"], "messageRegex": r"(?s)(.*\n)?required check \S+ not judged:.*"},
    {"name": "harness error", "description": "the run could not be judged (verdict error): bad input, a stack that "
                                             "did not start, a fault without evidence, an interruption",
     "matchedStatuses": ["broken"]},
]


def _ms(t: Any) -> int | None:
    """Epoch seconds (float) or an ISO-8601 time → epoch milliseconds (Allure's unit)."""
    if t is None:
        return None
    if isinstance(t, (int, float)):
        return int(round(float(t) * 1000))
    try:
        return int(round(datetime.fromisoformat(str(t)).timestamp() * 1000))
    except ValueError:
        return None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _experiment_key(source: str | None, title: str) -> str:
    """What identifies an experiment across runs: its file's path (relative to the working
    directory when inside it, else absolute), or its title when it has no file."""
    if source and Path(source).is_file():
        p = Path(source).resolve()
        try:
            return str(p.relative_to(Path.cwd().resolve()))
        except ValueError:
            return str(p)
    return f"title:{title}"


def history_id(source: str | None, title: str) -> str:
    """The stable ``testCaseId``/``historyId`` of an experiment (module doc): MD5 hex of its key."""
    return md5(_experiment_key(source, title))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, default=str)
    return str(v)


def _params(pairs: dict[str, Any]) -> list[Parameter]:
    return [Parameter(name=k, value=_fmt(v)) for k, v in pairs.items() if v is not None]


def _check_phase(name: str) -> str | None:
    parts = str(name).split(".")
    return next((p for p in parts if p in _PHASES), None)


def _failing_lines(rep: Report) -> list[str]:
    return [f"{c.name}: {c.detail or ''}".rstrip(": ") for c in rep.failed_checks()]


def _status_details(rep: Report) -> StatusDetails | None:
    verdict = rep.verdict
    failing = _failing_lines(rep)
    errors = list(rep.errors)
    alerts = [v.text for v in family_views(rep.to_dict()) if isinstance(v, Line) and v.style == "alert"]   # an abort
    if verdict == "pass":
        return None
    if verdict == "error":
        lines = errors or ["the run could not be judged"]
        return StatusDetails(message="\n".join(lines), trace="\n".join(lines + failing) or None)
    lines = alerts + (failing or [f"verdict {verdict}"])
    return StatusDetails(message="\n".join(lines), trace="\n".join(lines + errors) or None)


def _phase_steps(rep: Report, events: list[dict[str, Any]]) -> list[TestStepResult]:
    windows = phase_windows(events)
    failed_in = {_check_phase(c.name) for c in rep.failed_checks()}
    steps = []
    load_start = next((e["t"] for e in events if e.get("event") == "load_started"), None)
    first = min((a for a, _ in windows.values()), default=None)
    if load_start is not None and first is not None and first > load_start:
        steps.append(TestStepResult(name="phase warm-up", status=Status.PASSED, start=_ms(load_start),
                                    stop=_ms(first), parameters=_params({"duration_s": first - load_start}),
                                    description="load running, not judged"))
    for ph in _PHASES[1:]:
        m = rep.phases.get(ph)
        if m is None:
            continue
        a, b = windows.get(ph, (m.start, m.end))
        figures = {"duration_s": m.duration_s, "requests": m.requests, "errors": m.errors, "error_rate": m.error_rate,
                   "ttft_p95_s": m.ttft_s.p95 if m.ttft_s else None, "e2e_p95_s": m.e2e_s.p95 if m.e2e_s else None,
                   "output_tokens_per_s": m.output_tokens_per_s}
        steps.append(TestStepResult(name=f"phase {ph}", status=Status.FAILED if ph in failed_in else Status.PASSED,
                                    start=_ms(a), stop=_ms(b), parameters=_params(figures)))
    return steps


def _fault_steps(rep: Report) -> list[TestStepResult]:
    """One step per injected fault: from injection to clear (open: to the report's end),
    passed when it left evidence that it acted, else broken."""
    steps = []
    for f in rep.faults:
        ev = f.evidence or {}
        detail = ev.get("detail") or None
        steps.append(TestStepResult(
            name=f"fault {f.kind} on {f.target}", status=Status.PASSED if f.acted else Status.BROKEN,
            statusDetails=None if f.acted else StatusDetails(message=detail or "left no evidence that it acted"),
            start=_ms(f.injected_at), stop=_ms(f.cleared_at),
            parameters=_params({"fault_id": f.fault_id, "acted": f.acted, "evidence": detail,
                                "cleared_at": f.cleared_at,
                                **{f"observed {k}": v for k, v in (ev.get("observations") or {}).items()}})))
    return steps


#: Columns of the per-phase table: (header, phase field, percentile or None).
_TABLE = [("duration_s", "duration_s", None), ("requests", "requests", None), ("errors", "errors", None),
          ("error_rate", "error_rate", None),
          *((f"{m}_{q}_s", f"{m}_s", q) for m in ("ttft", "tpot", "itl", "e2e") for q in ("p50", "p95", "p99")),
          ("output_tokens_per_s", "output_tokens_per_s", None), ("goodput_rps", "goodput_rps", None)]


def phase_table_csv(report: dict[str, Any]) -> str:
    """The per-phase table as CSV: one row per phase (start and end epoch seconds, the
    figures of :data:`_TABLE`, then the check families' per-phase figures
    (:func:`harness.report.summary.phase_figures`, e.g. the speculative server's acceptance
    rate from vLLM's counters); empty cells where the report has no value."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    figures = phase_figures(report)
    w.writerow(["phase", "start", "end", *(h for h, _, _ in _TABLE), *figures])
    for ph, m in (report.get("phases") or {}).items():
        cells = []
        for _, field, q in _TABLE:
            v = m.get(field)
            cells.append((v or {}).get(q) if q else v)
        cells += [f.get(ph) for f in figures.values()]
        w.writerow([ph, m.get("start"), m.get("end"), *("" if v is None else (f"{v:.6g}" if isinstance(v, float)
                                                                               else v) for v in cells)])
    return buf.getvalue()


def _activity_status(run: dict[str, Any]) -> tuple[str, str | None]:
    if run.get("status") == "failed":
        exc = run.get("exception") or []
        return Status.BROKEN, (exc[-1].strip() if exc else "the activity raised")
    if run.get("status") not in (None, "succeeded"):
        return Status.SKIPPED, f"status {run.get('status')}"
    if run.get("tolerance_met") is False:
        return Status.FAILED, f"tolerance not met: output {_fmt(run.get('output'))}"
    return Status.PASSED, None


_WORST = [Status.BROKEN, Status.FAILED, Status.SKIPPED, Status.PASSED]


def _worst(steps: list[TestStepResult], default: str = Status.PASSED) -> str:
    found = {s.status for s in steps}
    return next((s for s in _WORST if s in found), default)


def _activity_steps(runs: list[dict[str, Any]]) -> list[TestStepResult]:
    out = []
    for r in runs:
        act = r.get("activity") or {}
        prov = act.get("provider") or {}
        status, message = _activity_status(r)
        args = prov.get("arguments") or {}
        params = {"function": f"{prov.get('module', '')}.{prov.get('func', '')}".strip(".") or None,
                  **{f"arg {k}": v for k, v in args.items()}}
        if act.get("tolerance") is not None:
            params["tolerance"] = act.get("tolerance")
        if r.get("output") is not None:
            params["output"] = r.get("output")
        out.append(TestStepResult(name=f"{act.get('type', 'activity')} {act.get('name', '?')}", status=status,
                                  statusDetails=StatusDetails(message=message) if message else None,
                                  start=_ms(r.get("start")), stop=_ms(r.get("end")), parameters=_params(params)))
    return out


def _journal_steps(journal: dict | None) -> list[TestStepResult]:
    if not journal:
        return []
    steps = []
    ss = journal.get("steady_states") or {}
    sections = [("steady-state hypothesis before the method", ss.get("before")), ("method", journal.get("run")),
                ("steady-state hypothesis after the method", ss.get("after")), ("rollbacks", journal.get("rollbacks"))]
    for title, section in sections:
        if section is None:
            continue
        runs = (section.get("probes") or []) if isinstance(section, dict) else list(section)
        children = _activity_steps(runs)
        status = _worst(children)
        if isinstance(section, dict) and section.get("steady_state_met") is False and status == Status.PASSED:
            status = Status.FAILED
        starts = [s.start for s in children if s.start]
        stops = [s.stop for s in children if s.stop]
        steps.append(TestStepResult(name=title, status=status, steps=children, start=min(starts, default=None),
                                    stop=max(stops, default=None)))
    return steps


def _check_steps(rep: Report) -> TestStepResult | None:
    if not rep.checks:
        return None
    children = []
    for c in rep.checks:
        status = Status.PASSED if c.passed is True else Status.FAILED if c.passed is False else Status.SKIPPED
        children.append(TestStepResult(name=f"check {c.name}", status=status,
                                       statusDetails=StatusDetails(message=c.detail) if c.detail else None,
                                       parameters=_params({"category": c.category, "observed": c.observed,
                                                           "limit": c.limit})))
    failed = sum(s.status == Status.FAILED for s in children)
    skipped = sum(s.status == Status.SKIPPED for s in children)
    return TestStepResult(name=f"checks ({len(children)}: {failed} failed, {skipped} not judged)",
                          status=Status.FAILED if failed else Status.PASSED, steps=children)


def _fault_kinds(rep: Report, journal: dict | None) -> list[str]:
    """The fault families of the run: those injected, else those the method's actions name."""
    kinds = [f.kind for f in rep.faults if f.kind]
    by_activity = {cls.activity: kind for kind, cls in REGISTRY.items()}
    doc = (journal or {}).get("experiment") or {}
    for act in doc.get("method") or []:
        kind = by_activity.get(((act or {}).get("provider") or {}).get("func"))
        if kind:
            kinds.append(kind)
    return list(dict.fromkeys(kinds))


def _summary_text(report: dict[str, Any]) -> str:
    buf = io.StringIO()
    Console(file=buf, width=160, color_system=None, force_terminal=False, no_color=True,
            highlight=False).print(render_summary(report))
    return buf.getvalue()


def _log_tail(path: Path) -> bytes:
    with path.open("rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - LOG_TAIL_BYTES))
        data = fh.read()
    return b"\n".join(data.splitlines()[-LOG_TAIL_LINES:]) + b"\n"


def _link(source: str | None) -> Link | None:
    if not source or not Path(source).is_file():
        return None
    p = Path(source).resolve()
    server, repo, sha = (os.environ.get(k) for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_SHA"))
    if server and repo and sha:   # in GitHub Actions: the file at the commit that ran
        try:
            rel = p.relative_to(Path.cwd().resolve())
            return Link(type=LinkType.LINK, name=f"experiment {rel}", url=f"{server}/{repo}/blob/{sha}/{rel}")
        except ValueError:
            pass
    return Link(type=LinkType.LINK, name=f"experiment {p.name}", url=p.as_uri())


def allure_result(run_dir: str | Path, report: dict[str, Any], journal: dict | None = None,
                  plot: Path | None = None, plot_error: str | None = None) -> tuple[TestResult, list[tuple]]:
    """The Allure test result of a judged run (module doc), without attachments written.

    Args:
        run_dir: the run directory.
        report: its report (``report.json``'s dict).
        journal: the Chaos Toolkit journal, if any.
        plot: the timeline plot to attach; ``plot_error`` says why there is none.

    Returns:
        ``(result, attachments)``: ``attachments`` are ``(name, AttachmentType, path or
        bytes)`` for :func:`write_allure_results` to write next to the result.
    """
    d = Path(run_dir)
    doc = _read_json(d / "experiment.json") or (journal or {}).get("experiment") or {}
    cfg = _read_json(d / "config.json") or {}
    events = read_timeline(d / "timeline.jsonl")
    rep = Report.model_validate(report)
    title = rep.experiment or str(doc.get("title") or d.name)
    source = rep.source
    key = history_id(source, title)
    spec = rep.stack.speculative or Speculative()
    kinds = _fault_kinds(rep, journal)
    tags = [str(t) for t in doc.get("tags") or []]
    verdict = rep.verdict

    steps = _phase_steps(rep, events) + _fault_steps(rep) + _journal_steps(journal)
    checks = _check_steps(rep)
    if checks is not None:
        steps.append(checks)
    start = _ms((journal or {}).get("start")) or (_ms(events[0]["t"]) if events else None)
    stop = _ms((journal or {}).get("end")) or (_ms(events[-1]["t"]) if events else _ms(rep.generated_at))

    labels = [Label(LabelType.EPIC, "specchaos"), Label(LabelType.STORY, title), Label(LabelType.SUITE, title),
              Label(LabelType.SUB_SUITE, ", ".join(kinds) or "no fault"),
              Label(LabelType.SEVERITY, (Severity.CRITICAL if "gate" in tags else Severity.NORMAL).value),
              Label(LabelType.FRAMEWORK, "specchaos"), Label(LabelType.LANGUAGE, "python"),
              Label(LabelType.HOST, platform.node())]
    labels += [Label(LabelType.FEATURE, k) for k in kinds] + [Label(LabelType.TAG, t) for t in tags]
    params = _params({"launcher": rep.stack.launcher, "target": (cfg.get("stack") or {}).get("target"),
                      "draft": spec.draft, "method": spec.method, "k": spec.num_speculative_tokens,
                      "fault kinds": ", ".join(kinds) or "none", "seed": (cfg.get("load") or {}).get("seed"),
                      "vLLM": rep.stack.vllm_version})
    description = [str(doc.get("description") or "").strip(), f"Verdict: **{verdict}**."]
    if plot_error:
        description.append(f"({plot_error}; the verdict does not depend on the plot)")
    link = _link(source)

    attachments: list[tuple] = []
    if plot is not None and plot.is_file():
        attachments.append(("timeline plot", AttachmentType.PNG, plot))
    attachments.append(("per-phase table", AttachmentType.CSV, phase_table_csv(report).encode("utf-8")))
    attachments.append(("summary", AttachmentType.TEXT, _summary_text(report).encode("utf-8")))
    attachments.append(("report.json", AttachmentType.JSON, json.dumps(report, indent=2).encode("utf-8")))
    if journal is not None:
        attachments.append(("journal.json", AttachmentType.JSON, json.dumps(journal, indent=2, default=str).encode()))
    elif (d / "journal.json").is_file():
        attachments.append(("journal.json", AttachmentType.JSON, d / "journal.json"))
    for lg in sorted((d / "logs").glob("*")) if (d / "logs").is_dir() else []:
        if lg.is_file():
            attachments.append((f"log tail: {lg.name}", AttachmentType.TEXT, _log_tail(lg)))

    result = TestResult(
        uuid=uuid4(), name=title, fullName=_experiment_key(source, title), historyId=key, testCaseId=key,
        status=STATUS.get(verdict, Status.UNKNOWN), statusDetails=_status_details(rep),
        description="\n\n".join(p for p in description if p), steps=steps, parameters=params, labels=labels,
        links=[link] if link else [], start=start, stop=stop, titlePath=["specchaos", title])
    return result, attachments


def _dirs(run_dir: Path, extra: list[str | Path] | None) -> list[Path]:
    out = [run_dir / RESULTS_DIR]
    more = list(extra or [])
    if os.environ.get(ALLURE_DIR_ENV):
        more.append(os.environ[ALLURE_DIR_ENV])
    for m in more:
        p = Path(m)
        if p.resolve() not in {o.resolve() for o in out}:
            out.append(p)
    return out


def executor(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``executor.json``: what ran the tests. In GitHub Actions (``$GITHUB_RUN_ID`` set) the
    workflow run (name, ``buildOrder`` = run number, build URL); elsewhere this host, with
    ``buildOrder`` the epoch second, so trend points keep their order."""
    env = os.environ if environ is None else environ
    if env.get("GITHUB_RUN_ID"):
        server, repo = env.get("GITHUB_SERVER_URL", "https://github.com"), env.get("GITHUB_REPOSITORY", "")
        number = env.get("GITHUB_RUN_NUMBER", "")
        return {"name": "GitHub Actions", "type": "github", "reportName": "specchaos",
                "buildName": f"{env.get('GITHUB_WORKFLOW', 'workflow')} #{number}",
                "buildOrder": int(number) if number.isdigit() else None,
                "buildUrl": f"{server}/{repo}/actions/runs/{env['GITHUB_RUN_ID']}"}
    stamp = int(time.time())
    return {"name": platform.node() or "local", "type": "local", "reportName": "specchaos",
            "buildName": f"{platform.node() or 'local'} {datetime.fromtimestamp(stamp).isoformat(timespec='seconds')}",
            "buildOrder": stamp}


def _prop(text: object, key: bool = False) -> str:
    """``text`` escaped for a Java ``.properties`` file (read as ISO-8859-1 by Allure):
    backslashes, line breaks, non-ASCII as ``\\uXXXX``; in a key also spaces, ``:``, ``=``."""
    out = []
    for ch in str(text).replace("\n", " "):
        if ch == "\\":
            out.append("\\\\")
        elif key and ch in " :=#!":
            out.append("\\" + ch)
        elif ord(ch) > 126:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def _offset(t: float | None, t0: float | None) -> str:
    return "?" if t is None or t0 is None else f"+{t - t0:.1f} s"


def overview(report: dict[str, Any]) -> dict[str, str]:
    """What the overview page says of one run (its Environment widget): ``verdict`` (the
    verdict, the exit code and the failed checks), ``required`` (judged N of M, those not
    judged) and ``timeline`` (each phase's start and length from the first phase's start,
    and when each fault acted and was cleared)."""
    rep = Report.model_validate(report)
    failed = [c.name for c in rep.failed_checks()]
    out = {"verdict": f"{rep.verdict.upper()} (exit code {EXIT_CODES.get(rep.verdict, 2)}); "
                      + (f"{len(failed)} failed: {', '.join(failed)}" if failed else "no check failed")}
    if rep.errors:
        out["errors"] = "; ".join(rep.errors)
    req = rep.required
    if req is not None and req.of:
        missing = [f"{r.name} ({r.reason})" for r in req.checks if not r.judged]
        out["required"] = f"judged {req.judged} of {req.of}" + (
            f"; not judged: {', '.join(missing)}" if missing else "")
    t0 = min((m.start for m in rep.phases.values() if m.start is not None), default=None)
    parts = [f"{ph} {_offset(m.start, t0)} for {m.duration_s or 0:.1f} s" for ph, m in rep.phases.items()]
    parts += [f"{f.kind} on {f.target} {_offset(f.injected_at, t0)}"
              + (f" to {_offset(f.cleared_at, t0)}" if f.cleared_at is not None else "")
              + ("" if f.acted else " (no evidence)") for f in rep.faults]
    if parts:
        out["timeline"] = "; ".join(parts)
    return out


#: The stack's keys of ``environment.properties`` (one value for every run in a results directory).
_STACK_KEYS = ("vLLM", "launcher", "method", "draft", "k", "host", "python")


def write_results_metadata(target: str | Path, report: dict[str, Any] | None = None) -> None:
    """Write Allure's files beside the results in ``target``: ``categories.json``,
    ``executor.json`` and, given a report, ``environment.properties``: the stack of that run
    (vLLM version, launcher, method, draft model name, k, host, Python) and, per
    experiment, :func:`overview` as ``<experiment>: verdict`` etc. — the overview page's
    Environment widget, so the page a person opens first says whether each run passed and
    why. Another experiment's lines already in the file are kept (results of many runs
    gathered in one directory); the library has no writer for these files."""
    t = Path(target)
    t.mkdir(parents=True, exist_ok=True)
    (t / "categories.json").write_text(json.dumps(CATEGORIES, indent=2) + "\n", encoding="utf-8")
    (t / "executor.json").write_text(json.dumps({k: v for k, v in executor().items() if v is not None}, indent=2)
                                     + "\n", encoding="utf-8")
    if report is None:
        return
    rep = Report.model_validate(report)
    spec = rep.stack.speculative or Speculative()
    env = {"vLLM": rep.stack.vllm_version, "launcher": rep.stack.launcher, "method": spec.method,
           "draft": model_name(spec.draft) or None, "k": spec.num_speculative_tokens,
           "host": platform.node(), "python": platform.python_version()}
    title = rep.experiment or "experiment"
    mine = _prop(f"{title}: ", key=True)
    path = t / "environment.properties"
    kept = [ln for ln in (path.read_text(encoding="latin-1").splitlines() if path.is_file() else [])
            if ln and not ln.startswith(mine) and ln.split("=", 1)[0] not in _STACK_KEYS]
    mine_lines = [f"{mine}{_prop(k, key=True)}={_prop(v)}" for k, v in overview(report).items()]
    lines = mine_lines + kept + [f"{k}={_prop(v)}" for k, v in env.items() if v is not None]
    path.write_text("\n".join(lines) + "\n", encoding="latin-1")


def write_allure_results(run_dir: str | Path, report: dict[str, Any] | None = None, journal: dict | None = None,
                         extra_dirs: list[str | Path] | None = None) -> list[Path]:
    """Draw the timeline plot and write the run's Allure result (module doc) into
    ``<run_dir>/allure-results/`` (replaced) and every other directory: ``extra_dirs`` and
    ``$SPECCHAOS_ALLURE_DIR`` (added to).

    Args:
        run_dir: a judged run directory.
        report: its report (default: read ``report.json``).
        journal: the Chaos Toolkit journal (default: read ``journal.json`` when present).
        extra_dirs: more result directories.

    Returns:
        The ``*-result.json`` files written, one per directory.

    Raises:
        OSError: a directory cannot be written; ValueError: no report.
    """
    d = Path(run_dir)
    if report is None:
        try:   # read as its typed view: a file without the shape of a report is refused here
            report = read_report(d / "report.json").to_dict()
        except (OSError, ValueError) as exc:   # pydantic's ValidationError is a ValueError
            raise ValueError(f"{d / 'report.json'}: no readable report to publish ({exc})") from exc
    if journal is None and (d / "journal.json").is_file():
        journal = _read_json(d / "journal.json")
    plot, plot_error = try_plot_timeline(d, title=str(report.get("experiment") or d.name))
    result, attachments = allure_result(d, report, journal, plot=plot, plot_error=plot_error)
    written = []
    for i, target in enumerate(_dirs(d, extra_dirs)):
        logger = AllureFileLogger(target, clean=(i == 0))   # the run's own directory holds this run only
        result.attachments = []
        for name, kind, body in attachments:
            file_name = ATTACHMENT_PATTERN.format(prefix=uuid4(), ext=kind.extension)
            if isinstance(body, Path):
                logger.report_attached_file(body, file_name)
            else:
                logger.report_attached_data(body, file_name)
            result.attachments.append(Attachment(name=name, source=file_name, type=kind.mime_type))
        write_results_metadata(target, report)
        before = set(Path(target).glob("*-result.json"))
        logger.report_result(result)
        written += sorted(set(Path(target).glob("*-result.json")) - before)
    return written


#: Labels allure-pytest sets on its results itself (kept as it sets them by :func:`merge_into`).
_PYTEST_OWN_LABELS = {LabelType.FRAMEWORK, LabelType.LANGUAGE, LabelType.HOST, LabelType.THREAD}


def merge_into(target: TestResult, run_dir: str | Path, report: dict[str, Any],
               attach: Callable[[str, AttachmentType, bytes | Path], None], journal: dict | None = None) -> None:
    """Make ``target``, allure-pytest's result of an experiment's pytest item, the
    experiment's one Allure result: the steps (phases, faults, Chaos Toolkit activities,
    checks), parameters, labels, links, description and attachments of
    :func:`allure_result` go into it. Its status stays the item's outcome (the verdict's:
    passed, failed), except that a run that could not be judged (verdict ``error``) is
    broken, as in :data:`STATUS`.

    Args:
        target: the pytest item's result (before allure-pytest writes it).
        run_dir: the run directory; its ``timeline.png`` is attached (drawn when missing).
        report: the run's report.
        attach: writes one attachment of ``target``: ``(name, type, bytes or file)``.
        journal: the Chaos Toolkit journal (default: ``journal.json`` when present).
    """
    d = Path(run_dir)
    if journal is None and (d / "journal.json").is_file():
        journal = _read_json(d / "journal.json")
    plot, plot_error = (d / PLOT_FILE, None) if (d / PLOT_FILE).is_file() else \
        try_plot_timeline(d, title=str(report.get("experiment") or d.name))
    result, attachments = allure_result(d, report, journal, plot=plot, plot_error=plot_error)
    target.steps.extend(result.steps)
    have = {p.name for p in target.parameters}
    target.parameters.extend(p for p in result.parameters if p.name not in have)
    target.labels.extend(lb for lb in result.labels if lb.name not in _PYTEST_OWN_LABELS)
    target.links.extend(result.links)
    target.description = result.description
    if report.get("verdict") == "error":
        target.status = Status.BROKEN
    for name, kind, body in attachments:
        attach(name, kind, body)


def publish_allure(run_dir: str | Path, report: dict[str, Any] | None = None, journal: dict | None = None) -> str | None:
    """:func:`write_allure_results` that never raises (called by every judgement: a
    report is a reading aid, it never changes a verdict). Returns None, or the error in
    one line (also logged)."""
    try:
        files = write_allure_results(run_dir, report, journal)
        log.info("allure results: %s", ", ".join(str(f.parent) for f in files))
        return None
    except Exception as exc:  # noqa: BLE001
        log.warning("allure results of %s not written: %s: %s", run_dir, type(exc).__name__, exc, exc_info=True)
        return f"allure results not written: {type(exc).__name__}: {exc}"

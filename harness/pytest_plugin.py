"""The ``specchaos`` pytest plugin: experiment files as test items, and fixtures for
hand-written chaos tests. Registered as the ``pytest11`` entry point ``specchaos``; load it
explicitly with ``-p harness.pytest_plugin``.

**Collection.** A YAML/JSON file with a ``configuration.specchaos`` block is one test item
(its ``title`` is the item's name) when it is named on the command line, lies under a
directory named on the command line, or matches a glob of ``--specchaos-experiments`` /
the ini option ``specchaos_experiments`` (relative to the rootdir). Files found only by
walking ``testpaths`` are never collected (a plain ``pytest`` never starts an experiment),
nor are those found by walking the project's root directory (the ini file's; ``pytest .``), ``.json`` files not named
one by one, and the copies in run directories. Under a named directory, a YAML file that
does not parse, or a Chaos Toolkit experiment without ``configuration.specchaos``, is a
collection error (a broken gate experiment never drops silently out of the gate).

**Outcome.** The item runs the real runner (:func:`harness.experiment.runner.run`) into
``<out>/<NN>-<file stem>/`` during *setup*, so the verdict maps onto pytest's outcomes:

=========== ============================================================================
verdict     outcome
=========== ============================================================================
``pass``    passed
``fail``    failed; the message lists each failing check (name, observed, limit, detail)
``aborted`` failed; the message names the safeguard's reason and the failing checks
``error``   error (setup failed): the run's errors; bad input (:class:`SpecchaosError`)
            too, as its one line
=========== ============================================================================

``<out>`` is ``--specchaos-out`` (default ``results/pytest-<epoch>``). ``--specchaos-set
PATH=VALUE``, ``--specchaos-var-file FILE`` and ``SPECCHAOS_SET_*`` override every experiment's
``configuration.specchaos`` as ``specchaos run`` does (:mod:`harness.experiment.overrides`). Each item carries the
markers of its experiment's ``tags`` that are registered here (``chaos``, ``gate``, ``slow``),
so ``-m gate`` selects the gate experiments.

**Stacks are shared.** The plugin sets a :class:`harness.stack.pool.StackPool` as the
session's stack provider: items whose validated ``stack`` blocks are equal run on one started
stack (see that module for when a stack is reused, and where its logs go). Every pooled stack is
stopped at the end of the pytest session, on Ctrl-C and on SIGTERM (turned into
KeyboardInterrupt); a crash leaves run state files for ``specchaos cleanup``.

**Allure.** Two ways, one result per experiment either way:

* without allure-pytest (or without its ``--alluredir``): ``--specchaos-allure-dir DIR``
  sets ``SPECCHAOS_ALLURE_DIR``, and each run writes its own Allure result there
  (:mod:`harness.report.allure`);
* with allure-pytest and ``--alluredir DIR``: allure-pytest writes the item's result, and
  this plugin makes it the experiment's result (:func:`harness.report.allure.merge_into`,
  at the item's teardown): phases and faults as steps, the timeline plot and the per-phase
  table attached, broken for an ``error`` verdict; the runs write no second result there
  (a ``--specchaos-allure-dir`` naming the same directory is ignored). At the session's
  end ``categories.json``, ``executor.json`` and ``environment.properties`` are written
  beside the results (:func:`harness.report.allure.write_results_metadata`).

**Gate mode** (``--specchaos-gate``, used by ``ci/gate.sh``): the session's exit status is
0 when every selected experiment passed, 1 when one failed (or aborted) and none erred, 2 on
any error, on nothing selected (one line on stderr), and on pytest's own usage or
collection errors; a selected hand-written test that failed makes it at least 1. The verdict table (experiment, verdict, failing checks, duration) is
printed after every run with experiment items, and written as ``<out>/verdicts.json``.

**Fixtures** for hand-written chaos tests: ``specchaos_pool`` (session scope: the pool
itself, for tests that borrow stacks their own way), and (function scope, one run directory
per test under ``<out>/tests/``) ``specchaos_stack_config`` (override it to choose the stack; default
``StackConfig(models_dir=<rootdir>/models)``), ``specchaos_stack`` (a started stack from the
pool), ``specchaos_load`` (the harness's locust load against it), ``specchaos_fault`` (inject
by kind and params through the fault registry; every fault cleared at teardown).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from allure_commons.model2 import Status
from allure_commons.utils import uuid4

from faults.inject import FaultHandle, FaultInjector, InjectionContext
from faults.ledger import Ledger
from harness.errors import SpecchaosError
from harness.experiment import runner
from harness.experiment import session as sess
from harness.experiment.overrides import Override, collect_overrides
from harness.report.allure import merge_into, write_results_metadata
from harness.load.config import LoadConfig
from harness.load.locust_process import LocustProcess
from harness.load.prompts import build_bucketed_prompt_set, save_prompt_set
from harness.load.records import RequestRecord, read_records
from harness.metrics.steps import schedule_fields
from harness.stack.config import StackConfig
from harness.stack.pool import StackPool
from harness.stack.preflight import resolve_models
from harness.timeline import Timeline

__all__ = ["MARKERS", "EXPERIMENT_SUFFIXES", "outcome_of", "markers_of", "failure_message", "gate_exit_code",
           "verdict_table", "run_root"]

#: The markers this plugin registers; an experiment tag of the same name becomes the marker.
MARKERS = {
    "chaos": "a chaos experiment (every experiment file; hand-written chaos tests may use it too)",
    "gate": "a pre-release gate experiment: ci/gate.sh runs the experiments tagged `gate`",
    "slow": "a long experiment (minutes); deselect with -m 'not slow'",
}
EXPERIMENT_SUFFIXES = (".yaml", ".yml", ".json")
ALLURE_ENV = "SPECCHAOS_ALLURE_DIR"
#: The tag of experiments that must fail (``experiments/selftest/``): their item is a strict xfail.
SELFTEST_TAG = "selftest"
NOT_AN_EXPERIMENT = "no configuration.specchaos block (not a Chaos Toolkit experiment)"

_STATE = pytest.StashKey["_PluginState"]()


@dataclass
class _PluginState:
    out: Path
    explicit: list[Path]
    globs: list[str]
    rootdir: Path
    gate: bool
    project_root: Path | None = None   # the directory of pytest's ini file: named alone, it is searched for no experiment
    pool: StackPool | None = None
    #: ``--specchaos-set``/``--specchaos-var-file`` and ``SPECCHAOS_SET_*``: applied to every experiment item
    overrides: list[Override] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    items: int = 0
    test_errors: int = 0   # hand-written tests whose setup/teardown failed
    test_judged: int = 0   # hand-written tests that ran to a pass or a failure
    reports: list[dict[str, Any]] = field(default_factory=list)   # environment.properties under allure-pytest

    def get_pool(self) -> StackPool:
        if self.pool is None:
            self.pool = StackPool(self.out / "stacks")
            sess.set_stack_provider(self.pool)
            if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):   # stacks are shared from now on
                signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
        return self.pool


# ---------------------------------------------------------------------- pure mappings
def outcome_of(verdict: str | None) -> str:
    """pytest outcome of a verdict: ``"passed"`` (pass), ``"failed"`` (fail, aborted) or
    ``"error"`` (error, anything unknown or missing)."""
    return {"pass": "passed", "fail": "failed", "aborted": "failed"}.get(verdict or "", "error")


def markers_of(tags: Any) -> list[str]:
    """The registered markers (:data:`MARKERS`) among an experiment's ``tags``, in
    :data:`MARKERS` order; other tags (and a non-list) give none."""
    tags = {str(t) for t in tags} if isinstance(tags, (list, tuple)) else set()
    return [m for m in MARKERS if m in tags]


def failing_checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The checks of ``report`` that failed (``passed`` is false; not-judged ones are not failures)."""
    return [c for c in report.get("checks") or [] if c.get("passed") is False]


def _num(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)


def failure_message(report: dict[str, Any], run_dir: Path | None = None) -> str:
    """The item's message for a verdict that is not ``pass``: the verdict, the run's errors
    (error) or abort reason (aborted), then one line per failing check
    ``  name: observed X, limit Y (detail)``, then where the report is."""
    verdict = report.get("verdict")
    lines = [f"verdict: {verdict} ({report.get('experiment') or 'experiment'})"]
    for err in report.get("errors") or []:
        lines.append(f"  error: {err}")
    abort = (report.get("safeguards") or {}).get("abort")
    if verdict == "aborted" and abort:
        lines.append(f"  aborted: {abort.get('reason')}")
    for c in failing_checks(report):
        line = f"  {c.get('name')}: observed {_num(c.get('observed'))}, limit {_num(c.get('limit'))}"
        if c.get("detail"):
            line += f" ({c['detail']})"
        lines.append(line)
    if run_dir is not None:
        lines.append(f"  report: {run_dir / 'report.json'}")
    return "\n".join(lines)


def gate_exit_code(verdicts: list[str | None]) -> int:
    """The gate's exit code over the selected experiments' verdicts: 2 when there is none or
    any is ``error`` (or missing: the run never judged), 1 when any is ``fail`` or
    ``aborted``, else 0."""
    if not verdicts or any(outcome_of(v) == "error" for v in verdicts):
        return 2
    return 1 if any(outcome_of(v) == "failed" for v in verdicts) else 0


#: Failing check names the verdict table shows per experiment (the rest as ``+N more``).
TABLE_CHECKS = 2


def _failing_cell(names: list[str]) -> str:
    if not names:
        return "-"
    more = len(names) - TABLE_CHECKS
    return ", ".join(names[:TABLE_CHECKS]) + (f" +{more} more" if more > 0 else "")


def verdict_table(rows: list[dict[str, Any]]) -> str:
    """The compact verdict table: one line per experiment (``experiment``, ``verdict``, the
    first :data:`TABLE_CHECKS` ``failing`` check names and how many more, ``duration_s``
    in whole seconds), columns aligned, a header first. The item's failure message lists
    every failing check."""
    head = ("experiment", "verdict", "failing checks", "duration")
    body = [(str(r["experiment"]), str(r["verdict"]), _failing_cell(list(r["failing"])),
             f"{r['duration_s']:.0f} s") for r in rows]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(3)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths) + "  {}"
    return "\n".join(fmt.format(*line) for line in [head, *body])


# ---------------------------------------------------------------------- options and set-up
def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("specchaos", "specchaos chaos experiments")
    group.addoption("--specchaos-experiments", action="append", default=[], metavar="GLOB",
                    help="collect the experiment files matching GLOB (relative to the rootdir); repeatable")
    group.addoption("--specchaos-out", default=None, metavar="DIR",
                    help="base of the run directories (default: results/pytest-<epoch>)")
    group.addoption("--specchaos-allure-dir", default=None, metavar="DIR",
                    help="write each experiment's Allure results here (sets $SPECCHAOS_ALLURE_DIR); "
                         "default: allure-pytest's --alluredir when given")
    group.addoption("--specchaos-gate", action="store_true", default=False,
                    help="gate exit status: 0 all passed, 1 a failure, 2 an error or no experiment selected")
    group.addoption("--specchaos-set", action="append", default=[], metavar="PATH=VALUE",
                    help="override a field of every experiment's configuration.specchaos (as `specchaos run --set`); "
                         "repeatable")
    group.addoption("--specchaos-var-file", action="append", default=[], metavar="FILE",
                    help="a YAML/JSON mapping of dotted paths to values for every experiment (as `specchaos run "
                         "--var-file`); repeatable")
    parser.addini("specchaos_experiments", type="args", default=[],
                  help="globs of experiment files to collect (relative to the rootdir)")


def pytest_configure(config: pytest.Config) -> None:
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    out = Path(config.getoption("specchaos_out") or f"results/pytest-{int(time.time())}").resolve()
    explicit = []
    if config.args_source == pytest.Config.ArgsSource.ARGS:
        explicit = [Path(str(a).split("::")[0]).resolve() for a in config.args]
    globs = list(config.getoption("specchaos_experiments") or []) + list(config.getini("specchaos_experiments") or [])
    for pattern in globs:   # matches become command-line arguments: collected, then selected by -m/-k
        for path in sorted(Path(config.rootpath).glob(pattern)):
            if path.suffix in EXPERIMENT_SUFFIXES and path.resolve() not in explicit:
                config.args.append(str(path))
                explicit.append(path.resolve())
    try:
        overrides = collect_overrides(config.getoption("specchaos_set") or [], config.getoption("specchaos_var_file") or [])
    except SpecchaosError as exc:
        raise pytest.UsageError(exc.one_line()) from None
    config.stash[_STATE] = _PluginState(out=out, explicit=explicit, globs=globs, rootdir=Path(config.rootpath),
                                        project_root=config.inipath.parent.resolve() if config.inipath else None,
                                        gate=bool(config.getoption("specchaos_gate")), overrides=overrides)
    allure_dir = config.getoption("specchaos_allure_dir")
    allure_pytest = allure_pytest_dir(config)
    if allure_dir and (allure_pytest is None or Path(allure_dir).resolve() != allure_pytest):
        os.environ[ALLURE_ENV] = str(Path(allure_dir).resolve())


def allure_pytest_dir(config: pytest.Config) -> Path | None:
    """allure-pytest's ``--alluredir`` when that plugin is loaded and writing, else None."""
    d = getattr(config.option, "allure_report_dir", None)
    return Path(d).resolve() if d else None


def _allure_listener(config: pytest.Config) -> Any:
    """allure-pytest's listener (its results in progress), or None when it is not writing."""
    return config.pluginmanager.getplugin("allure_listener") if allure_pytest_dir(config) else None


def run_root(config: pytest.Config) -> Path | None:
    """The base of this session's run directories (``--specchaos-out``), or None when the
    plugin is not configured."""
    st = config.stash.get(_STATE, None)
    return st.out if st is not None else None


def _sigterm_as_interrupt(signum: int, frame: Any) -> None:
    """SIGTERM ends the pytest session like Ctrl-C: pooled stacks are stopped on the way out."""
    raise KeyboardInterrupt


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """Experiment files named on the command line (or by the globs), or found under a
    directory named there. Found by recursion: YAML only (``.json`` must be named), never
    by walking the project's root directory (``pytest .`` runs no experiment), never a run directory's
    copy (a directory holding ``report.json`` or ``run.json``). A YAML file found there that
    does not parse, or that is a Chaos Toolkit experiment without ``configuration.specchaos``,
    is a collection error: a broken gate experiment must not drop out of the gate."""
    if file_path.suffix not in EXPERIMENT_SUFFIXES:
        return None
    st = parent.config.stash[_STATE]
    path = file_path.resolve()
    named = path in st.explicit
    if not named:
        if file_path.suffix == ".json" or _in_run_dir(path):
            return None
        if not any(e in path.parents and e != st.project_root for e in st.explicit):
            return None
    doc, why = _read_doc(file_path)
    if doc is None and not (named or why == "not YAML" or why == "no configuration.specchaos block"):
        return None
    f = ExperimentFile.from_parent(parent, path=file_path)
    f.doc, f.why = doc, why
    return f


def _in_run_dir(path: Path) -> bool:
    return any((path.parent / name).exists() for name in ("report.json", "run.json"))


def _read_doc(path: Path) -> tuple[dict[str, Any] | None, str]:
    """(the parsed document, "") when it is a specchaos experiment (has
    ``configuration.specchaos``), else (None, why): "not YAML" (unreadable or unparsable),
    "no configuration.specchaos block" (a Chaos Toolkit experiment without it: it has a
    ``method`` or ``steady-state-hypothesis``), or :data:`NOT_AN_EXPERIMENT` (any other file)."""
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        return None, "not YAML" if not isinstance(exc, OSError) else "not readable"
    if not isinstance(doc, dict):
        return None, NOT_AN_EXPERIMENT
    if isinstance(doc.get("configuration"), dict) and "specchaos" in doc["configuration"]:
        return doc, ""
    if "method" in doc or "steady-state-hypothesis" in doc:
        return None, "no configuration.specchaos block"
    return None, NOT_AN_EXPERIMENT


# ---------------------------------------------------------------------- items
class ExperimentFile(pytest.File):
    """One experiment file; yields one :class:`ExperimentItem`."""

    doc: dict[str, Any] | None = None
    why: str = NOT_AN_EXPERIMENT

    def collect(self):
        if self.doc is None:
            raise SpecchaosError(f"not a specchaos experiment: {self.why}", where=str(self.path))
        title = str(self.doc.get("title") or self.path.stem)
        item = ExperimentItem.from_parent(self, name=title)
        for m in markers_of(self.doc.get("tags")):
            item.add_marker(m)
        if SELFTEST_TAG in (self.doc.get("tags") or []):   # must fail: a pass is an error of the harness
            item.add_marker(pytest.mark.xfail(strict=True, raises=ExperimentFailed,
                                              reason="a self-test experiment: its verdict must be fail"))
        yield item

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, SpecchaosError):
            return excinfo.value.one_line()
        return super().repr_failure(excinfo)


class ExperimentFailed(AssertionError):
    """The verdict was ``fail`` or ``aborted`` (the item fails; an assertion, so
    allure-pytest calls it failed, not broken)."""


class ExperimentItem(pytest.Item):
    """One experiment, run in :meth:`setup` (so an ``error`` verdict is a pytest error)."""

    report: dict[str, Any] | None = None
    run_dir: Path | None = None

    def setup(self) -> None:
        st = self.config.stash[_STATE]
        st.items += 1
        self.run_dir = st.out / f"{st.items:02d}-{self.path.stem}"
        st.get_pool()
        t0 = time.monotonic()
        row = {"experiment": self.name, "file": str(self.path), "run_dir": str(self.run_dir),
               "verdict": "error", "failing": [], "duration_s": 0.0}
        st.rows.append(row)
        bad_input = None
        try:
            _code, self.report = runner.run(self.path, self.run_dir, overrides=st.overrides)
        except SpecchaosError as exc:   # bad input: nothing started
            bad_input = exc.one_line()
        if bad_input is not None:   # failed outside the except block: one line, no chained traceback
            row.update(duration_s=time.monotonic() - t0, errors=[bad_input])
            pytest.fail(bad_input, pytrace=False)
        report = self.report or {}
        row.update(verdict=report.get("verdict"), failing=[c.get("name") for c in failing_checks(report)],
                   duration_s=time.monotonic() - t0, errors=list(report.get("errors") or []))
        if any(str(e).startswith(("interrupted by SIGINT", "interrupted by SIGTERM")) for e in row["errors"]):
            raise KeyboardInterrupt   # the runner caught the signal: end the pytest session too
        self.user_properties += [("verdict", row["verdict"]), ("run_dir", str(self.run_dir))]
        if outcome_of(report.get("verdict")) == "error":
            pytest.fail(failure_message(report, self.run_dir), pytrace=False)

    def runtest(self) -> None:
        if outcome_of((self.report or {}).get("verdict")) == "failed":
            raise ExperimentFailed(failure_message(self.report or {}, self.run_dir))

    def teardown(self) -> None:
        """With allure-pytest writing, make its result of this item the experiment's one
        result (module doc). Never fails the item: a problem is logged."""
        listener = _allure_listener(self.config)
        if listener is None:
            return
        try:
            result = listener.allure_logger.get_test(None)
            if result is None or result.name != self.name:
                return
            if self.report is None:   # bad input: nothing ran, nothing to add
                result.status = Status.BROKEN
                return

            def attach(name: str, kind: Any, body: bytes | Path) -> None:
                if isinstance(body, Path):
                    listener.allure_logger.attach_file(uuid4(), str(body), name=name, attachment_type=kind,
                                                       parent_uuid=result.uuid)
                else:
                    listener.allure_logger.attach_data(uuid4(), body, name=name, attachment_type=kind,
                                                       parent_uuid=result.uuid)

            merge_into(result, self.run_dir, self.report, attach)
            self.config.stash[_STATE].reports.append(self.report)
        except Exception:  # noqa: BLE001  (a report is a reading aid: it never changes an outcome)
            logging.getLogger(__name__).warning("the Allure result of %s was not completed", self.name, exc_info=True)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, ExperimentFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"experiment: {self.name}"


# ---------------------------------------------------------------------- end of session
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    st = session.config.stash.get(_STATE, None)
    if st is None:
        return
    if st.pool is not None:
        st.pool.close()
        sess.set_stack_provider(None)
    if st.rows:
        st.out.mkdir(parents=True, exist_ok=True)
        pool = {"starts": st.pool.starts, "reuses": st.pool.reuses} if st.pool else {}
        (st.out / "verdicts.json").write_text(json.dumps({"experiments": st.rows, "stacks": pool}, indent=2))
    allure_pytest = allure_pytest_dir(session.config)
    if allure_pytest is not None and st.rows:
        for rep in st.reports:   # each experiment's overview lines, and the stack of the last
            write_results_metadata(allure_pytest, rep)
    if st.gate:
        session.exitstatus = _gate_status(session, st, int(exitstatus))


def _gate_status(session: pytest.Session, st: _PluginState, exitstatus: int) -> int:
    """Gate mode's exit status: :func:`gate_exit_code` over the experiments; a hand-written
    gate test that failed makes it at least 1, one whose setup or teardown failed makes it 2;
    pytest's own errors (interrupted, usage, collection) are 2; nothing selected, or only
    skipped tests, is 2 with one line on stderr."""
    if exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.NO_TESTS_COLLECTED):
        return 2
    if not st.rows and not session.items:   # -m gate deselected everything (or nothing was collected)
        print(f"gate: no gate-tagged experiment selected among {' '.join(map(str, session.config.args))} "
              f"(add `gate` to an experiment's tags)", file=sys.stderr)
        return 2
    if st.test_errors:   # a hand-written gate test could not be set up or torn down: an error, not a finding
        return 2
    if not st.rows and st.test_judged == 0:   # every selected gate test was skipped: nothing was judged
        print("gate: every selected gate test was skipped; nothing was judged", file=sys.stderr)
        return 2
    code = gate_exit_code([r["verdict"] for r in st.rows]) if st.rows else 0
    return max(code, 1) if exitstatus == pytest.ExitCode.TESTS_FAILED else code


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """Counts, for gate mode, hand-written tests (not experiment items) that ran to a pass or
    a failure, and those whose setup or teardown failed (errors)."""
    report = yield
    st = item.config.stash.get(_STATE, None)
    if st is not None and not isinstance(item, ExperimentItem):
        if report.when in ("setup", "teardown") and report.failed:
            st.test_errors += 1
        elif report.when == "call" and not report.skipped:
            st.test_judged += 1
    return report


def pytest_unconfigure(config: pytest.Config) -> None:
    st = config.stash.get(_STATE, None)
    if st is not None and st.pool is not None:
        st.pool.close()
        sess.set_stack_provider(None)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    st = config.stash.get(_STATE, None)
    if st is None or not st.rows:
        return
    terminalreporter.section("specchaos verdicts")
    terminalreporter.write_line(verdict_table(st.rows))
    if st.pool is not None:
        terminalreporter.write_line(f"stacks started: {st.pool.starts}, reused: {st.pool.reuses}; "
                                    f"run directories under {st.out}")


# ---------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def specchaos_pool(request: pytest.FixtureRequest) -> StackPool:
    """The session's one :class:`~harness.stack.pool.StackPool`, the same that runs the
    experiment items and ``specchaos_stack``; also the stack provider of every experiment run
    in this process from now on (:func:`harness.experiment.runner.run` included). Its stacks
    are stopped at the end of the session."""
    return request.config.stash[_STATE].get_pool()


@pytest.fixture
def specchaos_run_dir(request: pytest.FixtureRequest) -> Path:
    """This test's run directory: ``<out>/tests/<test name>/`` (logs, timeline, ledger, records)."""
    st = request.config.stash[_STATE]
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in request.node.name)[:80]
    d = st.out / "tests" / safe
    (d / "logs").mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture
def specchaos_timeline(specchaos_run_dir: Path) -> Timeline:
    """This test's timeline (``timeline.jsonl`` in its run directory)."""
    return Timeline(specchaos_run_dir / "timeline.jsonl")


@pytest.fixture
def specchaos_stack_config(request: pytest.FixtureRequest) -> StackConfig:
    """The stack the fixtures start: override this fixture to choose another. Default: the
    default :class:`StackConfig` (spec with ``draft-exact`` and the ``ref`` server) on the
    models in ``<rootdir>/models``."""
    return StackConfig(models_dir=str(Path(request.config.rootpath) / "models"))


@pytest.fixture
def specchaos_ledger(specchaos_run_dir: Path) -> Ledger:
    """This test's fault ledger (``ledger.jsonl`` in its run directory)."""
    return Ledger(specchaos_run_dir / "ledger.jsonl")


@pytest.fixture
def specchaos_stack(request: pytest.FixtureRequest, specchaos_stack_config: StackConfig, specchaos_run_dir: Path,
                    specchaos_timeline: Timeline, specchaos_ledger: Ledger):
    """A started stack (:class:`harness.stack.base.Stack`) from the session's pool: shared with
    every test and experiment of the same stack configuration. Given back at teardown, clean
    when no fault is left open in the test's ledger (else it is stopped).

    Raises:
        SpecchaosError: the stack could not start (models missing, port in use...).
    """
    pool = request.config.stash[_STATE].get_pool()
    stack = pool.acquire(specchaos_stack_config, specchaos_run_dir, specchaos_timeline)
    try:
        yield stack
    finally:
        pool.release(stack, specchaos_run_dir, clean=not specchaos_ledger.open_faults())


class LoadDriver:
    """The harness's locust load against a stack (the ``specchaos_load`` fixture).

    ``start(**load)`` starts it (``load``: :class:`harness.load.config.LoadConfig` fields,
    default a small greedy closed loop of 2 users), ``stop()`` stops it and returns its
    records (:class:`harness.load.records.RequestRecord`, one per request try);
    ``records()`` reads them so far.
    """

    def __init__(self, stack: Any, run_dir: Path, cfg: StackConfig, timeline: Timeline):
        self.stack, self.run_dir, self.stack_cfg, self.timeline = stack, run_dir, cfg, timeline
        self.process: LocustProcess | None = None

    @property
    def records_path(self) -> Path:
        return self.run_dir / "records.jsonl"

    def start(self, server: str = "spec", run_time_s: float = 600.0, **load: Any) -> "LoadDriver":
        lc = LoadConfig(**({"users": 2, "short_prompts": 6, "medium_prompts": 2, "long_prompts": 0} | load))
        target = resolve_models(self.stack_cfg).target
        prompts = build_bucketed_prompt_set(target, lc.bucket_specs(), seed=lc.seed, max_tokens=lc.max_tokens,
                                            max_tokens_by_bucket=lc.bucket_max_tokens())
        save_prompt_set(self.run_dir / "prompts.json", prompts)
        srv = self.stack.servers[server]
        self.process = LocustProcess(srv.base_url, prompts_path=self.run_dir / "prompts.json",
                                     records_path=self.records_path, model=srv.model, cfg=lc, run_time_s=run_time_s,
                                     log_path=self.run_dir / "logs" / "locust.log")
        self.process.start()
        self.timeline.emit("runner", "load_started", users=lc.closed_users(), mirror=False, profile=lc.profile.kind,
                           **schedule_fields(lc.profile, lc.users))
        return self

    def stop(self) -> list[RequestRecord]:
        if self.process is not None:
            self.process.stop()
            self.process = None
            self.timeline.emit("runner", "load_stopped")
        return self.records()

    def records(self) -> list[RequestRecord]:
        return read_records(self.records_path) if self.records_path.exists() else []


@pytest.fixture
def specchaos_load(specchaos_stack: Any, specchaos_run_dir: Path, specchaos_stack_config: StackConfig,
                   specchaos_timeline: Timeline):
    """A :class:`LoadDriver` on ``specchaos_stack`` (not started: call ``.start(**load)``);
    stopped at teardown."""
    driver = LoadDriver(specchaos_stack, specchaos_run_dir, specchaos_stack_config, specchaos_timeline)
    try:
        yield driver
    finally:
        driver.stop()


class FaultDriver:
    """Injects faults into ``specchaos_stack`` through the registry (the ``specchaos_fault``
    fixture): ``inject(kind, **params) -> FaultHandle`` (ledger first, then act),
    ``evidence(handle, timeout_s)``, ``clear(handle)``; every fault is cleared at teardown.

    Raises (from ``inject``):
        ExperimentError: unknown kind or invalid params (nothing acted).
        FaultError: the fault could not act (it was rolled back).
    """

    def __init__(self, stack: Any, timeline: Timeline, ledger: Ledger):
        self.ctx = InjectionContext(stack=stack, timeline=timeline, ledger=ledger)
        for name, server in stack.servers.items():
            self.ctx.load_urls.setdefault(name, server.base_url)
        self.injector = FaultInjector(self.ctx)

    def inject(self, kind: str, **params: Any) -> FaultHandle:
        return self.injector.inject(kind, params, where=f"specchaos_fault({kind!r})")

    __call__ = inject

    def evidence(self, handle: FaultHandle, timeout_s: float = 60.0) -> Any:
        return self.injector.collect_evidence(handle, timeout_s)

    def clear(self, handle: FaultHandle) -> None:
        self.injector.clear(handle)

    def close(self) -> list[str]:
        """Clear every fault and release any prepared load path; the failures, one line each."""
        failures = [f"{f.get('fault_id')}: {f.get('error')}" for f in self.injector.clear_all()]
        return failures + list(self.injector.release_all())


@pytest.fixture
def specchaos_fault(specchaos_stack: Any, specchaos_timeline: Timeline, specchaos_ledger: Ledger):
    """A :class:`FaultDriver` on ``specchaos_stack``. At teardown every fault is cleared
    (before the stack is given back); a clear that failed fails the test's teardown."""
    driver = FaultDriver(specchaos_stack, specchaos_timeline, specchaos_ledger)
    try:
        yield driver
    finally:
        failures = driver.close()
        if failures:
            pytest.fail("specchaos_fault: clearing failed: " + "; ".join(failures), pytrace=False)

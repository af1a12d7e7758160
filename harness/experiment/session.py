"""The live state of one experiment run, shared by the Chaos Toolkit control,
actions and probes (they run in one process, so a module-level session is the
simplest honest way to share it).

The session owns the run directory and orders its resources:

    start():  stack (both servers, built by the launcher factory, or with a stack provider set
              a started one from it: see :func:`set_stack_provider`) → the declared faults
              prepare the load path → the load router (``stack.breaker.fallback: route``) → prompt set
              → reference outputs → health sampler
              → GPU telemetry sampler → metrics scraper (every server's /metrics) → the speculation
              circuit breaker, subscribed to the scraper (when ``stack.breaker.enabled``) → locust load
              (to ``load_urls["spec"]``, and in mirror mode to ``load_urls["ref"]`` too) → warm-up
              → ``baseline`` phase
    close():  stop load → stop the dense recovery probes → stop the breaker → clear every fault → release the load path
              → stop the load router → stop health
              sampler → stop GPU telemetry → stop metrics scraper → stop stack (or give it back to the provider) → forget the run state (idempotent; also run on
              errors and signals)

Nothing here judges: judgement is :func:`harness.report.judge.judge_run` over the files
this session writes (``prompts.json``, ``reference.jsonl``, ``records.jsonl``,
``timeline.jsonl``, ``ledger.jsonl``, ``logs/``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faults.base import Fault
from faults.inject import FaultInjector, InjectionContext
from faults.ledger import Ledger
from harness.errors import LoadError, SpecchaosError, StackError
from harness.experiment import recovery_probes
from harness.experiment.config import SpecchaosConfig
from harness.experiment.journal import journal_errors, steady_state_summary
from harness.checks.request_classes import reference_invariants
from harness.checks.run import CLASS_REFERENCE_FILE
from harness.load.client import fetch_reference
from harness.load.locust_process import LocustProcess, exit_reason
from harness.load.profiles import load_section, read_load_stats
from harness.load.prompts import Prompt, build_bucketed_prompt_set, save_prompt_set
from harness.load.records import worker_record_files, write_records
from harness.load.source_prep import source_prompts
from harness.load.sources import RequestSpec
from harness.metrics.gpu_telemetry import GPU_FILE, GpuSampler
from harness.metrics.harness_cpu import CpuMeter, load_requests
from harness.metrics.health import HealthSampler
from harness.metrics.scraper import METRICS_FILE, MetricsScraper
from harness.metrics.steps import schedule_fields
from harness.report.allure import publish_allure
from harness.report.prometheus import TEXTFILE as PROM_TEXTFILE
from harness.report.prometheus import publish_prometheus
from harness.report.json_report import write_report
from harness.report.judge import judge_run
from harness.report.timeline_plot import PLOT_FILE
from harness.net import allow_hosts
from harness.stack.breaker import SpeculationBreaker, route_upstream
from harness.stack.capabilities import TokenCounting
from harness.stack.launchers import make_stack
from harness.stack.pool import StackProvider
from harness.stack.preflight import resolve_models
from harness.stack.router import RouterProcess
from harness.stack.vllm import installed_vllm_version
from harness.state import RunState, set_current
from harness.timeline import Timeline

log = logging.getLogger(__name__)


#: Files of a run directory that a new run replaces (besides ``logs/*.log``).
RUN_FILES = ("records.jsonl", "load_stats.json", "timeline.jsonl", "ledger.jsonl", "reference.jsonl", "report.json", "run.json",
             "journal.json", "probes.jsonl", "prompts.json", "config.json", "experiment.json", GPU_FILE,
             METRICS_FILE, PLOT_FILE, PROM_TEXTFILE)


@dataclass
class RunInfo:
    """What the runner knows before anything starts."""

    title: str
    source: str
    out_dir: Path
    cfg: SpecchaosConfig
    meta: dict[str, Any] = field(default_factory=dict)
    #: The faults the experiment declares; each may prepare the load path before the load starts.
    faults: list[Fault] = field(default_factory=list)
    #: Seconds the method holds faults and pauses (``validate.method_hold_s``): added to the
    #: load's run time, so the load outlasts the longest method.
    method_hold_s: float = 0.0
    #: ``load.source``'s requests as validation prepared them (``Experiment.requests``):
    #: the run's prompt set instead of the generated one; None without a source.
    requests: list[RequestSpec] | None = None


class RunInterrupted(SpecchaosError):
    """Raised by :meth:`Session.sleep` in any thread once a signal interrupted the run, so
    every action that waits (fault actions in the background included) ends at once and
    its fault is cleared, instead of holding it for its whole duration."""


class RunAborted(RunInterrupted):
    """Raised by :meth:`Session.sleep` in any thread once a continuous safeguard aborted
    the method (its message is the abort's reason, ``aborted by safeguard ...``)."""


#: Upper bound of :meth:`Session.await_faults_cleared` (a fault action always ends after
#: its ``duration_s`` and evidence timeout; this only bounds the loop).
FAULTS_CLEARED_LIMIT_S = 3600.0


class Session:
    """One experiment run's resources and files. Use :func:`open_session` / :func:`current`."""

    def __init__(self, info: RunInfo):
        self.info = info
        self.cfg = info.cfg
        self.out_dir = info.out_dir
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "logs").mkdir(exist_ok=True)
        for name in RUN_FILES:   # results of an earlier run in the same directory
            (self.out_dir / name).unlink(missing_ok=True)
        for old_log in (self.out_dir / "logs").glob("*.log"):
            old_log.unlink(missing_ok=True)
        for run_file in ("records.jsonl", "load_stats.json"):   # a distributed load's per-worker files
            for old_worker in worker_record_files(self.out_dir / run_file):
                old_worker.unlink(missing_ok=True)
        self.timeline = Timeline(self.out_dir / "timeline.jsonl")
        self.errors: list[str] = []
        self.interrupted = False
        #: Set (to the reason) when a continuous safeguard aborted the method
        #: (:mod:`harness.experiment.safeguards`); every wait then ends, as on a signal.
        self.aborted: str | None = None
        self.phase: str | None = None
        self.stack: Any = None
        self.load: LocustProcess | None = None
        self.health: HealthSampler | None = None
        self.gpu: GpuSampler | None = None
        self.scraper: MetricsScraper | None = None
        self.breaker: SpeculationBreaker | None = None
        self.router: RouterProcess | None = None   # the load router (stack.breaker.fallback: route)
        self.cpu_meter: CpuMeter | None = None   # the harness's own CPU while the load runs
        self.prompts: list = []
        self.report: dict[str, Any] | None = None
        self.closed = False
        self._lock = threading.RLock()
        self._faults_active = 0   # fault actions between inject and clear (background ones overlap)
        self.ledger = Ledger(self.out_dir / "ledger.jsonl")
        self.run_state = RunState(self.out_dir, ledger=self.out_dir / "ledger.jsonl")
        set_current(self.run_state)
        self.fault_ctx = InjectionContext(stack=None, timeline=self.timeline, ledger=self.ledger)
        self.injector = FaultInjector(self.fault_ctx)
        self._provider = stack_provider   # fixed for this run (see set_stack_provider)
        self.write_meta()   # so a run killed with SIGKILL can still be re-judged

    # ------------------------------------------------------------------ paths
    @property
    def records_path(self) -> Path:
        return self.out_dir / "records.jsonl"

    @property
    def prompts_path(self) -> Path:
        return self.out_dir / "prompts.json"

    @property
    def reference_path(self) -> Path:
        return self.out_dir / "reference.jsonl"

    def _fetch_class_references(self, ref: Any, prompts: list[Prompt]) -> None:
        """The reference of each request class whose invariants compare with one (a stop
        string's cut, logprob values: :func:`harness.checks.request_classes.reference_invariants`):
        every prompt sent as that class's first turn to the reference server, into
        ``class_reference.jsonl`` (what integrity judges those invariants against when
        the run is not in mirror mode)."""
        lc = self.cfg.load
        classes = [c for c in lc.request_classes or [] if reference_invariants(c.body)]
        records = []
        for c in classes:
            log.info("fetching class %s's reference outputs for %d prompts", c.name, len(prompts))
            got = fetch_reference(ref.base_url, ref.model, prompts, timeout_s=lc.request_timeout_s,
                                  ignore_eos=lc.ignore_eos, request_class=c, top_logprobs=0)
            records += [got[k] for k in sorted(got)]
        if records:
            write_records(self.out_dir / CLASS_REFERENCE_FILE, records)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the stack, fetch reference outputs, start load, then warm-up and baseline.

        Raises:
            SpecchaosError: models missing, port in use, a server or locust failed to start.
        """
        cfg = self.cfg
        allow_hosts(cfg.stack.allow_hosts)   # traffic to an external server's host, when the user allowed it
        if self._provider is None:   # the default: this run's own stack
            self.stack = make_stack(cfg.stack, self.out_dir, timeline=self.timeline)
            self.fault_ctx.stack = self.stack
            log.info("starting the stack (launcher=%s)", self.stack.launcher)
            self.stack.start()
        else:   # a started (maybe shared) stack from the provider (the pytest plugin's pool)
            self.stack = self._provider.acquire(cfg.stack, self.out_dir, self.timeline)
            self.fault_ctx.stack = self.stack
        spec = self.stack.servers["spec"]
        for name, server in self.stack.servers.items():
            self.fault_ctx.load_urls.setdefault(name, server.base_url)
        self.injector.prepare(self.info.faults)   # e.g. a proxy on the load path
        self.start_router()   # the breaker's route fallback: the load router in front of it all

        lc = cfg.load
        if lc.source is not None:   # the source's requests, prepared at validation
            if self.info.requests is None:
                raise LoadError("load.source is set but its requests were not prepared", where="RunInfo.requests",
                                hint="open the session from a validated experiment (Experiment.requests)")
            self.prompts = source_prompts(self.info.requests, lc)
        else:
            # measured by the server's own tokenizer when the stack has it (an external server), else the target's
            counter = self.stack.count_tokens if isinstance(self.stack, TokenCounting) else None
            tokenizer_dir = "" if counter is not None else resolve_models(cfg.stack).target
            self.prompts = build_bucketed_prompt_set(tokenizer_dir, lc.bucket_specs(), seed=lc.seed,
                                                     max_tokens=lc.max_tokens, count_tokens=counter,
                                                     max_tokens_by_bucket=lc.bucket_max_tokens())
        save_prompt_set(self.prompts_path, self.prompts)
        self.info.meta["load"] = load_section(lc, self.prompts)   # run.json and report.json: profile, retry, digest
        self.write_meta()
        if "ref" in self.stack.servers:
            ref = self.stack.servers["ref"]
            fixed = [p for p in self.prompts if p.deterministic]   # a sampled source body has no reference
            log.info("fetching reference outputs for %d prompts from the non-speculative server", len(fixed))
            reference = fetch_reference(ref.base_url, ref.model, fixed,
                                        timeout_s=lc.request_timeout_s, ignore_eos=lc.ignore_eos)
            write_records(self.reference_path, [reference[k] for k in sorted(reference)])
            self._fetch_class_references(ref, fixed)

        self.health = HealthSampler(self.timeline, "spec", spec.base_url, cfg.recovery.health_interval_s)
        self.health.start()
        self.gpu = GpuSampler(self.timeline, self.out_dir / GPU_FILE)   # on a host without GPU: one note
        self.gpu.start()
        # every server's /metrics (direct, never through a fault proxy) into metrics.jsonl
        self.scraper = MetricsScraper(self.out_dir / METRICS_FILE, self.stack.servers, cfg.scrape.interval_s,
                                      cfg.scrape.timeout_s, timeline=self.timeline)
        if cfg.stack.breaker.enabled:   # the breaker judges the scraper's lines as they are written
            self.breaker = SpeculationBreaker(cfg.stack.breaker, self.stack.servers[cfg.stack.breaker.server],
                                              self.timeline, router=self.router)
            self.scraper.subscribe(self.breaker.observe)
        self.scraper.start()

        ph = cfg.phases
        run_time_s = (ph.warmup_s + ph.baseline_s + ph.fault_timeout_s + ph.recovery_timeout_s
                      + ph.after_s + self.info.method_hold_s + 120.0)
        mirror = self.stack.servers["ref"] if lc.mirror else None   # validation: mirror needs stack.reference
        target = self.stack.servers[lc.target]   # validation: target ref needs stack.reference
        self.load = LocustProcess(self.fault_ctx.load_urls[lc.target], prompts_path=self.prompts_path,
                                  records_path=self.records_path, model=target.model, cfg=lc,
                                  run_time_s=run_time_s, log_path=self.out_dir / "logs" / "locust.log",
                                  mirror_url=self.fault_ctx.load_urls["ref"] if mirror else None,
                                  mirror_model=mirror.model if mirror else None)
        self.load.start()
        self.cpu_meter = CpuMeter(self.load.pids).start() if self.load.pids else None
        self.timeline.emit("runner", "load_started", users=lc.closed_users(), mirror=lc.mirror, profile=lc.profile.kind,
                           **schedule_fields(lc.profile, lc.users))
        log.info("load running: %s; warm-up %.0f s, baseline %.0f s", lc.profile.kind + " loop", ph.warmup_s,
                 ph.baseline_s)
        self.sleep(ph.warmup_s)
        self.mark_phase("baseline")
        self.sleep(ph.baseline_s)

    def mark_phase(self, phase: str) -> None:
        """Mark the start of a phase (baseline, fault, recovery, after) on the timeline."""
        log.info("phase: %s", phase)
        self.phase = phase
        self.timeline.emit("runner", "phase_start", phase=phase)

    def fault_began(self) -> None:
        """A fault action is about to act: the ``fault`` phase starts with the first one."""
        with self._lock:
            self._faults_active += 1
            if self._faults_active == 1:
                self.mark_phase("fault")
                recovery_probes.fault_began(self)

    def fault_ended(self) -> None:
        """A fault action cleared its fault: the ``recovery`` phase starts once no fault
        action is active any more (overlapping faults, e.g. one run in the background,
        make one fault phase)."""
        with self._lock:
            self._faults_active = max(0, self._faults_active - 1)
            if self._faults_active == 0:
                self.mark_phase("recovery")
                recovery_probes.faults_cleared(self)

    def faults_active(self) -> int:
        """Fault actions between inject and clear right now."""
        with self._lock:
            return self._faults_active

    def await_faults_cleared(self, limit_s: float = FAULTS_CLEARED_LIMIT_S) -> bool:
        """Wait (keeping an eye on the load) until no fault action is active, e.g. one
        running in the background (``background: true``); at most ``limit_s`` seconds.
        Returns whether none is active."""
        end = time.monotonic() + limit_s
        while self.faults_active() and time.monotonic() < end:
            self.sleep(0.2)
        return not self.faults_active()

    def note_interrupt(self, signal_name: str) -> None:
        """Record that a signal interrupted the run (first one wins): the run's first error
        names the signal and the phase it hit. Safe to call from a signal handler."""
        if self.interrupted and any(e.startswith("interrupted by ") for e in self.errors):
            return
        self.interrupted = True
        where = f"the {self.phase} phase" if self.phase else "start-up (before the baseline)"
        self.errors.insert(0, f"interrupted by {signal_name} during {where}")

    def sleep(self, seconds: float) -> None:
        """Sleep in small steps; raises LoadError if the load generator died meanwhile
        (the locust process, or one of a distributed load's workers)."""
        end = time.monotonic() + seconds
        while True:
            if self.interrupted:   # any thread: a fault action in the background ends too
                raise RunInterrupted(self.errors[0] if self.errors else "interrupted")
            if self.aborted:
                raise RunAborted(self.aborted)
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(0.5, left))
            if self.interrupted:
                raise RunInterrupted(self.errors[0] if self.errors else "interrupted")
            if self.load is not None and not self.load.is_running():
                log_path = self.out_dir / "logs" / "locust.log"
                reason = exit_reason(log_path)
                if self.load.returncode == 0 and "max_requests" not in reason:   # it ran out of time
                    raise LoadError(f"the load ended while the experiment still needed it: locust reached its "
                                    f"run time ({self.load.run_time_s} s)", where=str(log_path),
                                    hint="the run is judged on what was recorded")
                raise LoadError(f"the locust load process exited early (code {self.load.returncode}): "
                                f"{exit_reason(log_path)}", where=str(log_path),
                                hint="the run is judged on what was recorded")
            load = self.load   # (stop_load on another thread may set it to None meanwhile)
            if load is not None and (lost := load.lost_worker_error()) is not None:
                raise lost

    def stop_load(self) -> None:
        """Stop locust (in-flight requests are written) and mark the end of the load."""
        with self._lock:
            if self.load is not None:
                if self.cpu_meter is not None:
                    self.cpu_meter.stop()   # before locust exits: its last sample counts
                self.load.stop()
                self.load = None
                self.timeline.emit("runner", "load_stopped")

    def start_router(self) -> None:
        """With ``stack.breaker.fallback: route``: start the load router (:mod:`harness.stack.router`)
        with the guarded server's load URL (a fault proxy's, if one is on the path) and the warm
        plain server (``route_to``), and send the load through it (``load_urls[server]``);
        records a ``router`` ``router_started`` event. Nothing otherwise.

        Raises:
            StackError: the router did not start, or ``route_to: ref`` without a reference server.
        """
        bc = self.cfg.stack.breaker
        if not (bc.enabled and bc.fallback == "route"):
            return
        urls = self.fault_ctx.load_urls
        plain = bc.route_to if "://" in bc.route_to else urls.get(bc.route_to)
        if plain is None:
            raise StackError(f"route_to {bc.route_to!r}: the stack has no such server", where="stack.breaker.route_to",
                             hint="turn stack.reference on, or give the URL of a running plain server")
        upstreams = {bc.server: urls[bc.server], route_upstream(bc): plain}
        self.router = RouterProcess.start(upstreams, active=bc.server)
        urls[bc.server] = self.router.url
        self.timeline.emit("router", "router_started", server=bc.server, url=self.router.url, upstreams=upstreams,
                           active=bc.server, pid=self.router.pid)

    def stop_router(self) -> None:
        """End the load router (idempotent); records ``router_stopped`` with its request counts."""
        if self.router is None:
            return
        try:
            counts = self.router.state().get("requests")
        except SpecchaosError:
            counts = None
        self.router.stop()
        self.timeline.emit("router", "router_stopped", pid=self.router.pid, requests=counts)
        self.router = None

    def stop_breaker(self) -> None:
        """The circuit breaker acts no more (idempotent); the scraper that feeds it stops later."""
        if self.breaker is not None:
            self.breaker.stop()

    def close(self) -> None:
        """Tear everything down, in order, whatever happened before. Idempotent."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            steps = [
                ("stop load", self.stop_load),
                ("stop recovery probes", lambda: recovery_probes.stop(self)),
                ("stop the breaker", self.stop_breaker),
                ("clear faults", self.injector.clear_all),
                ("release the load path", self.injector.release_all),
                ("stop the load router", self.stop_router),
                ("stop health sampler", self.health.stop if self.health else None),
                ("stop GPU telemetry", self.gpu.stop if self.gpu else None),
                ("stop metrics scraper", self.scraper.stop if self.scraper else None),
                ("stop stack", self._let_go_stack if self.stack else None),
            ]
            for what, step in steps:
                if step is None:
                    continue
                try:
                    failures = step()
                except Exception as exc:  # keep tearing down the rest
                    log.error("cleanup step %r failed: %s", what, exc)
                    self.errors.append(f"cleanup: {what} failed: {exc}")
                    continue
                for failure in failures if isinstance(failures, list) else []:
                    text = failure if isinstance(failure, str) else f"{failure.get('fault_id')}: {failure.get('error')}"
                    self.errors.append(f"cleanup: {what}: {text}")
            self.run_state.close()
            set_current(None)
            allow_hosts(())

    def _let_go_stack(self) -> None:
        """Stop the stack, or hand it back to its provider (clean: no open fault in the
        ledger, no failed cleanup step, no interruption)."""
        if self._provider is None:
            self.stack.stop()
            return
        clean = (not self.interrupted and not self.ledger.open_faults()
                 and not any(e.startswith("cleanup: ") for e in self.errors))
        self._provider.release(self.stack, self.out_dir, clean)

    def judge(self, journal: dict | None = None) -> dict[str, Any]:
        """Judge the recorded data (see :func:`harness.report.judge.judge_run`) with the
        Chaos Toolkit journal, write ``run.json`` and ``report.json``, then ``timeline.png``
        and the Allure results (:func:`harness.report.allure.publish_allure`) and the
        Prometheus metrics (:func:`harness.report.prometheus.publish_prometheus`), neither
        of which changes the verdict, return the report."""
        meta = dict(self.info.meta)
        stats = read_load_stats(self.out_dir / "load_stats.json")
        if stats is not None and isinstance(meta.get("load"), dict):
            meta["load"] = dict(meta["load"], open_loop=stats)
        meta.update({
            "experiment": self.info.title,
            "source": self.info.source,
            "stack": self.stack_info(),
            "errors": list(self.errors) + journal_errors(journal),
            "interrupted": self.interrupted,   # by a signal (Chaos Toolkit also says "interrupted" after a failed start)
            "journal_status": journal.get("status") if journal else None,
            "steady_state": steady_state_summary(journal),
        })
        if self.cpu_meter is not None:
            meta["harness_cpu"] = self.cpu_meter.section(load_requests(self.records_path))
        self.write_meta(meta)
        report = judge_run(self.out_dir, self.cfg, meta, journal=journal)
        write_report(self.out_dir / "report.json", report)
        publish_allure(self.out_dir, report, journal)   # timeline.png + Allure results; never raises
        publish_prometheus(self.out_dir, report, self.cfg.prometheus)   # specchaos.prom (+ push); never raises
        self.report = report
        return report

    def write_meta(self, meta: dict[str, Any] | None = None) -> None:
        """Write ``run.json``: what the runner knows beyond the recorded data (title,
        source, stack, run errors, interruption, steady-state outcome), for
        ``specchaos report`` to re-judge the run exactly as it was judged."""
        if meta is None:
            meta = dict(self.info.meta, experiment=self.info.title, source=self.info.source,
                        stack=self.stack_info(), errors=list(self.errors), interrupted=self.interrupted,
                        journal_status=None, steady_state={})
        (self.out_dir / "run.json").write_text(json.dumps(meta, indent=2, default=str))

    def stack_info(self) -> dict[str, Any]:
        """``report.json``'s ``stack``: launcher, vLLM version, speculative config, server URLs
        (from the configuration when the stack never started)."""
        if self.stack is not None:
            return {"launcher": self.stack.launcher, "vllm_version": self.stack.vllm_version,
                    "speculative": self.stack.speculative,
                    "servers": {n: s.base_url for n, s in self.stack.servers.items()}}
        sc = self.cfg.stack
        return {"launcher": sc.launcher, "vllm_version": installed_vllm_version(),
                "speculative": {"method": sc.method, "draft": sc.draft,
                                "num_speculative_tokens": sc.num_speculative_tokens}}


_session: Session | None = None

#: Where :meth:`Session.start` gets its stack and :meth:`Session.close` returns it
#: (:class:`harness.stack.pool.StackProvider`); None, the default (CLI, ``chaos run``):
#: each run builds its own stack with ``make_stack`` and stops it.
stack_provider: StackProvider | None = None


def set_stack_provider(provider: StackProvider | None) -> None:
    """Use ``provider`` for the stacks of sessions opened from now on (None: the default)."""
    global stack_provider
    stack_provider = provider


def open_session(info: RunInfo) -> Session:
    """Create the process-wide session (closing a previous one)."""
    global _session
    if _session is not None and not _session.closed:
        _session.close()
    _session = Session(info)
    return _session


def current() -> Session:
    """The live session.

    Raises:
        SpecchaosError: no session (the experiment's ``specchaos`` control did not run).
    """
    if _session is None:
        raise SpecchaosError("no specchaos session is open",
                             hint="declare the harness.experiment.control control in the experiment")
    return _session


def peek() -> Session | None:
    """The session if one exists, else None."""
    return _session


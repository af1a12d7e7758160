"""A judged run's headline results as Prometheus metrics, with ``prometheus_client``.

Every judgement writes ``<run_dir>/specchaos.prom`` in the text exposition format
(:func:`prometheus_client.write_to_textfile`: written to a temporary file, then renamed),
ready for node-exporter's textfile collector (copy or link it into the collector's
directory), and, when ``prometheus.pushgateway_url`` is set, pushes the same metrics to a
Pushgateway (:func:`prometheus_client.push_to_gateway`, job ``prometheus.job``, grouped by
``experiment``: each experiment's latest run replaces its previous one there).

Read from ``report.json`` only (its typed view, :class:`harness.report.schema.Report`).
Every metric is a gauge and carries the labels of :data:`RUN_LABELS`: ``experiment``
(the title), ``launcher``, ``method``, ``draft`` (the draft model's name: the last part of
its path), ``k`` (``num_speculative_tokens``) and ``vllm_version``. The metrics (units in
the names: seconds, ratios in [0, 1]):

======================================== ===================== ==========================================
metric                                   more labels           value
======================================== ===================== ==========================================
``specchaos_passed``                                           1 when the verdict is ``pass``, else 0
``specchaos_verdict``                    verdict               1 for the run's verdict, 0 for the others
``specchaos_run_timestamp_seconds``                            when the run was judged (epoch)
``specchaos_checks``                     result                checks passed / failed / not_judged
``specchaos_check_failed``               check, category       1 per failing check
``specchaos_required_checks``            result                required checks: required / judged
``specchaos_required_not_judged``        check                 1 per required check the run did not judge
``specchaos_restarts``                                         supervised restarts of the speculative server
``specchaos_recovery_seconds``           stage                 fault clear → healthy / first_success / slo
``specchaos_latency_seconds``            phase, metric, stat   TTFT, TPOT, ITL (per chunk), ITL per token,
                                                               E2E (``metric``): p50, p95, p99 (``stat``)
``specchaos_phase_requests``             phase                 logical requests sent in the phase
``specchaos_phase_errors``               phase                 of them failed
``specchaos_phase_error_ratio``          phase                 errors ÷ requests
``specchaos_phase_output_tokens_per_second`` phase             output tokens arriving per second
``specchaos_phase_goodput_requests_per_second`` phase          requests per second meeting every SLO
``specchaos_acceptance_rate``            phase, bucket,        client-side acceptance rate (``all``: the
                                         sampling              run, or every bucket / sampling class)
``specchaos_server_acceptance_rate``     server, phase         vLLM's counters (``/metrics``) per phase
``specchaos_integrity_responses``        result                compared / mismatched / malformed /
                                                               false_success
``specchaos_phase_start_timestamp_seconds`` phase              phase window (epoch)
``specchaos_phase_end_timestamp_seconds`` phase
``specchaos_fault_start_timestamp_seconds`` fault_id, kind,    when the fault acted (epoch): Grafana's fault
                                         target                annotations (``docs/grafana/specchaos.json``)
``specchaos_fault_end_timestamp_seconds`` fault_id, kind,      when it was cleared (absent while open)
                                         target
======================================== ===================== ==========================================

A value the report does not have (a phase without samples, a recovery never reached) is
left out rather than written as NaN.
"""

from __future__ import annotations

import logging
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Iterator

from prometheus_client import CollectorRegistry, push_to_gateway, write_to_textfile
from prometheus_client.core import GaugeMetricFamily, Metric

from harness.report.config import PrometheusConfig
from harness.report.schema import Distribution, Report

__all__ = ["TEXTFILE", "RUN_LABELS", "metric_families", "registry_of", "write_textfile", "push",
           "publish_prometheus"]

log = logging.getLogger(__name__)

#: The text file written into every run directory.
TEXTFILE = "specchaos.prom"
#: Labels every metric carries.
RUN_LABELS = ("experiment", "launcher", "method", "draft", "k", "vllm_version")
VERDICTS = ("pass", "fail", "aborted", "error")
#: Report field → ``metric`` label of ``specchaos_latency_seconds``.
LATENCIES = {"ttft_s": "ttft", "tpot_s": "tpot", "itl_s": "itl", "itl_per_token_s": "itl_per_token", "e2e_s": "e2e"}
#: The percentiles exported, as the ``stat`` label (not ``quantile``: that label belongs to
#: summaries, and these are gauges of one run's distribution).
STATS = ("p50", "p95", "p99")
RECOVERY = {"time_to_healthy_s": "healthy", "time_to_first_success_s": "first_success", "time_to_slo_s": "slo"}


def model_name(path: str | None) -> str:
    """A model's name from its path or hub id: the last part (``"/home/me/models/draft-exact"``
    → ``"draft-exact"``; ``"org/model"`` → ``"model"``); ``""`` for None."""
    return PurePosixPath(path.rstrip("/\\")).name if path else ""


def _run_labels(rep: Report) -> list[str]:
    spec = rep.stack.speculative
    k = spec.num_speculative_tokens if spec else None
    return [rep.experiment, rep.stack.launcher or "", (spec.method if spec else None) or "",
            model_name(spec.draft if spec else None), "" if k is None else str(k), rep.stack.vllm_version or ""]


class _Families:
    """Gauge families that all carry the run's labels."""

    def __init__(self, run: list[str]):
        self.run = run
        self.families: dict[str, GaugeMetricFamily] = {}

    def add(self, name: str, doc: str, value: float | int | bool | None, **labels: str) -> None:
        if value is None:
            return
        fam = self.families.get(name)
        if fam is None:
            fam = self.families[name] = GaugeMetricFamily(name, doc, labels=[*RUN_LABELS, *labels])
        fam.add_metric([*self.run, *(str(v) for v in labels.values())], float(value))


def _distributions(fams: _Families, phase: str, dists: dict[str, Distribution | None]) -> None:
    for field, metric in LATENCIES.items():
        d = dists.get(field)
        if d is None:
            continue
        for stat in STATS:
            fams.add("specchaos_latency_seconds", "Latency percentiles per phase (TTFT, TPOT, ITL per chunk, ITL per "
                     "token, E2E; vLLM's serving benchmark definitions), seconds", getattr(d, stat),
                     phase=phase, metric=metric, stat=stat)


def metric_families(report: dict[str, Any]) -> list[Metric]:
    """The metric families of a report (module doc).

    Raises:
        pydantic.ValidationError: the report does not have the shape of ``report.json``.
    """
    rep = Report.model_validate(report)
    f = _Families(_run_labels(rep))
    f.add("specchaos_passed", "1 when the run's verdict is pass, else 0", rep.verdict == "pass")
    for v in VERDICTS:
        f.add("specchaos_verdict", "1 for the run's verdict (pass, fail, aborted, error), 0 for the others",
              rep.verdict == v, verdict=v)
    f.add("specchaos_run_timestamp_seconds", "When the run was judged, epoch seconds", rep.generated_at)
    results = {"passed": sum(c.passed is True for c in rep.checks), "failed": sum(c.passed is False for c in rep.checks),
               "not_judged": sum(c.passed is None for c in rep.checks)}
    for result, n in results.items():
        f.add("specchaos_checks", "Checks of the run by result", n, result=result)
    for c in rep.checks:
        if c.passed is False:
            f.add("specchaos_check_failed", "1 for each check that failed", 1, check=c.name, category=c.category or "")
    if rep.required is not None:
        doc = "Required checks of the run (what the experiment exists to judge) and how many were judged"
        f.add("specchaos_required_checks", doc, rep.required.of, result="required")
        f.add("specchaos_required_checks", doc, rep.required.judged, result="judged")
        for r in rep.required.checks:
            if not r.judged:
                f.add("specchaos_required_not_judged", "1 for each required check the run did not judge", 1,
                      check=r.name)
    f.add("specchaos_restarts", "Supervised restarts of the speculative server", rep.restarts)
    if rep.recovery is not None:
        for field, stage in RECOVERY.items():
            f.add("specchaos_recovery_seconds", "Seconds from the fault's clear (or the process's death) to healthy, "
                  "to the first successful generation, to a window back within the baseline SLO",
                  getattr(rep.recovery, field), stage=stage)
    for phase, m in rep.phases.items():
        _distributions(f, phase, {k: getattr(m, k) for k in LATENCIES})
        f.add("specchaos_phase_requests", "Logical requests sent in the phase", m.requests, phase=phase)
        f.add("specchaos_phase_errors", "Logical requests of the phase that failed", m.errors, phase=phase)
        f.add("specchaos_phase_error_ratio", "Failed ÷ sent requests of the phase", m.error_rate, phase=phase)
        f.add("specchaos_phase_output_tokens_per_second", "Output tokens arriving per second in the phase",
              m.output_tokens_per_s, phase=phase)
        f.add("specchaos_phase_goodput_requests_per_second", "Requests per second that met every per-request SLO",
              m.goodput_rps, phase=phase)
        f.add("specchaos_phase_start_timestamp_seconds", "Start of the phase, epoch seconds", m.start, phase=phase)
        f.add("specchaos_phase_end_timestamp_seconds", "End of the phase, epoch seconds", m.end, phase=phase)
    _acceptance(f, rep)
    if rep.integrity is not None:
        for result in ("compared", "mismatched", "malformed", "false_success"):
            f.add("specchaos_integrity_responses", "Responses compared with the non-speculative reference, and "
                  "those that differed, were malformed, or were cut but called complete",
                  getattr(rep.integrity, result), result=result)
    for fault in rep.faults:
        keys = {"fault_id": fault.fault_id, "kind": fault.kind, "target": fault.target or ""}
        f.add("specchaos_fault_start_timestamp_seconds", "When the fault acted, epoch seconds", fault.injected_at, **keys)
        f.add("specchaos_fault_end_timestamp_seconds", "When the fault was cleared, epoch seconds", fault.cleared_at,
              **keys)
    return list(f.families.values())


def _acceptance(f: _Families, rep: Report) -> None:
    doc = "Client-side speculative acceptance rate (accepted ÷ draft tokens) per phase, prompt bucket and sampling class"
    floor = rep.acceptance_floor
    if floor is not None:
        if floor.total is not None:
            f.add("specchaos_acceptance_rate", doc, floor.total.acceptance_rate, phase="all", bucket="all",
                  sampling="all")
        for phase, counts in [("all", floor.buckets), *((p, ph.buckets) for p, ph in floor.phases.items())]:
            for bucket, by_sampling in counts.items():
                for sampling, c in by_sampling.items():
                    f.add("specchaos_acceptance_rate", doc, c.acceptance_rate, phase=phase, bucket=bucket,
                          sampling=sampling)
        for phase, ph in floor.phases.items():
            if ph.total is not None:
                f.add("specchaos_acceptance_rate", doc, ph.total.acceptance_rate, phase=phase, bucket="all",
                      sampling="all")
    if rep.speculation is not None:
        for server, s in rep.speculation.servers.items():
            for phase, p in s.phases.items():
                f.add("specchaos_server_acceptance_rate", "Acceptance rate from vLLM's spec_decode counters per phase",
                      p.acceptance_rate, server=server, phase=phase)


class _Static:
    """A collector that yields fixed families."""

    def __init__(self, families: Iterable[Metric]):
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        yield from self._families


def registry_of(report: dict[str, Any]) -> CollectorRegistry:
    """A registry holding only the report's metrics (no process or platform collectors)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Static(metric_families(report)))
    return registry


def write_textfile(run_dir: str | Path, report: dict[str, Any]) -> Path:
    """Write ``<run_dir>/specchaos.prom`` (atomically). Returns its path."""
    path = Path(run_dir) / TEXTFILE
    write_to_textfile(str(path), registry_of(report))
    return path


def push(report: dict[str, Any], cfg: PrometheusConfig) -> None:
    """Push the report's metrics to ``cfg.pushgateway_url`` (PUT: they replace the group
    ``job=cfg.job, experiment=<title>``).

    Raises:
        OSError, urllib.error.URLError: the Pushgateway cannot be reached or refused the push.
    """
    if cfg.pushgateway_url is None:
        return
    push_to_gateway(cfg.pushgateway_url, job=cfg.job, registry=registry_of(report),
                    grouping_key={"experiment": str(report.get("experiment"))}, timeout=cfg.timeout_s)


def publish_prometheus(run_dir: str | Path, report: dict[str, Any], cfg: PrometheusConfig | None = None) -> str | None:
    """:func:`write_textfile`, then :func:`push` when a Pushgateway is configured; never
    raises (called by every judgement: an export never changes a verdict). Returns None,
    or what failed in one line (also logged as a warning)."""
    cfg = cfg or PrometheusConfig()
    try:
        path = write_textfile(run_dir, report)
        log.info("prometheus text file: %s", path)
    except Exception as exc:  # noqa: BLE001
        log.warning("prometheus text file of %s not written: %s: %s", run_dir, type(exc).__name__, exc)
        return f"prometheus text file not written: {type(exc).__name__}: {exc}"
    if cfg.pushgateway_url is None:
        return None
    try:
        push(report, cfg)
        log.info("prometheus: pushed to %s (job %s)", cfg.pushgateway_url, cfg.job)
        return None
    except Exception as exc:  # noqa: BLE001
        log.warning("prometheus: push to %s failed: %s: %s", cfg.pushgateway_url, type(exc).__name__, exc)
        return f"prometheus push to {cfg.pushgateway_url} failed: {type(exc).__name__}: {exc}"

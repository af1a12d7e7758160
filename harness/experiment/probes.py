"""Chaos Toolkit probes of the harness, for steady-state hypotheses.

Health alone lies (a frozen engine answers ``/health`` 200 while producing nothing),
so the hypothesis also asks for a real generation and for the SLOs over the current
phase's load records.
"""

from __future__ import annotations

import logging

import httpx

from harness.checks.slo import coverage_check, phase_slo_checks
from harness.clock import now
from harness.experiment import session as sess
from harness.load.client import make_client, stream_completion
from harness.load.records import append_record, is_complete, is_spec_load, read_records
from harness.metrics.phases import phase_metrics

log = logging.getLogger(__name__)

__all__ = ["server_health", "generation_succeeds", "within_slo"]


def server_health(server: str = "spec", timeout_s: float = 5.0) -> int:
    """HTTP status of ``GET /health`` on a stack server (0 when it does not answer)."""
    s = sess.current()
    url = s.stack.servers[server].base_url
    try:
        return httpx.get(f"{url}/health", timeout=timeout_s, verify=False).status_code   # loopback HTTP: no CA bundle
    except httpx.HTTPError:
        return 0


def generation_succeeds(server: str = "spec", timeout_s: float = 30.0) -> bool:
    """True if one greedy streaming completion of the first prompt completes (``[DONE]``,
    a finish_reason, chunk tokens == usage). The record goes to ``probes.jsonl``."""
    s = sess.current()
    srv = s.stack.servers[server]
    with make_client(2) as client:
        rec = stream_completion(client, srv.base_url, srv.model, s.prompts[0], timeout_s=timeout_s,
                                source="probe", ignore_eos=s.cfg.load.ignore_eos, server=server)
    append_record(s.out_dir / "probes.jsonl", rec)
    ok, why = is_complete(rec)
    if not ok:
        log.warning("probe generation on %s incomplete: %s", server, why)
    return ok


def within_slo() -> bool:
    """True if the speculative server's load records of the current phase (since its ``phase_start``) meet the
    SLOs of ``configuration.specchaos.slo`` and the phase sent at least
    ``degradation.min_requests_per_phase`` requests — the same rules as the judge's
    ``slo.<phase>.*`` and ``coverage.<phase>.requests`` checks
    (:func:`harness.checks.slo.phase_slo_checks`)."""
    s = sess.current()
    starts = s.timeline.select("runner", "phase_start")
    since = starts[-1]["t"] if starts else 0.0
    phase = starts[-1].get("phase", "current") if starts else "current"
    records = [r for r in read_records(s.records_path) if is_spec_load(r)]
    m = phase_metrics(records, since, now())
    checks = [*phase_slo_checks(phase, m, s.cfg.slo, s.cfg.metrics.min_samples),
              coverage_check(phase, m, s.cfg.degradation.min_requests_per_phase)]
    missed = [c for c in checks if c.failed]     # a thin phase's latency is not judged, as by the judge
    for c in missed:
        log.warning("steady state: %s missed: %s", c.name, c.detail)
    return not missed

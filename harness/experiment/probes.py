"""Chaos Toolkit probes of the harness, for steady-state hypotheses.

Health alone lies (a frozen engine answers ``/health`` 200 while producing nothing),
so the hypothesis also asks for a real generation and for the SLOs over the current
phase's load records.
"""

from __future__ import annotations

import logging

import httpx

from harness.experiment import session as sess

log = logging.getLogger(__name__)

__all__ = ["server_health", "generation_succeeds", "within_slo"]


def server_health(server: str = "spec", timeout_s: float = 5.0) -> int:
    """HTTP status of ``GET /health`` on a stack server (0 when it does not answer)."""
    s = sess.current()
    url = s.stack.servers[server].base_url
    try:
        return httpx.get(f"{url}/health", timeout=timeout_s).status_code
    except httpx.HTTPError:
        return 0


def generation_succeeds(server: str = "spec", timeout_s: float = 30.0) -> bool:
    """True if one greedy streaming completion of the first prompt completes (``[DONE]``,
    a finish_reason, chunk tokens == usage). The record goes to ``probes.jsonl``."""
    from harness.checks.integrity import is_complete
    from harness.load.client import stream_completion
    from harness.load.records import append_record

    s = sess.current()
    srv = s.stack.servers[server]
    with httpx.Client() as client:
        rec = stream_completion(client, srv.base_url, srv.model, s.prompts[0], timeout_s=timeout_s,
                                source="probe", ignore_eos=s.cfg.load.ignore_eos)
    append_record(s.out_dir / "probes.jsonl", rec)
    ok, why = is_complete(rec)
    if not ok:
        log.warning("probe generation on %s incomplete: %s", server, why)
    return ok


def within_slo() -> bool:
    """True if the load records of the current phase (since its ``phase_start``) meet the
    SLOs of ``configuration.specchaos.slo`` (p95 TTFT, TPOT, ITL per token, E2E, error
    rate) with at least ``degradation.min_requests_per_phase`` requests."""
    from harness.clock import now
    from harness.load.records import read_records
    from harness.metrics.phases import phase_metrics

    s = sess.current()
    starts = s.timeline.select("runner", "phase_start")
    since = starts[-1]["t"] if starts else 0.0
    records = [r for r in read_records(s.records_path) if r.source == "load"]
    m = phase_metrics(records, since, now(), s.cfg.slo)
    slo = s.cfg.slo
    checks = {
        "requests": m["requests"] >= s.cfg.degradation.min_requests_per_phase,
        "error_rate": m["error_rate"] is not None and m["error_rate"] <= slo.error_rate,
        "ttft": _le(m["ttft_s"]["p95"], slo.ttft_p95_s),
        "tpot": _le(m["tpot_s"]["p95"], slo.tpot_p95_s),
        "itl": _le(m["itl_s"]["p95"], slo.itl_p95_s),
        "e2e": _le(m["e2e_s"]["p95"], slo.e2e_p95_s),
    }
    missed = [k for k, v in checks.items() if not v]
    if missed:
        log.warning("steady state: SLO missed on %s (requests=%s)", ", ".join(missed), m["requests"])
    return not missed


def _le(value: float | None, limit: float) -> bool:
    return value is not None and value <= limit

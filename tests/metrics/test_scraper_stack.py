"""The metrics scraper against the real vLLM stack (the session's ``real_stack``: spec with
``draft-exact``, k = 4, and the non-speculative reference): a few seconds of scraping while
greedy requests run show acceptance ≈ 1 from the parsed series, and no speculation on ref."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from harness.metrics.scraper import METRICS_FILE, MetricsScraper
from harness.metrics.speculation import SpeculationSeries, acceptance, read_series, server_lines

pytestmark = [pytest.mark.stack, pytest.mark.timeout(600)]


def test_scraping_the_real_stack_shows_acceptance_of_the_exact_draft(real_stack, tmp_path):
    t0 = time.monotonic()
    servers = real_stack.stack.servers
    spec = servers["spec"]
    scraper = MetricsScraper(tmp_path / METRICS_FILE, servers, interval_s=0.25)
    scraper.start()
    try:
        time.sleep(0.5)

        def greedy(i: int) -> None:
            with httpx.Client(timeout=60) as c:
                for j in range(2):
                    c.post(f"{spec.base_url}/v1/completions", json={
                        "model": spec.model, "prompt": f"The quick server {i} said {j}", "max_tokens": 32,
                        "temperature": 0, "ignore_eos": True}).raise_for_status()

        users = [threading.Thread(target=greedy, args=(i,)) for i in range(3)]
        for u in users:
            u.start()
        for u in users:
            u.join(60)
        time.sleep(0.6)
    finally:
        scraper.stop()
    lines = read_series(tmp_path / METRICS_FILE)
    spec_lines, ref_lines = server_lines(lines, "spec"), server_lines(lines, "ref")
    assert len(spec_lines) >= 4 and all(ln["ok"] for ln in spec_lines), [ln for ln in spec_lines if not ln["ok"]]
    s = SpeculationSeries(spec_lines)
    a = acceptance(s, spec_lines[0]["t"], spec_lines[-1]["t"] + 1)
    print(f"\n[measure] real stack, draft-exact, 6 greedy requests x 32 tokens: acceptance rate "
          f"{a['acceptance_rate']:.3f}, mean acceptance length {a['mean_acceptance_length']:.2f}, per position "
          f"{[round(p, 3) for p in a['per_position_acceptance']]}, {len(spec_lines)} scrapes, "
          f"test {time.monotonic() - t0:.1f} s")
    assert a["draft_tokens"] >= 100
    assert a["acceptance_rate"] >= 0.95 and a["mean_acceptance_length"] >= 4.8
    assert len(a["per_position_acceptance"]) == 4 and min(a["per_position_acceptance"]) >= 0.95
    last = spec_lines[-1]
    assert last["rss_bytes"] > 100 * 2**20 and last["gauges"]["process_start_time_seconds"] > 0
    assert last["histograms"]["vllm:time_to_first_token_seconds"]["count"] > 0
    assert "vllm:inter_token_latency_seconds" in last["histograms"]
    assert ref_lines and not SpeculationSeries(ref_lines).speculative

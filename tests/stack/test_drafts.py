"""The calibrated drafts on real vLLM (tiny models, CPU): the acceptance rate the server
reports on ``/metrics`` matches the one ``specchaos models build`` measured and wrote into
the manifest. One extra speculative server (no reference), about a minute."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from harness.stack import procs
from harness.stack.local import LocalServer
from harness.stack.vllm_server import VllmSpec
from harness.stack.models import CALIBRATION_OUTPUT_TOKENS, build_models, calibration_prompts, read_acceptance
from harness.ports import free_ports
from harness.stack.vllm import speculative_config, vllm_distribution

pytestmark = [pytest.mark.stack, pytest.mark.nightly, pytest.mark.own_stack, pytest.mark.timeout(600)]

MODELS = Path(__file__).resolve().parents[2] / "models"
ACCEPTED, DRAFTED = "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total"


def spec_counters(base_url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    out = {ACCEPTED: 0.0, DRAFTED: 0.0}
    for fam in text_string_to_metric_families(httpx.get(f"{base_url}/metrics", timeout=10).text):
        for s in fam.samples:
            if s.name in out:
                out[s.name] += s.value
    return out


@pytest.mark.parametrize("draft", ["draft-acc50"])
def test_a_calibrated_draft_serves_the_acceptance_in_the_manifest(tmp_path, draft):
    if vllm_distribution() is None:
        pytest.skip("vLLM is not installed")
    build_models(MODELS)
    expected = read_acceptance(MODELS, draft)
    assert expected is not None
    s = LocalServer(f"spec-{draft}", VllmSpec(MODELS / "target", dtype="float32",
                                              speculative_config=speculative_config("draft_model", MODELS / draft, 4)),
                    port=free_ports("127.0.0.1", 1)[0], log_path=tmp_path / "spec-server.log", startup_timeout_s=300)
    t0 = time.monotonic()
    try:
        s.start()
        pgid = s._inc.pid
        s.wait_ready()
        started = time.monotonic() - t0
        before = spec_counters(s.base_url)

        def ask(prompt: str) -> None:   # the calibration set, greedy, as the build measured it
            r = httpx.post(f"{s.base_url}/v1/completions", timeout=120, json={
                "model": s.model, "prompt": prompt, "max_tokens": CALIBRATION_OUTPUT_TOKENS, "temperature": 0,
                "ignore_eos": True})
            assert r.status_code == 200, r.text

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(ask, calibration_prompts()))
        after = spec_counters(s.base_url)
    finally:
        s.stop()
    accepted, drafted = after[ACCEPTED] - before[ACCEPTED], after[DRAFTED] - before[DRAFTED]
    served = accepted / drafted
    print(f"\n[measure] {draft}: served acceptance rate {served:.4f} ({accepted:.0f}/{drafted:.0f} draft tokens), "
          f"manifest {expected}; server ready in {started:.1f} s, test {time.monotonic() - t0:.1f} s")
    assert abs(served - expected) <= 0.1
    assert procs.group_members(pgid) == []

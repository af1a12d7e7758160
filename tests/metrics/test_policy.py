"""Break-even, best k and the recommended policy on synthetic cells with a known answer
(:mod:`harness.metrics.policy`)."""

from __future__ import annotations

import pytest

from harness.metrics.policy import acceptance_threshold, best_k, break_even, combine_sampling, derive_policy

BUCKETS = {"short": (16, 60), "medium": (120, 136), "long": (496, 528)}


def cell(spec: str, k: int, level: float, bucket: str, speedup: float, sampling: str = "greedy",
         acc: float | None = None, width: float = 0.05, method: str = "draft_model") -> dict:
    lo, hi = BUCKETS[bucket]
    return {"id": f"{spec}-k{k}-c{level:g}-{bucket}-{sampling}", "speculator": spec, "method": method,
            "draft": None if method == "ngram" else f"draft-{spec}", "k": k, "level": level, "bucket": bucket,
            "min_prompt_tokens": lo, "max_prompt_tokens": hi, "sampling": sampling, "acceptance_rate": acc,
            "speedup": {"goodput": {"speedup": speedup, "low": speedup - width, "high": speedup + width}}}


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


def test_acceptance_threshold_separates_wins_from_losses():
    # losses at 0.1 and 0.3, wins from 0.5 on: the cut is midway between 0.3 and 0.5
    assert acceptance_threshold([(0.1, 0.7), (0.3, 0.95), (0.5, 1.1), (0.9, 2.0)]) == pytest.approx(0.4)
    # one outlier (a win at 0.2) costs one misclassification either way: the lowest best cut
    assert acceptance_threshold([(0.2, 1.05), (0.3, 0.9), (0.6, 1.2), (0.8, 1.5)]) == pytest.approx(0.45)
    assert acceptance_threshold([(0.5, 1.2), (0.9, 1.5)]) is None   # nothing lost: nothing to separate
    assert acceptance_threshold([(None, 1.2)]) is None


def test_a_mix_of_sampling_classes_pays_off_only_where_each_class_does():
    pts = combine_sampling([cell("a", 4, 1, "short", 1.8), cell("a", 4, 1, "short", 0.9, "sampled")], "goodput")
    assert len(pts) == 1 and pts[0]["speedup"] == 0.9 and pts[0]["cells"] == ["a-k4-c1-short-greedy",
                                                                              "a-k4-c1-short-sampled"]


def known_sweep() -> list[dict]:
    """Two speculators, k 2 and 4, concurrency 1/4/16, three buckets. Known answer:
    ``good`` wins; short loses everywhere (so: enable above medium's 120 tokens); medium
    is best at k=2 and crosses 1 between 4 (1.2) and 16 (0.8) at 10; long is best at k=4
    and crosses between 4 (1.5) and 16 (0.5) at 8; so max concurrency 4 (the smaller last
    win). ``bad`` (low acceptance) loses everywhere. Acceptance: good 0.8, bad 0.2."""
    table = {  # (bucket, k): speedups at concurrency 1, 4, 16
        ("short", 2): (0.9, 0.8, 0.6), ("short", 4): (0.85, 0.7, 0.5),
        ("medium", 2): (1.6, 1.2, 0.8), ("medium", 4): (1.4, 1.1, 0.7),
        ("long", 2): (1.7, 1.3, 0.6), ("long", 4): (2.0, 1.5, 0.5),
    }
    cells = []
    for (bucket, k), speeds in table.items():
        for level, s in zip((1, 4, 16), speeds):
            cells.append(cell("good", k, level, bucket, s, acc=0.8))
            cells.append(cell("bad", k, level, bucket, s * 0.45, acc=0.2))
    return cells


def test_the_policy_of_a_known_sweep():
    pol = derive_policy(known_sweep(), "goodput", soft_margin=0.1)
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
    # breaker: good (0.8) pays off in some cells, bad (0.2) never: the cut lies midway
    br = pol["breaker"]
    assert br["acceptance_threshold"] == pytest.approx(0.5) and br["hard_rejection"] == pytest.approx(0.5)
    assert br["soft_rejection"] == pytest.approx(0.4) and br["soft_num_speculative_tokens"] == 2
    assert pol["vllm"]["speculative_config"]["disable_by_batch_size"] == 4


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

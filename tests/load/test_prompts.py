"""Prompt set: deterministic for a seed, length classes as documented, JSON round trip."""

from __future__ import annotations

import json

import pytest

from harness.errors import LoadError, ModelError
from harness.load.prompts import (
    CLASS_BOUNDS,
    Prompt,
    build_prompt_set,
    load_prompt_set,
    load_token_counter,
    save_prompt_set,
)


def _build(d, seed=7, **kw):
    args = dict(short=6, medium=4, long=2, max_tokens=32)
    args.update(kw)
    return build_prompt_set(d, seed=seed, **args)


def test_same_seed_same_set(tiny_tokenizer_dir):
    assert _build(tiny_tokenizer_dir) == _build(tiny_tokenizer_dir)


def test_other_seed_other_texts(tiny_tokenizer_dir):
    a = [p.text for p in _build(tiny_tokenizer_dir, seed=1)]
    b = [p.text for p in _build(tiny_tokenizer_dir, seed=2)]
    assert not set(a) & set(b)


def test_ids_classes_and_lengths(tiny_tokenizer_dir):
    ps = _build(tiny_tokenizer_dir)
    count = load_token_counter(tiny_tokenizer_dir)
    assert [p.prompt_id for p in ps] == list(range(12))
    assert [p.prompt_class for p in ps] == ["short"] * 6 + ["medium"] * 4 + ["long"] * 2
    for p in ps:
        assert p.prompt_tokens == count(p.text)  # measured, BOS included
        assert p.max_tokens == 32
    assert all(16 <= p.prompt_tokens < 64 for p in ps if p.prompt_class == "short")
    assert all(abs(p.prompt_tokens - 128) <= 8 for p in ps if p.prompt_class == "medium")
    assert all(abs(p.prompt_tokens - 512) <= 16 for p in ps if p.prompt_class == "long")
    assert len({p.text for p in ps}) == len(ps)
    shorts = {p.prompt_tokens for p in ps if p.prompt_class == "short"}
    assert len(shorts) > 1  # mixed, not one length


def test_bounds_table_matches_documented_classes():
    assert CLASS_BOUNDS["short"][3] < 64
    assert CLASS_BOUNDS["medium"][2:] == (120, 136)
    assert CLASS_BOUNDS["long"][2:] == (496, 528)


def test_counter_only_path_is_deterministic():
    words = lambda t: len(t.split())  # noqa: E731 - one word one token
    a = build_prompt_set("unused", seed=3, short=3, medium=1, long=1, max_tokens=8, count_tokens=words)
    b = build_prompt_set("unused", seed=3, short=3, medium=1, long=1, max_tokens=8, count_tokens=words)
    assert a == b
    assert a[3].prompt_tokens == words(a[3].text)


def test_empty_classes(tiny_tokenizer_dir):
    assert _build(tiny_tokenizer_dir, short=0, medium=0, long=0) == []


def test_impossible_tokenizer_is_load_error():
    # Every word costs 100 tokens: no short prompt can fit in 16..60.
    with pytest.raises(LoadError):
        build_prompt_set("unused", seed=1, short=1, medium=0, long=0, max_tokens=8,
                         count_tokens=lambda t: 100 * len(t.split()))


def test_missing_tokenizer_dir_is_model_error(tmp_path):
    with pytest.raises(ModelError):
        build_prompt_set(tmp_path / "nope", seed=1, short=1, medium=0, long=0, max_tokens=8)


def test_round_trip(tmp_path, tiny_tokenizer_dir):
    ps = _build(tiny_tokenizer_dir)
    path = tmp_path / "prompts.json"
    save_prompt_set(path, ps)
    assert load_prompt_set(path) == ps
    assert json.loads(path.read_text())["format"] == "specchaos-prompts/1"


@pytest.mark.parametrize("content", ["not json", "[]", '{"format": "x", "prompts": []}',
                                     '{"format": "specchaos-prompts/1", "prompts": [{"prompt_id": 0}]}',
                                     '{"format": "specchaos-prompts/1", "prompts": [{"prompt_id": 0, '
                                     '"prompt_class": "", "text": "", "prompt_tokens": 1, "max_tokens": 1}]}'])
def test_bad_files_are_load_errors(tmp_path, content):
    path = tmp_path / "prompts.json"
    path.write_text(content)
    with pytest.raises(LoadError):
        load_prompt_set(path)


def test_missing_file_is_load_error(tmp_path):
    with pytest.raises(LoadError):
        load_prompt_set(tmp_path / "absent.json")


def test_prompt_is_plain_data():
    p = Prompt(0, "short", "hi", 2, 4)
    assert p.prompt_id == 0 and p.max_tokens == 4


def test_configured_buckets_name_the_prompt_classes(tiny_tokenizer_dir):
    from harness.load.config import LoadConfig
    from harness.load.prompts import build_bucketed_prompt_set

    lc = LoadConfig(buckets=[{"name": "tiny", "min_prompt_tokens": 10, "max_prompt_tokens": 30, "count": 3},
                             {"name": "k1", "min_prompt_tokens": 200, "max_prompt_tokens": 260, "count": 2},
                             {"name": "xl", "min_prompt_tokens": 700, "max_prompt_tokens": 800, "count": 2}])
    ps = build_bucketed_prompt_set(tiny_tokenizer_dir, lc.bucket_specs(), seed=5, max_tokens=16)
    count = load_token_counter(tiny_tokenizer_dir)
    assert [p.prompt_class for p in ps] == ["tiny"] * 3 + ["k1"] * 2 + ["xl"] * 2
    assert [p.prompt_id for p in ps] == list(range(7))
    bounds = {b.name: (b.min_prompt_tokens, b.max_prompt_tokens) for b in lc.buckets}
    for p in ps:
        lo, hi = bounds[p.prompt_class]
        assert lo <= p.prompt_tokens == count(p.text) <= hi
    # the default buckets build exactly the set the three counts always built
    default = LoadConfig(short_prompts=6, medium_prompts=4, long_prompts=2)
    assert build_bucketed_prompt_set(tiny_tokenizer_dir, default.bucket_specs(), seed=7, max_tokens=32) == \
        _build(tiny_tokenizer_dir)


def test_a_saved_set_with_configured_bucket_names_loads(tmp_path):
    ps = [Prompt(0, "k1", "some text", 3, 4), Prompt(1, "xl", "more text", 3, 4)]
    save_prompt_set(tmp_path / "p.json", ps)
    assert load_prompt_set(tmp_path / "p.json") == ps


def test_token_counts_equal_transformers_counts_special_tokens_included(tiny_tokenizer_dir):
    """The counter reads tokenizer.json with ``tokenizers`` (no transformers import); its counts
    are transformers' AutoTokenizer's, the BOS the post-processor adds included."""
    from transformers import AutoTokenizer

    count = load_token_counter(tiny_tokenizer_dir)
    tok = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
    texts = ["", "a", "the quick brown fox", " leading space", "émoji ✓ and\nnew lines", "word " * 50]
    assert [count(t) for t in texts] == [len(tok(t, add_special_tokens=True)["input_ids"]) for t in texts]
    assert count("") == 1   # the BOS alone


def test_a_broken_tokenizer_json_is_a_model_error(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelError, match="cannot load tokenizer.json"):
        load_token_counter(tmp_path)

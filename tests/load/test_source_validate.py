"""``load.source`` at ``specchaos validate``: the source is read, measured with the target's
tokenizer and bucketed before anything starts; each bad source is one line naming
``FILE:LINE``, exit 2 (tests/experiment/test_bad_input.py's pattern)."""

from __future__ import annotations

import json

import pytest

from harness.experiment.config import parse_config
from harness.load.source_prep import prepare_source
from harness.stack.config import StackConfig
from harness.stack.preflight import resolve_models
from tests.experiment.files import write
from tests.experiment.test_bad_input import ROOT, assert_one_line_error, cli, doc

TRACE = '{"timestamp": 0, "input_length": 40, "output_length": 16}\n'


def source_doc(fmt: str = "mooncake", path: str = "src.jsonl", **extra) -> dict:
    d = doc()
    load = d["configuration"]["specchaos"].setdefault("load", {})
    for k in ("short_prompts", "medium_prompts", "long_prompts", "request_classes"):
        load.pop(k, None)
    load["source"] = {"format": fmt, "path": path, **extra}
    return d


@pytest.mark.parametrize("text, needle", [
    (TRACE + "not json\n", "src.jsonl:2: not JSON"),
    ("", "src.jsonl: empty file"),
    ('{"timestamp": 0, "output_length": 16}\n', "src.jsonl:1:"),
    ('{"timestamp": 0, "input_length": 1200, "output_length": 16}\n', "src.jsonl:1: prompt of 1200 tokens"),
    ('{"timestamp": 0, "input_length": 90, "output_length": 16}\n', "src.jsonl:1: prompt of 90 tokens is in no"),
])
def test_bad_source_is_one_line_with_file_and_line(tmp_path, text, needle):
    (tmp_path / "src.jsonl").write_text(text)
    res = cli("validate", str(write(tmp_path, source_doc())), cwd=tmp_path)
    assert_one_line_error(res, needle)


def test_missing_source_file(tmp_path):
    res = cli("validate", str(write(tmp_path, source_doc(path="nowhere.jsonl"))), cwd=tmp_path)
    assert_one_line_error(res, "nowhere.jsonl: no such file")


def test_source_beside_request_classes_is_refused(tmp_path):
    d = source_doc()
    d["configuration"]["specchaos"]["load"]["request_classes"] = [{"name": "plain", "weight": 1}]
    (tmp_path / "src.jsonl").write_text(TRACE)
    assert_one_line_error(cli("validate", str(write(tmp_path, d)), cwd=tmp_path), "load: ", "remove request_classes")


def test_a_relative_source_path_is_taken_from_the_working_directory(tmp_path):
    (tmp_path / "exps").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "src.jsonl").write_text(TRACE)
    exp = write(tmp_path / "exps", source_doc(path="data/src.jsonl"))
    res = cli("validate", str(exp), cwd=tmp_path)   # as stack.models_dir: one rule for validate, run and chaos run
    assert res.returncode == 0, res.stderr
    assert_one_line_error(cli("validate", str(exp), cwd=tmp_path / "exps"), "data/src.jsonl: no such file")


def test_shipped_example_sources_bucket_by_measured_length():
    target = resolve_models(StackConfig(models_dir=str(ROOT / "models"))).target
    cfg = parse_config({"load": {"source": {"format": "openai", "path": "requests.jsonl"}}})
    specs = prepare_source(cfg.load, ROOT / "experiments" / "sources", tokenizer_dir=target, max_model_len=1024)
    assert len(specs) == 20 and {s.prompt_class for s in specs} == {"short"}
    assert all(16 <= s.prompt_tokens <= 60 for s in specs)
    assert specs[0].origin.endswith("requests.jsonl:1") and specs[2].endpoint == "chat"
    cfg = parse_config({"load": {"source": {"format": "mooncake", "path": "trace.jsonl", "speedup": 2,
                                            "limit": 6}}})
    specs = prepare_source(cfg.load, ROOT / "experiments" / "sources", tokenizer_dir=target, max_model_len=1024)
    assert [s.prompt_class for s in specs] == ["short", "short", "medium", "short", "short", "medium"]
    assert [s.arrival_s for s in specs] == pytest.approx([0, 0.2, 0.45, 0.65, 1.0, 1.3])


def test_custom_buckets_take_the_measured_lengths(tmp_path):
    target = resolve_models(StackConfig(models_dir=str(ROOT / "models"))).target
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"timestamp": i, "input_length": n, "output_length": 8}) + "\n"
                                              for i, n in enumerate((20, 90, 200))))
    cfg = parse_config({"load": {"source": {"format": "mooncake", "path": "t.jsonl"}, "buckets": [
        {"name": "a", "min_prompt_tokens": 8, "max_prompt_tokens": 64, "count": 0},
        {"name": "b", "min_prompt_tokens": 65, "max_prompt_tokens": 300, "count": 0}]}})
    specs = prepare_source(cfg.load, tmp_path, tokenizer_dir=target, max_model_len=1024)
    assert [s.prompt_class for s in specs] == ["a", "b", "b"]

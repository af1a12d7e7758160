"""``load.source`` at ``specchaos validate``: the source is read, measured with the target's
tokenizer and bucketed before anything starts; each bad source is one line naming
``FILE:LINE``, exit 2 (tests/experiment/test_bad_input.py's pattern)."""

from __future__ import annotations

import json

import pytest

from harness.errors import ExperimentError
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
])
def test_bad_source_is_one_line_with_file_and_line(tmp_path, text, needle):
    (tmp_path / "src.jsonl").write_text(text)
    res = cli("validate", str(write(tmp_path, source_doc())), cwd=tmp_path)
    assert_one_line_error(res, needle)


#: hand-written buckets that leave a gap (65-119 tokens)
GAPPED = [{"name": "a", "min_prompt_tokens": 8, "max_prompt_tokens": 64},
          {"name": "b", "min_prompt_tokens": 120, "max_prompt_tokens": 300}]


def test_a_prompt_outside_hand_written_buckets_is_refused_naming_each(tmp_path):
    (tmp_path / "src.jsonl").write_text("".join(json.dumps({"timestamp": i, "input_length": n, "output_length": 8})
                                                + "\n" for i, n in enumerate((20, 90, 100, 200))))
    d = source_doc()
    d["configuration"]["specchaos"]["load"]["buckets"] = GAPPED   # no count: a source brings its prompts
    res = cli("validate", str(write(tmp_path, d)), cwd=tmp_path)
    assert res.returncode == 2, res.stdout
    first, *rest = res.stderr.strip().splitlines()
    assert "src.jsonl:2: prompt of 90 tokens is in no" in first and "2 such prompts" in first
    assert [r.strip() for r in rest] == [f"{tmp_path / 'src.jsonl'}:2: 90 tokens", f"{tmp_path / 'src.jsonl'}:3: 100 tokens"]


def test_without_buckets_every_length_has_a_bucket_and_validate_prints_the_table(tmp_path):
    lengths = (3, 20, 90, 100, 200, 700)   # 3: below the synthetic prompts' 8-token minimum
    (tmp_path / "src.jsonl").write_text("".join(json.dumps({"timestamp": i, "input_length": n, "output_length": 8})
                                                + "\n" for i, n in enumerate(lengths)))
    res = cli("validate", str(write(tmp_path, source_doc())), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    rows = [line.split() for line in res.stdout.splitlines() if line.startswith("  ")]
    assert [(r[0], r[3]) for r in rows] == [("1-16", "1"), ("17-32", "1"), ("65-128", "2"), ("129-256", "1"),
                                            ("513-1024", "1")]
    assert "derived: power-of-two ranges" in res.stdout and "6 request(s)" in res.stdout


def test_every_bad_line_is_named_up_to_a_limit(tmp_path):
    good = '{"timestamp": 0, "input_length": 40, "output_length": 16}\n'
    (tmp_path / "src.jsonl").write_text(good + "not json\n" * 3 + '{"timestamp": 1}\n' + "[1]\n" * 30)
    res = cli("validate", str(write(tmp_path, source_doc())), cwd=tmp_path)
    assert res.returncode == 2
    first, *rest = res.stderr.strip().splitlines()
    assert "src.jsonl: 34 bad lines" in first
    assert rest[0].strip().startswith(f"{tmp_path / 'src.jsonl'}:2: not JSON")
    assert rest[3].strip().startswith(f"{tmp_path / 'src.jsonl'}:5:") and "input_length" in rest[3]
    assert len(rest) == 21 and rest[-1].strip() == "and 14 more"


def test_synthetic_buckets_need_a_count_and_eight_tokens():
    with pytest.raises(ExperimentError, match=r"buckets\[0\] \(a\): count is required"):
        parse_config({"load": {"buckets": [{"name": "a", "min_prompt_tokens": 8, "max_prompt_tokens": 64}]}})
    with pytest.raises(ExperimentError, match="below 8, the shortest synthetic prompt"):
        parse_config({"load": {"buckets": [{"name": "a", "min_prompt_tokens": 4, "max_prompt_tokens": 64,
                                            "count": 2}]}})


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
    assert len(specs) == 20 and {s.prompt_class for s in specs} <= {"17-32", "33-64"}
    assert all(17 <= s.prompt_tokens <= 64 for s in specs)
    assert all(int(s.prompt_class.split("-")[0]) <= s.prompt_tokens <= int(s.prompt_class.split("-")[1])
               for s in specs)
    assert specs[0].origin.endswith("requests.jsonl:1") and specs[2].endpoint == "chat"
    cfg = parse_config({"load": {"source": {"format": "mooncake", "path": "trace.jsonl", "speedup": 2,
                                            "limit": 6}}})
    specs = prepare_source(cfg.load, ROOT / "experiments" / "sources", tokenizer_dir=target, max_model_len=1024)
    assert [s.prompt_class for s in specs] == ["33-64", "33-64", "65-128", "17-32", "33-64", "65-128"]
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


def test_a_floor_naming_a_category_the_source_lacks_is_refused(tmp_path):
    (tmp_path / "src.jsonl").write_text('{"prompt": "def f():", "category": "code"}\n{"prompt": "Once upon"}\n')
    d = source_doc(fmt="openai")
    d["configuration"]["specchaos"]["acceptance_floor"] = {"request_classes": {"prose": 0.3}}
    res = cli("validate", str(write(tmp_path, d)), cwd=tmp_path)
    assert_one_line_error(res, "acceptance_floor.request_classes", "'prose' is not a category of load.source",
                          "code, source")
    d["configuration"]["specchaos"]["acceptance_floor"] = {"request_classes": {"code": 0.3}}
    assert cli("validate", str(write(tmp_path, d)), cwd=tmp_path).returncode == 0

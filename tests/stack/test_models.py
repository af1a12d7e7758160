"""Tiny model build: determinism, completeness detection, rebuild, resolution errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.errors import ModelError
from harness.stack import models as M


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("models")
    M.build_models(d)
    return d


def test_build_writes_three_models_and_manifest(built: Path):
    manifest = json.loads((built / "manifest.json").read_text())
    assert manifest["format_version"] == M.FORMAT_VERSION
    assert set(manifest["models"]) == set(M.MODEL_NAMES)
    for name in M.MODEL_NAMES:
        files = set(manifest["models"][name]["files"])
        assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= files
    cfg = json.loads((built / "target" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (2, 256, 4, 2)
    assert cfg["max_position_embeddings"] == 2048
    assert 2000 <= cfg["vocab_size"] <= 4000
    assert M.verify_models(built) == []


def test_tokenizer_ids_match_config(built: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(built / "target")
    cfg = json.loads((built / "target" / "config.json").read_text())
    assert len(tok) == cfg["vocab_size"]
    assert (tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (cfg["bos_token_id"], cfg["eos_token_id"], 0)
    ids = tok("The quick server answered the request.").input_ids
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == "The quick server answered the request."


def test_drafts_exact_and_noisy(built: Path):
    from safetensors.torch import load_file

    t = load_file(built / "target" / "model.safetensors")
    e = load_file(built / "draft-exact" / "model.safetensors")
    n = load_file(built / "draft-noisy" / "model.safetensors")
    assert (built / "target" / "model.safetensors").read_bytes() == (built / "draft-exact" / "model.safetensors").read_bytes()
    assert set(t) == set(n)
    w = "model.layers.0.mlp.up_proj.weight"
    rel = float((n[w].float() - t[w].float()).std() / t[w].float().std())
    assert 0.4 < rel < 0.6
    for name in M.MODEL_NAMES[1:]:
        assert (built / name / "tokenizer.json").read_bytes() == (built / "target" / "tokenizer.json").read_bytes()


def test_build_is_deterministic(built: Path, tmp_path: Path):
    M.build_models(tmp_path, force=True)
    assert _tree(tmp_path) == _tree(built)


def test_skip_when_verified(built: Path, monkeypatch):
    monkeypatch.setattr(M, "_build", lambda d: pytest.fail("rebuilt a verified directory"))
    assert M.build_models(built)["format_version"] == M.FORMAT_VERSION


@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda d: (d / "manifest.json").unlink(), "manifest.json missing"),
        (lambda d: (d / "draft-noisy" / "model.safetensors").unlink(), "draft-noisy/model.safetensors: missing"),
        (lambda d: (d / "target" / "tokenizer.json").write_text("{}"), "target/tokenizer.json: sha256 mismatch"),
        (lambda d: (d / "manifest.json").write_text("{not json"), "manifest.json unreadable"),
    ],
    ids=["no-manifest", "missing-file", "corrupt-file", "corrupt-manifest"],
)
def test_detect_and_rebuild_damage(built: Path, tmp_path: Path, damage, problem):
    import shutil

    d = tmp_path / "m"
    shutil.copytree(built, d)
    damage(d)
    problems = M.verify_models(d)
    assert any(p.startswith(problem) for p in problems), problems
    M.build_models(d)
    assert M.verify_models(d) == []
    assert _tree(d) == _tree(built)


def test_interrupted_build_never_looks_complete(built: Path, tmp_path: Path, monkeypatch):
    import shutil

    d = tmp_path / "m"
    shutil.copytree(built, d)

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(M, "_save_tokenizer", boom)
    with pytest.raises(KeyboardInterrupt):
        M.build_models(d, force=True)
    assert M.verify_models(d) == ["manifest.json missing"]
    assert not list(d.glob(".*.building-*"))
    monkeypatch.undo()
    M.build_models(d)
    assert _tree(d) == _tree(built)


def test_verify_missing_dir(tmp_path: Path):
    assert M.verify_models(tmp_path / "nope") == [f"{tmp_path / 'nope'}: directory missing"]


def test_resolve_model(built: Path, tmp_path: Path, monkeypatch):
    assert M.resolve_model(built, "target") == (built / "target").resolve()
    assert M.resolve_model(tmp_path, str(built / "draft-exact")) == (built / "draft-exact").resolve()
    monkeypatch.chdir(built.parent)
    assert M.resolve_model(tmp_path, f"./{built.name}/draft-noisy") == (built / "draft-noisy").resolve()


def test_resolve_model_missing(tmp_path: Path):
    with pytest.raises(ModelError) as ei:
        M.resolve_model(tmp_path, "target")
    assert ei.value.where == str(tmp_path / "target")
    assert ei.value.hint == f"run `specchaos models build --dir {tmp_path}`"


def test_resolve_model_without_config(tmp_path: Path):
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelError) as ei:
        M.resolve_model(tmp_path, "target")
    assert "config.json" in ei.value.message
    assert ei.value.where == str(tmp_path / "target")
    assert "specchaos models build" in ei.value.hint

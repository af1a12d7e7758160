"""Tiny model build: determinism, completeness detection, rebuild, resolution errors, the
calibrated drafts (acceptance measured by simulation) and the wrong-vocabulary draft."""

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


#: The models ``make test`` built before the tests (``specchaos models build``).
REPO_MODELS = Path(__file__).resolve().parents[2] / "models"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A built models directory, read only: the repository's ``models/`` when its manifest
    verifies (``make test`` built it: no second build per xdist worker), else a fresh build.
    :func:`test_build_is_deterministic` builds once more and compares."""
    if M.verify_models(REPO_MODELS) == []:
        return REPO_MODELS
    d = tmp_path_factory.mktemp("models")
    M.build_models(d)
    return d


def test_build_writes_every_model_and_manifest(built: Path):
    manifest = json.loads((built / "manifest.json").read_text())
    assert manifest["format_version"] == M.FORMAT_VERSION
    assert set(manifest["models"]) == set(M.MODEL_NAMES)
    assert {"draft-acc80", "draft-acc50", "draft-acc20", "draft-wrongvocab"} <= set(M.MODEL_NAMES)
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
    for name in M.DRAFT_NAMES:
        assert (built / name / "tokenizer.json").read_bytes() == (built / "target" / "tokenizer.json").read_bytes()
        assert (built / name / "config.json").read_bytes() == (built / "target" / "config.json").read_bytes()


def test_calibrated_drafts_hit_their_acceptance_rates(built: Path):
    """The manifest records, per draft, the acceptance rate measured at build time (greedy,
    k = 4); each calibrated draft lands within the tolerance of its aim, more noise means
    less acceptance, and the figure is reproduced from the saved files."""
    manifest = json.loads((built / "manifest.json").read_text())
    models = manifest["models"]
    assert manifest["calibration"]["num_speculative_tokens"] == M.CALIBRATION_K == 4
    assert models["draft-exact"]["acceptance"] == {"rate": 1.0, "noise_fraction": 0.0}
    assert models["draft-noisy"]["acceptance"]["rate"] < 0.05
    fractions = []
    for name, aim in M.CALIBRATED_DRAFTS.items():
        acc = models[name]["acceptance"]
        assert acc["aim"] == aim
        assert abs(acc["rate"] - aim) <= M.CALIBRATION_TOLERANCE, (name, acc)
        assert M.read_acceptance(built, name) == acc["rate"]
        fractions.append(acc["noise_fraction"])
        assert f"{acc['noise_fraction']:g} x std" in models[name]["description"]
    assert 0 < fractions[0] < fractions[1] < fractions[2] < M.NOISE_FRACTION
    assert M.measure_acceptance(built, "draft-acc50") == models["draft-acc50"]["acceptance"]["rate"]
    assert M.read_acceptance(built, "target") is None and M.read_acceptance(built / "nope", "draft-acc50") is None


def test_wrong_vocab_draft_has_its_own_smaller_vocabulary(built: Path):
    from transformers import AutoTokenizer

    target = json.loads((built / "target" / "config.json").read_text())
    wrong = json.loads((built / "draft-wrongvocab" / "config.json").read_text())
    assert wrong["vocab_size"] == M.WRONG_VOCAB_SIZE != target["vocab_size"]
    assert {k: v for k, v in wrong.items() if k != "vocab_size"} == {k: v for k, v in target.items() if k != "vocab_size"}
    tok = AutoTokenizer.from_pretrained(built / "draft-wrongvocab")
    assert len(tok) == wrong["vocab_size"]
    assert tok("The quick server").input_ids != AutoTokenizer.from_pretrained(built / "target")("The quick server").input_ids
    entry = json.loads((built / "manifest.json").read_text())["models"]["draft-wrongvocab"]
    assert entry["vocab_size"] == M.WRONG_VOCAB_SIZE and "acceptance" not in entry
    with pytest.raises(ModelError, match="vocab_size 1024 differs"):
        M.measure_acceptance(built, "draft-wrongvocab")


@pytest.mark.parametrize("hit, accepted, proposed", [
    ([True] * 40, 28, 28),          # 32 tokens: prefill + 7 steps of 1 + 4 accepted (the last one past the end)
    ([False] * 40, 0, 124),         # 31 steps, each 4 proposed, none accepted
    ([True, True, False] * 14, 21, 44),
    ([], 0, 124),                   # too short: read as misses
])
def test_greedy_acceptance_counts_steps_like_vllm(hit, accepted, proposed):
    assert M.greedy_acceptance(hit, 32, 4) == (accepted, proposed)


def test_bisection_lands_within_tolerance_of_the_aim():
    calls = []

    def rate_at(f: float) -> float:   # falls with noise, like a draft's acceptance
        calls.append(f)
        return 1.0 / (1.0 + 60 * f)

    for aim in (0.8, 0.5, 0.2):
        calls.clear()
        f, rate = M._bisect_noise(rate_at, aim)
        assert abs(rate - aim) <= M.CALIBRATION_TOLERANCE and rate == rate_at(f)
        assert len(calls) <= M.CALIBRATION_STEPS + 1


def test_calibration_prompts_are_fixed():
    assert M.calibration_prompts() == M.calibration_prompts()
    assert len(M.calibration_prompts()) == M.CALIBRATION_PROMPTS


@pytest.mark.nightly   # make test builds the models from scratch in every fresh clone; the second build to compare, nightly
def test_build_is_deterministic(built: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setattr(M, "_CALIBRATION_MEMO", {})   # measure again, do not reuse
    M.build_models(tmp_path, force=True)
    assert _tree(tmp_path) == _tree(built)


@pytest.mark.nightly   # rebuilds and calibrates four drafts (about a minute on 2 cores)
def test_a_manifest_of_the_three_model_version_is_rebuilt(built: Path, tmp_path: Path):
    import shutil

    d = tmp_path / "m"
    shutil.copytree(built, d)
    manifest = json.loads((d / "manifest.json").read_text())
    for name in ("draft-acc80", "draft-acc50", "draft-acc20", "draft-wrongvocab"):
        del manifest["models"][name]
        shutil.rmtree(d / name)
    (d / "manifest.json").write_text(json.dumps(manifest))
    assert "manifest.json: model 'draft-acc80' not listed" in M.verify_models(d)
    M.build_models(d)
    assert M.verify_models(d) == [] and _tree(d) == _tree(built)


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
    assert ei.value.hint == f"run `specchaos models build --dir {tmp_path}`, which builds target"


@pytest.mark.parametrize("name", ["draft-acc20", "draft-wrongvocab"])
def test_a_missing_new_draft_is_named_with_how_to_build_it(tmp_path: Path, name: str):
    with pytest.raises(ModelError) as ei:
        M.resolve_model(tmp_path, name)
    assert ei.value.message == f"model {name!r} not found"
    assert ei.value.hint == f"run `specchaos models build --dir {tmp_path}`, which builds {name}"


def test_an_unknown_model_name_lists_the_models_a_build_makes(tmp_path: Path):
    with pytest.raises(ModelError) as ei:
        M.resolve_model(tmp_path, "draft-acc90")
    assert "it builds target, draft-exact, draft-noisy, draft-acc80, draft-acc50, draft-acc20, draft-wrongvocab" in ei.value.hint


def test_resolve_model_without_config(tmp_path: Path):
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelError) as ei:
        M.resolve_model(tmp_path, "target")
    assert "config.json" in ei.value.message
    assert ei.value.where == str(tmp_path / "target")
    assert "specchaos models build" in ei.value.hint

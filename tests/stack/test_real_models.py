"""The real model set (``specchaos models build --set real``): refusal in one line when the
package or its extra is missing (cheap, always run); the built set's checksums, chat
template, tokenizer and layer-skip drafts (on ``models-real/`` when built, ``make
models-real``; skipped otherwise, failed under ``SPECCHAOS_REQUIRE_REAL_MODELS=1``); a build from scratch, compared byte for byte (nightly:
minutes); the ngram simulation against hand-computed steps."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.errors import ModelError
from harness.stack import real_models as R
from tests.experiment.files import skip_without_real_models

ROOT = Path(__file__).resolve().parents[2]
#: The set ``make models-real`` builds (minutes, ~1.2 GB; ``.ci/run`` builds it before make test).
REPO_REAL = ROOT / "models-real"


def _installed() -> bool:
    try:
        R.gguf_path()
    except ModelError:
        return False
    return True


@pytest.fixture
def needs_package() -> None:
    """The tests that read the package's GGUF skip without it (fail under
    ``SPECCHAOS_REQUIRE_REAL_MODELS=1``, as ``.ci/run`` sets)."""
    if not _installed():
        skip_without_real_models(f"{R.PACKAGE} {R.PACKAGE_VERSION} or the `real` extra (gguf, accelerate) is not "
                                 f"installed: make models-real installs them")


@pytest.fixture(scope="module")
def built() -> Path:
    """``models-real/`` when its manifest verifies; the tests that read it skip otherwise
    (fail under ``SPECCHAOS_REQUIRE_REAL_MODELS=1``)."""
    problems = R.verify_real_models(REPO_REAL)
    if problems:
        skip_without_real_models(f"the real model set is not built in models-real/ (make models-real: minutes, "
                                 f"~1.2 GB): {problems[0]}")
    return REPO_REAL


# ------------------------------------------------------------------ refusal (cheap)


@pytest.mark.parametrize("missing", [R.PACKAGE, "gguf", "accelerate"])
def test_a_missing_package_is_refused_in_one_line_with_exit_2(missing, tmp_path, monkeypatch):
    real = metadata.distribution

    def distribution(name):
        if name == missing:
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(R.metadata, "distribution", distribution)
    with pytest.raises(ModelError, match=missing):
        R.build_real_models(tmp_path / "m")
    assert not (tmp_path / "m").exists()      # refused before anything is written
    res = CliRunner().invoke(app, ["models", "build", "--set", "real", "--dir", str(tmp_path / "m")])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("specchaos: error:"), res.output
    assert "pip install" in lines[0] and missing in lines[0]


def test_every_missing_package_is_named_at_once(tmp_path, monkeypatch):
    """On a machine without the `real` extra (CI's), all three are missing: one line names them all."""
    def distribution(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(R.metadata, "distribution", distribution)
    with pytest.raises(ModelError) as err:
        R.build_real_models(tmp_path / "m")
    for name in (R.PACKAGE, *R.EXTRA_MODULES.values()):
        assert name in str(err.value)
    assert "are not installed" in str(err.value)
    assert not (tmp_path / "m").exists()


def test_another_package_version_is_refused(monkeypatch):
    class Dist:
        version = "0.1.1"
    monkeypatch.setattr(R.metadata, "distribution", lambda name: Dist())
    with pytest.raises(ModelError, match="0.1.2"):
        R.gguf_path()


def test_an_unknown_model_set_is_refused_with_exit_2():
    res = CliRunner().invoke(app, ["models", "build", "--set", "huge"])
    assert res.exit_code == 2 and "tiny or real" in res.output


# ------------------------------------------------------------------ acceptance arithmetic (cheap)


def test_the_output_ends_after_the_end_of_turn_token():
    assert R._output_len([9, 9, 5, 6, 2, 7, 8], 2, eos_id=2, max_tokens=10) == 3
    assert R._output_len([9, 9, 5, 6, 2, 7, 8], 2, eos_id=2, max_tokens=2) == 2
    assert R._output_len([9, 9, 5, 6], 2, eos_id=2, max_tokens=10) == 2


def test_ngram_proposes_what_followed_the_match_and_counts_like_vllm():
    # prompt 1 2 3 4 1 2 | output 3 4 1 2 3 9. Step 1 (context ... 1 2 3): the 3-gram "1 2 3"
    # recurs at the start, so vLLM's proposer offers what followed it, 4 1 2 3: all accepted,
    # and the target's own next token ends the 6 output tokens.
    assert R.ngram_acceptance([1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 9], 6, 6, k=4) == (4, 4)
    # prompt 5 6 7 1 2 | output 5 6 9 9 9: at "... 5" no 2-gram recurs (nothing proposed); at
    # "... 5 6" it proposes 7 1 2 5 against the target's 9: 4 proposed, 0 accepted
    assert R.ngram_acceptance([5, 6, 7, 1, 2, 5, 6, 9, 9, 9], 5, 5, k=4) == (0, 4)
    # nothing recurs: nothing proposed, nothing accepted
    assert R.ngram_acceptance(list(range(10, 30)), 10, 10, k=4) == (0, 0)


def test_the_prompt_set_covers_every_content_type_and_length():
    cells = {(ct, ln) for ct, ln, _ in R.real_prompts()}
    assert cells == {(ct, ln) for ct in R.CONTENT_TYPES for ln in R.PROMPT_LENGTHS}
    assert len(R.real_prompts()) == 16


# ------------------------------------------------------------------ the built set


def test_every_file_is_checksummed_and_verifies(built: Path):
    manifest = json.loads((built / "manifest.json").read_text())
    assert manifest["set"] == "real" and manifest["format_version"] == R.REAL_FORMAT_VERSION
    assert manifest["source"]["package"] == R.PACKAGE and manifest["source"]["version"] == R.PACKAGE_VERSION
    assert len(manifest["source"]["sha256"]) == 64
    assert set(manifest["models"]) == set(R.REAL_MODEL_NAMES)
    for name in R.REAL_MODEL_NAMES:
        assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                "tokenizer_config.json", "special_tokens_map.json"} == set(manifest["models"][name]["files"])
    assert R.verify_real_models(built) == []


def test_the_target_is_smollm2_135m_in_float32(built: Path):
    from safetensors import safe_open

    cfg = json.loads((built / "target" / "config.json").read_text())
    assert "quantization_config" not in cfg
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (30, 576, 49152)
    with safe_open(str(built / "target" / "model.safetensors"), "pt") as f:
        n = 0
        for k in f.keys():
            t = f.get_slice(k)
            assert t.get_dtype() == "F32", k
            shape = t.get_shape()
            size = 1
            for s in shape:
                size *= s
            n += size
    assert round(n / 1e6, 1) == 134.5


def test_the_chat_template_renders_chatml(built: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(built / "target")
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert (tok.eos_token, tok.eos_token_id, len(tok)) == ("<|im_end|>", 2, 49152)
    assert tok("hello world").input_ids[0] != tok.bos_token_id     # no BOS added, as SmolLM2's own tokenizer


@pytest.mark.parametrize("name", list(R.LAYER_SKIP_DEPTHS))
def test_a_layer_skip_draft_has_its_layers_and_the_targets_tokenizer(built: Path, name: str):
    from safetensors import safe_open

    depth = R.LAYER_SKIP_DEPTHS[name]
    cfg = json.loads((built / name / "config.json").read_text())
    tcfg = json.loads((built / "target" / "config.json").read_text())
    assert cfg["num_hidden_layers"] == depth
    assert {k: v for k, v in cfg.items() if k != "num_hidden_layers"} == \
        {k: v for k, v in tcfg.items() if k != "num_hidden_layers"}
    with safe_open(str(built / name / "model.safetensors"), "pt") as d, \
            safe_open(str(built / "target" / "model.safetensors"), "pt") as t:
        layers = {int(k.split(".")[2]) for k in d.keys() if k.startswith("model.layers.")}
        assert layers == set(range(depth))
        for k in ("model.embed_tokens.weight", "model.norm.weight", f"model.layers.{depth - 1}.mlp.down_proj.weight"):
            assert d.get_tensor(k).equal(t.get_tensor(k)), k        # the target's own weights, norm and head
        assert "lm_head.weight" not in set(d.keys())                  # tied to the embeddings, as the target's
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        assert (built / name / f).read_bytes() == (built / "target" / f).read_bytes(), f
    acc = json.loads((built / "manifest.json").read_text())["models"][name]["acceptance"]
    assert set(acc["by_content"]) == set(R.CONTENT_TYPES)
    assert all(set(v) == set(R.PROMPT_LENGTHS) for v in acc["by_content"].values())
    assert 0.0 <= acc["rate"] <= 1.0 and acc["proposed"] > 0


def test_ngram_acceptance_is_recorded_per_content_type(built: Path):
    ng = json.loads((built / "manifest.json").read_text())["methods"]["ngram"]
    assert set(ng["by_content"]) == set(R.CONTENT_TYPES) and 0.0 <= ng["rate"] <= 1.0


@pytest.mark.nightly   # dequantizes, simulates and writes ~1.2 GB: about 4 minutes on 2 cores
@pytest.mark.usefixtures("needs_package")
def test_a_build_from_the_installed_package_is_deterministic(built: Path, tmp_path: Path):
    manifest = R.build_real_models(tmp_path / "real")
    assert R.verify_real_models(tmp_path / "real") == []
    assert manifest == json.loads((built / "manifest.json").read_text())


@pytest.mark.usefixtures("needs_package")
def test_the_saved_tokenizer_encodes_as_the_packages_gguf_tokenizer(built: Path):
    from transformers import AutoTokenizer

    path = R.gguf_path()
    gguf_tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    tok = AutoTokenizer.from_pretrained(built / "target")
    for _, _, messages in R.real_prompts()[::3]:
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert text == gguf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert tok(text).input_ids == gguf_tok(text).input_ids

"""Tiny, deterministic models for the stack under test, built offline in seconds.

``build_models(DIR)`` writes three Llama-architecture causal LMs that share one tokenizer::

    DIR/target/        2 layers, hidden 256, 4 heads (2 KV heads), intermediate 512,
                       max_position_embeddings 2048, bf16 safetensors, random weights
    DIR/draft-exact/   byte-identical weights to the target  -> acceptance rate ~1
    DIR/draft-noisy/   target + Gaussian noise of 0.5 x std(tensor) per tensor
                       -> acceptance rate ~0
    DIR/manifest.json  written LAST: format version + sha256 of every file

Each model directory holds ``config.json``, ``generation_config.json``,
``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json`` and
``special_tokens_map.json``; vLLM and transformers load it as a HF model with a fast
tokenizer. The tokenizer is a byte-level BPE trained with the ``tokenizers`` library on a
synthetic English-like corpus drawn from a seeded RNG over a built-in word list; its
specials are ``<unk>`` (0), ``<s>`` (1, bos, prepended to every encoding) and ``</s>``
(2, eos), the ids ``config.json`` names.

Everything comes from fixed seeds, so building twice gives byte-identical files (on the
same transformers / tokenizers / safetensors versions). Weight values do not depend on
transformers' init order: each tensor is drawn from its own generator seeded from its
name.

A build writes each model into a temporary directory beside its final place and renames
it in, and removes the manifest first and writes it last, so an interrupted build never
looks complete: :func:`verify_models` then reports it and the next :func:`build_models`
rebuilds it. Concurrent builds of one directory are serialised with a lock file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from harness.errors import ModelError

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MODEL_NAMES = ("target", "draft-exact", "draft-noisy")

SEED = 20240611
CORPUS_SENTENCES = 6000
VOCAB_SIZE = 3072
NOISE_FRACTION = 0.5      # noise std as a fraction of each tensor's std (draft-noisy)
INIT_STD = 0.02           # std of every matrix in the target (norm weights are 1)

ARCH: dict[str, Any] = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}

UNK, BOS, EOS = "<unk>", "<s>", "</s>"
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)

# A built-in word list: enough distinct English words for a vocabulary of a few thousand.
_WORDS = """
the of and to in is was that for on with as by at from it be are this which or an have
not but they his her she he we you their there been were one all would can more if has
will when who what about so up out into than them some time could only other then its
also two first new after way may these over any most such where much through back years
should people well just because before good each those how long did many three between
make under world still being even own while last might great year here day same another
know around again place work small point home life every state large part number world
high often house water while world found still city night during light thought country
head school never under always something story young family given against people small
system public within power early general hand group left second order fact body course
problem word later since enough name feel line side river market paper music field money
change side morning table window garden letter doctor friend mother father child woman
man girl boy teacher student animal forest mountain ocean island bridge street village
road train plane ship horse bird fish tree flower stone fire wind rain snow summer winter
spring autumn color green blue red yellow black white bright dark quiet loud quick slow
warm cold happy sad strong weak simple clear open close begin end start stop run walk
talk speak listen watch look see hear read write learn teach think believe remember
forget give take bring carry hold keep leave find lose build break make fix cut draw
paint sing dance play swim climb jump sleep wake eat drink cook wash clean buy sell pay
send receive answer ask call help move turn push pull rise fall grow plant travel visit
wait stay arrive return follow lead meet join share show hide win fail try choose decide
agree explain describe discover imagine expect hope wish need want like love hate enjoy
prefer allow offer promise suggest happen appear seem become remain matter reason result
question answer idea example history science nature energy light sound voice language
number letter picture image model engine server request token speed signal memory
machine network cluster process thread signal kernel buffer packet socket message
stream output input value error test check state report metric latency window
before after above below inside outside near far early late often seldom always never
very quite rather almost nearly perhaps maybe surely certainly probably together alone
already soon today tomorrow yesterday tonight everywhere somewhere nowhere anyway though
although unless until whether because since while whereas however therefore moreover
captain sailor farmer baker writer painter singer dancer driver pilot nurse judge king
queen prince princess soldier guard hunter miner weaver potter smith merchant stranger
castle tower palace cottage cabin harbor valley meadow desert canyon glacier volcano
lantern candle mirror blanket basket bottle kettle ladder hammer needle thread pocket
silver golden wooden iron copper velvet silken gentle fierce clever honest proud humble
ancient modern hidden broken frozen shining silent distant narrow wide deep shallow
"""
WORDS: tuple[str, ...] = tuple(dict.fromkeys(_WORDS.split()))


# ---------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------


def build_models(models_dir: Path, force: bool = False) -> dict:
    """Build the tiny models into ``models_dir`` (skipped when they already verify).

    Args:
        models_dir: directory to hold ``target``, ``draft-exact``, ``draft-noisy`` and
            ``manifest.json`` (created if missing).
        force: rebuild even when the manifest verifies.

    Returns:
        The manifest (also written to ``models_dir/manifest.json``)::

            {"format_version": 1, "seed": int, "vocab_size": int,
             "bos_token_id": 1, "eos_token_id": 2, "unk_token_id": 0,
             "models": {"target": {"description": str,
                                    "files": {"config.json": "<sha256 hex>", ...}}, ...}}

    A partial or corrupt directory (manifest missing, file missing, hash mismatch) is
    rebuilt from scratch. Takes a few seconds on CPU.

    Raises:
        ModelError: the directory cannot be written.
    """
    models_dir = Path(models_dir)
    try:
        models_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelError(f"cannot create the models directory: {exc}", where=str(models_dir)) from None
    with _locked(models_dir):
        if not force:
            problems = verify_models(models_dir)
            if not problems:
                log.info("models in %s verify; nothing to build", models_dir)
                return _read_manifest(models_dir)
            log.info("rebuilding models in %s: %s", models_dir, "; ".join(problems[:5]))
        t0 = time.perf_counter()
        try:
            manifest = _build(models_dir)
        except OSError as exc:
            raise ModelError(f"cannot write models: {exc}", where=str(models_dir),
                             hint="check free disk space and permissions") from None
        log.info("built models in %s in %.1f s", models_dir, time.perf_counter() - t0)
        return manifest


def verify_models(models_dir: Path) -> list[str]:
    """Problems with the models in ``models_dir``; an empty list means all good.

    Each problem is one line, e.g. ``"manifest.json missing"``,
    ``"target/model.safetensors: missing"``, ``"draft-noisy/config.json: sha256 mismatch"``.
    Files beyond those the manifest lists are ignored.
    """
    models_dir = Path(models_dir)
    if not models_dir.is_dir():
        return [f"{models_dir}: directory missing"]
    try:
        manifest = _read_manifest(models_dir)
    except FileNotFoundError:
        return [f"{MANIFEST} missing"]
    except (OSError, ValueError) as exc:
        return [f"{MANIFEST} unreadable: {exc}"]
    if manifest.get("format_version") != FORMAT_VERSION:
        return [f"{MANIFEST}: format_version {manifest.get('format_version')!r}, expected {FORMAT_VERSION}"]
    problems: list[str] = []
    models = manifest.get("models") or {}
    for name in MODEL_NAMES:
        if name not in models:
            problems.append(f"{MANIFEST}: model {name!r} not listed")
            continue
        files = models[name].get("files") or {}
        if not files:
            problems.append(f"{MANIFEST}: model {name!r} lists no files")
        for rel, digest in sorted(files.items()):
            path = models_dir / name / rel
            if not path.is_file():
                problems.append(f"{name}/{rel}: missing")
            elif _sha256(path) != digest:
                problems.append(f"{name}/{rel}: sha256 mismatch")
    return problems


def resolve_model(models_dir: Path, name: str) -> Path:
    """The directory of model ``name``.

    ``name`` is either a directory (absolute, or relative to the current directory) or the
    name of a subdirectory of ``models_dir`` (e.g. ``"target"``). The first that exists
    and holds a ``config.json`` wins.

    Returns:
        The resolved absolute path.

    Raises:
        ModelError: neither exists, or the directory has no ``config.json``; ``where`` is
            the path looked at, the hint says how to build the models.
    """
    models_dir = Path(models_dir)
    hint = f"run `specchaos models build --dir {models_dir}`"
    candidates = []
    direct = Path(name).expanduser()
    if direct.is_absolute() or os.sep in name or name.startswith("."):
        candidates.append(direct)
    candidates.append(models_dir / name)
    if direct not in candidates:
        candidates.append(direct)
    for cand in candidates:
        if (cand / "config.json").is_file():
            return cand.resolve()
    for cand in candidates:
        if cand.is_dir():
            raise ModelError("model directory has no config.json (partial or not a model)",
                             where=str(cand), hint=hint)
    raise ModelError(f"model {name!r} not found", where=str(candidates[0]), hint=hint)


# ---------------------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(models_dir: Path) -> Iterator[None]:
    with open(models_dir / ".build.lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _read_manifest(models_dir: Path) -> dict:
    data = json.loads((models_dir / MANIFEST).read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data


def synthetic_corpus(n_sentences: int = CORPUS_SENTENCES, seed: int = SEED) -> list[str]:
    """English-like sentences drawn from a seeded RNG over :data:`WORDS` (deterministic)."""
    rng = random.Random(seed)
    # Zipf-like word frequencies so that merges look like natural text.
    weights = [1.0 / (i + 1) ** 0.8 for i in range(len(WORDS))]
    out = []
    for _ in range(n_sentences):
        n = rng.randint(4, 16)
        words = rng.choices(WORDS, weights=weights, k=n)
        if rng.random() < 0.15:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 2025)))
        if n > 6 and rng.random() < 0.3:
            words[rng.randrange(1, n - 2)] += ","
        words[0] = words[0].capitalize()
        out.append(" ".join(words) + rng.choice([".", ".", ".", "?", "!"]))
    return out


def _train_tokenizer(corpus: list[str]):
    # deferred: tokenizers/torch/transformers are heavy and only needed to build models
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[UNK, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer, length=len(corpus))
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    assert (tok.token_to_id(UNK), bos_id, tok.token_to_id(EOS)) == (0, 1, 2)
    return tok


def _save_tokenizer(tok, out: Path) -> None:
    """Write tokenizer.json + tokenizer_config.json + special_tokens_map.json (HF fast)."""
    tok.save(str(out / "tokenizer.json"), pretty=False)
    added = {
        str(tok.token_to_id(t)): {
            "content": t, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True,
        }
        for t in (UNK, BOS, EOS)
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": UNK,
        "pad_token": None,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": ARCH["max_position_embeddings"],
        "added_tokens_decoder": added,
        "chat_template": CHAT_TEMPLATE,
    }
    _write_json(out / "tokenizer_config.json", config)
    _write_json(out / "special_tokens_map.json", {"bos_token": BOS, "eos_token": EOS, "unk_token": UNK})


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _model_files(vocab_size: int) -> tuple[dict, dict, dict]:
    """(config.json dict, generation_config.json dict, {name: (shape, kind)}) of the target."""
    # deferred: heavy (torch, transformers), only needed to build models
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab_size, bos_token_id=1, eos_token_id=2, pad_token_id=None, **ARCH)
    config = json.loads(cfg.to_json_string(use_diff=True))
    config["architectures"] = ["LlamaForCausalLM"]
    config["dtype"] = "bfloat16"
    config["torch_dtype"] = "bfloat16"        # the name transformers < 5 reads
    config.pop("transformers_version", None)   # keeps files identical across versions
    generation = {"bos_token_id": 1, "eos_token_id": 2}
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    shapes = {n: tuple(p.shape) for n, p in model.state_dict().items()}
    return config, generation, shapes


def _name_seed(name: str, salt: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{SEED}:{salt}:{name}".encode()).digest()[:8], "little") & (2**63 - 1)


def _target_weights(shapes: dict) -> dict:
    """Float32 target weights: N(0, INIT_STD) matrices, all-ones norm weights."""
    import torch  # deferred: heavy, only needed to build models

    out = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shape, dtype=torch.float32)
        else:
            g = torch.Generator().manual_seed(_name_seed(name, 0))
            out[name] = torch.randn(shape, generator=g, dtype=torch.float32) * INIT_STD
    return out


def _noisy(weights: dict) -> dict:
    """Each tensor + N(0, NOISE_FRACTION x its std); constant tensors (norms) stay as they are."""
    import torch  # deferred: heavy, only needed to build models

    out = {}
    for name in sorted(weights):
        w = weights[name]
        std = float(w.std()) if w.numel() > 1 else 0.0
        if std == 0.0:
            out[name] = w.clone()
            continue
        g = torch.Generator().manual_seed(_name_seed(name, 1))
        out[name] = w + torch.randn(w.shape, generator=g, dtype=torch.float32) * (NOISE_FRACTION * std)
    return out


def _save_weights(weights: dict, path: Path) -> None:
    # deferred: heavy (torch), only needed to build models
    import torch
    from safetensors.torch import save_file

    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in sorted(weights.items())},
              str(path), metadata={"format": "pt"})


def _build(models_dir: Path) -> dict:
    (models_dir / MANIFEST).unlink(missing_ok=True)   # never looks complete while building
    for stale in models_dir.glob(".*.building-*"):        # left by an interrupted build
        shutil.rmtree(stale, ignore_errors=True)
    for stale in models_dir.glob(".*.old-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tok = _train_tokenizer(synthetic_corpus())
    vocab_size = tok.get_vocab_size()
    config, generation, shapes = _model_files(vocab_size)
    target = _target_weights(shapes)
    variants = {
        "target": (target, "target model: random weights from fixed seeds"),
        "draft-exact": (target, "draft identical to the target (acceptance rate ~1)"),
        "draft-noisy": (_noisy(target), f"target + Gaussian noise {NOISE_FRACTION} x std per tensor (acceptance rate ~0)"),
    }
    manifest: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "seed": SEED,
        "vocab_size": vocab_size,
        "unk_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "architecture": dict(ARCH, architectures=["LlamaForCausalLM"], dtype="bfloat16"),
        "models": {},
    }
    for name, (weights, description) in variants.items():
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.building-", dir=models_dir))
        try:
            _write_json(tmp / "config.json", config)
            _write_json(tmp / "generation_config.json", generation)
            _save_weights(weights, tmp / "model.safetensors")
            _save_tokenizer(tok, tmp)
            files = {}
            for p in sorted(tmp.iterdir()):
                os.chmod(p, 0o644)
                files[p.name] = _sha256(p)
            os.chmod(tmp, 0o755)
            _swap_in(tmp, models_dir / name)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        manifest["models"][name] = {"description": description, "files": files}
    tmp_manifest = models_dir / f".{MANIFEST}.tmp"
    _write_json(tmp_manifest, manifest)
    os.replace(tmp_manifest, models_dir / MANIFEST)
    return manifest


def _swap_in(new: Path, final: Path) -> None:
    """Replace ``final`` by ``new`` with renames only (the old copy is removed after)."""
    old = None
    if final.exists() or final.is_symlink():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(new, final)
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)

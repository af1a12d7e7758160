"""Tiny, deterministic models for the stack under test, built offline in seconds.

``build_models(DIR)`` writes Llama-architecture causal LMs; all but the last share one
tokenizer::

    DIR/target/           2 layers, hidden 256, 4 heads (2 KV heads), intermediate 512,
                          max_position_embeddings 2048, bf16 safetensors, random weights
    DIR/draft-exact/      byte-identical weights to the target  -> acceptance rate ~1
    DIR/draft-noisy/      target + Gaussian noise of 0.5 x std(tensor) per tensor
                          -> acceptance rate ~0
    DIR/draft-acc80/      target + noise scaled to give acceptance rate ~0.8,
    DIR/draft-acc50/      ~0.5 and
    DIR/draft-acc20/      ~0.2 (calibrated drafts, see below)
    DIR/draft-wrongvocab/ same architecture, its OWN tokenizer and a smaller vocabulary
                          (vLLM refuses it as a draft of the target at startup)
    DIR/manifest.json     written LAST: format version, sha256 of every file, and per
                          draft its measured acceptance rate

Each model directory holds ``config.json``, ``generation_config.json``,
``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json`` and
``special_tokens_map.json``; vLLM and transformers load it as a HF model with a fast
tokenizer. The tokenizer is a byte-level BPE trained with the ``tokenizers`` library on a
synthetic English-like corpus drawn from a seeded RNG over a built-in word list; its
specials are ``<unk>`` (0), ``<s>`` (1, bos, prepended to every encoding) and ``</s>``
(2, eos), the ids ``config.json`` names.

**Calibrated drafts.** The noise of ``draft-accNN`` (the same seeded noise tensors as
``draft-noisy``, scaled by a noise fraction) is found by measurement at build time: a
simulation of greedy speculative decoding (:func:`greedy_acceptance`) with
:data:`CALIBRATION_K` speculative tokens over a fixed seeded prompt set
(:func:`calibration_prompts`), in float32 on the bf16-rounded weights (what the server
loads with ``--dtype float32``), bisected until the acceptance rate is within
:data:`CALIBRATION_TOLERANCE` of the aim. The acceptance rate is vLLM's
(``spec_decode_num_accepted_tokens / spec_decode_num_draft_tokens``); the manifest holds
the measured rate and the noise fraction of every draft.

Everything comes from fixed seeds, so building twice gives byte-identical files (on the
same transformers / tokenizers / safetensors / torch versions; the calibration runs on one
CPU thread so the thread count cannot move it). Weight values do not depend on
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
from typing import Any, Callable, Iterator

from harness.errors import ModelError

log = logging.getLogger(__name__)

FORMAT_VERSION = 2          # 2: calibrated drafts, draft-wrongvocab, acceptance per draft
MANIFEST = "manifest.json"
#: Calibrated drafts: name -> the acceptance rate aimed at (greedy decoding, k = CALIBRATION_K).
CALIBRATED_DRAFTS: dict[str, float] = {"draft-acc80": 0.8, "draft-acc50": 0.5, "draft-acc20": 0.2}
WRONG_VOCAB_DRAFT = "draft-wrongvocab"
MODEL_NAMES = ("target", "draft-exact", "draft-noisy", *CALIBRATED_DRAFTS, WRONG_VOCAB_DRAFT)
#: Drafts whose vocabulary is the target's (usable with ``method: draft_model``).
DRAFT_NAMES = ("draft-exact", "draft-noisy", *CALIBRATED_DRAFTS)
#: The real set's models (``models build --set real``, :mod:`harness.stack.real_models`,
#: which checks its drafts against these names): named here so that a missing one's hint
#: names the build that makes it.
REAL_MODEL_NAMES = ("target", "draft-l8", "draft-l15", "draft-l25")

SEED = 20240611
CORPUS_SENTENCES = 6000
VOCAB_SIZE = 3072
NOISE_FRACTION = 0.5      # noise std as a fraction of each tensor's std (draft-noisy)
INIT_STD = 0.02           # std of every matrix in the target (norm weights are 1)
WRONG_VOCAB_SIZE = 1024   # draft-wrongvocab's tokenizer (the target's is ~2,100)

CALIBRATION_K = 4                 # speculative tokens per step (vLLM's num_speculative_tokens)
CALIBRATION_PROMPTS = 16          # prompts in the calibration set
CALIBRATION_OUTPUT_TOKENS = 48    # greedy output tokens per prompt (max_tokens, ignore_eos)
CALIBRATION_TOLERANCE = 0.01      # stop bisecting when |rate - aim| <= this
CALIBRATION_STEPS = 14            # at most this many bisection steps per draft

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
        models_dir: directory to hold the models of :data:`MODEL_NAMES` and
            ``manifest.json`` (created if missing).
        force: rebuild even when the manifest verifies.

    Returns:
        The manifest (also written to ``models_dir/manifest.json``)::

            {"format_version": 2, "seed": int, "vocab_size": int,
             "bos_token_id": 1, "eos_token_id": 2, "unk_token_id": 0,
             "architecture": {...},
             "calibration": {"method", "num_speculative_tokens": 4, "prompts": 16,
                             "output_tokens": 48, "dtype": "float32", "tolerance": 0.01,
                             "torch_version": str},
             "models": {"target": {"description": str, "vocab_size": int,
                                    "files": {"config.json": "<sha256 hex>", ...}},
                        "draft-acc50": {..., "acceptance": {"rate": float (measured),
                                        "aim": 0.5, "noise_fraction": float}}, ...}}

        ``acceptance`` (every draft sharing the target's vocabulary): ``rate`` is the
        acceptance rate measured by :func:`greedy_acceptance` on the calibration set,
        ``noise_fraction`` the noise std as a fraction of each tensor's std, ``aim`` the
        rate aimed at (calibrated drafts only).

    A partial or corrupt directory (manifest missing, file missing, hash mismatch, a model
    of :data:`MODEL_NAMES` not listed) is rebuilt from scratch. Takes about 10-30 s on
    CPU (the calibration of the three drafts is most of it).

    Raises:
        ModelError: the directory cannot be written.
    """
    return build_verified(Path(models_dir), verify_models, _build, force=force, what="models",
                          hint="check free disk space and permissions")


def build_verified(models_dir: Path, verify: Callable[[Path], list[str]], build: Callable[[Path], dict[str, Any]],
                   *, force: bool, what: str, hint: str) -> dict[str, Any]:
    """Build a model set into ``models_dir`` under its lock unless ``verify`` finds nothing
    wrong (then its manifest is returned as it is); ``force`` builds anyway. ``what`` names
    the set in the log, ``hint`` the advice of a failed write. Shared by the tiny set
    (:func:`build_models`) and the real one (:func:`harness.stack.real_models.build_real_models`).

    Raises:
        ModelError: the directory cannot be created or written.
    """
    try:
        models_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelError(f"cannot create the models directory: {exc}", where=str(models_dir)) from None
    with _locked(models_dir):
        if not force:
            problems = verify(models_dir)
            if not problems:
                log.info("%s in %s verify; nothing to build", what, models_dir)
                return _read_manifest(models_dir)
            log.info("building %s in %s: %s", what, models_dir, "; ".join(problems[:5]))
        t0 = time.perf_counter()
        try:
            manifest = build(models_dir)
        except OSError as exc:
            raise ModelError(f"cannot write models: {exc}", where=str(models_dir), hint=hint) from None
        log.info("built %s in %s in %.1f s", what, models_dir, time.perf_counter() - t0)
        return manifest


def verify_models(models_dir: Path, names: tuple[str, ...] = MODEL_NAMES,
                  format_version: int = FORMAT_VERSION) -> list[str]:
    """Problems with the models in ``models_dir``; an empty list means all good.

    ``names`` and ``format_version``: the model set expected (default: the tiny set; the
    real set passes its own, :mod:`harness.stack.real_models`).

    Each problem is one line, e.g. ``"manifest.json missing"``,
    ``"manifest.json: model 'draft-acc50' not listed"`` (built by an older version),
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
    if manifest.get("format_version") != format_version:
        return [f"{MANIFEST}: format_version {manifest.get('format_version')!r}, expected {format_version}"]
    problems: list[str] = []
    models = manifest.get("models") or {}
    for name in names:
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
    real = f"specchaos models build --set real --dir {models_dir}"
    if name in REAL_MODEL_NAMES and (name not in MODEL_NAMES or "real" in Path(models_dir).name):
        hint = f"run `{real}` (the real model set: {', '.join(REAL_MODEL_NAMES)}; make models-real)"
    elif name in MODEL_NAMES:
        hint += f", which builds {name}"
    elif os.sep not in name:
        hint += f"; it builds {', '.join(MODEL_NAMES)} (and `{real}`: {', '.join(REAL_MODEL_NAMES)})"
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


def read_acceptance(models_dir: Path, name: str) -> float | None:
    """The acceptance rate the manifest of ``models_dir`` records for draft ``name``
    (greedy, k = :data:`CALIBRATION_K`, measured at build time), or None when the
    manifest is missing or unreadable or has no figure for that model."""
    try:
        entry = (_read_manifest(Path(models_dir)).get("models") or {}).get(name) or {}
    except (OSError, ValueError):
        return None
    rate = (entry.get("acceptance") or {}).get("rate")
    return float(rate) if isinstance(rate, (int, float)) else None


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


def _train_tokenizer(corpus: list[str], vocab_size: int = VOCAB_SIZE):
    # deferred: tokenizers/torch/transformers are heavy and only needed to build models
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
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


def _target_weights(shapes: dict, salt: int = 0) -> dict:
    """Float32 target weights: N(0, INIT_STD) matrices, all-ones norm weights (``salt``
    other than 0: another model's weights, e.g. draft-wrongvocab's)."""
    import torch  # deferred: heavy, only needed to build models

    out = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shape, dtype=torch.float32)
        else:
            g = torch.Generator().manual_seed(_name_seed(name, salt))
            out[name] = torch.randn(shape, generator=g, dtype=torch.float32) * INIT_STD
    return out


def _noisy(weights: dict, fraction: float = NOISE_FRACTION) -> dict:
    """Each tensor + N(0, ``fraction`` x its std); constant tensors (norms) stay as they are.

    The noise tensors come from the same seeds whatever ``fraction`` is, so the drafts
    differ from the target along one fixed direction per tensor, scaled."""
    import torch  # deferred: heavy, only needed to build models

    out = {}
    for name in sorted(weights):
        w = weights[name]
        std = float(w.std()) if w.numel() > 1 else 0.0
        if std == 0.0 or fraction == 0.0:
            out[name] = w.clone()
            continue
        g = torch.Generator().manual_seed(_name_seed(name, 1))
        out[name] = w + torch.randn(w.shape, generator=g, dtype=torch.float32) * (fraction * std)
    return out


# ---------------------------------------------------------------------------------------
# Calibration: acceptance rate of a draft by simulated greedy speculative decoding
# ---------------------------------------------------------------------------------------


def calibration_prompts(n: int = CALIBRATION_PROMPTS, seed: int = SEED + 1) -> list[str]:
    """The fixed prompt set the drafts are calibrated on: ``n`` texts of 3, 8 or 25
    sentences of :func:`synthetic_corpus` (about 40, 100 and 300 tokens), deterministic."""
    rng = random.Random(seed)
    corpus = synthetic_corpus(2000, seed=seed)
    return [" ".join(rng.sample(corpus, rng.choice((3, 8, 25)))) for _ in range(n)]


def _llama(config: dict, weights: dict):
    """A float32 LlamaForCausalLM with ``weights`` rounded through bfloat16 (what the
    server loads from the bf16 safetensors with ``--dtype float32``), in eval mode."""
    # deferred: heavy (torch, transformers), only needed to build and calibrate models
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**{k: v for k, v in config.items()
                         if k not in ("architectures", "dtype", "torch_dtype", "model_type")})
    model = LlamaForCausalLM(cfg)
    model.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in weights.items()})
    return model.eval()


class _Calibration:
    """The target's greedy continuations of the calibration prompts, computed once, and
    the acceptance rate of any draft against them (:meth:`rate`)."""

    def __init__(self, target, prompt_ids: list[list[int]], output_tokens: int, k: int):
        import torch  # deferred: heavy, only needed to build models

        self.prompt_lens = [len(ids) for ids in prompt_ids]
        self.output_tokens, self.k = output_tokens, k
        seqs = []
        with torch.inference_mode():
            for ids in prompt_ids:
                # output_tokens + k: the drafts of the last step are checked against the
                # target's continuation too (vLLM verifies all k, then cuts at max_tokens)
                out = target(torch.tensor([ids]), use_cache=True)
                seq = list(ids) + [int(out.logits[0, -1].argmax())]
                for _ in range(output_tokens + k - 1):
                    out = target(torch.tensor([[seq[-1]]]), past_key_values=out.past_key_values, use_cache=True)
                    seq.append(int(out.logits[0, -1].argmax()))
                seqs.append(seq)
        self.seqs = seqs
        width = max(len(s) for s in seqs)
        # right padding: with causal attention a padded tail changes no earlier position
        self.batch = torch.tensor([s + [0] * (width - len(s)) for s in seqs])

    def rate(self, draft) -> float:
        """Accepted ÷ proposed draft tokens of ``draft`` (teacher-forced, see
        :func:`greedy_acceptance`)."""
        import torch  # deferred: heavy, only needed to build models

        with torch.inference_mode():
            pred = draft(self.batch).logits.argmax(-1).tolist()
        accepted = proposed = 0
        for row, seq, plen in zip(pred, self.seqs, self.prompt_lens):
            # hit[i]: the draft's greedy token after seq[:plen + i] is the target's seq[plen + i]
            hit = [row[plen + i - 1] == seq[plen + i] for i in range(len(seq) - plen)]
            a, p = greedy_acceptance(hit, self.output_tokens, self.k)
            accepted += a
            proposed += p
        return accepted / proposed if proposed else 0.0


def greedy_acceptance(hit: list[bool], output_tokens: int, k: int) -> tuple[int, int]:
    """(accepted, proposed) draft tokens of one greedy request under speculative decoding.

    ``hit[i]`` says whether the draft, given the prompt and the target's first ``i``
    output tokens, proposes the target's output token ``i`` (under greedy decoding the
    accepted tokens are always the target's own, so one teacher-forced pass of the draft
    over the target's output decides every step). As in vLLM: the prefill yields output
    token 0; each later step proposes ``k`` tokens, accepts the longest prefix that
    matches (vLLM's ``num_accepted_tokens``; ``k`` are counted as ``num_draft_tokens``),
    and adds the target's own next token; steps run until ``output_tokens`` exist.
    ``hit`` must cover ``output_tokens + k`` positions (shorter is read as misses).
    """
    accepted = proposed = 0
    pos = 1
    while pos < output_tokens:
        a = 0
        while a < k and pos + a < len(hit) and hit[pos + a]:
            a += 1
        accepted += a
        proposed += k
        pos += a + 1
    return accepted, proposed


def _bisect_noise(rate_at, aim: float) -> tuple[float, float]:
    """(noise fraction, measured rate) whose rate is closest to ``aim``: bisection on
    [0, NOISE_FRACTION] (the rate falls as the noise grows), stopping within
    CALIBRATION_TOLERANCE or after CALIBRATION_STEPS steps."""
    lo, hi = 0.0, NOISE_FRACTION
    best: tuple[float, float] | None = None
    for _ in range(CALIBRATION_STEPS):
        mid = (lo + hi) / 2
        rate = rate_at(mid)
        if best is None or abs(rate - aim) < abs(best[1] - aim):
            best = (mid, rate)
        if abs(rate - aim) <= CALIBRATION_TOLERANCE:
            break
        if rate > aim:
            lo = mid
        else:
            hi = mid
    assert best is not None
    return best


#: Calibration results by (target weights, settings) digest: a rebuild in the same process
#: (tests rebuild damaged directories) reuses them; the function is deterministic anyway.
_CALIBRATION_MEMO: dict[str, dict[str, Any]] = {}


def _calibrate(config: dict, target_weights: dict, tok) -> dict[str, Any]:
    """Noise fraction and measured acceptance rate of every draft sharing the target's
    vocabulary: ``{"calibration": {...settings}, "drafts": {name: {"rate", "noise_fraction"[, "aim"]}}}``."""
    import torch  # deferred: heavy, only needed to build models

    settings = {
        "method": "simulated greedy speculative decoding (teacher-forced draft, transformers, CPU)",
        "num_speculative_tokens": CALIBRATION_K, "prompts": CALIBRATION_PROMPTS,
        "output_tokens": CALIBRATION_OUTPUT_TOKENS, "dtype": "float32", "tolerance": CALIBRATION_TOLERANCE,
        "torch_version": torch.__version__.split("+")[0],
    }
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for name in sorted(target_weights):
        h.update(name.encode())
        h.update(target_weights[name].numpy().tobytes())
    key = h.hexdigest()
    if key in _CALIBRATION_MEMO:
        return json.loads(json.dumps(_CALIBRATION_MEMO[key]))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # the result must not depend on the host's core count
    try:
        t0 = time.perf_counter()
        prompt_ids = [tok.encode(p).ids for p in calibration_prompts()]
        cal = _Calibration(_llama(config, target_weights), prompt_ids, CALIBRATION_OUTPUT_TOKENS, CALIBRATION_K)
        seen: dict[float, float] = {}

        def rate_at(fraction: float) -> float:
            if fraction not in seen:
                seen[fraction] = cal.rate(_llama(config, _noisy(target_weights, fraction)))
            return seen[fraction]

        drafts: dict[str, dict[str, Any]] = {
            "draft-exact": {"rate": rate_at(0.0), "noise_fraction": 0.0},
            "draft-noisy": {"rate": rate_at(NOISE_FRACTION), "noise_fraction": NOISE_FRACTION},
        }
        for name, aim in CALIBRATED_DRAFTS.items():
            fraction, rate = _bisect_noise(rate_at, aim)
            drafts[name] = {"rate": rate, "noise_fraction": fraction, "aim": aim}
        log.info("calibrated drafts in %.1f s (%d simulations): %s", time.perf_counter() - t0, len(seen),
                 ", ".join(f"{n} {d['rate']:.3f} (noise {d['noise_fraction']:.5f})" for n, d in drafts.items()))
    finally:
        torch.set_num_threads(threads)
    for d in drafts.values():
        d["rate"] = round(d["rate"], 4)
    result = {"calibration": settings, "drafts": drafts}
    _CALIBRATION_MEMO[key] = json.loads(json.dumps(result))
    return result


def measure_acceptance(models_dir: Path, draft: str, target: str = "target") -> float:
    """The acceptance rate of model ``draft`` as a draft of ``target`` (both directories
    in ``models_dir``), measured from their files as the build measures it: greedy
    speculative decoding with k = :data:`CALIBRATION_K` on :func:`calibration_prompts`,
    float32. Seconds on CPU; needs torch, transformers, tokenizers and safetensors.

    Raises:
        ModelError: a model is missing, or the two vocabularies differ in size.
    """
    import torch  # deferred: heavy, only needed to measure models
    from safetensors.torch import load_file  # deferred: needs torch
    from tokenizers import Tokenizer  # deferred: only needed to build and measure models

    tdir, ddir = resolve_model(models_dir, target), resolve_model(models_dir, draft)
    tconf = json.loads((tdir / "config.json").read_text())
    dconf = json.loads((ddir / "config.json").read_text())
    if tconf.get("vocab_size") != dconf.get("vocab_size"):
        raise ModelError(f"draft vocab_size {dconf.get('vocab_size')} differs from the target's "
                         f"{tconf.get('vocab_size')}", where=str(ddir))
    tok = Tokenizer.from_file(str(tdir / "tokenizer.json"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tw = {k: v.float() for k, v in load_file(str(tdir / "model.safetensors")).items()}
        dw = {k: v.float() for k, v in load_file(str(ddir / "model.safetensors")).items()}
        cal = _Calibration(_llama(tconf, tw), [tok.encode(p).ids for p in calibration_prompts()],
                           CALIBRATION_OUTPUT_TOKENS, CALIBRATION_K)
        return round(cal.rate(_llama(dconf, dw)), 4)
    finally:
        torch.set_num_threads(threads)


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
    calibrated = _calibrate(config, target, tok)
    acceptance = calibrated["drafts"]
    # draft-wrongvocab: its own tokenizer (another corpus, a smaller vocabulary) and weights
    wrong_tok = _train_tokenizer(synthetic_corpus(seed=SEED + 2), vocab_size=WRONG_VOCAB_SIZE)
    wrong_config, _, wrong_shapes = _model_files(wrong_tok.get_vocab_size())
    # name -> (weights, description, tokenizer, config.json)
    variants = {
        "target": (target, "target model: random weights from fixed seeds", tok, config),
        "draft-exact": (target, "draft identical to the target (acceptance rate ~1)", tok, config),
        "draft-noisy": (_noisy(target), f"target + Gaussian noise {NOISE_FRACTION} x std per tensor "
                        f"(acceptance rate ~0)", tok, config),
    }
    for name, aim in CALIBRATED_DRAFTS.items():
        fraction = acceptance[name]["noise_fraction"]
        variants[name] = (_noisy(target, fraction), f"target + Gaussian noise {fraction:g} x std per tensor, "
                          f"calibrated to acceptance rate ~{aim}", tok, config)
    variants[WRONG_VOCAB_DRAFT] = (
        _target_weights(wrong_shapes, salt=2),
        f"draft with its own tokenizer and vocab_size {wrong_tok.get_vocab_size()} (the target's: {vocab_size}); "
        f"vLLM refuses it as the target's draft at startup", wrong_tok, wrong_config)
    manifest: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "seed": SEED,
        "vocab_size": vocab_size,
        "unk_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "architecture": dict(ARCH, architectures=["LlamaForCausalLM"], dtype="bfloat16"),
        "calibration": calibrated["calibration"],
        "models": {},
    }
    for name, (weights, description, model_tok, model_config) in variants.items():
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.building-", dir=models_dir))
        try:
            _write_json(tmp / "config.json", model_config)
            _write_json(tmp / "generation_config.json", generation)
            _save_weights(weights, tmp / "model.safetensors")
            _save_tokenizer(model_tok, tmp)
            files = {}
            for p in sorted(tmp.iterdir()):
                os.chmod(p, 0o644)
                files[p.name] = _sha256(p)
            os.chmod(tmp, 0o755)
            _swap_in(tmp, models_dir / name)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        manifest["models"][name] = {"description": description, "vocab_size": model_config["vocab_size"],
                                    "files": files}
        if name in acceptance:
            manifest["models"][name]["acceptance"] = acceptance[name]
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

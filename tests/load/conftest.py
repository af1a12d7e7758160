"""Shared fixtures for the load-side tests: a tiny tokenizer built here (no model needed), a
fake vLLM server per module and a run directory holding :data:`PROMPTS`."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.load import prompts as prompts_mod
from harness.load.prompts import Prompt, save_prompt_set
from tests.fakes import run_fake

#: The small prompt set the locust-process tests send (every bucket, 4-token prompts, 6 tokens out).
PROMPTS = [Prompt(i, ("short", "medium", "long")[i % 3], f"prompt number {i}", 4, 6) for i in range(5)]


@pytest.fixture(scope="module")
def server():
    """A fake vLLM server (:func:`tests.fakes.run_fake`) shared by one test module."""
    with run_fake() as srv:
        yield srv


@pytest.fixture()
def run_dir(tmp_path):
    """A run directory with ``prompts.json`` (:data:`PROMPTS`) and ``logs/``."""
    save_prompt_set(tmp_path / "prompts.json", PROMPTS)
    (tmp_path / "logs").mkdir()
    return tmp_path


def _build_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers, decoders
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = [" ".join(prompts_mod._WORDS[i:i + 12]) for i in range(0, len(prompts_mod._WORDS), 3)] * 4
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(str(path))


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory) -> Path:
    """A directory with a small byte-level BPE tokenizer that adds a BOS token."""
    d = tmp_path_factory.mktemp("tok")
    _build_tokenizer(d)
    return d

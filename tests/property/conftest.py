"""Fixtures of the property suite: the ``ci`` and ``nightly`` hypothesis profiles
(:mod:`tests.property.profiles`) and :class:`Api`, the two servers of the session's one
real stack (``real_stack`` in ``tests/conftest.py``) with the target's tokenizer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import httpx
import pytest

from harness.load.client import make_client
from tests.conftest import ROOT
from tests.property import profiles
from tests.property.wire import Completion, send

profiles.register()   # also done by tests/conftest.py, for runs that do not name this directory


@dataclass
class Api:
    """The stack as the properties see it.

    Fields:
        urls: server name (``"spec"``, ``"ref"``) → base URL; model: served name (both
            serve the target under one name); client: a loopback ``httpx.Client``;
        tokenizer: the target's (``models/target``, transformers); eos_id: its EOS id;
        max_model_len: the servers' context (tokens).
    """

    urls: dict[str, str]
    model: str
    client: httpx.Client
    tokenizer: Any
    eos_id: int
    max_model_len: int

    def ask(self, server: str, body: dict[str, Any], base_url: str | None = None) -> Completion:
        """Send ``body`` (``model`` added) to ``server`` (or to ``base_url``, e.g. a proxy
        in front of it); one request at a time, never batched with another."""
        return send(self.client, base_url or self.urls[server], {"model": self.model, **body})

    def decode(self, ids: Sequence[int]) -> str:
        """Token ids → text as vLLM detokenizes output (special tokens skipped)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def prompt_tokens(self, text: str) -> int:
        """The prompt's length in tokens as vLLM counts ``usage.prompt_tokens`` (BOS included)."""
        return len(self.tokenizer(text).input_ids)

    def fits(self, body: dict[str, Any]) -> bool:
        """The prompt and ``max_tokens`` fit the context (else vLLM answers 400)."""
        return self.prompt_tokens(body["prompt"]) + int(body["max_tokens"]) <= self.max_model_len


@pytest.fixture(scope="session")
def target_tokenizer():
    """The target's tokenizer (transformers), loaded once per session."""
    from transformers import AutoTokenizer   # deferred: heavy, only for the real-stack tests

    return AutoTokenizer.from_pretrained(str(ROOT / "models" / "target"))


@pytest.fixture(scope="module")
def api(real_stack, target_tokenizer):
    """:class:`Api` over the session's real stack, for one test module (as ``real_stack``)."""
    stack = real_stack.stack
    spec, ref = stack.servers["spec"], stack.servers["ref"]
    assert spec.model == ref.model, (spec.model, ref.model)
    tok = target_tokenizer
    with make_client(max_connections=4) as client:
        yield Api(urls={"spec": spec.base_url, "ref": ref.base_url}, model=spec.model, client=client,
                  tokenizer=tok, eos_id=int(tok.eos_token_id), max_model_len=stack.cfg.max_model_len)

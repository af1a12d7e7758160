"""The speculative settings, validated once: which methods need, and which refuse, a draft
model; ngram's prompt lookup window; the one function that writes vLLM's
``--speculative-config`` (what a launcher, and a restart with other settings, send)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil
import pytest
from pydantic import ValidationError

from harness.errors import first_error
from harness.stack.config import DEFAULT_DRAFT, StackConfig
from harness.stack.vllm import NGRAM_PROMPT_LOOKUP, speculative_config, speculative_problems


def loc_and_msg(**fields) -> tuple[str, str]:
    with pytest.raises(ValidationError) as ei:
        StackConfig(**fields)
    path, msg, _ = first_error(ei.value)
    return path, msg


# ------------------------------------------------------------------ the rules (pure)
@pytest.mark.parametrize("args, fields", [
    (("draft_model", "d"), []),
    (("ngram", None), []),
    (("ngram", None, 1, 1), []),
    (("mtp", None), []),
    (("eagle3", "/m/eagle3"), []),
    (("draft_model", None), ["draft"]),
    (("eagle", ""), ["draft"]),
    (("ngram", "draft-exact"), ["draft"]),
    (("mtp", "draft-exact"), ["draft"]),
    (("draft_model", "d", 2, None), ["prompt_lookup_min"]),
    (("eagle", "d", None, 3), ["prompt_lookup_max"]),
    (("ngram", None, 3, 2), ["prompt_lookup_max"]),
    (("ngram", None, 5, None), ["prompt_lookup_max"]),      # above the default max 4
    (("ngram", None, 0, 2), ["prompt_lookup_min"]),
    (("ngram", None, 2, True), ["prompt_lookup_max"]),
    (("ngram", "x", 4, 2), ["draft", "prompt_lookup_max"]),
    (("medusa", "d"), ["method"]),
])
def test_speculative_problems_name_their_fields(args, fields):
    assert [f for f, _ in speculative_problems(*args)] == fields


def test_speculative_config_shapes_and_window():
    assert speculative_config("ngram", None, 3) == {"method": "ngram", "num_speculative_tokens": 3,
                                                    "prompt_lookup_min": NGRAM_PROMPT_LOOKUP[0],
                                                    "prompt_lookup_max": NGRAM_PROMPT_LOOKUP[1]}
    assert speculative_config("ngram", None, 4, prompt_lookup_min=1, prompt_lookup_max=6) == {
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 6}
    assert speculative_config("mtp", None, 2) == {"method": "mtp", "num_speculative_tokens": 2}
    assert speculative_config("eagle3", Path("/m/e3"), 5) == {"method": "eagle3", "model": "/m/e3",
                                                             "num_speculative_tokens": 5}


@pytest.mark.parametrize("args, kw, needle", [
    (("ngram", "/m/draft-exact", 4), {}, "draft: method ngram uses no draft model"),
    (("draft_model", None, 4), {}, "draft: method draft_model needs a draft model"),
    (("draft_model", "/m/d", 4), {"prompt_lookup_max": 3}, "prompt_lookup_max: only method ngram"),
    (("ngram", None, 4), {"prompt_lookup_min": 4, "prompt_lookup_max": 3}, "prompt_lookup_max 3 is below"),
])
def test_speculative_config_refuses_what_vllm_would_ignore_or_refuse(args, kw, needle):
    """Whoever restarts a server with other settings gets the same rules as the config."""
    with pytest.raises(ValueError, match=needle):
        speculative_config(*args, **kw)


# ------------------------------------------------------------------ the stack block
def test_the_default_draft_follows_the_method():
    assert StackConfig().draft == DEFAULT_DRAFT == "draft-exact"
    assert StackConfig(method="eagle").draft == DEFAULT_DRAFT
    assert StackConfig(method="ngram").draft is None
    assert StackConfig(method="mtp").draft is None
    assert StackConfig(method="ngram", draft=None).draft is None
    cfg = StackConfig(method="ngram", prompt_lookup_min=1, prompt_lookup_max=3)
    assert (cfg.prompt_lookup_min, cfg.prompt_lookup_max) == (1, 3)
    assert StackConfig.model_validate(cfg.model_dump()) == cfg   # config.json round trip


@pytest.mark.parametrize("fields, where, needle", [
    ({"method": "ngram", "draft": "draft-exact"}, "draft",
     "method ngram uses no draft model (it drafts from the prompt (prompt lookup)), so draft 'draft-exact' would be "
     "ignored"),
    ({"method": "mtp", "draft": "draft-acc50"}, "draft", "method mtp uses no draft model"),
    ({"method": "draft_model", "draft": None}, "draft", "method draft_model needs a draft model"),
    ({"method": "eagle3", "draft": None}, "draft", "method eagle3 needs a draft model"),
    ({"prompt_lookup_min": 2}, "prompt_lookup_min", "only method ngram has a prompt lookup window; method is draft_model"),
    ({"method": "eagle", "prompt_lookup_max": 4}, "prompt_lookup_max", "only method ngram"),
    ({"method": "ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "prompt_lookup_max",
     "prompt_lookup_max 2 is below prompt_lookup_min 4"),
    ({"method": "ngram", "prompt_lookup_min": 6}, "prompt_lookup_max",
     "prompt_lookup_max 4 (the default) is below prompt_lookup_min 6"),
    ({"method": "ngram", "prompt_lookup_min": 0}, "prompt_lookup_min", "greater than or equal to 1"),
    ({"method": "ngram", "prompt_lookup_max": "four"}, "prompt_lookup_max", "valid integer"),
    ({"method": "ngram", "prompt_lookup": 3}, "prompt_lookup", "Extra inputs are not permitted"),
    ({"speculative_config": {"method": "ngram"}}, "speculative_config", "Extra inputs are not permitted"),
    ({"method": "medusa"}, "method", "Input should be"),
])
def test_bad_speculative_settings_are_refused_at_their_field(fields, where, needle):
    path, msg = loc_and_msg(**fields)
    assert path == where, (path, msg)
    assert needle in msg, msg


def test_a_saved_ngram_run_with_the_old_default_draft_is_still_rejudged():
    """Runs saved before the rule wrote ``draft: draft-exact`` for ngram (the old default);
    they ran without a draft, and re-judging them must not fail."""
    old = StackConfig.model_validate({"method": "ngram", "draft": "draft-exact"}, context={"recorded": True})
    assert old.draft is None
    with pytest.raises(ValidationError):
        StackConfig.model_validate({"method": "ngram", "draft": "draft-exact"})


# ------------------------------------------------------------------ what the server is given
def test_the_ngram_window_reaches_the_servers_command_line(tmp_path):
    """The configured window is what the (fake) vLLM process gets in --speculative-config."""
    from tests.fakes.stack import FakeStack

    (tmp_path / "models" / "target").mkdir(parents=True)
    (tmp_path / "models" / "target" / "config.json").write_text("{}")
    cfg = StackConfig(models_dir=str(tmp_path / "models"), method="ngram", prompt_lookup_min=1,
                      prompt_lookup_max=5, num_speculative_tokens=3, reference=False, startup_timeout_s=60)
    stack = FakeStack(cfg, tmp_path / "run")
    assert stack.speculative == {"method": "ngram", "draft": None, "num_speculative_tokens": 3,
                                 "prompt_lookup_min": 1, "prompt_lookup_max": 5}
    t0 = time.monotonic()
    stack.start()
    try:
        api = stack.servers["spec"].api_process()
        argv = psutil.Process(api.pid).cmdline()
        sent = json.loads(argv[argv.index("--speculative-config") + 1])
    finally:
        stack.stop()
    assert sent == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 5}
    assert time.monotonic() - t0 < 60


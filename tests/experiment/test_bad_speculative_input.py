"""Bad speculative settings in an experiment file: one line naming the field, exit 2,
nothing started (the real CLI in a subprocess). And every shipped experiment still
validates under the stricter rules (one for GPU hosts is refused in one line without a GPU)."""

from __future__ import annotations

import pytest

from tests.experiment.files import EXPERIMENTS, experiment_files, gpu_only, needs_real_models, write
from tests.experiment.test_bad_input import assert_one_line_error, cli, doc, no_new_processes  # noqa: F401

STACK = "configuration.specchaos.stack"


@pytest.mark.parametrize("stack, needles", [
    ({"method": "ngram", "draft": "draft-exact"},
     [f"{STACK}.draft", "method ngram uses no draft model", "remove stack.draft"]),
    ({"method": "draft_model", "prompt_lookup_min": 2},
     [f"{STACK}.prompt_lookup_min", "only method ngram has a prompt lookup window"]),
    ({"method": "ngram", "draft": None, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
     [f"{STACK}.prompt_lookup_max", "prompt_lookup_max 2 is below prompt_lookup_min 4"]),
    ({"method": "ngram", "draft": None, "prompt_lookup_min": 0},
     [f"{STACK}.prompt_lookup_min", "greater than or equal to 1"]),
    ({"method": "ngram", "draft": None, "prompt_lookup_window": 3},
     [f"{STACK}.prompt_lookup_window", "unknown field 'prompt_lookup_window'"]),
    ({"method": "eagle3", "draft": None}, [f"{STACK}.draft", "method eagle3 needs a draft model"]),
], ids=["ngram-with-draft", "lookup-without-ngram", "lookup-min-above-max", "lookup-zero", "unknown-key",
        "eagle3-without-draft"])
def test_bad_speculative_settings(tmp_path, no_new_processes, stack, needles):  # noqa: F811
    d = doc()
    d["configuration"]["specchaos"]["stack"].update(stack)
    assert_one_line_error(cli("validate", str(write(tmp_path, d))), *needles)


def test_a_calibrated_draft_that_is_not_built_names_it_and_the_build(tmp_path, no_new_processes):  # noqa: F811
    models = tmp_path / "old-models"
    (models / "target").mkdir(parents=True)
    (models / "target" / "config.json").write_text("{}")
    d = doc()
    d["configuration"]["specchaos"]["stack"].update(models_dir=str(models), draft="draft-acc20")
    res = cli("validate", str(write(tmp_path, d)))
    assert_one_line_error(res, f"{STACK}.draft", "draft model 'draft-acc20' not found",
                          f"run `specchaos models build --dir {models}`, which builds draft-acc20")


def test_ngram_without_a_draft_line_validates(tmp_path, models_built):
    d = doc()
    d["configuration"]["specchaos"]["stack"].pop("draft")
    d["configuration"]["specchaos"]["stack"].update(method="ngram", prompt_lookup_min=1, prompt_lookup_max=3)
    res = cli("validate", str(write(tmp_path, d)))
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("draft", ["draft-acc80", "draft-acc50", "draft-acc20", "draft-wrongvocab"])
def test_the_new_drafts_are_found_by_name(tmp_path, models_built, draft):
    d = doc()
    d["configuration"]["specchaos"]["stack"]["draft"] = draft
    res = cli("validate", str(write(tmp_path, d)))
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("path", [p.relative_to(EXPERIMENTS) for p in experiment_files()], ids=str)
def test_every_shipped_experiment_validates(path, models_built):
    """... or, for an experiment for GPU hosts on a host without a GPU, is refused in one line."""
    res = cli("validate", str(EXPERIMENTS / path))
    if needs_real_models(EXPERIMENTS / path):   # refused in one line that names the missing model and the build
        assert_one_line_error(res, "models-real", "specchaos models build --set real")
        return
    why = gpu_only(EXPERIMENTS / path)
    if why is not None:
        assert_one_line_error(res, "configuration.specchaos.gpu.require", why)
        return
    assert res.returncode == 0, res.stderr

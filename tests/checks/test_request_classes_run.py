"""Request classes judged over a run (``integrity.classes``): responses of each class
recorded by the real client from the fake vLLM, then judged by
:func:`harness.checks.integrity.check` — healthy, then with one ``--defect`` each
(:data:`tests.fakes.fake_vllm.DEFECTS`), each of which must fail its own invariant only."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from harness.checks import integrity
from harness.checks.base import RecordedRun
from harness.checks.config import IntegrityConfig
from harness.load.client import fetch_reference, make_client, stream_completion
from harness.checks.request_classes import classes_section
from harness.load.config import LoadConfig
from harness.load.records import RequestRecord
from harness.load.prompts import Prompt
from harness.report.schema import Integrity
from harness.checks.integrity import _class_line

from tests.factories import make_record
from tests.fakes import run_fake

LOAD = LoadConfig(request_classes=[
    {"name": "stop", "body": {"stop": [" w1"], "max_tokens": 64, "ignore_eos": True}},
    {"name": "json", "endpoint": "chat", "body": {"response_format": {"type": "json_object"}, "max_tokens": 32}},
    {"name": "lp", "body": {"logprobs": 1, "ignore_eos": True}},
    {"name": "chatlp", "endpoint": "chat", "body": {"logprobs": True, "ignore_eos": True}},
    {"name": "tools", "endpoint": "chat", "body": {"tools": [{"type": "function", "function": {
        "name": "lookup", "parameters": {"type": "object", "properties": {"w": {"type": "string"}},
                                         "required": ["w"]}}}]}},
    {"name": "idle", "endpoint": "chat", "body": {"stop": "x"}},   # no request is sent: not judged
])
PROMPTS = [Prompt(prompt_id=i, prompt_class="short", text=f"tell me {w}", prompt_tokens=3, max_tokens=10)
           for i, w in enumerate(("one", "two", "three"))]

#: Which class checks each defect must fail (none other), besides the run-wide checks named.
EXPECTED = {
    None: (set(), set()),
    "stop_overrun": ({"integrity.classes.stop.stop"}, set()),
    "drop_token": ({f"integrity.classes.{c}.usage" for c in ("stop", "json", "lp", "chatlp", "tools")},
                   {"integrity.malformed", "integrity.false_success"}),   # (the client's ok counts no tokens)
    "bad_json": ({"integrity.classes.json.structured", "integrity.classes.tools.tool_calls"}, set()),
    "zero_logprobs": ({"integrity.classes.lp.logprobs", "integrity.classes.chatlp.logprobs"}, set()),
}


def responses(*flags: str, server: str = "spec", classes=LOAD.request_classes[:-1]) -> list[RequestRecord]:
    """The records of one request per prompt and class from a fake started with ``flags``."""
    records = []
    with run_fake("--step-delay-s", "0.005", *flags) as fake, make_client() as client:
        for request_class in classes:
            for p in PROMPTS:
                records.append(stream_completion(client, fake.base_url, fake.served_model_name, p, timeout_s=10,
                                                 request_class=request_class, server=server))
    return records


def recorded_run(defect: str | None) -> RecordedRun:
    records = responses(*(["--defect", defect] if defect else []))
    limits = SimpleNamespace(integrity=IntegrityConfig(min_compared=0), load=LOAD)
    return RecordedRun(records=records, reference={}, events=[], limits=limits)  # type: ignore[arg-type]


@pytest.mark.parametrize("defect", list(EXPECTED))
def test_each_defect_fails_its_own_invariant_only(defect):
    run = recorded_run(defect)
    checks = integrity.check(run)
    section = integrity.section(run)["classes"]
    failed = {c.name for c in checks if c.failed} - {"integrity.compared"}   # no reference in this test
    classes, run_wide = EXPECTED[defect]
    assert failed == classes | run_wide, [c.detail for c in checks if c.failed]
    assert list(section) == ["stop", "json", "lp", "chatlp", "tools", "idle"]
    for name in ("stop", "json", "lp", "chatlp", "tools"):
        assert section[name]["responses"] == len(PROMPTS) and section[name]["compared"] == 0
    assert set(section["json"]["invariants"]) == {"usage", "structured"}
    assert set(section["lp"]["invariants"]) == {"usage", "logprobs"}
    assert set(section["tools"]["invariants"]) == {"usage", "tool_calls"}
    for c in checks:
        if c.failed and c.name.startswith("integrity.classes."):
            _, _, name, inv = c.name.split(".")
            entry = section[name]["invariants"][inv]
            assert entry["violations"] == c.observed > 0 and entry["first"]["request_id"] in c.detail
    idle = [c for c in checks if c.name.startswith("integrity.classes.idle.")]
    assert {c.name for c in idle} == {"integrity.classes.idle.stop", "integrity.classes.idle.usage",
                                      "integrity.classes.idle.stop_cut"}
    assert all(not c.judged for c in idle) and section["idle"] == {"responses": 0, "compared": 0, "invariants": {}}
    assert Integrity.model_validate(integrity.section(run)).classes["stop"].responses == len(PROMPTS)
    assert _class_line(section["stop"]).startswith(f"{len(PROMPTS)} responses; stop ")


def test_without_classes_the_integrity_section_and_checks_are_todays():
    run = recorded_run(None)
    run.limits = SimpleNamespace(integrity=IntegrityConfig(min_compared=0), load=LoadConfig())
    assert "classes" not in integrity.section(run)
    assert [c.name for c in integrity.check(run)] == ["integrity.mismatched", "integrity.malformed",
                                                      "integrity.false_success", "integrity.compared"]


def test_only_classes_the_plain_reference_predicts_are_compared_with_it():
    lc = LoadConfig(request_classes=[{"name": "plain"}, {"name": "seeded", "body": {"seed": 3, "max_tokens": 4}},
                                     {"name": "stop", "body": {"stop": "x"}}, {"name": "chat", "endpoint": "chat"}])
    assert lc.comparable_classes() == {"plain", "seeded"} and LoadConfig().comparable_classes() == {"plain"}
    ref = make_record(token_ids=[1, 2, 3, 4])
    records = [make_record(token_ids=[1, 2, 9, 9], request_class=name) for name in ("plain", "stop", "chat")]
    _, summary = integrity.integrity_checks(records, {0: ref}, 0, comparable=lc.comparable_classes())
    assert (summary["compared"], summary["mismatched"], summary["not_comparable"]) == (1, 1, 2)
    _, today = integrity.integrity_checks(records, {0: ref}, 0)
    assert (today["compared"], today["not_comparable"]) == (3, 0)


def test_mirror_records_are_the_reference_of_deterministic_requests():
    classes = [LOAD.request_classes[0], LOAD.request_classes[2]]   # stop, lp
    ref = responses(server="ref", classes=classes)
    healthy = classes_section(responses(classes=classes), classes, ref_records=ref)
    for name, inv in (("stop", "stop_cut"), ("lp", "logprobs_ref")):
        assert healthy[name]["compared"] == len(PROMPTS)
        assert healthy[name]["invariants"][inv] == {"judged": len(PROMPTS), "violations": 0, "first": None}
    changed = classes_section(responses("--mismatch", classes=classes), classes, ref_records=ref)
    assert changed["stop"]["invariants"]["stop_cut"]["violations"] > 0
    assert "the reference at char" in changed["stop"]["invariants"]["stop_cut"]["first"]["detail"]
    assert changed["lp"]["invariants"]["logprobs_ref"]["violations"] == 0   # judged up to the first new token
    zeros = classes_section(responses("--defect", "zero_logprobs", classes=classes), classes, ref_records=ref)
    assert zeros["lp"]["invariants"]["logprobs_ref"]["violations"] == len(PROMPTS)
    sampled = classes_section(responses(classes=classes), classes, ref_records=ref, greedy=())
    assert sampled["stop"]["compared"] == 0 and "stop_cut" not in sampled["stop"]["invariants"]


def test_the_decoder_is_the_target_tokenizer_and_a_missing_one_leaves_text_unjudged(tmp_path):
    """integrity.text_from_ids: the run's target tokenizer decodes token ids as vLLM streams
    them; where it cannot be read the text invariant is not judged (never a crash)."""
    from tokenizers import Tokenizer

    from harness.checks.integrity import _decoder
    from harness.experiment.config import SpecchaosConfig
    from harness.checks.base import RecordedRun
    from harness.load.prompts import load_decoder
    from tests.experiment.fast_e2e import MODELS

    if not (MODELS / "target" / "tokenizer.json").is_file():
        pytest.skip("models not built (make test builds them)")
    tok = Tokenizer.from_file(str(MODELS / "target" / "tokenizer.json"))
    ids = tok.encode("the quick brown fox jumps", add_special_tokens=False).ids
    assert load_decoder(MODELS / "target")(ids) == tok.decode(ids, skip_special_tokens=True)
    here = SpecchaosConfig.model_validate({"stack": {"models_dir": str(MODELS)}})
    assert _decoder(RecordedRun(records=[], reference={}, events=[], limits=here))(ids) == tok.decode(ids)
    gone = SpecchaosConfig.model_validate({"stack": {"models_dir": str(tmp_path / "nowhere")}})
    assert _decoder(RecordedRun(records=[], reference={}, events=[], limits=gone)) is None


def class_refs(*flags: str, classes) -> list[RequestRecord]:
    """The per-class reference fetch of a run (``class_reference.jsonl``) from a fake started with ``flags``."""
    with run_fake("--step-delay-s", "0.005", *flags) as fake:
        return [r for c in classes for r in fetch_reference(fake.base_url, fake.served_model_name, PROMPTS,
                                                            timeout_s=10, request_class=c, top_logprobs=0).values()]


def test_the_per_class_reference_fetch_judges_the_reference_invariants_without_mirror_mode():
    classes = [LOAD.request_classes[0], LOAD.request_classes[2], LOAD.request_classes[3]]   # stop, lp, chatlp
    limits = SimpleNamespace(integrity=IntegrityConfig(min_compared=0), load=LoadConfig(request_classes=classes))

    def judged(refs):
        run = RecordedRun(records=records, reference={}, events=[], limits=limits,  # type: ignore[arg-type]
                          class_reference=refs)
        return {c.name: c for c in integrity.check(run)}, integrity.section(run)["classes"]

    records = responses(classes=classes)
    refs = class_refs(classes=classes)
    assert {r.request_class for r in refs} == {"stop", "lp", "chatlp"} and all(r.source == "reference" for r in refs)
    checks, section = judged(refs)
    for name, inv in (("stop", "stop_cut"), ("lp", "logprobs_ref"), ("chatlp", "logprobs_ref")):
        assert checks[f"integrity.classes.{name}.{inv}"].passed is True
        assert section[name]["compared"] == len(PROMPTS)
    # the reference's logprobs from another model: every value differs
    checks, _ = judged(class_refs("--defect", "zero_logprobs", classes=classes))
    assert checks["integrity.classes.lp.logprobs_ref"].passed is False
    assert checks["integrity.classes.chatlp.logprobs_ref"].passed is False
    # no reference at all: the reference invariants are not judged, and say why
    checks, section = judged([])
    for name, inv in (("stop", "stop_cut"), ("lp", "logprobs_ref")):
        c = checks[f"integrity.classes.{name}.{inv}"]
        assert c.passed is None and "had a reference to compare with" in c.detail and section[name]["compared"] == 0

"""The request-class self-tests (``experiments/selftest/append-after-stop.yaml``,
``break-json.yaml``, ``zero-logprobs.yaml``, and on the real stack ``drop-token-text.yaml``:
the ``corrupt`` toxic's semantic modes,
:mod:`faults.sse_rewrite`) through the fast end-to-end path on the fake vLLM: each must
fail, exactly on its own invariant's checks, with the proxy's evidence showing its mode
acted. Each run takes the self-test's request classes and toxic from its file (the stop
strings swapped for one the fake's ``" w<id>"`` text meets, the JSON schema for one its
``{"w": ...}`` object satisfies) and ``FAST`` phases (:mod:`tests.experiment.fast_e2e`).

Like ``corrupt-stream.yaml`` (``test_network.py``), each also has a real-stack twin in the
nightly tier (CI form, 5 s of the toxic): the network family already acts on the real
stack in ``make test`` (the jitter experiment)."""

from __future__ import annotations

import pytest
import yaml

from harness.load.records import read_records
from tests.experiment.fast_e2e import run_fast
from tests.experiment.files import EXPERIMENTS, ci_form, experiment_doc, run_pooled, write
from tests.procs import leaked_since, sut_pids

SELFTESTS = EXPERIMENTS / "selftest"
#: self-test file → the checks that must fail, and nothing else
#: A class's reference invariants (the reference server's answer to the same request, fetched
#: per class by the run: stop_cut, logprobs_ref) catch the same defect, since the toxic acts on
#: the speculative server's streams only.
EXPECTED = {
    "append-after-stop.yaml": {"integrity.classes.stop.stop", "integrity.classes.stop.stop_cut"},
    "break-json.yaml": {"integrity.classes.json-schema.structured"},
    "zero-logprobs.yaml": {"integrity.classes.logprobs.logprobs", "integrity.classes.chat.logprobs",
                           "integrity.classes.logprobs.logprobs_ref", "integrity.classes.chat.logprobs_ref"},
}
#: On the real stack also the text invariant (integrity.text_from_ids: the fake's token text
#: is not the tokenizer's, so its runs do not judge it): drop_token_text is caught there only.
#: break-json on the real stack: the tiny random-weight target, held to its JSON schema by
#: vLLM's structured outputs, writes "{" and then whitespace until max_tokens (measured: every
#: one of 178 responses cut by length, none a complete object), and a cut object is not judged
#: for validity; the "#" inserted after the "{" is caught by the text invariant instead.
EXPECTED_REAL = {**EXPECTED, "drop-token-text.yaml": {"integrity.classes.plain.text", "integrity.classes.chat.text"},
                 "break-json.yaml": {"integrity.classes.json-schema.text"}}
#: The fake's text is " w<id>" per token: " w1" starts about one id in nine, so stop-string finishes come often.
FAKE_STOP = [" w1"]
#: The fake's structured output is ``{"w": "w<id> ..."}`` whatever the schema: one it satisfies.
FAKE_SCHEMA = {"type": "object", "properties": {"w": {"type": "string"}}, "required": ["w"],
               "additionalProperties": False}


def selftest(name: str) -> tuple[list[dict], dict]:
    """The file's ``load.request_classes`` (for the fake) and its toxic's action arguments."""
    doc = yaml.safe_load((SELFTESTS / name).read_text())
    classes = doc["configuration"]["specchaos"]["load"]["request_classes"]
    for c in classes:
        if "stop" in c.get("body", {}):
            c["body"] = {**c["body"], "stop": FAKE_STOP}
        if "json_schema" in c.get("body", {}).get("response_format", {}):
            c["body"]["response_format"]["json_schema"]["schema"] = FAKE_SCHEMA
    (action,) = [a for a in doc["method"] if a["provider"]["func"] == "network_toxic"]
    return classes, action["provider"]["arguments"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", list(EXPECTED))
def test_the_request_class_self_test_fails_on_its_own_invariant_on_the_fake(tmp_path, name):
    classes, arguments = selftest(name)
    method = [{"type": "action", "name": "toxic", "provider": {
        "type": "python", "module": "harness.experiment.actions", "func": "network_toxic",
        "arguments": {**arguments, "duration_s": 3}}}]
    config = {"load": {"request_classes": classes}}
    if name == "break-json.yaml":
        config["acceptance_floor"] = {"exclude_request_classes": ["json-schema"]}
    code, rep, seconds, out = run_fast(tmp_path, name.removesuffix(".yaml"), method=method, **config)
    failed = {c["name"] for c in rep["checks"] if c["passed"] is False}   # None: not judged
    print(f"{name} on the fake: {seconds:.1f} s, verdict {rep['verdict']}, failed {sorted(failed)}")
    assert code == 1 and rep["verdict"] == "fail", (rep["errors"], failed)
    assert failed == EXPECTED[name]
    (fault,) = rep["faults"]
    obs = fault["evidence"]["observations"]
    mode = arguments["attributes"]["mode"]
    assert fault["acted"] and obs["events_corrupted"] > 0, obs
    assert {c["mode"] for c in obs["corruptions"]} == {mode}
    integ = rep["integrity"]
    assert integ["malformed"] == 0 and integ["mismatched"] == 0 and integ["compared"] >= 10
    for check in EXPECTED[name]:
        _, _, cls, inv = check.split(".")
        entry = integ["classes"][cls]["invariants"][inv]
        assert 0 < entry["violations"] < entry["judged"], entry    # during the fault only, not before or after
    recs = [r for r in read_records(out / "records.jsonl") if r.source == "load"]
    assert {r.request_class for r in recs} == {c["name"] for c in classes}


@pytest.mark.nightly   # make test runs these self-tests on the fake (above)
@pytest.mark.stack
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", list(EXPECTED_REAL))
def test_the_request_class_self_test_fails_on_its_own_invariant_on_the_real_stack(tmp_path, specchaos_pool, name):
    before = sut_pids()
    d = ci_form(experiment_doc(f"selftest/{name}"), duration_s=5)
    code, rep = run_pooled(write(tmp_path, d), tmp_path / "out")
    failed = {c["name"] for c in rep["checks"] if c["passed"] is False}
    assert code == 1 and rep["verdict"] == "fail", (rep["errors"], failed)
    assert failed == EXPECTED_REAL[name]
    (fault,) = rep["faults"]
    obs = fault["evidence"]["observations"]
    assert fault["acted"] and obs["events_corrupted"] > 0
    assert rep["integrity"]["malformed"] == 0 and rep["integrity"]["mismatched"] == 0
    assert leaked_since(before, pool=specchaos_pool) == []

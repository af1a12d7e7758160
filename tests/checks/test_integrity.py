import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.checks.integrity import divergence_index, first_divergence, integrity_checks, planned_stop_windows
from harness.load.records import is_complete
from tests.asserts import assert_failed
from tests.factories import cut, fail, make_record


def by_name(checks):
    return {c.name: c for c in checks}


# ---------------------------------------------------------------- is_complete

def test_complete_record_is_complete():
    assert is_complete(make_record()) == (True, "")
    assert is_complete(make_record(max_tokens=10, finish_reason="stop"))[0]


@pytest.mark.parametrize(
    "change, words",
    [
        (dict(status=500), "HTTP status 500"),
        (dict(status=None), "HTTP status None"),
        (dict(error="stream_error"), "error stream_error"),
        (dict(done=False), "[DONE]"),
        (dict(e2e_s=None), "never ended"),
        (dict(finish_reason=None), "finish_reason"),
        (dict(finish_reason="abort"), "finish_reason"),
        (dict(output_tokens=None), "usage"),
        (dict(output_tokens=5), "chunks carried 4 tokens, usage says 5"),
        (dict(chunk_tokens=[1, 1, 1]), "chunk token counts"),
        (dict(token_ids=[1, 2, 3]), "3 token ids, usage says 4"),
        (dict(max_tokens=0), "max_tokens not recorded"),
        (dict(max_tokens=3), "exceed max_tokens 3"),
        (dict(max_tokens=8), "finish_reason 'length' at 4 tokens"),
    ],
)
def test_each_rule_breaks_completeness(change, words):
    r = dataclasses.replace(make_record(), **change)
    ok, why = is_complete(r)
    assert not ok
    assert words in why


def test_complete_ignores_client_ok_label():
    r = make_record(ok=False)
    assert is_complete(r)[0]  # strict re-derivation, not the label
    assert not is_complete(cut(make_record(), 2, labelled_ok=True))[0]


def test_token_ids_absent_is_allowed():
    assert is_complete(dataclasses.replace(make_record(), token_ids=None))[0]


@given(
    toks=st.lists(st.integers(1, 5), min_size=1, max_size=20),
    data=st.data(),
    labelled_ok=st.booleans(),
)
def test_cutting_a_stream_anywhere_before_done_is_never_complete(toks, data, labelled_ok):
    r = make_record(chunk_tokens=toks)
    k = data.draw(st.integers(0, len(toks)))
    c = cut(r, k, labelled_ok=labelled_ok)
    assert not is_complete(c)[0]
    # even if the client somehow saw usage, no [DONE] means not complete
    c2 = dataclasses.replace(c, output_tokens=sum(c.chunk_tokens), finish_reason="stop", error=None, status=200)
    assert not is_complete(c2)[0]


# ---------------------------------------------------------------- divergence

def test_divergence_index():
    assert divergence_index([1, 2, 3], [1, 2, 3]) is None
    assert divergence_index([1, 9, 3], [1, 2, 3]) == 1
    assert divergence_index([1, 2], [1, 2, 3]) == 2
    assert divergence_index([], [1]) == 0


def test_first_divergence_names_index_tokens_and_lengths():
    a = make_record(token_ids=[5, 6, 7, 8])
    b = make_record(token_ids=[5, 6, 70, 8])
    assert first_divergence(a, a) is None
    msg = first_divergence(a, b)
    assert msg == "token 2: got 7, expected 70 (got 4 tokens, expected 4)"
    shorter = make_record(token_ids=[5, 6], chunk_tokens=[1, 1])
    msg = first_divergence(shorter, a)
    assert msg == "token 2: got <end>, expected 7 (got 2 tokens, expected 4)"


def test_first_divergence_falls_back_to_text():
    a = dataclasses.replace(make_record(), token_ids=None, text="hello world")
    b = dataclasses.replace(make_record(), text="hello there")
    msg = first_divergence(a, b)
    assert msg.startswith("char 6: got 'w', expected 't'")


@given(
    ids=st.lists(st.integers(0, 50000), min_size=1, max_size=64),
    data=st.data(),
)
def test_single_changed_token_reported_at_its_index(ids, data):
    i = data.draw(st.integers(0, len(ids) - 1))
    new = data.draw(st.integers(0, 50000).filter(lambda v: v != ids[i]))
    changed = list(ids)
    changed[i] = new
    got = make_record(token_ids=changed, chunk_tokens=[1] * len(ids))
    exp = make_record(token_ids=ids, chunk_tokens=[1] * len(ids))
    msg = first_divergence(got, exp)
    assert msg.startswith(f"token {i}: got {new}, expected {ids[i]}")
    _, summary = integrity_checks([got], {0: exp}, min_compared=1)
    assert summary["mismatched"] == 1
    assert f"token {i}:" in summary["first_divergence"]


# ---------------------------------------------------------------- integrity_checks

def ref_for(pid, n=4):
    return make_record(prompt_id=pid, source="reference", chunk_tokens=[1] * n)


def test_all_good_passes():
    refs = {p: ref_for(p) for p in range(3)}
    recs = [make_record(prompt_id=p, chunk_tokens=[2, 1, 1]) for p in range(3) for _ in range(2)]
    checks, s = integrity_checks(recs, refs, min_compared=6)
    assert all(c.passed for c in checks), checks
    assert s["compared"] == 6 and s["mismatched"] == s["malformed"] == s["false_success"] == 0
    assert s["first_divergence"] is None


def test_responses_of_a_routed_plain_fallback_are_compared_but_cover_nothing():
    """The breaker's route fallback: the reference server's own responses (``served_by``
    ``ref``) equal the reference by construction; coverage counts the speculative ones."""
    refs = {p: ref_for(p) for p in range(3)}
    spec = [make_record(prompt_id=p, served_by="spec") for p in range(2)]
    plain = [make_record(prompt_id=p, served_by="ref") for p in range(3)] + [make_record(prompt_id=0, served_by="ref",
                                                                                      token_ids=[0, 1, 99, 3])]
    checks, s = integrity_checks(spec + plain, refs, min_compared=3, fallback=("ref",))
    c = by_name(checks)
    assert s["compared"] == 6 and s["compared_by_server"] == {"spec": 2, "ref": 4}
    assert c["integrity.compared"].passed is False and c["integrity.compared"].observed == 2
    assert "2 served by the speculative server" in c["integrity.compared"].detail and "4 served by the plain" in \
        c["integrity.compared"].detail
    assert c["integrity.mismatched"].passed is False and c["integrity.mismatched"].observed == 1   # still judged
    checks, s = integrity_checks(spec + plain[:3], refs, min_compared=2, fallback=("ref",))
    assert all(x.passed for x in checks)


def test_changed_token_fails_mismatched():
    refs = {0: ref_for(0)}
    bad = make_record(prompt_id=0, token_ids=[0, 1, 99, 3])
    checks, s = integrity_checks([make_record(prompt_id=0), bad], refs, min_compared=1)
    c = by_name(checks)["integrity.mismatched"]
    assert c.passed is False and c.observed == 1 and c.limit == 0
    assert "token 2: got 99, expected 2" in c.detail
    assert bad.request_id in s["first_divergence"]


def test_a_source_requests_mismatch_names_its_file_and_line():
    refs = {0: ref_for(0)}
    bad = make_record(prompt_id=0, token_ids=[0, 1, 99, 3], origin="src.jsonl:7", request_class="source")
    checks, s = integrity_checks([bad], refs, min_compared=1)
    assert "(prompt 0, src.jsonl:7): token 2" in s["first_divergence"]
    assert s["examples"]["mismatched"][0]["origin"] == "src.jsonl:7"
    assert "src.jsonl:7" in by_name(checks)["integrity.mismatched"].detail


def test_cut_stream_labelled_ok_fails_false_success():
    refs = {0: ref_for(0)}
    recs = [make_record(prompt_id=0), cut(make_record(prompt_id=0), 2, labelled_ok=True)]
    checks, s = integrity_checks(recs, refs, min_compared=1)
    c = by_name(checks)["integrity.false_success"]
    assert c.passed is False and c.observed == 1
    assert s["false_success"] == 1
    assert s["compared"] == 1  # the cut one is never compared as a success
    assert by_name(checks)["integrity.mismatched"].passed


def test_chunk_total_not_usage_fails_malformed():
    refs = {0: ref_for(0)}
    bad = dataclasses.replace(make_record(prompt_id=0), output_tokens=5, max_tokens=8)
    checks, s = integrity_checks([make_record(prompt_id=0), bad], refs, min_compared=1)
    c = by_name(checks)["integrity.malformed"]
    assert c.passed is False and c.observed == 1
    assert "chunks carried 4 tokens, usage says 5" in c.detail
    assert s["examples"]["malformed"][0]["request_id"] == bad.request_id


@pytest.mark.parametrize(
    "change",
    [
        dict(finish_reason=None),
        dict(token_ids=[0, 1, 2]),
        dict(max_tokens=3),
        dict(max_tokens=9),  # finish "length" below the limit
    ],
)
def test_other_malformed_finished_responses(change):
    bad = dataclasses.replace(make_record(prompt_id=0), **change)
    checks, s = integrity_checks([bad], {0: ref_for(0)}, min_compared=0)
    assert s["malformed"] == 1
    assert_failed(by_name(checks)["integrity.malformed"])


def test_done_without_finish_reason_labelled_bad_payload_by_the_client_is_malformed():
    # what harness.load.client records for "[DONE] but no finish_reason"
    bad = dataclasses.replace(make_record(), finish_reason=None, error="bad_payload", ok=False)
    checks, s = integrity_checks([bad], {0: ref_for(0)}, min_compared=0)
    assert s["malformed"] == 1 and by_name(checks)["integrity.malformed"].passed is False
    # an error the server itself reported in the stream is an honest error
    honest = dataclasses.replace(make_record(), error="stream_error", ok=False)
    _, s = integrity_checks([honest], {0: ref_for(0)}, min_compared=0)
    assert s["malformed"] == 0


def test_planned_stop_windows_run_from_the_order_to_the_expected_exit():
    events = [{"t": 10.0, "event": "server_respeculating", "server": "spec"},
              {"t": 11.0, "event": "server_exited", "server": "ref", "expected": True},
              {"t": 12.5, "event": "server_exited", "server": "spec", "expected": True},
              {"t": 20.0, "event": "server_exited", "server": "spec", "expected": False},   # a kill: no window
              {"t": 30.0, "event": "server_respeculating", "server": "spec"}]                # never exited: none
    assert planned_stop_windows(events) == [("spec", 10.0, 12.5)]


def test_a_response_cut_by_a_planned_restart_is_counted_apart_and_any_other_still_fails():
    """vLLM answering [DONE] without finish_reason while the harness stops it for a planned
    restart is counted ``cut_by_planned_stop``; the same defect outside the window, or on
    another server, is malformed; a false success inside the window still fails."""
    def done_without_finish(send_time, server="spec", **kw):
        return dataclasses.replace(make_record(), finish_reason=None, error="bad_payload", ok=False,
                                   send_time=send_time, e2e_s=0.07, server=server, **kw)

    windows = [("spec", 100.0, 101.0)]
    inside = done_without_finish(100.5)
    checks, s = integrity_checks([inside, make_record()], {0: ref_for(0)}, min_compared=1, planned_stops=windows)
    assert s["malformed"] == 0 and s["cut_by_planned_stop"] == 1
    assert s["examples"]["cut_by_planned_stop"][0]["request_id"] == inside.request_id
    assert all(c.passed for c in checks) and "1 cut while the harness stopped" in by_name(checks)["integrity.malformed"].detail
    for bad in (done_without_finish(99.0), done_without_finish(101.5), done_without_finish(100.5, server="ref")):
        checks, s = integrity_checks([bad], {0: ref_for(0)}, min_compared=0, planned_stops=windows)
        assert s["malformed"] == 1 and s["cut_by_planned_stop"] == 0 and by_name(checks)["integrity.malformed"].passed is False
    lying = cut(dataclasses.replace(make_record(), send_time=100.2), 2, labelled_ok=True)
    checks, s = integrity_checks([lying], {0: ref_for(0)}, min_compared=0, planned_stops=windows)
    assert s["false_success"] == 1 and by_name(checks)["integrity.false_success"].passed is False


def test_honest_errors_are_neither_malformed_nor_false_success():
    recs = [fail(), cut(make_record(), 1)]
    checks, s = integrity_checks(recs + [make_record()], {0: ref_for(0)}, min_compared=1)
    assert s["malformed"] == 0 and s["false_success"] == 0
    assert all(c.passed for c in checks)


def test_nothing_compared_fails_coverage_even_with_zero_minimum():
    checks, s = integrity_checks([make_record(prompt_id=7)], {0: ref_for(0)}, min_compared=0)
    c = by_name(checks)["integrity.compared"]
    assert c.passed is False and c.observed == 0
    assert c.category == "coverage"


def test_too_few_compared_fails_coverage():
    checks, _ = integrity_checks([make_record()], {0: ref_for(0)}, min_compared=5)
    c = by_name(checks)["integrity.compared"]
    assert c.passed is False and c.observed == 1 and c.limit == 5


def test_incomplete_reference_is_not_compared():
    checks, s = integrity_checks([make_record()], {0: cut(ref_for(0), 2)}, min_compared=1)
    assert s["compared"] == 0
    assert_failed(by_name(checks)["integrity.compared"])


def test_different_max_tokens_compares_prefix():
    ref = make_record(prompt_id=0, chunk_tokens=[1] * 8)  # 8 tokens, length-limited at 8
    short = make_record(prompt_id=0, chunk_tokens=[1] * 4)  # length-limited at 4: a prefix
    _, s = integrity_checks([short], {0: ref}, min_compared=1)
    assert s["compared"] == 1 and s["mismatched"] == 0
    wrong = make_record(prompt_id=0, token_ids=[0, 1, 5, 3])
    _, s = integrity_checks([wrong], {0: ref}, min_compared=1)
    assert s["mismatched"] == 1


# ---------------------------------------------------------------- near-ties

def tied_ref(top_at_2):
    """The reference for prompt 0 (tokens 0, 1, 2, 3) with its top logprobs; position 2 as given."""
    ref = ref_for(0)
    ref.top_logprobs = [[[0, -0.1], [7, -3.0]], [[1, -0.2], [8, -2.5]], top_at_2, [[3, -0.1], [9, -4.0]]]
    return ref


FLIPPED = [0, 1, 99, 5]   # took the runner-up at token 2, then went its own way


def test_a_runner_up_within_the_margin_is_a_near_tie_not_a_mismatch():
    refs = {0: tied_ref([[2, -0.5001], [99, -0.5032]])}
    flipped = make_record(prompt_id=0, token_ids=FLIPPED)
    checks, s = integrity_checks([make_record(prompt_id=0), flipped], refs, min_compared=2, tie_margin=0.01)
    c = by_name(checks)["integrity.mismatched"]
    assert c.passed and c.observed == 0
    assert s["near_ties"] == 1 and s["mismatched"] == 0 and s["compared"] == 2
    (ex,) = s["examples"]["near_ties"]
    assert ex["request_id"] == flipped.request_id and "token 2: got 99, expected 2" in ex["detail"]
    assert "margin 0.00310" in ex["detail"] and "1 near-tie(s) not counted" in c.detail


@pytest.mark.parametrize("top_at_2, margin, why", [
    ([[2, -0.1], [99, -2.0]], 0.01, "the runner-up was 1.9 nats behind: a changed output"),
    ([[2, -0.5], [98, -0.501]], 0.01, "the response's token is not among the reference's top tokens"),
    ([[2, -0.5], [99, -0.501]], 0.0, "margin 0: every difference counts"),
])
def test_a_difference_that_is_no_near_tie_is_still_a_mismatch(top_at_2, margin, why):
    refs = {0: tied_ref(top_at_2)}
    checks, s = integrity_checks([make_record(prompt_id=0, token_ids=FLIPPED)], refs, min_compared=1,
                                 tie_margin=margin)
    c = by_name(checks)["integrity.mismatched"]
    assert c.passed is False and c.observed == 1 and s["near_ties"] == 0, why
    assert "token 2: got 99, expected 2" in c.detail


def test_a_length_difference_is_never_a_near_tie():
    refs = {0: tied_ref([[2, -0.5], [99, -0.5]])}
    short = make_record(prompt_id=0, token_ids=[0, 1, 2], chunk_tokens=[1, 1, 1], max_tokens=4, finish_reason="stop")
    checks, s = integrity_checks([short], refs, min_compared=1, tie_margin=1.0)
    assert by_name(checks)["integrity.mismatched"].passed is False and s["near_ties"] == 0


def test_without_reference_logprobs_a_difference_is_a_mismatch():
    checks, s = integrity_checks([make_record(prompt_id=0, token_ids=FLIPPED)], {0: ref_for(0)}, min_compared=1,
                                 tie_margin=1.0)
    assert by_name(checks)["integrity.mismatched"].passed is False and s["near_ties"] == 0

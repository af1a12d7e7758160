"""The toxics' pure parts (:mod:`faults.toxics`): validation, the seeded toxicity draw,
the slicer's split, the SSE re-framing and ``corrupt`` — property-tested with hypothesis."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faults.toxics import (LatencyAttrs, latency_s, max_chunk_delay_s,
                           CorruptAttrs, CorruptPlan, SlicerAttrs, SseReframer, affected, chunk, connection_rng, corrupt_events,
                           parse_toxic, slice_sizes, split_events)


# ------------------------------------------------------------------ validation

@pytest.mark.parametrize("data, needle", [
    ({"type": "lag"}, "type: Input should be 'latency'"),
    ({"type": "latency", "attributes": {"latency": -1}}, "attributes.latency: Input should be greater than or equal to 0"),
    ({"type": "latency", "toxicity": 1.5}, "toxicity: Input should be less than or equal to 1"),
    ({"type": "latency", "toxicity": -0.1}, "toxicity: Input should be greater than or equal to 0"),
    ({"type": "latency", "stream": "sideways"}, "stream: Input should be 'upstream' or 'downstream'"),
    ({"type": "slicer", "attributes": {"average_size": 4, "size_variation": 4}}, "size_variation must be smaller"),
    ({"type": "bandwidth", "attributes": {"rate": 0}}, "attributes.rate: Input should be greater than 0"),
    ({"type": "corrupt", "attributes": {"mode": "flip"}}, "attributes.mode"),
    ({"type": "latency", "attributes": {"delay": 3}}, "attributes.delay: unknown attribute of latency"),
])
def test_bad_toxics_are_one_line_naming_the_field(data, needle):
    with pytest.raises(ValueError) as err:
        parse_toxic(data)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_toxic_defaults_like_toxiproxy():
    t = parse_toxic({"type": "latency", "attributes": {"latency": 10}})
    assert t.public() == {"name": "latency_downstream", "type": "latency", "stream": "downstream", "toxicity": 1.0,
                          "attributes": {"latency": 10}}


# ------------------------------------------------------------------ seeded decisions

def decisions(seed: int, toxicity: float, n: int = 200) -> list[bool]:
    return [affected(connection_rng(seed, "latency_downstream", i), toxicity) for i in range(n)]


def test_the_same_seed_gives_the_same_toxicity_decisions_and_another_seed_others():
    a, b = decisions(7, 0.3), decisions(7, 0.3)
    assert a == b
    assert decisions(8, 0.3) != a
    assert 0.2 < sum(a) / len(a) < 0.4                   # the fraction of connections affected
    assert all(decisions(7, 1.0)) and not any(decisions(7, 0.0))


# ------------------------------------------------------------------ slicer

@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 5000), avg=st.integers(1, 300), var_frac=st.floats(0, 0.99), seed=st.integers(0, 2**32))
def test_slicer_pieces_cover_the_chunk_exactly(n, avg, var_frac, seed):
    attrs = SlicerAttrs(average_size=avg, size_variation=int(var_frac * avg), delay=0)
    sizes = slice_sizes(n, attrs, random.Random(seed))
    assert sum(sizes) == n and all(s >= 1 for s in sizes)
    assert all(s <= avg + attrs.size_variation for s in sizes)


# ------------------------------------------------------------------ SSE re-framing

def sse_response(events: list[bytes], chunks: list[int]) -> bytes:
    """An HTTP/1.1 chunked text/event-stream response carrying ``events``, its body cut into
    HTTP chunks at the given (relative) points."""
    body = b"".join(e + b"\n\n" for e in events)
    cuts = sorted({min(len(body), c) for c in chunks} | {0, len(body)})
    framed = b"".join(chunk(body[a:b]) for a, b in zip(cuts, cuts[1:]) if b > a)
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
    return head + framed + b"0\r\n\r\n"


def decode(stream: bytes) -> list[list[bytes]]:
    """The SSE events of every response of a (keep-alive) HTTP byte stream."""
    out = []
    while stream:
        head, _, rest = stream.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), stream[:80]
        body = b""
        while True:
            line, _, rest = rest.partition(b"\r\n")
            size = int(line, 16)
            if size == 0:
                assert rest.startswith(b"\r\n")
                rest = rest[2:]
                break
            body, rest = body + rest[:size], rest[size + 2:]
        events, left = split_events(body)
        assert left == b""
        out.append(events)
        stream = rest
    return out


event = st.builds(lambda ids, t: b"data: " + json.dumps({"choices": [{"index": 0, "text": t, "token_ids": ids}]}).encode(),
                  st.lists(st.integers(0, 50000), min_size=1, max_size=6), st.text(max_size=12).filter(lambda s: "\n" not in s))
events_st = st.lists(event, min_size=1, max_size=12).map(lambda es: es + [b"data: [DONE]"])


@settings(max_examples=150, deadline=None)
@given(responses=st.lists(events_st, min_size=1, max_size=3), cuts=st.lists(st.integers(0, 4000), max_size=10),
       splits=st.lists(st.integers(1, 400), max_size=40))
def test_any_split_of_the_byte_stream_reassembles_to_the_same_events(responses, cuts, splits):
    stream = b"".join(sse_response(evs, cuts) for evs in responses)
    reframer = SseReframer()
    out, pos = b"", 0
    for n in splits + [len(stream)]:
        out += reframer.feed(stream[pos:pos + n])
        pos += n
    assert decode(out) == responses
    assert reframer.responses == len(responses)


def test_other_responses_pass_byte_for_byte():
    plain = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"
    chunked = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    r = SseReframer()
    assert r.feed(plain + chunked + plain) == plain + chunked + plain


# ------------------------------------------------------------------ corrupt

@settings(max_examples=300, deadline=None)
@given(events=events_st, seed=st.integers(0, 2**32), mode=st.sampled_from(["alter", "drop", "duplicate", "any"]),
       max_event=st.integers(0, 15))
def test_corrupt_changes_exactly_what_it_says(events, seed, mode, max_event):
    out, what = corrupt_events(events, random.Random(seed), CorruptAttrs(mode=mode, max_event=max_event))
    if what is None:
        assert out == events
        return
    k = what.event
    assert events[k].decode() == what.before and events[k] != b"data: [DONE]"
    assert mode == "any" or what.mode == mode
    if what.mode == "drop":
        assert out == events[:k] + events[k + 1:] and what.after is None
    elif what.mode == "duplicate":
        assert out == events[:k + 1] + [events[k]] + events[k + 1:]
    else:
        assert out[:k] == events[:k] and out[k + 1:] == events[k + 1:] and len(out) == len(events)
        assert out[k] != events[k] and out[k].decode() == what.after
        got = json.loads(out[k][6:])["choices"][0]["token_ids"]
        want = json.loads(events[k][6:])["choices"][0]["token_ids"]
        assert got[0] == want[0] + 1 and got[1:] == want[1:]      # exactly the first token id


def test_corrupt_through_the_reframer_matches_the_pure_function():
    events = [b'data: {"choices":[{"index":0,"text":"a","token_ids":[%d]}]}' % i for i in range(6)] + [b"data: [DONE]"]
    attrs = CorruptAttrs(mode="any", max_event=4)
    for seed in range(20):
        plan = CorruptPlan(random.Random(seed), attrs)
        out = SseReframer(plan).feed(sse_response(events, [17, 50]))
        expected, _ = corrupt_events(events, random.Random(seed), attrs)
        assert decode(out) == [expected]


def test_the_most_one_chunk_is_delayed_by_declaration():
    assert max_chunk_delay_s(LatencyAttrs(latency=50, jitter=25, distribution="normal")) == pytest.approx(0.125)
    assert max_chunk_delay_s(LatencyAttrs(latency=50, jitter=25)) == pytest.approx(0.075)       # uniform: its upper end
    assert max_chunk_delay_s(LatencyAttrs(latency=30)) == pytest.approx(0.030)
    rng = random.Random(7)
    attrs = LatencyAttrs(latency=50, jitter=25, distribution="normal")
    draws = [latency_s(attrs, rng) for _ in range(20000)]
    assert sum(d > max_chunk_delay_s(attrs) for d in draws) / len(draws) < 0.003   # 3 sd: 0.13 % expected

"""A record's JSON line is the dataclass's fields, exactly as ``dataclasses.asdict`` gives them
(``to_json`` skips asdict's deep copy, so this guards against a nested field added later)."""

from __future__ import annotations

import json
from dataclasses import asdict, fields

from harness.load.records import RequestRecord


def test_to_json_is_asdict_and_round_trips():
    r = RequestRecord(request_id="a" * 32, source="load", user_id=3, send_time=12.5, ttft_s=0.1,
                      chunk_offsets_s=[0.1, 0.2], chunk_tokens=[4, 1], token_ids=[1, 2, 3, 4, 5], text="é x",
                      status=200, done=True, ok=True, finish_reason="length", output_tokens=5)
    data = json.loads(r.to_json())
    assert data == asdict(r)
    assert set(data) == {f.name for f in fields(RequestRecord)}
    assert RequestRecord.from_dict(data) == r

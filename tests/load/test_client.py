"""The streaming client's parser and error classes, fed real HTTP by the fake vLLM.

These test the client, not the system under test: every scenario is a byte stream
written by hand in the fake (:data:`tests.fakes.fake_vllm.SCENARIOS`), chosen by the
request's ``model``.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import clock
from harness.errors import LoadError
from harness.load.client import completion_body, fetch_reference, make_client, stream_completion
from harness.load.prompts import Prompt

from tests.fakes import run_fake

PROMPT = Prompt(prompt_id=3, prompt_class="medium", text="hello there", prompt_tokens=3, max_tokens=6)


@pytest.fixture(scope="module")
def server():
    with run_fake() as srv:
        yield srv


@pytest.fixture()
def client():
    with make_client() as c:
        yield c


def run(client, server, scenario, timeout_s=5.0, **kw):
    return stream_completion(client, server.base_url, scenario, PROMPT, timeout_s=timeout_s, **kw)


def slack_s(client, server) -> float:
    """The room an upper time bound gets on this host now: four times the E2E latency of a
    normal request measured just before (its three 20 ms gaps plus the host's own delay; about
    0.3 s on an idle machine, more on a loaded one), never less than 0.25 s. The scenarios a
    bound guards against last 10 s (no deadline) or a whole timeout longer."""
    control = run(client, server, "normal")
    assert control.ok and control.e2e_s is not None
    return max(0.25, 4 * control.e2e_s)


def test_body_is_greedy_streaming_with_usage_and_token_ids():
    body = completion_body(PROMPT, "m", ignore_eos=True)
    assert body == {"model": "m", "prompt": "hello there", "max_tokens": 6, "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True}, "return_token_ids": True, "ignore_eos": True}


def test_normal_stream(client, server):
    before = clock.now()
    r = run(client, server, "normal", source="probe", user_id=5)
    assert server.bodies[-1] == completion_body(PROMPT, "normal")
    assert (r.ok, r.done, r.status, r.error, r.error_detail) == (True, True, 200, None, None)
    assert (r.source, r.user_id, r.prompt_id, r.prompt_class, r.max_tokens) == ("probe", 5, 3, "medium", 6)
    assert before <= r.send_time <= clock.now()
    assert r.chunk_tokens == [2, 3, 1]  # the empty chunk carries no output and is not counted
    assert r.token_ids == [10, 11, 12, 13, 14, 15]
    assert r.text == "a b c d e f"
    assert (r.output_tokens, r.prompt_tokens, r.finish_reason) == (6, 7, "length")
    assert r.ttft_s == r.chunk_offsets_s[0] > 0
    assert r.chunk_offsets_s == sorted(r.chunk_offsets_s)
    assert r.chunk_offsets_s[-1] - r.chunk_offsets_s[0] >= 0.03  # server sleeps 20 ms between events
    assert r.e2e_s >= r.chunk_offsets_s[-1]
    assert len(r.request_id) == 32 and json.loads(r.to_json())["ok"] is True


def test_chunks_without_token_ids_count_one_per_text_chunk(client, server):
    r = run(client, server, "no_token_ids")
    assert r.ok and r.token_ids is None
    assert r.chunk_tokens == [1, 1] and r.text == "xy" and r.finish_reason == "stop"
    assert r.output_tokens is None  # no usage chunk was sent


def test_cut_before_done_is_stream_cut(client, server):
    r = run(client, server, "cut")
    assert (r.ok, r.done, r.status, r.error) == (False, False, 200, "stream_cut")
    assert r.chunk_tokens == [2, 3] and r.token_ids == [10, 11, 12, 13, 14]  # what arrived is kept
    assert r.finish_reason is None and r.e2e_s is not None


def test_clean_http_end_without_done_is_stream_cut(client, server):
    r = run(client, server, "clean_end_no_done")
    assert (r.ok, r.done, r.error) == (False, False, "stream_cut")


def test_error_event_mid_stream_is_stream_error(client, server):
    r = run(client, server, "stream_error")
    assert (r.ok, r.status, r.error, r.done) == (False, 200, "stream_error", True)
    assert "EngineCore encountered an issue" in r.error_detail
    assert r.chunk_tokens == [2]


def test_http_500(client, server):
    r = run(client, server, "http500")
    assert (r.ok, r.status, r.error) == (False, 500, "http_500")
    assert "engine dead" in r.error_detail and r.e2e_s is not None


def test_unparsable_chunk_is_bad_payload(client, server):
    r = run(client, server, "bad_json")
    assert (r.ok, r.error) == (False, "bad_payload") and r.chunk_tokens == [2]


def test_wrong_content_type_is_bad_payload(client, server):
    r = run(client, server, "wrong_content_type")
    assert (r.ok, r.status, r.error) == (False, 200, "bad_payload")


def test_done_without_finish_reason_is_not_ok(client, server):
    r = run(client, server, "done_without_finish")
    assert (r.ok, r.done, r.error) == (False, True, "bad_payload")


def test_a_stream_aborted_by_the_server_is_not_ok(client, server):
    """vLLM ends the streams in flight with finish_reason "abort" when it shuts down (seen on
    a planned restart): [DONE] arrives, yet the response is cut."""
    r = run(client, server, "aborted")
    assert (r.ok, r.done, r.error, r.finish_reason) == (False, True, "aborted", "abort")


def test_refused_connection_is_connect(client):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    r = stream_completion(client, f"http://127.0.0.1:{port}", "m", PROMPT, timeout_s=2)
    assert (r.ok, r.status, r.error) == (False, None, "connect")
    assert r.e2e_s is not None and r.e2e_s < 2   # at once, not after the 2 s timeout


def test_no_answer_is_timeout(client, server):
    slack = slack_s(client, server)
    r = run(client, server, "hang_head", timeout_s=0.5)
    assert (r.ok, r.status, r.error) == (False, None, "timeout")
    assert 0.45 <= r.e2e_s < 0.5 + slack, (r.e2e_s, slack)   # the hang lasts 10 s


def test_timeout_bounds_the_whole_request_not_each_read(client, server):
    # One chunk at 0.3 s, then silence: a per-read timeout would end a whole timeout (0.6 s)
    # after the chunk, the request's deadline ends it 0.3 s after.
    slack = slack_s(client, server)
    r = run(client, server, "hang_after_chunk", timeout_s=0.6)
    assert (r.ok, r.status, r.error) == (False, 200, "timeout")
    assert r.chunk_tokens == [2] and 0.25 <= r.ttft_s < 0.6
    assert 0.55 <= r.e2e_s < 0.6 + slack and r.e2e_s - r.ttft_s < 0.6, (r.ttft_s, r.e2e_s, slack)


def test_endless_trickle_is_timeout(client, server):
    slack = slack_s(client, server)
    r = run(client, server, "trickle", timeout_s=0.5)
    assert (r.ok, r.error) == (False, "timeout")
    assert len(r.chunk_tokens) >= 3 and r.e2e_s < 0.5 + slack, (r.e2e_s, slack)   # the trickle lasts 10 s


def test_client_is_reusable_after_faults(client, server):
    for scenario in ("hang_after_chunk", "cut", "http500"):
        run(client, server, scenario, timeout_s=0.4)
    assert run(client, server, "normal").ok


@pytest.mark.parametrize("url", ["http://10.0.0.1:8000", "http://example.com", "http://0.0.0.0:1",
                                 "ftp://127.0.0.1:1", "nonsense"])
def test_non_loopback_is_refused(client, url):
    with pytest.raises(LoadError):
        stream_completion(client, url, "m", PROMPT, timeout_s=1)
    with pytest.raises(LoadError):
        fetch_reference(url, "m", [PROMPT], timeout_s=1)


@pytest.mark.parametrize("host", ["localhost", "127.0.0.2", "[::1]"])
def test_loopback_forms_are_accepted(client, host):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    r = stream_completion(client, f"http://{host}:{port}", "m", PROMPT, timeout_s=1)
    assert r.error in ("connect", "timeout")


def _prompts(n):
    return [Prompt(i, "short", f"prompt {i}", 3, 6) for i in range(n)]


def test_fetch_reference(server):
    refs = fetch_reference(server.base_url, "normal", _prompts(5), timeout_s=5, concurrency=3)
    assert list(refs) == [0, 1, 2, 3, 4]
    assert all(r.ok and r.source == "reference" and r.user_id == -1 for r in refs.values())
    assert [r.prompt_id for r in refs.values()] == [0, 1, 2, 3, 4]


def test_fetch_reference_retries(server):
    refs = fetch_reference(server.base_url, "flaky", _prompts(3), timeout_s=5, retry_backoff_s=0.01)
    assert all(r.ok for r in refs.values())
    assert all(server.flaky_seen[f"prompt {i}"] == 3 for i in range(3))


def test_fetch_reference_gives_up_naming_the_prompt(server):
    with pytest.raises(LoadError, match=r"prompt 0 after 4 attempts: http_500"):
        fetch_reference(server.base_url, "http500", _prompts(1), timeout_s=5, retry_backoff_s=0.01)


GEVENT_SCRIPT = r"""
from gevent import monkey; monkey.patch_all()
import sys, time, gevent, json
from harness.load.client import make_client, stream_completion
from harness.load.prompts import Prompt
p = Prompt(0, "short", "x", 1, 4)
url = sys.argv[1]
out = {}
with make_client() as c:
    r = stream_completion(c, url, "hang_after_chunk", p, timeout_s=0.6)
    out["timeout"] = [r.error, r.e2e_s]
    seen = []
    g = gevent.spawn(stream_completion, c, url, "hang_after_chunk", p, timeout_s=5, on_interrupt=seen.append)
    gevent.sleep(0.5)
    g.kill(block=True)
    out["interrupt"] = [seen[0].error, seen[0].ok, seen[0].chunk_tokens] if seen else None
    out["after"] = stream_completion(c, url, "normal", p, timeout_s=5).ok
print(json.dumps(out))
"""


def test_under_gevent_timeout_and_interrupt(client, server, tmp_path):
    """Locust runs the client in greenlets: the deadline must work there, and a user killed
    mid-request (locust's stop timeout) must still hand over its record as an error."""
    script = tmp_path / "g.py"
    script.write_text(GEVENT_SCRIPT)
    res = subprocess.run([sys.executable, str(script), server.base_url], capture_output=True, text=True,
                         timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["timeout"][0] == "timeout" and out["timeout"][1] < 0.6 + slack_s(client, server)
    assert out["interrupt"] == ["other:GreenletExit", False, [2]]
    assert out["after"] is True


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_any_split_of_the_byte_stream_gives_the_same_record(server, seed):
    """TCP may cut the stream anywhere (inside a line, inside a UTF-8 character)."""
    with make_client() as c:
        r = stream_completion(c, server.base_url, f"split:{seed}", PROMPT, timeout_s=5)
    assert (r.ok, r.error, r.text, r.token_ids) == (True, None, "é ü 日本語 ✓", [1, 2, 3, 4, 5, 6, 7])
    assert r.chunk_tokens == [2, 4, 1] and r.output_tokens == 7 and r.finish_reason == "stop"


def test_top_logprobs_are_asked_by_id_and_ranked():
    from harness.load.client import _ranked, completion_body
    body = completion_body(Prompt(prompt_id=0, prompt_class="short", text="hi", prompt_tokens=1, max_tokens=4),
                           "m", top_logprobs=2)
    assert body["logprobs"] == 2 and body["return_tokens_as_token_ids"] is True
    plain = completion_body(Prompt(prompt_id=0, prompt_class="short", text="hi", prompt_tokens=1, max_tokens=4), "m")
    assert "logprobs" not in plain and "return_tokens_as_token_ids" not in plain
    assert _ranked({"token_id:7": -2.5, "token_id:12": -0.1, "hello": -1.0}) == [[12, -0.1], [7, -2.5]]
    assert _ranked(None) == []

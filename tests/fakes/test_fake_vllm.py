"""The fake vLLM itself: streams, usage, metrics, determinism, and its process tree's faults."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.load.client import make_client, stream_completion
from harness.load.prompts import Prompt
from harness.stack import procs
from tests.fakes import fake_vllm as fv

pytestmark = pytest.mark.timeout(60)

PROMPTS = [Prompt(i, "short", f"the fake prompt number {i} says hello", 8, 24) for i in range(6)]


def metric(text: str, name: str, **labels: str) -> float:
    """One sample of the /metrics text, read with Prometheus' own parser."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise KeyError(name)


def post(fake, **body) -> httpx.Response:
    with httpx.Client(trust_env=False, timeout=10) as c:
        return c.post(f"{fake.base_url}/v1/completions", json={"model": fake.served_model_name, **body})


def raw_stream(fake, **body) -> tuple[httpx.Response, list[str]]:
    """The SSE ``data:`` payloads of one streamed completion, as sent."""
    with httpx.Client(trust_env=False, timeout=10) as c:
        with c.stream("POST", f"{fake.base_url}/v1/completions",
                      json={"model": fake.served_model_name, "stream": True, **body}) as r:
            lines = [ln for ln in r.iter_lines()]
    return r, lines


def test_stream_is_well_formed_and_usage_counts_what_was_streamed(fake_vllm):
    fake = fake_vllm(num_speculative_tokens=4)
    r, lines = raw_stream(fake, prompt="hello there", max_tokens=13, temperature=0, ignore_eos=True,
                          stream_options={"include_usage": True}, return_token_ids=True)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["transfer-encoding"] == "chunked" and r.http_version == "HTTP/1.1"
    events = [ln[len("data: "):] for ln in lines if ln]
    assert all(ln.startswith("data: ") for ln in lines if ln) and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    content, usage = chunks[:-1], chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["prompt_tokens"] == 3
    ids = [t for c in content for t in c["choices"][0]["token_ids"]]
    assert usage["usage"]["completion_tokens"] == len(ids) == 13
    assert [len(c["choices"][0]["token_ids"]) for c in content] == [5, 5, 3]   # k+1 per step, all accepted
    assert [c["choices"][0]["finish_reason"] for c in content] == [None, None, "length"]
    assert "".join(c["choices"][0]["text"] for c in content) == "".join(f" w{t}" for t in ids)
    assert all(c["model"] == "fake" and c["object"] == "text_completion" for c in chunks)
    assert len(content[0]["choices"][0]["prompt_token_ids"]) == 3 and "prompt_token_ids" not in content[1]["choices"][0]
    # Non-streaming answers the same ids; the metrics count every step and accepted token.
    whole = post(fake, prompt="hello there", max_tokens=13, temperature=0, ignore_eos=True, return_token_ids=True)
    assert whole.status_code == 200
    assert whole.json()["choices"][0]["token_ids"] == ids and whole.json()["usage"]["completion_tokens"] == 13
    m = fake.metrics_text()
    lbl = {"model_name": "fake"}
    assert metric(m, "vllm:spec_decode_num_drafts_total", **lbl) == 6
    assert metric(m, "vllm:spec_decode_num_draft_tokens_total", **lbl) == 24
    assert metric(m, "vllm:spec_decode_num_accepted_tokens_total", **lbl) == 26 - 6
    per_pos = [metric(m, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i), **lbl)
               for i in range(4)]
    assert per_pos == [6, 6, 4, 4]
    assert metric(m, "vllm:generation_tokens_total", **lbl) == 26
    assert metric(m, "vllm:num_requests_running", **lbl) == 0
    assert metric(m, "vllm:num_requests_waiting", **lbl) == 0
    assert metric(m, "vllm:num_preemptions_total", **lbl) == 0


def test_client_record_and_models(fake_vllm):
    fake = fake_vllm(num_speculative_tokens=2)
    with make_client() as c:
        rec = stream_completion(c, fake.base_url, "fake", PROMPTS[0], timeout_s=10, ignore_eos=True)
    assert rec.ok and rec.output_tokens == len(rec.token_ids) == 24 and rec.finish_reason == "length"
    assert set(rec.chunk_tokens) == {3} and rec.prompt_tokens == 8
    models = httpx.get(f"{fake.base_url}/v1/models", trust_env=False).json()
    assert [m["id"] for m in models["data"]] == ["fake"]
    assert post(fake, model="nope", prompt="x").status_code == 404
    too_long = post(fake, prompt="x", max_tokens=5000)
    assert too_long.status_code == 400 and "maximum context length" in too_long.json()["error"]["message"]


def test_greedy_output_is_the_same_on_every_fake_and_sampling_takes_small_steps(fake_vllm):
    fast = ("--step-delay-s", "0.001")
    spec, ref, bad, again = (fake_vllm(*fast, *flags, num_speculative_tokens=k, wait=False)
                             for flags, k in (((), 4), ((), None), (("--mismatch",), None), ((), None)))
    for f in (spec, ref, bad, again):
        f.wait_ready()
    with make_client() as c:
        for p in PROMPTS:
            s, r, b, a = (stream_completion(c, f.base_url, "fake", p, timeout_s=10) for f in (spec, ref, bad, again))
            assert s.ok and r.ok and b.ok and a.ok
            assert s.token_ids == r.token_ids == a.token_ids and s.finish_reason == r.finish_reason
            assert set(r.chunk_tokens) == {1} and set(s.chunk_tokens[:-1]) <= {5}
            assert b.token_ids[:2] == r.token_ids[:2] and b.token_ids != r.token_ids
        ref.popen.kill()   # a restarted server answers the same
        ref.popen.wait(5)
        restarted = fake_vllm(*fast, port=ref.port)
        assert [stream_completion(c, restarted.base_url, "fake", p, timeout_s=10).token_ids for p in PROMPTS] == \
            [stream_completion(c, spec.base_url, "fake", p, timeout_s=10).token_ids for p in PROMPTS]
    # Sampled (temperature 1): 1-2 tokens per step on the speculative server.
    r, lines = raw_stream(spec, prompt="sampled", max_tokens=40, temperature=1.0, ignore_eos=True,
                          return_token_ids=True)
    sizes = [len(json.loads(ln[6:])["choices"][0]["token_ids"]) for ln in lines if ln and ln != "data: [DONE]"]
    assert set(sizes) <= {1, 2} and sum(sizes) == 40 and 2 in sizes


def test_eos_ends_a_greedy_request_with_stop_unless_ignored(fake_vllm):
    # A prompt whose greedy sequence draws EOS within 40 tokens (found with the fake's own function).
    text = next(t for t in (f"eos probe {i}" for i in range(2000))
                if fv.EOS_ID in [fv.token_id(fv.greedy_seed(t), p) for p in range(1, 40)])
    fake = fake_vllm()
    stop = post(fake, prompt=text, max_tokens=40, temperature=0, return_token_ids=True).json()
    ids = stop["choices"][0]["token_ids"]
    assert stop["choices"][0]["finish_reason"] == "stop" and ids[-1] == fv.EOS_ID and len(ids) < 40
    assert stop["usage"]["completion_tokens"] == len(ids)
    full = post(fake, prompt=text, max_tokens=40, temperature=0, ignore_eos=True, return_token_ids=True).json()
    assert full["choices"][0]["finish_reason"] == "length" and full["choices"][0]["token_ids"][:len(ids)] == ids


def test_corrupt_usage(fake_vllm):
    fake = fake_vllm("--corrupt-usage")
    body = post(fake, prompt="x y", max_tokens=3, temperature=0, ignore_eos=True).json()
    assert body["usage"]["completion_tokens"] == 4


def test_roles_are_found_by_the_harness(fake_vllm):
    fake = fake_vllm()
    roles = fake.roles()
    assert {k: len(v) for k, v in roles.items()} == {"api": 1, "engine": 1, "worker": 1}
    assert roles["engine"][0].ppid() == fake.pid and roles["worker"][0].ppid() == roles["engine"][0].pid
    assert procs.title_of(roles["worker"][0]).startswith("VLLM::Worker")


class Streamer(threading.Thread):
    """Streams one long greedy request, noting when each chunk arrived."""

    def __init__(self, fake, max_tokens: int = 400):
        super().__init__(daemon=True)
        self.fake, self.max_tokens = fake, max_tokens
        self.arrivals: list[float] = []
        self.events: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.Client(trust_env=False, timeout=30) as c:
                with c.stream("POST", f"{self.fake.base_url}/v1/completions", json={
                        "model": "fake", "prompt": "long one", "max_tokens": self.max_tokens, "temperature": 0,
                        "ignore_eos": True, "stream": True, "return_token_ids": True}) as r:
                    for line in r.iter_lines():
                        if line:
                            self.arrivals.append(time.monotonic())
                            self.events.append(line)
        except BaseException as exc:   # noqa: BLE001 - reported by the test
            self.error = exc

    def wait_chunks(self, n: int, timeout_s: float = 10) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.arrivals) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(self.arrivals) >= n, "the stream did not start"


def health(fake) -> int | None:
    try:
        return httpx.get(f"{fake.base_url}/health", trust_env=False, timeout=2).status_code
    except httpx.HTTPError:
        return None


@pytest.mark.parametrize("role", ["engine", "worker"])
def test_sigstop_stops_tokens_while_health_stays_200(fake_vllm, role):
    fake = fake_vllm("--step-delay-s", "0.01")
    victim = fake.role(role)
    s = Streamer(fake, max_tokens=60)
    s.start()
    s.wait_chunks(5)
    victim.send_signal(signal.SIGSTOP)
    try:
        time.sleep(0.05)   # a step already under way may still arrive
        n = len(s.arrivals)
        for _ in range(4):
            assert health(fake) == 200
            time.sleep(0.1)
        assert len(s.arrivals) == n, "tokens arrived while the engine was frozen"
    finally:
        victim.send_signal(signal.SIGCONT)
    s.join(20)
    assert s.error is None and s.events[-1] == "data: [DONE]"
    assert sum(len(json.loads(e[6:])["choices"][0]["token_ids"]) for e in s.events[:-1]) == 60


@pytest.mark.parametrize("role", ["worker", "engine"])
def test_death_in_the_tree_fails_streams_and_the_api_exits_0(fake_vllm, role):
    fake = fake_vllm("--step-delay-s", "0.01", "--dead-exit-delay", "0.5")
    tree = fake.tree()
    streams = [Streamer(fake) for _ in range(3)]
    for s in streams:
        s.start()
    for s in streams:
        s.wait_chunks(2)
    t_kill = time.monotonic()
    fake.role(role).kill()
    statuses = set()
    while fake.popen.poll() is None and time.monotonic() - t_kill < 10:
        statuses.add(health(fake))
        time.sleep(0.05)
    assert fake.popen.wait(5) == 0          # vLLM exits 0 after EngineDeadError
    assert 503 in statuses                  # /health tells, briefly, before the exit
    for s in streams:
        s.join(10)
        assert s.error is None
        err = json.loads(s.events[-2][6:])
        assert s.events[-1] == "data: [DONE]" and err["error"]["code"] == 500
        assert "EngineCore" in err["error"]["message"] and s.arrivals[-1] - t_kill < 1.0
    assert procs.wait_gone(tree, 5) == []   # the rest of the tree went down with it
    assert "EngineDeadError" in fake.log_text()


def test_orphans_outlive_the_api_until_the_group_is_killed(fake_vllm):
    fake = fake_vllm("--orphans")
    engine, worker = fake.role("engine"), fake.role("worker")
    fake.role("api").kill()
    fake.popen.wait(5)
    time.sleep(0.3)
    assert procs.alive(engine) and procs.alive(worker)
    assert fake.stop() == []
    assert not procs.alive(engine) and not procs.alive(worker)


def test_without_orphans_the_tree_follows_the_api(fake_vllm):
    fake = fake_vllm()
    tree = fake.tree()
    fake.role("api").kill()
    assert procs.wait_gone(tree, 5) == []


def test_exit_hook_and_sigterm(fake_vllm):
    fake = fake_vllm()
    httpx.post(f"{fake.base_url}/exit?code=7", trust_env=False)
    assert fake.popen.wait(5) == 7
    fake = fake_vllm("--term-delay", "0.3")
    fake.popen.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    assert fake.popen.wait(5) == 0 and time.monotonic() - t0 >= 0.25
    assert "fake vllm got SIGTERM" in fake.log_text()


def test_ready_after_and_ignored_sigterm(fake_vllm):
    fake = fake_vllm("--ready-after", "30", "--ignore-sigterm", "api,worker", wait=False)
    deadline = time.monotonic() + 10
    while health(fake) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert health(fake) == 503 and post(fake, prompt="x").status_code == 503
    worker = fake.role("worker")
    fake.popen.send_signal(signal.SIGTERM)
    worker.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert fake.popen.poll() is None and procs.alive(worker)
    assert "fake vllm ignoring SIGTERM" in fake.log_text() and "fake vllm worker ignoring SIGTERM" in fake.log_text()


def test_crash(fake_vllm):
    with pytest.raises(RuntimeError, match="exited with 1"):
        fake_vllm("--crash", "ValueError: broken config")


def test_scenarios_by_model_name(fake_vllm):
    fake = fake_vllm(served_model_name="normal")   # the served name wins over a bare scenario name
    with make_client() as c:
        served = stream_completion(c, fake.base_url, "normal", PROMPTS[1], timeout_s=10)
        scenario = stream_completion(c, fake.base_url, "scenario:normal", PROMPTS[1], timeout_s=10)
        bare = stream_completion(c, fake.base_url, "cut", PROMPTS[1], timeout_s=10)
    assert served.ok and len(served.token_ids) == 24
    assert scenario.ok and scenario.token_ids == [10, 11, 12, 13, 14, 15]
    assert bare.error == "stream_cut"
    assert [b["model"] for b in fake.bodies] == ["normal", "scenario:normal", "cut"]
    assert fake.bodies[0]["prompt"] == PROMPTS[1].text
    with make_client() as c:
        flaky = [stream_completion(c, fake.base_url, "flaky", PROMPTS[1], timeout_s=10) for _ in range(3)]
    assert [r.status for r in flaky] == [503, 503, 200] and flaky[-1].ok
    assert fake.flaky_seen == {PROMPTS[1].text: 3}
    r = post(fake, model="scenario:nope", prompt="x")
    assert r.status_code == 404 and "unknown fake scenario" in r.json()["error"]["message"]


def test_every_process_is_gone_after_stop(fake_vllm):
    fake = fake_vllm("--orphans", "--ignore-sigterm", "api,engine,worker")
    tree = fake.tree()
    assert len(tree) == 3
    assert fake.stop() == [] and procs.wait_gone(tree, 0.1) == []
    assert procs.group_members(fake.pid) == []

"""The fake vLLM itself: streams, usage, metrics, determinism, and its process tree's faults.

Tests that only ask share two module-wide fakes (a speculative one, k = 4, and a plain
reference); a test that kills or freezes something starts its own.
"""

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
from tests.fakes import http_client, run_fake

pytestmark = pytest.mark.timeout(60)

PROMPTS = [Prompt(i, "short", f"the fake prompt number {i} says hello", 8, 24) for i in range(4)]
FAST = ("--step-delay-s", "0.001")


@pytest.fixture(scope="module")
def spec():
    with run_fake(*FAST, num_speculative_tokens=4) as fake:
        yield fake


@pytest.fixture(scope="module")
def ref():
    with run_fake(*FAST) as fake:
        yield fake


def metrics(fake) -> dict[tuple, float]:
    """``{(name, (label, value)...): value}`` of /metrics, read with Prometheus' own parser."""
    out = {}
    for family in text_string_to_metric_families(fake.metrics_text()):
        for s in family.samples:
            labels = {k: v for k, v in s.labels.items() if k not in ("engine", "model_name")}
            assert s.labels["model_name"] == fake.served_model_name
            out[(s.name, *sorted(labels.items()))] = s.value
    return out


def post(fake, **body) -> httpx.Response:
    with http_client(10) as c:
        return c.post(f"{fake.base_url}/v1/completions", json={"model": fake.served_model_name, **body})


def raw_stream(fake, **body) -> tuple[httpx.Response, list[str]]:
    """The lines of one streamed completion, as sent."""
    with http_client(10) as c:
        with c.stream("POST", f"{fake.base_url}/v1/completions",
                      json={"model": fake.served_model_name, "stream": True, **body}) as r:
            lines = list(r.iter_lines())
    return r, lines


def test_stream_is_well_formed_and_usage_and_metrics_count_what_was_streamed(spec):
    before = metrics(spec)
    r, lines = raw_stream(spec, prompt="hello there", max_tokens=13, temperature=0, ignore_eos=True,
                          stream_options={"include_usage": True}, return_token_ids=True)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["transfer-encoding"] == "chunked" and r.http_version == "HTTP/1.1"
    assert all(ln.startswith("data: ") for ln in lines if ln)
    events = [ln[len("data: "):] for ln in lines if ln]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    content, usage = chunks[:-1], chunks[-1]
    assert all(c["model"] == "fake" and c["object"] == "text_completion" for c in chunks)
    assert usage["choices"] == [] and usage["usage"]["prompt_tokens"] == 3
    ids = [t for c in content for t in c["choices"][0]["token_ids"]]
    assert usage["usage"]["completion_tokens"] == len(ids) == 13
    assert [len(c["choices"][0]["token_ids"]) for c in content] == [5, 5, 3]   # k+1 per step, all accepted
    assert [c["choices"][0]["finish_reason"] for c in content] == [None, None, "length"]
    assert "".join(c["choices"][0]["text"] for c in content) == "".join(f" w{t}" for t in ids)
    assert len(content[0]["choices"][0]["prompt_token_ids"]) == 3 and "prompt_token_ids" not in content[1]["choices"][0]
    # Non-streaming answers the same ids; the metrics count every step and accepted token of both.
    whole = post(spec, prompt="hello there", max_tokens=13, temperature=0, ignore_eos=True, return_token_ids=True)
    assert whole.status_code == 200
    assert whole.json()["choices"][0]["token_ids"] == ids and whole.json()["usage"]["completion_tokens"] == 13
    after = metrics(spec)

    def delta(name, **labels):
        key = (name, *sorted(labels.items()))
        return after[key] - before.get(key, 0.0)

    assert delta("vllm:spec_decode_num_drafts_total") == 6
    assert delta("vllm:spec_decode_num_draft_tokens_total") == 24
    assert delta("vllm:spec_decode_num_accepted_tokens_total") == 26 - 6
    assert [delta("vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i)) for i in range(4)] == \
        [6, 6, 4, 4]
    assert delta("vllm:generation_tokens_total") == 26
    assert delta("vllm:request_success_total", finished_reason="length") == 2
    assert after[("vllm:num_requests_running",)] == after[("vllm:num_requests_waiting",)] == 0
    assert after[("vllm:num_preemptions_total",)] == 0


def test_greedy_output_is_the_same_on_every_fake_and_sampling_takes_small_steps(spec, ref, fake_vllm):
    bad = fake_vllm(*FAST, "--mismatch")
    with make_client() as c:
        runs = {name: [stream_completion(c, f.base_url, "fake", p, timeout_s=10) for p in PROMPTS]
                for name, f in (("spec", spec), ("ref", ref), ("bad", bad))}
        assert all(r.ok for rs in runs.values() for r in rs)
        for s, r, b in zip(runs["spec"], runs["ref"], runs["bad"]):
            assert s.token_ids == r.token_ids and s.finish_reason == r.finish_reason
            assert s.output_tokens == len(s.token_ids) and s.prompt_tokens == 8
            assert set(r.chunk_tokens) == {1} and set(s.chunk_tokens[:-1]) <= {5}
            assert b.token_ids[:2] == r.token_ids[:2] and b.token_ids != r.token_ids   # differs from token 2 on
        bad.popen.kill()   # a restarted server (same port) answers the same
        bad.popen.wait(5)
        again = fake_vllm(*FAST, port=bad.port)
        assert [stream_completion(c, again.base_url, "fake", p, timeout_s=10).token_ids for p in PROMPTS] == \
            [r.token_ids for r in runs["ref"]]
    # Sampled (temperature 1): 1-2 tokens per step on the speculative server.
    r, lines = raw_stream(spec, prompt="sampled", max_tokens=40, temperature=1.0, ignore_eos=True,
                          return_token_ids=True)
    sizes = [len(json.loads(ln[6:])["choices"][0]["token_ids"]) for ln in lines if ln and ln != "data: [DONE]"]
    assert set(sizes) <= {1, 2} and sum(sizes) == 40 and 2 in sizes


def test_eos_ends_a_greedy_request_with_stop_unless_ignored(ref):
    # A prompt whose greedy sequence draws EOS within 40 tokens (found with the fake's own function).
    text = next(t for t in (f"eos probe {i}" for i in range(2000))
                if fv.EOS_ID in [fv.token_id(fv.greedy_seed(t), p) for p in range(1, 40)])
    stop = post(ref, prompt=text, max_tokens=40, temperature=0, return_token_ids=True).json()
    ids = stop["choices"][0]["token_ids"]
    assert stop["choices"][0]["finish_reason"] == "stop" and ids[-1] == fv.EOS_ID and len(ids) < 40
    assert stop["usage"]["completion_tokens"] == len(ids)
    full = post(ref, prompt=text, max_tokens=40, temperature=0, ignore_eos=True, return_token_ids=True).json()
    assert full["choices"][0]["finish_reason"] == "length" and full["choices"][0]["token_ids"][:len(ids)] == ids


def test_models_and_refusals(ref):
    with http_client() as c:
        models = c.get(f"{ref.base_url}/v1/models").json()
        assert c.get(f"{ref.base_url}/health").status_code == 200
    assert [m["id"] for m in models["data"]] == ["fake"]
    assert post(ref, model="nope", prompt="x").status_code == 404
    too_long = post(ref, prompt="x", max_tokens=5000)
    assert too_long.status_code == 400 and "maximum context length" in too_long.json()["error"]["message"]


def test_roles_are_found_by_the_harness(ref):
    roles = ref.roles()
    assert {k: len(v) for k, v in roles.items()} == {"api": 1, "engine": 1, "worker": 1}
    assert roles["engine"][0].ppid() == ref.pid and roles["worker"][0].ppid() == roles["engine"][0].pid
    assert procs.title_of(roles["worker"][0]).startswith("VLLM::Worker")


def test_scenarios_by_model_name_and_corrupt_usage(fake_vllm):
    fake = fake_vllm(*FAST, "--corrupt-usage", served_model_name="normal")   # the served name wins
    with make_client() as c:
        served = stream_completion(c, fake.base_url, "normal", PROMPTS[1], timeout_s=10, ignore_eos=True)
        scenario = stream_completion(c, fake.base_url, "scenario:normal", PROMPTS[1], timeout_s=10)
        bare = stream_completion(c, fake.base_url, "cut", PROMPTS[1], timeout_s=10)
        flaky = [stream_completion(c, fake.base_url, "flaky", PROMPTS[1], timeout_s=10) for _ in range(3)]
    assert served.ok and len(served.token_ids) == 24 and served.output_tokens == 25   # --corrupt-usage
    assert scenario.ok and scenario.token_ids == [10, 11, 12, 13, 14, 15]
    assert bare.error == "stream_cut"
    assert [r.status for r in flaky] == [503, 503, 200] and flaky[-1].ok
    assert [b["model"] for b in fake.bodies] == ["normal", "scenario:normal", "cut"] + ["flaky"] * 3
    assert fake.bodies[0]["prompt"] == PROMPTS[1].text
    assert fake.flaky_seen == {PROMPTS[1].text: 3}
    r = post(fake, model="scenario:nope", prompt="x")
    assert r.status_code == 404 and "unknown fake scenario" in r.json()["error"]["message"]


class Streamer(threading.Thread):
    """Streams one long greedy request, noting when each line arrived."""

    def __init__(self, fake, max_tokens: int = 400):
        super().__init__(daemon=True)
        self.fake, self.max_tokens = fake, max_tokens
        self.arrivals: list[float] = []
        self.events: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with http_client(30) as c:
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

    def settle(self, quiet_s: float = 0.15, timeout_s: float = 5.0) -> int:
        """Wait until nothing arrived for ``quiet_s``; the number of lines by then."""
        deadline = time.monotonic() + timeout_s
        n = len(self.arrivals)
        while time.monotonic() < deadline:
            time.sleep(quiet_s)
            if len(self.arrivals) == n:
                break
            n = len(self.arrivals)
        return n

    def tokens(self) -> int:
        return sum(len(json.loads(e[6:])["choices"][0]["token_ids"]) for e in self.events if e != "data: [DONE]")


def health(fake) -> int | None:
    try:
        with http_client(2) as c:
            return c.get(f"{fake.base_url}/health").status_code
    except httpx.HTTPError:
        return None


def test_sigstop_of_engine_or_worker_stops_tokens_while_health_stays_200(fake_vllm):
    fake = fake_vllm("--step-delay-s", "0.01")
    s = Streamer(fake, max_tokens=60)
    s.start()
    for role in ("engine", "worker"):
        s.wait_chunks(len(s.arrivals) + 3)
        victim = fake.role(role)
        victim.send_signal(signal.SIGSTOP)
        try:
            n = s.settle()   # a step already on its way back may still arrive
            for _ in range(3):
                assert health(fake) == 200, role
                time.sleep(0.1)
            assert len(s.arrivals) == n, f"tokens arrived while the {role} was frozen"
        finally:
            victim.send_signal(signal.SIGCONT)
    s.join(20)
    assert s.error is None and s.events[-1] == "data: [DONE]" and s.tokens() == 60


@pytest.mark.parametrize("role", ["worker", "engine"])
def test_death_in_the_tree_fails_streams_and_the_api_exits_0(fake_vllm, role):
    fake = fake_vllm("--step-delay-s", "0.01")
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
        time.sleep(0.03)
    assert fake.popen.wait(5) == 0          # vLLM exits 0 after EngineDeadError
    assert 503 in statuses                  # /health tells, briefly, before the exit
    for s in streams:
        s.join(10)
        assert s.error is None
        err = json.loads(s.events[-2][6:])
        assert s.events[-1] == "data: [DONE]" and err["error"]["code"] == 500
        assert "EngineCore" in err["error"]["message"] and s.arrivals[-1] - t_kill < 2.0
    assert procs.wait_gone(tree, 5) == []   # the rest of the tree went down with it
    assert "EngineDeadError" in fake.log_text()


def test_children_follow_the_api_unless_orphans(fake_vllm):
    follow, orphans = fake_vllm(), fake_vllm("--orphans")
    follow_tree = follow.tree()
    engine, worker = orphans.role("engine"), orphans.role("worker")
    follow.role("api").kill()
    orphans.role("api").kill()
    assert procs.wait_gone(follow_tree, 5) == []
    orphans.popen.wait(5)
    time.sleep(0.2)
    assert procs.alive(engine) and procs.alive(worker)   # as vLLM's may: only a group kill ends them
    assert orphans.stop() == []
    assert not procs.alive(engine) and not procs.alive(worker)


def test_exit_hook_and_sigterm(fake_vllm):
    hooked, termed = fake_vllm(), fake_vllm("--term-delay", "0.3")
    with http_client() as c:
        c.post(f"{hooked.base_url}/exit?code=7")
    termed.popen.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    assert termed.popen.wait(5) == 0 and time.monotonic() - t0 >= 0.25
    assert hooked.popen.wait(5) == 7
    assert "fake vllm got SIGTERM" in termed.log_text()


def test_ready_after_and_ignored_sigterm(fake_vllm):
    fake = fake_vllm("--ready-after", "30", "--ignore-sigterm", "api,engine,worker", "--orphans", wait=False)
    deadline = time.monotonic() + 10
    while health(fake) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert health(fake) == 503 and post(fake, prompt="x").status_code == 503
    tree = fake.tree()
    assert len(tree) == 3
    for p in tree:
        p.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    assert all(procs.alive(p) for p in tree)
    log = fake.log_text()
    assert "fake vllm ignoring SIGTERM" in log and "fake vllm worker ignoring SIGTERM" in log
    assert fake.stop() == [] and procs.wait_gone(tree, 0.1) == [] and procs.group_members(fake.pid) == []


def test_crash(fake_vllm):
    with pytest.raises(RuntimeError, match="exited with 1"):
        fake_vllm("--crash", "ValueError: broken config")

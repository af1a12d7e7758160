"""The real-stack coverage line (tests/coverage.py) over hand-written ledgers: a fault counts
only when it acted (evidence) against a real vLLM (the ledger's system: a launcher of the
allow-list and the version the server reported), and a missing family is reported and fails
the session (the ``--real-stack-coverage`` hook of tests/conftest.py, run by pytester)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from faults.base import Evidence
from faults.inject import reported_vllm_version, system_of
from faults.ledger import Ledger
from tests.coverage import coverage_line, families_acted, ledgers_under, real_vllm

REAL = {"launcher": "local", "vllm_version": "0.32.0", "server_vllm_version": "0.32.0"}


def write(path, faults):
    """faults: (kind, system, acted or None for no evidence)."""
    led = Ledger(path)
    for kind, system, acted in faults:
        fid = led.intend(kind, "spec", {}, system=system)
        led.injected(fid, {})
        if acted is not None:
            led.evidence(fid, Evidence(acted=acted, observations={}, detail=""))
        led.cleared(fid)
    return path


def test_only_faults_that_acted_against_a_real_vllm_count(tmp_path):
    a = write(tmp_path / "a" / "ledger.jsonl", [("process-kill", REAL, True), ("process-freeze", REAL, False),
                                                 ("network", {"launcher": "fake", "vllm_version": "0.32.0"}, True),
                                                 ("memory-hog", REAL, None)])
    b = write(tmp_path / "b" / "c" / "ledger.jsonl", [("process-kill", REAL, True), ("client-abort", {}, True)])
    (tmp_path / "b" / "ledger.jsonl").write_text('{"event": "intended", "fault_id": "x", "kind": "network", '
                                                 f'"system": {json.dumps(REAL)}}}\n{{not json\n')
    found = ledgers_under(tmp_path, tmp_path / "missing", None)
    assert found == sorted([a.resolve(), b.resolve(), (tmp_path / "b" / "ledger.jsonl").resolve()])
    acted = families_acted(found)
    assert dict(acted) == {"process-kill": 2}
    line, missing = coverage_line(acted, ["process-kill", "process-freeze", "network"])
    assert line == "real-stack coverage: process-kill"
    assert missing == ["network", "process-freeze"]
    assert coverage_line(acted, ["network"]) == ("real-stack coverage: (none)", ["network"])


def test_what_counts_as_a_real_vllm():
    for launcher in ("local", "docker", "external"):
        assert real_vllm({"launcher": launcher, "server_vllm_version": "0.32.0"}), launcher
    for system in ({}, None, {"launcher": "local"},
                   {"launcher": "local", "vllm_version": "0.32.0"},   # the installed package's word only
                   {"launcher": "local", "server_vllm_version": "fake"},
                   {"launcher": "external", "server_vllm_version": "unknown"},
                   # the allow-list: no fake counts, named in a deny-list or not
                   *({"launcher": fake, "vllm_version": "0.32.0", "server_vllm_version": "0.32.0"}
                     for fake in ("fake", "fake-mismatch", "fake-slow-restart", "fake-slow-steps", "stub", "custom"))):
        assert not real_vllm(system), system


class _Version(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"version": "0.32.0"}).encode()
        self.send_response(200 if self.path == "/version" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def version_server():
    """A loopback HTTP server answering ``GET /version`` as vLLM's does: its base URL."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Version)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_the_injector_records_the_stack_it_targets_and_the_version_its_server_reported(version_server, fake_vllm):
    stack = SimpleNamespace(launcher="local", vllm_version="0.32.0")
    assert reported_vllm_version(version_server) == "0.32.0"
    assert system_of(stack, reported_vllm_version(version_server)) == REAL and system_of(None) == {}
    assert system_of(stack) == {"launcher": "local", "vllm_version": "0.32.0"}   # no answer: left out
    assert system_of(type("S", (), {"launcher": "docker"})()) == {"launcher": "docker"}
    # a server that is gone, and the fake vLLM (no /version): nothing reported
    assert reported_vllm_version("http://127.0.0.1:9", timeout_s=1.0) == ""
    assert reported_vllm_version(fake_vllm().base_url) == ""



def test_the_ledger_of_an_injection_holds_the_version_the_server_reported(version_server, tmp_path, monkeypatch):
    from faults.inject import FaultInjector, InjectionContext
    from faults.ledger import read_ledger_lines
    from faults.registry import REGISTRY
    from harness.timeline import Timeline
    from tests.faults.test_inject import Flag

    monkeypatch.setitem(REGISTRY, Flag.kind, Flag)
    stack = SimpleNamespace(launcher="local", vllm_version="0.31.0",   # the package says one thing, the server another
                            servers={"spec": SimpleNamespace(base_url=version_server)})
    ctx = InjectionContext(None, Timeline(tmp_path / "t.jsonl"), Ledger(tmp_path / "ledger.jsonl"))
    with FaultInjector(ctx) as inj:
        inj.inject("test-flag", {"name": "before-the-stack"})   # no stack yet: nothing to ask
        ctx.stack = stack
        inj.inject("test-flag", {"name": "coverage"})
    intended = [e["system"] for e in read_ledger_lines(tmp_path / "ledger.jsonl") if e["event"] == "intended"]
    assert intended == [{}, {"launcher": "local", "vllm_version": "0.31.0", "server_vllm_version": "0.32.0"}]

def test_families_for_gpu_hosts_are_named_apart_on_a_host_without_one(monkeypatch):
    from faults.cuda_error import CudaError
    from faults.process_kill import ProcessKill
    from tests.coverage import gpu_only_families
    from tests.fakes.fake_nvml import install

    install(monkeypatch, {"gpus": [], "init_error": "library_not_found"})
    assert gpu_only_families({"cuda-error": CudaError, "process-kill": ProcessKill}) == {
        "cuda-error": "no NVIDIA GPU on this host (NVML: NVML Shared Library Not Found)"}
    from faults.registry import REGISTRY
    assert set(gpu_only_families(REGISTRY)) == {"cuda-error"}   # every other family is covered here
    install(monkeypatch, {"gpus": [{}]})   # a GPU: the family is covered like any other (here it lacks libcuda)
    assert "cuda-error" not in gpu_only_families({"cuda-error": CudaError})


# ---------------------------------------------------------------------- the session hook
#: A test session that writes one ledger: a fault of every registered family (less ``absent``)
#: intended against ``system``, with evidence that it acted.
LEDGERS = """
from faults.registry import REGISTRY
from tests.test_coverage import write


def test_faults_acted(tmp_path):
    write(tmp_path / "ledger.jsonl", [(kind, {system!r}, True) for kind in REGISTRY if kind not in {absent!r}])
"""


def coverage_session(pytester, system: dict, absent: tuple[str, ...] = ()):
    """Run :data:`LEDGERS` with ``--real-stack-coverage`` and tests/conftest.py's hooks."""
    pytester.makeconftest("from tests.conftest import pytest_addoption, pytest_sessionfinish, "
                          "pytest_terminal_summary  # noqa: F401\n")
    pytester.makepyfile(test_ledgers=LEDGERS.format(system=system, absent=absent))
    return pytester.runpytest("--real-stack-coverage", "-p", "no:cacheprovider")


def test_the_coverage_hook_passes_when_every_family_acted_against_a_real_vllm(pytester):
    from faults.registry import REGISTRY
    result = coverage_session(pytester, REAL)
    assert result.ret == 0, result.stdout.str()
    line = next(x for x in result.outlines if x.startswith("real-stack coverage: "))
    assert set(line.split(" (GPU hosts only")[0].split()[2:]) <= set(REGISTRY) and "FAILED" not in result.stdout.str()


@pytest.mark.parametrize("system, absent, missing", [
    (REAL, ("network",), "network"),                                    # a family never acted
    ({**REAL, "launcher": "fake-slow-restart"}, (), "process-kill"),    # a fake launcher: no family counts
    ({**REAL, "launcher": "fake-slow-steps"}, (), "process-kill"),
    ({"launcher": "local", "vllm_version": "0.32.0"}, (), "process-kill"),   # no version from the server
], ids=["family-missing", "fake-slow-restart", "fake-slow-steps", "no-server-version"])
def test_the_coverage_hook_fails_the_session_when_a_family_is_missing(pytester, system, absent, missing):
    result = coverage_session(pytester, system, absent)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.assert_outcomes(passed=1)   # the test itself passed: the hook failed the session
    failed = next(x for x in result.outlines if x.startswith("real-stack coverage: FAILED: no fault of "))
    assert missing in failed.split(" acted ")[0].split()

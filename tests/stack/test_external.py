"""The external launcher without a server: the capabilities it declares, the refusal of a
fault it cannot serve at validate (one line, exit 2, nothing started), the allow-list of
hosts, ``--launcher``, and integrity reported not judged without a reference. The run
against a real vLLM server is tests/experiment/test_external_e2e.py."""

from __future__ import annotations

import json

import pytest

from faults.base import Fault
from faults.registry import REGISTRY
from harness.checks.integrity import NEEDS_REFERENCE
from harness.experiment.config import SpecchaosConfig
from harness.net import ALLOW_HOSTS_ENV, LoopbackGet, allow_hosts, is_allowed_host
from harness.report.judge import judge_run
from harness.stack import capabilities as caps
from harness.stack.config import StackConfig
from harness.stack.external import ExternalServer, ExternalStack
from harness.stack.launchers import launcher_class
from harness.stack.local import LocalServer
from tests.experiment.files import EXPERIMENTS, MODELS
from tests.experiment.test_bad_input import assert_one_line_error, cli
from tests.procs import sut_pids
from tests.report.test_judge import META, write_run

KILL = EXPERIMENTS / "kill-draft-worker.yaml"
EXTERNAL = EXPERIMENTS / "external-endpoint.yaml"
URL = "http://127.0.0.1:8000"


# ------------------------------------------------------------------ capabilities (unit)

def test_local_servers_offer_every_capability_external_ones_only_readiness_and_metrics():
    assert caps.capabilities_of(LocalServer) == frozenset(caps.CAPABILITIES) - {"containers"}
    assert caps.capabilities_of(ExternalServer) == {"readiness", "metrics"}
    assert launcher_class("external").server_class is ExternalServer


def test_docker_servers_offer_every_capability_containers_included():
    assert caps.capabilities_of(launcher_class("docker").server_class) == frozenset(caps.CAPABILITIES)


def test_instances_are_checked_against_the_runtime_protocols():
    server = ExternalServer("spec", URL)
    assert isinstance(server, caps.Readiness) and isinstance(server, caps.MetricsEndpoint)
    assert not isinstance(server, caps.ProcessRoles) and not isinstance(server, caps.Supervised)
    assert caps.capabilities_of(server) == caps.capabilities_of(ExternalServer)
    assert isinstance(ExternalStack(StackConfig(launcher="external", spec_url=URL), "/tmp"), caps.TokenCounting)


def test_a_class_missing_one_member_lacks_the_capability():
    """The defect: a server class that offers roles() but no api_process() does not offer
    process ids, and one without the settled_at property is not supervised."""
    class HalfProcesses:
        def roles(self):
            return {}

    class NoSettled:   # a supervisor that cannot say when a restart is done
        state = "ready"

        def wait_for_incarnation(self, n, timeout_s=None):
            return None

        def restart_with_env(self, env, *, reason=""):
            return 1

    assert caps.missing(("processes",), HalfProcesses) == ["processes"]
    assert caps.missing(("processes", "readiness"), HalfProcesses) == ["processes", "readiness"]
    assert caps.missing(("supervision",), NoSettled) == ["supervision"]
    assert not caps.provides(HalfProcesses(), "processes")


def test_every_family_declares_known_capabilities():
    for kind, cls in REGISTRY.items():
        assert all(n in caps.CAPABILITIES for n in cls.needs), (kind, cls.needs)
    assert REGISTRY["process-kill"].needs == ("processes",)
    assert REGISTRY["network"].needs == () and REGISTRY["client-abort"].needs == ()
    assert set(REGISTRY["draft-swap"].needs) >= {"respeculation", "supervision"}
    with pytest.raises(KeyError):   # a wrong declaration is a bug, never "offered"
        caps.missing(("pids",), LocalServer)
    assert Fault.needs == ()


def test_the_refusal_names_the_fault_the_launcher_and_what_is_missing():
    line = caps.refusal("process-kill", ["processes"], "external", ExternalStack.summary, ["docker", "local"])
    assert line == ("process-kill needs process ids (capability `processes`); launcher `external` attaches to "
                    "URLs only: use launcher docker or local")
    assert "no registered launcher offers it" in caps.refusal("x", ["logs"], "external", "attaches", [])


# ------------------------------------------------------------------ validate (CLI, nothing started)

def test_a_kill_through_the_external_launcher_is_refused_at_validate_and_run(tmp_path):
    before = sut_pids()
    args = ("--launcher", "external", "--set", f"stack.spec_url={URL}", "--set", "stack.reference=false")
    assert_one_line_error(cli("validate", str(KILL), *args), "method[0].provider", "process-kill",
                          "process ids (capability `processes`)", "launcher `external` attaches to URLs only",
                          "use launcher docker or local")
    out = tmp_path / "out"
    assert_one_line_error(cli("run", str(KILL), "--out", str(out), *args), "process-kill", "launcher `external`")
    assert not (out / "ledger.jsonl").exists() and sut_pids() - before == set()


def test_the_breaker_is_refused_without_respeculation():
    res = cli("validate", str(EXTERNAL), "--set", "stack.breaker.enabled=true")
    assert_one_line_error(res, "stack.breaker.enabled", "speculation circuit breaker", "capability `respeculation`",
                          "launcher `external`")


def test_the_shipped_external_experiment_validates_with_loopback_urls():
    assert cli("validate", str(EXTERNAL), "--set", "stack.spec_url=http://localhost:9").returncode == 0
    assert cli("validate", str(EXTERNAL), "--set", "stack.spec_url=http://[::1]:9").returncode == 0


@pytest.mark.parametrize("url", ["http://10.0.0.5:8000", "http://vllm.staging.internal:8000"])
def test_a_host_off_loopback_needs_the_allow_list(url):
    host = url.split("//")[1].rsplit(":", 1)[0]
    assert_one_line_error(cli("validate", str(EXTERNAL), "--set", f"stack.spec_url={url}"),
                          "stack.spec_url", f"host '{host}' is not loopback and not in stack.allow_hosts")
    res = cli("validate", str(EXTERNAL), "--set", f"stack.spec_url={url}", "--set", f"stack.allow_hosts=[{host}]")
    assert res.returncode == 0, res.stderr
    assert_one_line_error(cli("validate", str(EXTERNAL), "--set", f"stack.reference_url={url}"),
                          "stack.reference_url", "not in stack.allow_hosts")


@pytest.mark.parametrize("sets, needles", [
    (["stack.spec_url=http://127.0.0.1:8000/v1"], ["stack.spec_url", "not a server root URL"]),
    (["stack.spec_url=ftp://127.0.0.1:8000"], ["stack.spec_url", "not a server root URL"]),
    (["stack.spec_url=http://127.0.0.1:8000#@10.0.0.5"], ["stack.spec_url", "not a server root URL"]),
    (["stack.spec_url=http://user:pw@127.0.0.1:8000"], ["stack.spec_url", "not a server root URL"]),
    (["stack.spec_url=http://127.0.0.1:0"], ["stack.spec_url", "not a server root URL"]),
    (["stack.spec_url=null"], ["set stack.spec_url"]),
    (["stack.reference=true"], ["needs stack.reference_url"]),
])
def test_bad_external_settings_are_one_line(sets, needles):
    args = [a for s in sets for a in ("--set", s)]
    assert_one_line_error(cli("validate", str(EXTERNAL), *args), *needles)


def test_urls_are_for_the_external_launcher_only():
    assert_one_line_error(cli("validate", str(EXTERNAL), "--launcher", "local"),
                          "spec_url/reference_url are for launcher external", "launcher 'local'")


@pytest.mark.skipif(not (MODELS / "manifest.json").exists(), reason="models not built (make test builds them)")
def test_launcher_option_overrides_the_file_and_wins_over_set():
    res = cli("validate", str(KILL), "--set", "stack.launcher=external", "--launcher", "local")
    assert res.returncode == 0 and "2 override(s) applied" in res.stdout, res.stdout + res.stderr
    assert_one_line_error(cli("validate", str(KILL), "--launcher", "nowhere"), "unknown launcher 'nowhere'")


def test_the_url_is_normalised_with_its_port():
    cfg = StackConfig(launcher="external", spec_url="http://localhost", reference_url="https://[::1]/")
    assert (cfg.spec_url, cfg.reference_url, cfg.reference) == ("http://localhost:80", "https://[::1]:443", True)
    assert StackConfig(launcher="external", spec_url=URL).reference is False


# ------------------------------------------------------------------ allow-list (unit)

def test_allowed_hosts_reach_every_traffic_path(monkeypatch):
    monkeypatch.delenv(ALLOW_HOSTS_ENV, raising=False)
    assert not is_allowed_host("10.0.0.5") and is_allowed_host("127.0.0.2")
    with pytest.raises(ValueError):
        LoopbackGet("http://10.0.0.5:80", 1.0)
    allow_hosts(["10.0.0.5", "[FD00::1]"])
    try:
        assert is_allowed_host("10.0.0.5") and is_allowed_host("fd00::1") and not is_allowed_host("10.0.0.6")
        LoopbackGet("http://10.0.0.5:80", 1.0).close()
    finally:
        allow_hosts(())
    assert ALLOW_HOSTS_ENV not in __import__("os").environ and not is_allowed_host("10.0.0.5")


# ------------------------------------------------------------------ integrity without a reference

def test_integrity_is_not_judged_without_a_reference(tmp_path):
    """No reference server: the checks that compare outputs are N/J with the reason, never a
    silent pass; with one, the same records are judged (and a missing comparison fails)."""
    d = write_run(tmp_path / "run", reference=[])
    meta = dict(META, stack=dict(META["stack"], launcher="external"))
    cfg = SpecchaosConfig.model_validate({"stack": {"launcher": "external", "spec_url": URL}})
    checks = {c["name"]: c for c in judge_run(d, cfg, meta)["checks"]}
    for name in NEEDS_REFERENCE:
        assert checks[name]["passed"] is None and not checks[name]["judged"], checks[name]
        assert "launcher external without stack.reference_url" in checks[name]["detail"]
    assert checks["integrity.malformed"]["judged"]   # judged without a reference
    local = {c["name"]: c for c in judge_run(d, SpecchaosConfig.model_validate({}), META)["checks"]}
    assert local["integrity.compared"]["passed"] is False   # a reference was configured: nothing compared fails
    json.dumps(checks)

"""The recipes of docs/explanation/extending.md, done for real: a trivial fault family and a trivial check,
each written in a temporary module, registered with one line, and run through the fast
end-to-end path (:mod:`tests.experiment.fast_e2e`) next to the built-in ones."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

from faults.registry import REGISTRY, register_fault, unregister_fault
from harness.checks.registry import CHECKS, CheckFamily, register_check, unregister_check
from harness.experiment import actions
from tests.experiment.fast_e2e import run_fast

pytestmark = pytest.mark.timeout(180)

FAMILY = '''
"""Fault family ``touch-file``: a file exists while the fault is active (trivial, reversible)."""
from pathlib import Path
from typing import ClassVar

from faults.base import Evidence, Fault, FaultContext, FaultParams


class TouchFileParams(FaultParams):
    """path: the file to create."""
    path: str


class TouchFile(Fault):
    """Create a file; remove it when cleared."""
    kind: ClassVar[str] = "touch-file"
    activity: ClassVar[str] = "touch_file"
    Params = TouchFileParams

    def describe_target(self, ctx: FaultContext) -> str:
        return self.params.path

    def inject(self, ctx: FaultContext) -> dict:
        Path(self.params.path).write_text("fault")
        return {"path": self.params.path, "servers": sorted(ctx.servers)}

    def evidence(self, ctx: FaultContext, timeout_s: float) -> Evidence:
        there = Path(self.params.path).exists()
        return Evidence(there, {"exists": there}, "the file exists" if there else "no file")

    def clear(self, ctx: FaultContext) -> None:
        Path(self.params.path).unlink(missing_ok=True)
'''

CHECK = '''
"""Check family ``request_count``: the run sent at least one load request."""
from harness.checks.base import CheckResult, RecordedRun


def check(run: RecordedRun) -> list[CheckResult]:
    n = len(run.records)
    return [CheckResult("request_count.total", "coverage", n > 0, n, 1, f"{n} load requests recorded")]


def section(run: RecordedRun) -> dict:
    return {"total": len(run.records), "phases": {ph: len(rs) for ph, rs in run.members.items()}}
'''


TUNNEL = '''
"""Fault family ``tunnel``: the load goes through a TCP relay set up before the load starts
(``prepare``); the fault's evidence is the traffic measured through it."""
import socket
import threading
from typing import ClassVar
from urllib.parse import urlsplit

from faults.base import Evidence, Fault, FaultContext, FaultParams


class TunnelParams(FaultParams):
    """server: whose load path to relay."""
    server: str = "spec"


class Tunnel(Fault):
    """Relay the load to one server through a loopback TCP relay."""
    kind: ClassVar[str] = "tunnel"
    activity: ClassVar[str] = "tunnel"
    Params = TunnelParams

    def prepare(self, ctx: FaultContext) -> None:
        up = urlsplit(ctx.load_urls[self.params.server])
        self.upstream = (up.hostname, up.port)
        self.bytes = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()
        ctx.load_urls[self.params.server] = f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                continue
            upstream = socket.create_connection(self.upstream)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src, dst) -> None:
        try:
            while data := src.recv(65536):
                self.bytes += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def describe_target(self, ctx: FaultContext) -> str:
        return f"{self.params.server}/load-path"

    def inject(self, ctx: FaultContext) -> dict:
        self.at_inject = self.bytes
        return {"bytes_before": self.bytes}

    def evidence(self, ctx: FaultContext, timeout_s: float) -> Evidence:
        import time
        time.sleep(1.0)
        moved = self.bytes - self.at_inject
        return Evidence(moved > 0, {"bytes_relayed": moved}, f"{moved} bytes relayed in 1 s")

    def clear(self, ctx: FaultContext) -> None:
        return None

    def release(self, ctx: FaultContext) -> None:
        self.stopped.set()
        self.listener.close()
'''


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """Write the two temporary modules, register them (one line each), undo afterwards."""
    (tmp_path / "recipe_fault.py").write_text(textwrap.dedent(FAMILY))
    (tmp_path / "recipe_check.py").write_text(textwrap.dedent(CHECK))
    (tmp_path / "recipe_tunnel.py").write_text(textwrap.dedent(TUNNEL))
    monkeypatch.syspath_prepend(str(tmp_path))
    fam = importlib.import_module("recipe_fault")
    chk = importlib.import_module("recipe_check")
    register_fault(fam.TouchFile)                                                # the registry line
    register_fault(importlib.import_module("recipe_tunnel").Tunnel)
    register_check(CheckFamily("request_count", chk.check, chk.section))         # the registry line
    actions.refresh_fault_actions()   # registered at run time: regenerate the typed actions
    yield tmp_path
    unregister_fault("touch-file")
    unregister_fault("tunnel")
    unregister_check("request_count")
    actions.refresh_fault_actions()
    for mod in ("recipe_fault", "recipe_check", "recipe_tunnel"):
        sys.modules.pop(mod, None)


def test_a_new_family_and_a_new_check_run_through_the_whole_path(plugins):
    marker = plugins / "marker"
    method = [{"type": "action", "name": "touch-a-file",
               "provider": {"type": "python", "module": "harness.experiment.actions", "func": "touch_file",
                            "arguments": {"path": str(marker), "duration_s": 1.0}}}]
    code, rep, seconds, out = run_fast(plugins, "recipe", method=method)
    assert "touch-file" in REGISTRY and "request_count" in CHECKS
    failed = [c for c in rep["checks"] if not c["passed"]]
    assert code == 0 and rep["verdict"] == "pass", (rep["errors"], failed)
    (fault,) = rep["faults"]
    assert fault["kind"] == "touch-file" and fault["acted"] and fault["cleared_at"] is not None
    assert not marker.exists(), "the fault was not cleared"
    c = {c["name"]: c for c in rep["checks"]}["request_count.total"]
    assert c["passed"] and c["observed"] == rep["requests"]["total"]
    assert rep["request_count"]["total"] == rep["requests"]["total"]


def test_a_fault_can_put_itself_on_the_load_path_without_touching_the_session(plugins):
    method = [{"type": "action", "name": "relay-the-load",
               "provider": {"type": "python", "module": "harness.experiment.actions", "func": "tunnel",
                            "arguments": {"server": "spec"}}}]
    # the relay is a thread of this (test) process: under parallel tests its per-token latency
    # swings, and on a loaded host it may deliver most responses of a phase in one chunk (a p95
    # TPOT of 0: a ratio to it is undefined and fails). What is judged here is the load path:
    # every other check passes, and the exit code is the verdict's
    code, rep, _, _ = run_fast(plugins, "tunnel", method=method,
                               degradation={"after_vs_baseline_max_ratio": 100.0, "fault_vs_baseline_max_ratio": 100.0})
    failed = [c for c in rep["checks"] if c["passed"] is False]
    assert not rep["errors"] and not [c for c in failed if not c["name"].endswith("_p95_ratio")], failed
    assert code == (1 if failed else 0) and rep["verdict"] == ("fail" if failed else "pass")
    (fault,) = rep["faults"]
    assert fault["kind"] == "tunnel" and fault["acted"]
    assert fault["evidence"]["observations"]["bytes_relayed"] > 0   # the load really went through it


def test_a_typed_action_rejects_an_unknown_argument_like_chaos_toolkit(plugins):
    with pytest.raises(TypeError):
        actions.touch_file(path="x", nope=1)

"""The cgroup families at the experiment level: bad input through the real CLI (one line
naming the field, exit 2, nothing applied: no ledger, no cgroup), the thermal experiment
validates, the fast end-to-end path on the fake vLLM with a real cgroup quota (evidence,
clear, nothing left, the report's GPU note), and the throttle's effect on the real stack
(tokens/s against the window before it), on the session's shared stack."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from faults import cgroup
from faults.inject import FaultInjector, InjectionContext
from faults.ledger import Ledger
from faults.registry import make_fault
from harness import gpu
from harness.timeline import Timeline
from tests.experiment.fast_e2e import fast_experiment, run_fast
from tests.experiment.files import EXPERIMENTS, ROOT, experiment_doc, write
from tests.experiment.test_bad_input import assert_one_line_error, cli
from tests.faults.cgroups import no_cgroup_left  # noqa: F401 - autouse fixture
from tests.faults.cgroups import needs_cgroup, not_writable_root, specchaos_cgroups
from tests.procs import sut_pids, wait_for

EXPERIMENT = EXPERIMENTS / "thermal-throttle.yaml"


def thermal_doc(func: str = "throttle_cpu", **arguments) -> dict:
    d = experiment_doc(EXPERIMENT.name)
    prov = d["method"][0]["provider"]
    if func != prov["func"]:
        prov["func"], prov["arguments"] = func, {"server": "spec", "duration_s": 5}
    prov["arguments"].update(arguments)
    return d


def left_cgroups() -> list[Path]:
    out = []
    for controller in ("cpu", "memory"):
        try:
            out += specchaos_cgroups(controller)
        except Exception:   # noqa: BLE001 - no such hierarchy here
            pass
    return out


# ------------------------------------------------------------------ bad input

@pytest.mark.parametrize("func, arguments, needles", [
    ("throttle_cpu", {"duration_s": -1}, ["method[0].provider.arguments.duration_s", "greater than or equal to 0"]),
    ("throttle_cpu", {"cpu_fraction": 1.5}, ["method[0].provider.arguments.cpu_fraction", "less than or equal to 1"]),
    ("throttle_cpu", {"cpu_fraction": 0}, ["method[0].provider.arguments.cpu_fraction", "greater than 0"]),
    ("throttle_cpu", {"roles": ["drafter"]}, ["method[0].provider.arguments.roles.0", "'api', 'engine' or 'worker'"]),
    ("throttle_cpu", {"gpu_clocks_mhz": 900}, ["method[0].provider.arguments.gpu_clocks_mhz", "no NVIDIA GPU"]),
    ("limit_memory", {"limit_gib": 100000}, ["method[0].provider.arguments.limit_gib",
                                              "more than this machine's memory"]),
    ("limit_memory", {"limit_gib": -1}, ["method[0].provider.arguments.limit_gib", "greater than 0"]),
    ("limit_memory", {"limit_bytes": 0}, ["method[0].provider.arguments.limit_bytes", "greater than 0"]),
    ("limit_memory", {}, ["method[0].provider.arguments", "exactly one of limit_gib, limit_bytes, usage_factor"]),
])
def test_bad_arguments_are_one_line_and_nothing_is_applied(tmp_path, models_built, func, arguments, needles):
    if "gpu_clocks_mhz" in arguments and gpu.unavailable() is None:
        pytest.skip("this host has an NVIDIA GPU")
    before = sut_pids()
    res = cli("run", str(write(tmp_path, thermal_doc(func, **arguments))), "--out", str(tmp_path / "o"))
    assert_one_line_error(res, *needles)
    # no ledger: no fault was even intended, so no cgroup of this run exists (the hierarchy as a
    # whole is not compared: other xdist workers make cgroups meanwhile)
    assert not (tmp_path / "o" / "ledger.jsonl").exists() and not (tmp_path / "o" / "timeline.jsonl").exists()
    assert sut_pids() - before == set()


@needs_cgroup("cpu")
@pytest.mark.parametrize("func, arguments, field", [
    ("throttle_cpu", {"mechanism": "cgroup"}, "mechanism"),
    ("limit_memory", {"limit_gib": 1}, None),
])
def test_a_cgroup_that_is_not_writable_fails_validation(tmp_path, models_built, monkeypatch, func, arguments, field):
    controller = "cpu" if func == "throttle_cpu" else "memory"
    root = not_writable_root(tmp_path, controller)
    monkeypatch.setenv(cgroup.ROOT_ENV, str(root))
    res = cli("validate", str(write(tmp_path, thermal_doc(func, **arguments))))
    at = "method[0].provider.arguments" + (f".{field}" if field else ":")
    line = assert_one_line_error(res, at, f"cgroup {root / controller}",
                                 "not writable (Operation not permitted)")
    assert "duty_cycle" in line or func == "limit_memory"


def test_the_thermal_experiment_validates(models_built):
    res = cli("validate", str(EXPERIMENT))
    assert res.returncode == 0, res.stderr


# ------------------------------------------------------------------ fast path (fake vLLM, real cgroup)

@needs_cgroup("cpu")
@pytest.mark.timeout(180)
def test_a_cpu_quota_on_the_fake_stack_acts_is_lifted_and_reports_the_gpu_note(tmp_path):
    method = [{"type": "action", "name": "throttle",
               "provider": {"type": "python", "module": "harness.experiment.actions", "func": "throttle_cpu",
                            "arguments": {"server": "spec", "cpu_fraction": 0.05, "mechanism": "cgroup",
                                          "duration_s": 6}}}]
    code, rep, seconds, out = run_fast(tmp_path, "thermal", method=method)
    (fault,) = rep["faults"]
    ev = fault["evidence"]["observations"]
    assert fault["kind"] == "cpu-throttle" and fault["acted"], (rep["errors"], fault["evidence"]["detail"])
    assert ev["mechanism"] == "cgroup" and ev["quota_read_back_cpus"] == 0.05 and ev["throttled_periods"] > 0
    assert ev["cpu_used_cpus"] <= 0.05 * 1.1 + 0.02
    assert ev["tokens_per_s_before"] is not None and ev["tokens_per_s_during"] is not None
    assert fault["cleared_at"] is not None and not [d for d in left_cgroups() if fault["fault_id"] in d.name]
    (entry,) = Ledger(out / "ledger.jsonl").entries()
    assert entry["state"] == "cleared"
    if gpu.unavailable():
        assert rep["gpu"]["available"] is False and rep["gpu"]["note"].startswith(gpu.NO_GPU)
        assert not (out / "gpu.jsonl").exists()
    assert code in (0, 1) and rep["verdict"] in ("pass", "fail"), rep["errors"]


@needs_cgroup("cpu")
@needs_cgroup("memory")
@pytest.mark.timeout(180)
@pytest.mark.parametrize("func, arguments, controller", [
    ("throttle_cpu", {"cpu_fraction": 0.5, "mechanism": "cgroup"}, "cpu"),
    ("limit_memory", {"limit_gib": 1}, "memory"),
], ids=["cpu-throttle", "memory-limit"])
def test_sigterm_mid_fault_clears_the_cgroup(tmp_path, func, arguments, controller):
    """``specchaos run`` (fake stack) SIGTERMed while the fault holds the server's tree:
    the run's own teardown lifts it (ledger cleared, no cgroup left), exit 2."""
    method = [{"type": "action", "name": "cgroup-fault",
               "provider": {"type": "python", "module": "harness.experiment.actions", "func": func,
                            "arguments": {"server": "spec", "duration_s": 120, **arguments}}}]
    exp = fast_experiment(tmp_path, "sigterm", method=method)
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONUNBUFFERED="1", SPECCHAOS_LAUNCHERS="fake=tests.fakes.stack:FakeStack")
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", str(exp), "--out", str(out)], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ledger = Ledger(out / "ledger.jsonl")
        wait_for(lambda: any(e["state"] == "injected" for e in ledger.entries()), 120, "the fault")
        (entry,) = ledger.entries()
        path = Path(entry["facts"]["cgroup"]["path"])
        assert path.is_dir() and cgroup.read_values(path, ["cgroup.procs"])["cgroup.procs"]
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, output[-3000:]
    assert [e["state"] for e in Ledger(out / "ledger.jsonl").entries()] == ["cleared"]
    assert not path.exists() and not [d for d in left_cgroups() if entry["fault_id"] in d.name]


# ------------------------------------------------------------------ real stack

class Streams:
    """``n`` threads streaming greedy completions to a server until stopped."""

    def __init__(self, base_url: str, model: str, n: int = 3):
        self.base_url, self.model = base_url, model
        self._stop = threading.Event()
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(n)]

    def _loop(self) -> None:
        with httpx.Client(timeout=60, trust_env=False) as c:
            while not self._stop.is_set():
                try:
                    with c.stream("POST", f"{self.base_url}/v1/completions", json={
                            "model": self.model, "prompt": "The weather today", "max_tokens": 64,
                            "temperature": 0, "ignore_eos": True, "stream": True}) as r:
                        for _ in r.iter_lines():
                            pass
                except httpx.HTTPError as exc:
                    self.errors.append(repr(exc))

    def __enter__(self) -> "Streams":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self.threads:
            t.join(timeout=60)


@pytest.mark.stack
@needs_cgroup("cpu")
@pytest.mark.timeout(300)
def test_a_cpu_quota_drops_tokens_per_second_on_the_real_stack(real_stack, tmp_path):
    """0.3 CPU on the speculative server's whole tree (the shared stack, restored after):
    the quota read back, the tree held to it, output tokens/s from vLLM's own counter well
    below the 4 s before; after the clear the tree is back in its cgroup and generating."""
    spec = real_stack.stack.servers["spec"]
    inj = FaultInjector(InjectionContext(real_stack.stack, Timeline(tmp_path / "timeline.jsonl"),
                                         Ledger(tmp_path / "ledger.jsonl")))
    with Streams(spec.base_url, spec.model) as load:
        time.sleep(3)                                          # the load reaches steady state
        try:
            fault = make_fault("cpu-throttle", {"server": "spec", "cpu_fraction": 0.3, "mechanism": "cgroup"})
            inj.prepare([fault])
            time.sleep(5)                                      # the "before" window
            handle = inj.inject("cpu-throttle", {"server": "spec", "cpu_fraction": 0.3, "mechanism": "cgroup"})
            ev = inj.collect_evidence(handle, timeout_s=30)
        finally:
            inj.clear_all()
            inj.release_all()
        time.sleep(3)
    o = ev.observations
    print(f"\n[measure] cpu-throttle 0.3 CPU on the real spec tree: {ev.detail}")
    assert ev.acted, ev.detail
    assert o["quota_read_back_cpus"] == 0.3 and o["cpu_used_cpus"] <= 0.35 and o["throttled_periods"] > 0
    assert o["tokens_per_s_before"] > 0 and o["tokens_ratio"] < 0.7, o
    assert not load.errors, load.errors[:3]
    assert not [d for d in left_cgroups() if handle.fault_id in d.name]
    h = cgroup.hierarchy("cpu")
    assert all(cgroup.cgroup_of(p.pid, h) == cgroup.cgroup_of("self", h)
               for procs in spec.roles().values() for p in procs)

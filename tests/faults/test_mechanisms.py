"""Mechanisms below the families (:mod:`faults.mechanisms`): the selector's choice from the
server's capabilities and the family's argument (refusals keep their words), the Docker
engine's mechanisms driven by the four families against a fake container (no engine), and
a new mechanism — one class and one registry line — used by ``cpu-throttle`` unedited."""

from __future__ import annotations

import re
import signal
import time
from typing import Any, ClassVar

import psutil
import pytest

from faults import mechanisms
from faults.cpu_throttle import CpuThrottle
from faults.ledger import Ledger
from faults.mechanisms import Mechanism, Target
from faults.memory_limit import MemoryLimit
from faults.process_freeze import ProcessFreeze
from faults.registry import make_fault
from harness.errors import FaultError

from .cgroups import PlainServer, python
from .conftest import ServersStack, wait_until

pytestmark = pytest.mark.timeout(60)


class FakeContainer:
    """What the mechanisms use of a ``docker`` SDK ``Container``: ``update`` sets the
    ``HostConfig`` limits, ``pause``/``unpause`` the state, ``kill`` signals the init
    (``State.Pid``); ``stats`` counts CPU time at the quota and a throttled period per 10 ms."""

    name, id = "specchaos-spec-fake", "c0ffee"

    def __init__(self, init_pid: int):
        self.attrs: dict[str, Any] = {"HostConfig": {"CpuQuota": 0, "CpuPeriod": 0, "Memory": 0},
                                      "State": {"Paused": False, "Pid": init_pid}}
        self.t0 = time.monotonic()

    def reload(self) -> None:
        pass

    def update(self, cpu_quota: int | None = None, cpu_period: int | None = None, mem_limit: int | None = None,
               memswap_limit: int | None = None) -> None:
        hc = self.attrs["HostConfig"]
        hc.update({k: v for k, v in (("CpuQuota", cpu_quota), ("CpuPeriod", cpu_period), ("Memory", mem_limit))
                   if v is not None})

    def pause(self) -> None:
        self.attrs["State"]["Paused"] = True

    def unpause(self) -> None:
        self.attrs["State"]["Paused"] = False

    def kill(self, signal: str) -> None:
        psutil.Process(self.attrs["State"]["Pid"]).send_signal(getattr(__import__("signal"), signal))

    def stats(self, stream: bool = False) -> dict[str, Any]:
        hc, dt = self.attrs["HostConfig"], time.monotonic() - self.t0
        share = hc["CpuQuota"] / hc["CpuPeriod"] if hc["CpuQuota"] > 0 else 1.0
        return {"cpu_stats": {"cpu_usage": {"total_usage": int(dt * share * 1e9)},
                              "throttling_data": {"throttled_periods": int(dt * 100), "periods": int(dt * 100)}},
                "memory_stats": {"usage": 100 << 20, "limit": hc["Memory"] or 1 << 40, "max_usage": 110 << 20}}


class ContainerServer(PlainServer):
    """A plain process tree that runs "in" a :class:`FakeContainer` (capability ``containers``)."""

    def __init__(self, proc: psutil.Process, c: FakeContainer | None = None):
        super().__init__(proc)
        self.c = c or FakeContainer(proc.pid)

    def container(self) -> FakeContainer:
        return self.c

    def container_name(self) -> str:
        return self.c.name


@pytest.fixture
def plain(started) -> PlainServer:
    return PlainServer(psutil.Process(started.popen(["sleep", "60"]).pid))


@pytest.fixture
def boxed(started) -> ContainerServer:
    return ContainerServer(psutil.Process(started.popen(["sleep", "60"]).pid))


def target(srv: Any, roles: list[str] | None = None) -> Target:
    return Target(srv, "spec", "spec/tree", "f-test", roles)


def test_a_container_gets_the_engines_mechanisms_and_a_process_tree_the_hosts(plain, boxed):
    assert mechanisms.select("cpu", target(boxed))[0].name == "container"
    assert mechanisms.select("memory", target(boxed))[0].name == "container"
    assert mechanisms.select("freeze", target(boxed, ["container"]), "container")[0].name == "docker_pause"
    assert mechanisms.select("kill", target(boxed, ["container"]), "container")[0].name == "container"
    assert mechanisms.select("kill", target(boxed, ["worker"]), "worker")[0].name == "signal"
    assert mechanisms.select("freeze", target(plain, ["engine"]), "engine")[0].name == "signal"
    mech, why = mechanisms.select("cpu", target(boxed), "cgroup")
    assert mech.name == "container" and why == "a container's cgroup is Docker's: its quota set through the engine"
    mech, why = mechanisms.select("cpu", target(boxed, ["worker"]))
    assert mech.name == "duty_cycle" and why == "per-role limits in a container: its cgroups are Docker's"
    assert mechanisms.select("cpu", target(plain), "duty_cycle")[0].name == "duty_cycle"


@pytest.mark.parametrize("action, asked, roles, words", [
    ("cpu", "cgroup", ["worker"], "mechanism cgroup for single roles would move the container's processes out of "
                                  "Docker's cgroups"),
    ("memory", "auto", ["worker"], "a memory limit on single roles needs a cgroup of the harness's own"),
    ("memory", "cgroup", ["worker"], "out of Docker's cgroups: limit the whole container (no roles)"),
])
def test_per_role_cgroups_on_a_container_are_refused_in_their_words(boxed, action, asked, roles, words):
    with pytest.raises(FaultError, match=re.escape(words)) as ei:
        mechanisms.select(action, target(boxed, roles), asked)
    assert ei.value.where == "spec/tree"


def test_validation_refuses_per_role_cgroups_on_containers_in_the_same_words():
    cpu = make_fault("cpu-throttle", {"mechanism": "cgroup", "roles": ["worker"]})
    assert cpu.excluded() == {"containers": "mechanism cgroup for single roles would move the container's processes "
                                            "out of Docker's cgroups: limit the whole container (no roles), or use "
                                            "mechanism duty_cycle"}
    assert make_fault("memory-limit", {"roles": ["worker"], "usage_factor": 2}).excluded() == {
        "containers": "a memory limit on single roles needs a cgroup of the harness's own, which would move the "
                      "container's processes out of Docker's cgroups: limit the whole container (no roles)"}
    assert make_fault("cpu-throttle", {"mechanism": "container"}).required() == ("containers",)
    assert make_fault("cpu-throttle", {}).excluded() == {} and make_fault("memory-limit", {"limit_gib": 0.1}).excluded() == {}


@pytest.mark.parametrize("action, asked", [("cpu", "container"), ("memory", "container"), ("freeze", "container"),
                                           ("kill", "container")])
def test_a_container_mechanism_asked_of_a_process_tree_is_refused(plain, action, asked):
    with pytest.raises(FaultError, match="server spec does not run in a container"):
        mechanisms.select(action, target(plain, ["container"] if action in ("freeze", "kill") else None), asked)


def test_the_families_drive_the_engines_mechanisms(boxed, make_injector, tmp_path):
    inj = make_injector(ServersStack(spec=boxed))
    hc = boxed.c.attrs["HostConfig"]
    h = inj.inject("cpu-throttle", {"cpu_fraction": 0.3})
    assert h.facts["mechanism"] == "container" and h.facts["container_name"] == boxed.c.name
    assert h.facts["read_back"] == {"cpu_quota_us": 30000, "cpu_period_us": 100000} and hc["CpuQuota"] == 30000
    ev = inj.collect_evidence(h, timeout_s=6)
    assert ev.acted is True and ev.observations["quota_read_back_cpus"] == 0.3, ev.detail
    inj.clear(h)
    assert hc["CpuQuota"] == -1

    h = inj.inject("memory-limit", {"usage_factor": 1.5})
    assert h.facts["mechanism"] == "container" and h.facts["limit_bytes"] == 150 << 20 == hc["Memory"]
    ev = inj.collect_evidence(h, timeout_s=2)
    assert ev.acted is True and ev.observations["limit_read_back"] == 150 << 20, ev.detail
    inj.clear(h)
    assert hc["Memory"] == mechanisms.container.MEMORY_LIFTED_BYTES

    h = inj.inject("process-freeze", {"role": "container"})
    assert h.facts["mechanism"] == "docker_pause" and boxed.c.attrs["State"]["Paused"] is True
    ev = inj.collect_evidence(h, timeout_s=1)
    assert ev.acted is True and ev.observations["metrics_answered"] is False, ev.detail
    inj.clear(h)
    assert boxed.c.attrs["State"]["Paused"] is False

    h = inj.inject("process-kill", {"role": "container", "expect_restart": False})
    assert h.facts["mechanism"] == "container" and h.facts["pids"] == [boxed.proc.pid]
    assert inj.collect_evidence(h, timeout_s=10).acted is True
    inj.clear(h)
    assert [e["state"] for e in Ledger(tmp_path / "ledger.jsonl").entries()] == ["cleared"] * 4


def test_a_limit_the_engine_does_not_report_is_no_evidence(boxed, make_injector, monkeypatch):
    """The defect: the engine accepted the update but reports another quota."""
    inj = make_injector(ServersStack(spec=boxed))
    h = inj.inject("cpu-throttle", {"cpu_fraction": 0.3})
    boxed.c.attrs["HostConfig"]["CpuQuota"] = 50000
    ev = inj.collect_evidence(h, timeout_s=4)
    assert ev.acted is False and "not the limit asked" in ev.detail
    inj.clear(h)


# ------------------------------------------------------------------ a new mechanism: one class, one registry line

class ThermoServer(PlainServer):
    """A launcher's server whose CPU is capped by its own thermostat (no cgroup, no container)."""

    cap: float | None = None


class Thermostat(Mechanism):
    """cpu-throttle for :class:`ThermoServer`: sets its cap; reads it back."""

    name: ClassVar[str] = "thermostat"
    action: ClassVar[str] = "cpu"
    measured_by = "the thermostat's setting; "
    recovered: ClassVar[list[dict[str, Any]]] = []

    @classmethod
    def serves(cls, srv: Any) -> bool:
        return isinstance(srv, ThermoServer)

    def apply(self, cpu_fraction: float, period_s: float) -> dict[str, Any]:
        self.t.srv.cap = cpu_fraction
        return {"read_back": {"cap": self.t.srv.cap}}

    def observe(self, window_s: float, limit_cpus: float, obs: dict[str, Any]) -> tuple[bool, str]:
        obs["quota_read_back_cpus"] = self.t.srv.cap
        return self.t.srv.cap == obs["cpu_fraction"], f"{self.t.where}: the thermostat reads {self.t.srv.cap}"

    def restore(self) -> None:
        self.t.srv.cap = None

    @classmethod
    def recover(cls, facts: dict[str, Any], fault_id: str) -> None:
        cls.recovered.append(facts)


@pytest.fixture
def thermostat(monkeypatch):
    monkeypatch.setattr(mechanisms, "MECHANISMS", list(mechanisms.MECHANISMS))   # the registry, restored after
    mechanisms.register(Thermostat)                                              # the one registry line
    yield Thermostat


def test_a_new_mechanism_is_one_class_and_one_registry_line(started, make_injector, tmp_path, thermostat, plain):
    srv = ThermoServer(psutil.Process(started.popen(python("import time; time.sleep(60)")).pid))
    inj = make_injector(ServersStack(spec=srv))
    h = inj.inject("cpu-throttle", {"cpu_fraction": 0.4})
    assert h.facts["mechanism"] == "thermostat" and h.facts["fallback_reason"] is None and srv.cap == 0.4
    ev = inj.collect_evidence(h, timeout_s=4)
    assert ev.acted is True and ev.observations["quota_read_back_cpus"] == 0.4
    assert ev.observations["measured_by"].startswith("the thermostat's setting; ")
    inj.clear(h)
    assert srv.cap is None
    entry = {"fault_id": "f-1", "kind": "cpu-throttle", "facts": dict(h.facts)}
    CpuThrottle.recover(entry)                                # cleanup's path: the facts' mechanism
    assert thermostat.recovered == [entry["facts"]]
    # other servers never get it: "auto" passes it by, and nothing of it shows in their fallback
    mech, why = mechanisms.select("cpu", target(plain))
    assert mech.name in ("cgroup", "duty_cycle") and "thermostat" not in str(why)


def test_a_mechanism_that_does_not_read_back_is_no_evidence(started, make_injector, thermostat):
    srv = ThermoServer(psutil.Process(started.popen(["sleep", "60"]).pid))
    inj = make_injector(ServersStack(spec=srv))
    h = inj.inject("cpu-throttle", {"cpu_fraction": 0.4})
    srv.cap = 0.9                                             # the defect: the setting did not hold
    ev = inj.collect_evidence(h, timeout_s=4)
    assert ev.acted is False and "reads 0.9" in ev.detail
    inj.clear(h)


def test_recover_reaches_the_recorded_mechanism_only(thermostat):
    thermostat.recovered.clear()
    MemoryLimit.recover({"fault_id": "f-2", "facts": {"mechanism": "thermostat"}})   # not a memory mechanism
    ProcessFreeze.recover({"fault_id": "f-3", "facts": {}})
    assert thermostat.recovered == []
    CpuThrottle.recover({"fault_id": "f-4", "facts": {"mechanism": "thermostat", "cap": 1}})
    assert thermostat.recovered == [{"mechanism": "thermostat", "cap": 1}]


def test_the_signal_mechanisms_signal_the_recorded_processes(started, make_injector):
    p = started.popen(["sleep", "60"])
    srv = PlainServer(psutil.Process(p.pid))
    h = make_injector(ServersStack(spec=srv)).inject("process-kill", {"role": "api", "expect_restart": False,
                                                                      "signal": "SIGTERM"})
    assert h.facts["mechanism"] == "signal" and h.facts["pids"] == [p.pid]
    assert wait_until(lambda: p.poll() == -signal.SIGTERM, 5)

"""``memory-hog`` for real: a hog process that takes host memory (pages touched),
measured evidence, the safety floor, rollback, and bad input. No vLLM needed."""

import psutil
import pytest
from pydantic import ValidationError

from faults.memory_hog import GIB, MemoryHogParams, host_memory
from harness.stack.procs import same_process
from harness.errors import FaultError

from .conftest import wait_until

pytestmark = pytest.mark.timeout(120)

HALF_GIB = 0.5


def test_the_hog_takes_memory_for_real_and_gives_it_back(make_injector):
    inj = make_injector()
    h = inj.inject("memory-hog", {"size_gib": HALF_GIB})
    f = h.facts
    assert f["taken_bytes"] == f["requested_bytes"] == int(HALF_GIB * GIB) and not f["capped"]
    assert same_process(f["pid"], f["create_time"], f["cmdline"])
    ev = inj.collect_evidence(h, 10)
    o = ev.observations
    assert ev.acted, ev.detail
    assert o["hog_rss_bytes"] >= 0.9 * f["taken_bytes"]                 # the pages are really backed
    assert o["drop_bytes"] >= 0.5 * f["taken_bytes"]                    # and the host has that much less
    assert "available memory" in ev.detail and o["hog_rss_gib"] >= 0.45
    assert psutil.Process(f["pid"]).memory_info().rss >= 0.9 * f["taken_bytes"]
    inj.clear(h)
    assert wait_until(lambda: not same_process(f["pid"], f["create_time"]), 5)
    assert [e["state"] for e in inj.ctx.ledger.entries()] == ["cleared"]


def test_the_safety_floor_caps_the_hog(make_injector):
    _, available = host_memory()
    floor_gib = (available - 0.25 * GIB) / GIB          # room for about 0.25 GiB only
    h = make_injector().inject("memory-hog", {"size_gib": 2.0, "min_available_gib": floor_gib})
    assert h.facts["capped"] and h.facts["taken_bytes"] < 2 * GIB
    h.fault.clear(None)


def test_leaving_more_than_is_available_fails_and_leaves_nothing(make_injector):
    inj = make_injector()
    _, available = host_memory()
    with pytest.raises(FaultError, match="takes nothing"):
        inj.inject("memory-hog", {"leave_free_gib": round(available / GIB + 0.5, 1)})
    assert [e["state"] for e in inj.ctx.ledger.entries()] == ["cleared"]


def test_a_dead_hog_is_no_evidence(make_injector):
    inj = make_injector()
    h = inj.inject("memory-hog", {"size_gib": 0.1})
    psutil.Process(h.facts["pid"]).kill()
    assert wait_until(lambda: not same_process(h.facts["pid"], h.facts["create_time"]), 5)
    ev = inj.collect_evidence(h, 5)
    assert not ev.acted and "gone" in ev.detail
    inj.clear(h)


@pytest.mark.parametrize("args, field", [
    ({"size_gib": 0}, "size_gib"), ({"size_gib": -1}, "size_gib"), ({"leave_free_gib": -0.5}, "leave_free_gib"),
    ({"size_gib": 10_000}, "size_gib"), ({"leave_free_gib": 10_000}, "leave_free_gib"),
    ({"size_gib": 1, "min_available_gib": -1}, "min_available_gib"), ({"size_gib": 1, "device": "tpu"}, "device"),
])
def test_bad_sizes_name_the_field(args, field):
    with pytest.raises(ValidationError) as ei:
        MemoryHogParams(**args)
    assert ei.value.errors()[0]["loc"] == (field,)


def test_one_size_exactly():
    for args in ({}, {"size_gib": 1, "leave_free_gib": 1}):
        with pytest.raises(ValidationError, match="exactly one of size_gib"):
            MemoryHogParams(**args)


def test_gpu_hog_without_a_gpu_is_refused():
    with pytest.raises(ValidationError, match="no NVIDIA GPU") as ei:
        MemoryHogParams(size_gib=1, device="gpu")
    assert ei.value.errors()[0]["loc"] == ("device",)


def test_a_hog_slow_to_exit_is_killed_and_one_that_never_exits_is_left_to_cleanup(make_injector, monkeypatch):
    # A busy host (stability run, 3 Dec): a 16.8 GiB hog took over 10 s to exit and the
    # clear raised subprocess.TimeoutExpired, turning the run into an error.
    import subprocess
    import faults.memory_hog as mh
    monkeypatch.setattr(mh, "END_S", 0.5)
    monkeypatch.setattr(mh, "END_S_PER_GIB", 0.0)
    inj = make_injector()
    h = inj.inject("memory-hog", {"size_gib": 0.1})
    pid = h.facts["pid"]
    # the hog ignores end-of-file (it is stopped): only the SIGKILL ends it
    psutil.Process(pid).suspend()
    inj.clear(h)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert [e["state"] for e in inj.ctx.ledger.entries()] == ["cleared"]
    # a process that outlives its SIGKILL: one line, not a raw TimeoutExpired
    h2 = inj.inject("memory-hog", {"size_gib": 0.1})
    popen = h2.fault._popen
    real_wait = popen.wait
    monkeypatch.setattr(popen, "wait", lambda timeout=None: (_ for _ in ()).throw(subprocess.TimeoutExpired("hog", timeout)))
    with pytest.raises(FaultError, match=r"still running 0 s after SIGKILL"):
        h2.fault.clear(None)
    monkeypatch.setattr(popen, "wait", real_wait)
    popen.wait(5)

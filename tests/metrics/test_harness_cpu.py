"""The harness's own CPU use: the pure section against hand-computed values, and the meter
against a child process that burns a known amount of CPU."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from harness.load.records import RequestRecord, write_records
from harness.metrics.harness_cpu import CpuMeter, harness_cpu, load_requests, process_tree_cpu_s


def test_section_by_hand():
    s = harness_cpu(locust_cpu_s=3.0, controller_cpu_s=1.0, wall_s=40.0, requests=800)
    assert s == {"locust_cpu_s": 3.0, "controller_cpu_s": 1.0, "wall_s": 40.0, "requests": 800,
                 "requests_per_s": 20.0, "per_request_ms": 5.0, "percent_of_core": 10.0,
                 "locust_percent_of_core": 7.5, "controller_percent_of_core": 2.5}


def test_empty_window_gives_no_rates():
    s = harness_cpu(0.0, 0.0, 0.0, 0)
    assert s["per_request_ms"] is None and s["percent_of_core"] is None and s["requests_per_s"] is None


@pytest.mark.parametrize("field", ["locust_cpu_s", "controller_cpu_s", "wall_s", "requests"])
def test_negative_input_is_refused(field):
    args = {"locust_cpu_s": 1.0, "controller_cpu_s": 1.0, "wall_s": 1.0, "requests": 1, field: -1}
    with pytest.raises(ValueError, match=field):
        harness_cpu(**args)


def test_load_requests_counts_load_records_only(tmp_path):
    recs = [RequestRecord(request_id=str(i), source=src) for i, src in enumerate(["load", "load", "probe", "reference"])]
    write_records(tmp_path / "records.jsonl", recs)
    assert load_requests(tmp_path / "records.jsonl") == 2
    assert load_requests(tmp_path / "missing.jsonl") == 0


def test_meter_measures_a_busy_child_and_survives_its_exit():
    # a parent that idles and a child that burns ~0.6 s of CPU: the tree counts the child
    code = ("import subprocess, sys, time\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import time\\nt = time.process_time()\\n"
            "while time.process_time() - t < 0.6: pass\\ntime.sleep(30)'])\n"
            "time.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(0.3)   # the child exists, still importing
        meter = CpuMeter(proc.pid, interval_s=0.2).start()
        end = time.monotonic() + 20    # a busy machine may take a while to give the child its 0.6 s
        while time.monotonic() < end and (process_tree_cpu_s(proc.pid) or 0) < 0.6:
            time.sleep(0.1)
        time.sleep(0.5)
        meter.stop()
        s = meter.section(requests=10)
    finally:
        proc.kill()
        proc.wait()
    assert 0.3 <= s["locust_cpu_s"] <= 1.0, s
    assert s["wall_s"] >= 0.5
    assert s["per_request_ms"] == pytest.approx((s["locust_cpu_s"] + s["controller_cpu_s"]) * 100, abs=0.01)
    assert process_tree_cpu_s(proc.pid) is None   # gone (reaped)
    meter.stop()   # idempotent


def test_meter_of_a_process_that_is_gone_reads_zero():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    meter = CpuMeter(proc.pid, interval_s=0.1).start()
    meter.stop()
    assert meter.section(0)["locust_cpu_s"] == 0.0



def test_controller_threads_name_where_the_cpu_went():
    s = harness_cpu(1.0, 2.0, 10.0, 5, {"scraper": 1.2, "health": 0.3, "MainThread": 0.4, "a": 0.01, "b": 0.02,
                                         "c": 0.03})
    assert list(s["controller_threads"]) == ["scraper", "MainThread", "health", "c", "b"]


def test_meter_attributes_a_busy_thread_of_this_process():
    import hashlib
    import threading

    burned, release = threading.Event(), threading.Event()

    def burn():   # hashing a large buffer releases the GIL: the meter keeps sampling meanwhile
        data = b"x" * (1 << 20)
        t = time.thread_time()
        while time.thread_time() - t < 0.4:
            hashlib.sha256(data).digest()
        burned.set()
        release.wait(30)   # alive at the meter's last sample

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    th = threading.Thread(target=burn, name="burner")
    try:
        meter = CpuMeter(proc.pid, interval_s=0.1).start()
        th.start()
        assert burned.wait(30)
        meter.stop()
    finally:
        release.set()
        th.join()
        proc.kill()
        proc.wait()
    threads = meter.section(1)["controller_threads"]
    assert threads.get("burner", 0) >= 0.3, threads


def test_meter_sums_several_load_processes():
    """Distributed load: the master and each worker are separate processes."""
    burn = ("import time\ntime.sleep(1.0)\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
            "time.sleep(30)")
    procs = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(2)]
    try:
        time.sleep(0.5)   # started up, not burning yet
        meter = CpuMeter([p.pid for p in procs], interval_s=0.1).start()
        end = time.monotonic() + 20
        while time.monotonic() < end and sum(process_tree_cpu_s(p.pid) or 0 for p in procs) < 0.6:
            time.sleep(0.1)
        time.sleep(0.3)
        meter.stop()
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert 0.45 <= meter.section(1)["locust_cpu_s"] <= 1.0


def test_meter_walks_the_hosts_processes_only_every_few_samples(monkeypatch):
    """Reading every process on the host costs ms: the meter walks at start, every
    WALK_EVERY samples and at the end, and reads the members it found in between."""
    import psutil

    walks = []
    real = psutil.Process.children
    mine = {"harness-cpu", threading.current_thread().name}   # the meter's thread and this one: other
    # threads of the test process (a session-scoped stack's supervisors) walk their own trees

    def counted(self, **kw):
        if threading.current_thread().name in mine:
            walks.append(1)
        return real(self, **kw)

    monkeypatch.setattr(psutil.Process, "children", counted)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        meter = CpuMeter(proc.pid, interval_s=0.05).start()
        deadline = time.monotonic() + 15   # a busy host (CI) takes longer than 20 samples a second
        while meter._samples < 12 and time.monotonic() < deadline:
            time.sleep(0.05)
        meter.stop()
    finally:
        proc.kill()
        proc.wait()
    samples = meter._samples
    assert samples >= 8
    assert len(walks) <= samples // CpuMeter.WALK_EVERY + 3, (len(walks), samples)

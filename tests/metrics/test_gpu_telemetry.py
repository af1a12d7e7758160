"""GPU telemetry: on this host (no NVIDIA GPU) the sampler records one clear note and
nothing else, without failing; where NVML answers (here: the fake NVML of
tests/fakes/fake_nvml.py in pynvml's place, the only way to run the sampling loop without a
GPU) it writes one line per GPU per sample into gpu.jsonl, which the checks judge and the
report's ``gpu`` section summarises."""

from __future__ import annotations

import json
import time

import pytest

from harness import gpu
from harness.checks import gpu as gpu_section
from harness.checks.base import RecordedRun
from harness.experiment.config import SpecchaosConfig
from harness.metrics.gpu_telemetry import GPU_FILE, GpuSampler
from harness.timeline import Timeline, read_timeline
from tests.fakes.fake_nvml import install


def run_of(tmp_path, events, windows=None) -> RecordedRun:
    return RecordedRun(records=[], reference={}, events=events, limits=SpecchaosConfig(), run_dir=tmp_path,
                       windows=windows or {})


def test_no_gpu_here_is_one_note_and_no_samples(tmp_path):
    if gpu.unavailable() is None:
        pytest.skip("this host has an NVIDIA GPU")
    tl = Timeline(tmp_path / "timeline.jsonl")
    s = GpuSampler(tl, tmp_path / GPU_FILE, interval_s=0.05)
    s.start()
    time.sleep(0.2)
    s.stop()
    s.stop()
    (ev,) = read_timeline(tmp_path / "timeline.jsonl")
    assert ev["event"] == "gpu_telemetry" and ev["available"] is False and ev["note"].startswith(gpu.NO_GPU)
    assert not (tmp_path / GPU_FILE).exists()
    sec = gpu_section.section(run_of(tmp_path, [ev]))
    assert sec == {"available": False, "note": ev["note"], "samples": 0, "gpus": []}
    res = gpu_section.check(run_of(tmp_path, [ev]))               # not judged, never passed
    assert res and all(c.passed is None and c.detail == f"not judged: {ev['note']}" for c in res)


def test_the_sampler_records_a_scripted_nvml_and_the_checks_judge_it(tmp_path, monkeypatch):
    """The fake NVML (tests/fakes/fake_nvml.py) stands where pynvml is: the real sampling
    loop writes one line per GPU per sample with every reading, drains the XID event set,
    measures its own cost; the checks then judge the recorded file — GPU 1's XID and its
    thermal throttle reason fail, healthy GPU 0 passes."""
    fake = install(monkeypatch, {"gpus": [
        {"temperature_c": [[0, 50], [0.4, 52]], "ecc_corrected": 2},
        {"throttle_reasons": [[0.1, 10, ["SwThermalSlowdown"]]], "events": [[0.15, "xid", 79]],
         "power_w": None}]})
    tl = Timeline(tmp_path / "timeline.jsonl")
    s = GpuSampler(tl, tmp_path / GPU_FILE, interval_s=0.05)
    s.start()
    time.sleep(0.5)
    s.stop()
    assert fake.inits == 0   # every nvmlInit was shut down
    lines = [json.loads(x) for x in (tmp_path / GPU_FILE).read_text().splitlines()]
    assert len(lines) >= 6 and len(lines) % 2 == 0 and {x["index"] for x in lines} == {0, 1}
    g0 = [x for x in lines if x["index"] == 0]
    g1 = [x for x in lines if x["index"] == 1]
    assert g0[0]["temperature_c"] == 50 and g0[-1]["temperature_c"] >= 51
    assert {x["pcie_link_gen"] for x in lines} == {5} and all(x["gpu_util_pct"] == 70 for x in lines)
    assert all(x["events"] == [] for x in g0)
    assert sum(len(x["events"]) for x in g1) == 1 and {"type": "xid", "xid": 79} in [e for x in g1 for e in x["events"]]
    assert all(x["power_w"] is None for x in g1) and "SwThermalSlowdown" in g1[-1]["throttle_reasons"]
    assert all(x["sample_wall_ms"] > 0 and x["sample_cpu_ms"] >= 0 for x in lines)
    (ev,) = read_timeline(tmp_path / "timeline.jsonl")
    assert ev["available"] is True and ev["gpus"] == 2 and ev["events_supported"] == {"0": True, "1": True}
    run = run_of(tmp_path, [ev], windows={"baseline": (lines[0]["t"], lines[-1]["t"] + 1)})
    sec = gpu_section.section(run)
    assert sec["available"] is True and sec["samples"] == len(lines) // 2
    assert sec["gpus"][1]["xid_events"][0]["xid"] == 79 and sec["gpus"][0]["sampler_wall_ms"]["n"] == len(g0)
    res = {c.name: c for c in gpu_section.check(run)}
    assert res["gpu.gpu1.xid_events"].passed is False and res["gpu.gpu1.baseline.throttle_reasons"].passed is False
    assert res["gpu.gpu0.xid_events"].passed and res["gpu.gpu0.baseline.throttle_reasons"].passed
    assert res["gpu.gpu0.temperature_max_c"].passed and res["gpu.gpu0.ecc_corrected_per_hour"].passed


def test_nvml_without_its_library_is_one_note(tmp_path, monkeypatch):
    install(monkeypatch, {"gpus": [{}], "init_error": "library_not_found"})
    assert gpu.unavailable() == "no NVIDIA GPU on this host (NVML: NVML Shared Library Not Found)"
    install(monkeypatch, {"gpus": []})
    assert gpu.unavailable() == "no NVIDIA GPU on this host (NVML sees 0 devices)"


def test_a_run_without_telemetry_says_so(tmp_path):
    assert gpu_section.section(run_of(tmp_path, []))["available"] is None

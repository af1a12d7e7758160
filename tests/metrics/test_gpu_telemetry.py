"""GPU telemetry: on this host (no NVIDIA GPU) the sampler records one clear note and
nothing else, without failing; where NVML answers (here: NVML's readings replaced by a
stand-in, the only way to run the sampling loop without a GPU) it writes one line per GPU
per sample into gpu.jsonl; the report's ``gpu`` section summarises what was recorded."""

from __future__ import annotations

import contextlib
import json
import time

import pytest

from harness import gpu
from harness.checks import gpu as gpu_section
from harness.checks.base import RecordedRun
from harness.experiment.config import SpecchaosConfig
from harness.metrics.gpu_telemetry import GPU_FILE, GpuSampler
from harness.timeline import Timeline, read_timeline


def run_of(tmp_path, events) -> RecordedRun:
    return RecordedRun(records=[], reference={}, events=events, limits=SpecchaosConfig(), run_dir=tmp_path)


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
    assert gpu_section.check(run_of(tmp_path, [ev])) == []       # recorded, never failing the run


def test_the_sampling_loop_writes_one_line_per_gpu_per_sample(tmp_path, monkeypatch):
    readings = iter(range(1000))

    def sample():
        k = next(readings)
        return [{"index": i, "name": f"H{i}", "temperature_c": 50 + k, "sm_clock_mhz": 1900 - 10 * k,
                 "throttle_reasons": ["SwThermalSlowdown"] if k == 2 else [], "memory_used_bytes": 1 << 30,
                 "power_w": 300.0 + k, "ecc_corrected": 0, "ecc_uncorrected": k} for i in range(2)]

    monkeypatch.setattr(gpu, "unavailable", lambda: None)
    monkeypatch.setattr(gpu, "session", contextlib.nullcontext)
    monkeypatch.setattr(gpu, "sample", sample)
    tl = Timeline(tmp_path / "timeline.jsonl")
    s = GpuSampler(tl, tmp_path / GPU_FILE, interval_s=0.05)
    s.start()
    time.sleep(0.4)
    s.stop()
    lines = [json.loads(x) for x in (tmp_path / GPU_FILE).read_text().splitlines()]
    assert len(lines) >= 6 and len(lines) % 2 == 0 and {x["index"] for x in lines} == {0, 1}
    (ev,) = read_timeline(tmp_path / "timeline.jsonl")
    assert ev["available"] is True and ev["gpus"] == 2
    sec = gpu_section.section(run_of(tmp_path, [ev]))
    assert sec["available"] is True and sec["samples"] == len(lines) // 2
    g0 = sec["gpus"][0]
    assert g0["temperature_c_max"] == max(x["temperature_c"] for x in lines if x["index"] == 0)
    assert g0["sm_clock_mhz_min"] < g0["sm_clock_mhz_max"] and g0["throttle_reasons_seen"] == ["SwThermalSlowdown"]
    assert g0["ecc_uncorrected_delta"] > 0


def test_a_run_without_telemetry_says_so(tmp_path):
    assert gpu_section.section(run_of(tmp_path, []))["available"] is None

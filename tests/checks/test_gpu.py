"""GPU health checks (:mod:`harness.checks.gpu`) on recorded ``gpu.jsonl`` series: each check
fails on its defect (a 6 °C/min ramp, ECC +10 within a window, an XID, a thermal throttle
reason, a down-clock, a saturated PCIe link, 87 °C), passes on a healthy series, and is not
judged — with the reason, never passed — without a GPU or without the reading."""

from __future__ import annotations

import json

import pytest

from harness.checks import gpu as gpu_checks
from harness.checks import server_memory
from harness.checks.base import RecordedRun
from harness.experiment.config import SpecchaosConfig
from tests.asserts import assert_failed

#: Ten minutes of samples every 5 s; phases of 150 s each.
T0, STEP_S, N = 1_800_000_000.0, 5.0, 120
WINDOWS = {"baseline": (T0, T0 + 150), "fault": (T0 + 150, T0 + 300), "recovery": (T0 + 300, T0 + 450),
           "after": (T0 + 450, T0 + 600)}
AVAILABLE = {"t": T0 - 1, "source": "gpu", "event": "gpu_telemetry", "available": True, "gpus": 1}
NO_GPU = {"t": T0 - 1, "source": "gpu", "event": "gpu_telemetry", "available": False,
          "note": "no NVIDIA GPU on this host (NVML: NVML Shared Library Not Found)"}


def healthy(k: int, index: int = 0) -> dict:
    """Sample ``k`` of a healthy H200 under steady load."""
    return {"t": T0 + k * STEP_S, "index": index, "name": "NVIDIA H200", "temperature_c": 55 + k % 2,
            "sm_clock_mhz": 1980, "mem_clock_mhz": 3201, "throttle_reasons": [], "throttle_reasons_mask": 0,
            "memory_used_bytes": 40 * 2**30, "power_w": 450.0, "ecc_corrected": 3, "ecc_uncorrected": 0,
            "gpu_util_pct": 70, "memory_util_pct": 30, "pcie_tx_bytes_per_s": 4e9, "pcie_rx_bytes_per_s": 2e9,
            "pcie_link_gen": 5, "pcie_link_width": 16, "events": [], "sample_wall_ms": 0.4, "sample_cpu_ms": 0.3}


def run_of(tmp_path, lines: list[dict] | None, event: dict | None = AVAILABLE, **gpu_limits) -> RecordedRun:
    if lines is not None:
        (tmp_path / "gpu.jsonl").write_text("".join(json.dumps(s) + "\n" for s in lines))
    cfg = SpecchaosConfig.model_validate({"gpu": gpu_limits})
    return RecordedRun(records=[], reference={}, events=[event] if event else [], limits=cfg, windows=dict(WINDOWS),
                       run_dir=tmp_path)


def checks(run: RecordedRun) -> dict:
    return {c.name: c for c in gpu_checks.check(run)}


def series(change=lambda k, s: None) -> list[dict]:
    out = []
    for k in range(N):
        s = healthy(k)
        change(k, s)
        out.append(s)
    return out


def test_a_healthy_series_passes_every_check(tmp_path):
    res = checks(run_of(tmp_path, series()))
    assert set(res) == {
        "gpu.gpu0.temperature_max_c", "gpu.gpu0.temperature_slope_c_per_min", "gpu.gpu0.ecc_corrected_per_hour",
        "gpu.gpu0.ecc_uncorrected_per_hour", "gpu.gpu0.pcie_utilisation_p95", "gpu.gpu0.xid_events",
        *(f"gpu.gpu0.{ph}.throttle_reasons" for ph in WINDOWS),
        *(f"gpu.gpu0.{ph}.sm_clock_drop" for ph in ("fault", "recovery", "after"))}
    assert all(c.passed is True for c in res.values()), [c for c in res.values() if not c.passed]
    assert res["gpu.gpu0.temperature_max_c"].observed == 56
    assert abs(res["gpu.gpu0.temperature_slope_c_per_min"].observed) < 1
    assert res["gpu.gpu0.ecc_corrected_per_hour"].observed == 0
    assert res["gpu.gpu0.pcie_utilisation_p95"].observed == pytest.approx(4e9 / (16 * 32e9 * 128 / 130 / 8), rel=1e-3)
    assert all(c.category == "gpu" for c in res.values())


def test_a_ramp_of_6_c_per_minute_fails_the_slope(tmp_path):
    def ramp(k, s):   # 40 °C → 70 °C over the fault and recovery phases: 6 °C/min, below 85 °C
        s["temperature_c"] = 40 + int(max(0, min(300, s["t"] - T0 - 150)) * 6 / 60)

    res = checks(run_of(tmp_path, series(ramp)))
    c = res["gpu.gpu0.temperature_slope_c_per_min"]
    assert c.passed is False and c.observed == pytest.approx(6, abs=0.3) and c.limit == 5
    assert "least-squares slope" in c.detail
    assert res["gpu.gpu0.temperature_max_c"].passed   # 70 °C: only the slope fails
    # a falling ramp (cooling fast after a load stops) is as unstable
    res = checks(run_of(tmp_path, series(lambda k, s: s.update(temperature_c=90 - int(k * STEP_S / 10)))))
    assert res["gpu.gpu0.temperature_slope_c_per_min"].observed == pytest.approx(-6, abs=0.3)
    assert_failed(res["gpu.gpu0.temperature_slope_c_per_min"])


def test_too_hot_fails_the_max_temperature(tmp_path):
    res = checks(run_of(tmp_path, series(lambda k, s: s.update(temperature_c=87 if k == 60 else 80))))
    c = res["gpu.gpu0.temperature_max_c"]
    assert c.passed is False and c.observed == 87 and c.limit == 85


def test_ecc_plus_10_within_a_window_fails(tmp_path):
    def ecc(k, s):   # +10 corrected errors over one minute of the fault phase
        s["ecc_corrected"] = 3 + min(10, max(0, k - 40))

    res = checks(run_of(tmp_path, series(ecc)))
    c = res["gpu.gpu0.ecc_corrected_per_hour"]
    assert c.passed is False and c.observed == pytest.approx(10 * 3600 / 300) and c.limit == 100
    assert "10 corrected ECC error(s) added within 300 s" in c.detail
    assert res["gpu.gpu0.ecc_uncorrected_per_hour"].passed
    # one uncorrected error anywhere fails; a counter reset (driver reload) adds nothing
    res = checks(run_of(tmp_path, series(lambda k, s: s.update(ecc_uncorrected=1 if k >= 100 else 0,
                                                               ecc_corrected=0 if k >= 60 else 3))))
    assert res["gpu.gpu0.ecc_uncorrected_per_hour"].passed is False
    assert res["gpu.gpu0.ecc_corrected_per_hour"].passed and res["gpu.gpu0.ecc_corrected_per_hour"].observed == 0


def test_an_xid_fails_unless_expected(tmp_path):
    lines = series(lambda k, s: s.update(events=[{"type": "xid", "xid": 79}] if k == 70 else []))
    c = checks(run_of(tmp_path, lines))["gpu.gpu0.xid_events"]
    assert c.passed is False and c.observed == 1 and "XID 79 at" in c.detail
    assert checks(run_of(tmp_path, lines, expected_xids=[79]))["gpu.gpu0.xid_events"].passed
    # an XID in the warm-up, before any phase, counts too
    early = series() + [{**healthy(0), "t": T0 - 30, "events": [{"type": "xid", "xid": 48}]}]
    assert checks(run_of(tmp_path, early))["gpu.gpu0.xid_events"].passed is False


def test_a_thermal_throttle_reason_fails_its_phase(tmp_path):
    def hot(k, s):
        if 35 <= k < 40:   # in the fault phase
            s["throttle_reasons"] = ["SwThermalSlowdown"]

    res = checks(run_of(tmp_path, series(hot)))
    c = res["gpu.gpu0.fault.throttle_reasons"]
    assert c.passed is False and c.observed == "SwThermalSlowdown" and "in 5 of 30 samples" in c.detail
    assert res["gpu.gpu0.baseline.throttle_reasons"].passed and res["gpu.gpu0.after.throttle_reasons"].passed
    # an experiment that throttles on purpose leaves its fault phase out
    res = checks(run_of(tmp_path, series(hot), throttle_phases=["baseline", "after"]))
    assert "gpu.gpu0.fault.throttle_reasons" not in res and all(c.passed for c in res.values())


def test_an_sm_clock_drop_fails_and_idle_samples_do_not_count(tmp_path):
    res = checks(run_of(tmp_path, series(lambda k, s: s.update(sm_clock_mhz=1500 if 30 <= k < 60 else 1980))))
    c = res["gpu.gpu0.fault.sm_clock_drop"]
    assert c.passed is False and c.observed == pytest.approx(1 - 1500 / 1980, abs=1e-4)
    assert res["gpu.gpu0.recovery.sm_clock_drop"].passed

    def idle(k, s):   # the recovery phase idles at 345 MHz: no load, not a slowdown
        if 60 <= k < 90:
            s.update(sm_clock_mhz=345, throttle_reasons=["GpuIdle"])
    res = checks(run_of(tmp_path, series(idle)))
    assert res["gpu.gpu0.recovery.sm_clock_drop"].passed is None
    assert "busy (not GpuIdle)" in res["gpu.gpu0.recovery.sm_clock_drop"].detail
    assert res["gpu.gpu0.after.sm_clock_drop"].passed


def test_a_saturated_pcie_link_fails(tmp_path):
    res = checks(run_of(tmp_path, series(lambda k, s: s.update(pcie_link_gen=4, pcie_rx_bytes_per_s=30e9))))
    c = res["gpu.gpu0.pcie_utilisation_p95"]
    assert c.passed is False and c.observed == pytest.approx(30e9 / 31.5077e9, rel=1e-3)


def test_no_gpu_every_check_is_not_judged_with_the_reason(tmp_path):
    for event, why in ((NO_GPU, NO_GPU["note"]), (None, "no GPU telemetry recorded in this run")):
        res = gpu_checks.check(run_of(tmp_path, None, event))
        assert {c.name for c in res} == {
            "gpu.temperature_max_c", "gpu.temperature_slope_c_per_min", "gpu.ecc_corrected_per_hour",
            "gpu.ecc_uncorrected_per_hour", "gpu.pcie_utilisation_p95", "gpu.xid_events", "gpu.throttle_reasons",
            "gpu.sm_clock_drop"}
        assert all(c.passed is None and not c.judged and c.detail == f"not judged: {why}" for c in res)
    # the GPU memory swing says the same, once
    (sm,) = [c for c in server_memory.check(run_of(tmp_path, None, NO_GPU)) if ".gpu" in c.name]
    assert sm.name == "server_memory.gpu.memory_swing" and sm.passed is None and NO_GPU["note"] in sm.detail


def test_readings_a_gpu_does_not_give_are_not_judged(tmp_path):
    lines = series(lambda k, s: s.update(ecc_corrected=None, ecc_uncorrected=None, events=None, pcie_link_gen=None))
    res = checks(run_of(tmp_path, lines))
    for name in ("ecc_corrected_per_hour", "ecc_uncorrected_per_hour", "xid_events", "pcie_utilisation_p95"):
        assert res[f"gpu.gpu0.{name}"].passed is None, name
    assert "XID events not supported" in res["gpu.gpu0.xid_events"].detail
    short = [s for s in series() if s["t"] < T0 + 25]   # 25 s: no 30 s span for a slope
    assert checks(run_of(tmp_path, short))["gpu.gpu0.temperature_slope_c_per_min"].passed is None


def test_limits_set_to_none_are_not_checked(tmp_path):
    res = checks(run_of(tmp_path, series(), max_temperature_c=None, max_sm_clock_drop=None, throttle_reasons=[]))
    assert "gpu.gpu0.temperature_max_c" not in res and not any("sm_clock_drop" in n or "throttle" in n for n in res)


def test_growth_and_bandwidth_by_hand():
    g = gpu_checks.growth_per_hour([(0, 5), (10, 7), (20, 2), (30, 4), (400, 14)], window_s=60)
    assert g["added"] == 10 and g["per_hour"] == 600 and g["total_added"] == 14   # the reset 7 → 2 adds 0
    assert gpu_checks.growth_per_hour([], 60) is None
    assert gpu_checks.pcie_bandwidth_bytes_per_s(4, 16) == pytest.approx(31.51e9, rel=1e-3)
    assert gpu_checks.pcie_bandwidth_bytes_per_s(3, 8) == pytest.approx(7.88e9, rel=1e-3)
    assert gpu_checks.pcie_bandwidth_bytes_per_s(None, 16) is None and gpu_checks.pcie_bandwidth_bytes_per_s(4, 0) is None
    s = gpu_checks.max_slope_per_min([(t, 20 + t / 10) for t in range(0, 120, 5)], window_s=60, min_samples=4)
    assert s["slope_per_min"] == pytest.approx(6) and s["windows"] > 10


def test_the_section_summarises_each_gpu(tmp_path):
    lines = series(lambda k, s: s.update(events=[{"type": "xid", "xid": 13}] if k == 5 else []))
    lines += [healthy(k, index=1) for k in range(N)]
    sec = gpu_checks.section(run_of(tmp_path, lines))
    assert sec["available"] is True and sec["samples"] == N and [g["index"] for g in sec["gpus"]] == [0, 1]
    g0 = sec["gpus"][0]
    assert g0["xid_events"] == [{"t": T0 + 25, "xid": 13}] and g0["events_supported"] is True
    assert g0["temperature_c_max"] == 56 and g0["pcie_utilisation_p95"] > 0 and g0["gpu_util_pct_mean"] == 70
    assert g0["sampler_wall_ms"]["mean"] == pytest.approx(0.4) and g0["sampler_cpu_ms"]["max"] == pytest.approx(0.3)
    assert gpu_checks.section(run_of(tmp_path, None, NO_GPU))["note"] == NO_GPU["note"]

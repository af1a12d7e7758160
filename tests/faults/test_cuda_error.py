"""The ``cuda-error`` fault family without a GPU: its LD_PRELOAD shim, built by the harness
(:func:`faults.cuda_error.build_shim`), run in front of a stub CUDA library by a driver
program (:mod:`tests.fakes.cuda`) — which launch fails (the Nth, or a seeded fraction that
this test recomputes), with which error, sticky or not, in which process (title, fork),
from when (the arm file) — and the family's refusals: a host without a GPU, without the
CUDA driver library or without a compiler, and parameters that select nothing."""

from __future__ import annotations

import pytest

from faults import cuda_error
from faults.cuda_error import CudaError, read_shim_log, shim_env
from faults.registry import REGISTRY, make_fault
from harness.errors import ExperimentError, FaultError
from tests.fakes.fake_nvml import install

GAMMA = 0x9E3779B97F4A7C15
MASK = 2**64 - 1


def splitmix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def expected_failures(n: int, fraction: float, seed: int) -> list[int]:
    """Launches 1..n that the shim's generator fails (its header's rule, recomputed)."""
    return [k for k in range(1, n + 1) if splitmix64((seed + k * GAMMA) & MASK) / 2**64 < fraction]


def env(native, tmp_path, **kw) -> dict[str, str]:
    kw.setdefault("error", 700)
    return shim_env(native.shim, log_file=tmp_path / "shim.jsonl", **kw)


def launches(lines: list[dict]) -> list[dict]:
    return [ln for ln in lines if "k" in ln]


def test_the_nth_launch_fails_and_the_error_sticks(cuda_native, tmp_path):
    lines = cuda_native.drive(env(cuda_native, tmp_path, nth_launch=3), "n=6")
    rcs = [ln["rc"] for ln in launches(lines)]
    assert rcs == [0, 0, 700, 700, 700, 700]
    assert [ln["last"] for ln in launches(lines)] == [0, 0, 700, 700, 700, 700]   # cudaGetLastError sees it
    (summary,) = [ln for ln in lines if "stub_launches" in ln]
    assert summary == {"proc": 0, "stub_launches": 2, "peek": 700, "sync": 700, "ctx_sync": 700}
    log = read_shim_log(tmp_path / "shim.jsonl")
    assert [(x["event"], x["launch"], x["api"], x["error"]) for x in log] == [
        ("armed", 1, "cudaLaunchKernel", 0), ("error", 3, "cudaGraphLaunch", 700)]
    assert log[1]["title"].endswith("cuda_driver") and log[1]["t"] > 1.7e9
    # without the shim every launch reaches the stub
    plain = cuda_native.drive(None, "n=6")
    assert [ln["rc"] for ln in launches(plain)] == [0] * 6 and plain[-1]["stub_launches"] == 6


def test_a_non_sticky_launch_failure_fails_that_launch_only(cuda_native, tmp_path):
    lines = cuda_native.drive(env(cuda_native, tmp_path, error=719, nth_launch=3, sticky=False), "n=6")
    assert [ln["rc"] for ln in launches(lines)] == [0, 0, 719, 0, 0, 0]
    assert [ln["last"] for ln in launches(lines)] == [0, 0, 719, 0, 0, 0]   # reported once, then reset
    assert lines[-1] == {"proc": 0, "stub_launches": 5, "peek": 0, "sync": 0, "ctx_sync": 0}


@pytest.mark.parametrize("api", ["cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch",
                                 "cuGraphLaunch"])
def test_every_launch_entry_point_is_counted(cuda_native, tmp_path, api):
    lines = cuda_native.drive(env(cuda_native, tmp_path, nth_launch=2, sticky=False), "n=3", f"api={api}")
    assert [ln["rc"] for ln in launches(lines)] == [0, 700, 0]


def test_a_seeded_fraction_fails_the_launches_its_generator_picks(cuda_native, tmp_path):
    n, fraction = 2000, 0.1
    picked = {}
    for seed in (7, 8):
        lines = cuda_native.drive(env(cuda_native, tmp_path, fraction=fraction, seed=seed, sticky=False), f"n={n}")
        picked[seed] = [ln["k"] for ln in launches(lines) if ln["rc"] == 700]
        assert picked[seed] == expected_failures(n, fraction, seed)
        assert 150 < len(picked[seed]) < 250                       # about a tenth
        assert lines[-1]["stub_launches"] == n - len(picked[seed])  # a failed launch never reached CUDA
    assert picked[7] != picked[8]
    again = cuda_native.drive(env(cuda_native, tmp_path, fraction=fraction, seed=7, sticky=False), f"n={n}")
    assert [ln["k"] for ln in launches(again) if ln["rc"]] == picked[7]   # the same seed, the same launches


def test_only_processes_of_the_chosen_titles_fail(cuda_native, tmp_path):
    worker = ("VLLM::Worker",)
    lines = cuda_native.drive(env(cuda_native, tmp_path, nth_launch=2, titles=worker), "n=3", title="VLLM::Worker_TP0")
    assert [ln["rc"] for ln in launches(lines)] == [0, 700, 700]
    assert read_shim_log(tmp_path / "shim.jsonl")[-1]["title"] == "VLLM::Worker_TP0"
    (tmp_path / "shim.jsonl").unlink()
    engine = ("VLLM::EngineCore", "VLLM::DPEngineCore")
    lines = cuda_native.drive(env(cuda_native, tmp_path, nth_launch=2, titles=engine), "n=3", title="VLLM::Worker")
    assert [ln["rc"] for ln in launches(lines)] == [0, 0, 0]
    assert read_shim_log(tmp_path / "shim.jsonl") == []        # never counted, never armed


def test_launches_count_from_the_arming(cuda_native, tmp_path):
    arm = tmp_path / "armed"
    lines = cuda_native.drive(env(cuda_native, tmp_path, nth_launch=2, arm_file=arm), "n=8", "arm_after=4")
    assert [ln["rc"] for ln in launches(lines)] == [0, 0, 0, 0, 0, 700, 700, 700]   # 5th = 1st counted
    assert [x["launch"] for x in read_shim_log(tmp_path / "shim.jsonl")] == [1, 2]


def test_each_forked_process_counts_its_own_launches(cuda_native, tmp_path):
    lines = cuda_native.drive(env(cuda_native, tmp_path, nth_launch=2), "n=3", "fork=1")
    for proc in (0, 1):
        assert [ln["rc"] for ln in launches(lines) if ln["proc"] == proc] == [0, 700, 700], proc
    log = read_shim_log(tmp_path / "shim.jsonl")
    assert len({x["pid"] for x in log if x["event"] == "error"}) == 2


def test_the_shim_is_built_once_per_source_version(cuda_native, tmp_path, monkeypatch):
    assert cuda_native.shim.name.startswith("cuda_fault_shim-") and cuda_native.shim.suffix == ".so"
    mtime = cuda_native.shim.stat().st_mtime_ns
    assert cuda_error.build_shim(cuda_native.shim.parent) == cuda_native.shim
    assert cuda_native.shim.stat().st_mtime_ns == mtime
    monkeypatch.setenv("CC", "false")                  # a compiler that fails
    with pytest.raises(FaultError, match="building the CUDA fault shim failed"):
        cuda_error.build_shim(tmp_path)
    assert list(tmp_path.iterdir()) == []              # nothing half-built left
    monkeypatch.setenv("CC", "no-such-compiler-here")
    with pytest.raises(FaultError, match="no C compiler"):
        cuda_error.build_shim(tmp_path)


def test_a_host_without_a_gpu_driver_or_compiler_is_refused_in_one_line(monkeypatch):
    fault = make_fault("cuda-error", {"nth_launch": 100}, "exp.yaml: method[0].provider")
    install(monkeypatch, {"gpus": [], "init_error": "library_not_found"})
    with pytest.raises(FaultError) as exc:
        fault.check_host()
    assert exc.value.message == "no NVIDIA GPU on this host (NVML: NVML Shared Library Not Found)"
    assert not exc.value.where and "\n" not in exc.value.one_line()
    install(monkeypatch, {"gpus": [{}]})                   # a GPU, but no libcuda.so.1 here
    monkeypatch.setattr(cuda_error, "LIBCUDA", "libcuda-not-here.so.1")
    assert cuda_error.host_problem().startswith("no CUDA driver library (libcuda-not-here.so.1) on this host")
    monkeypatch.setattr(cuda_error, "LIBCUDA", "libc.so.6")   # a library that loads
    monkeypatch.setattr(cuda_error, "compiler", lambda: None)
    assert cuda_error.host_problem() == "no C compiler (cc, or $CC) on this host to build the CUDA fault shim"
    monkeypatch.setattr(cuda_error, "compiler", lambda: "/usr/bin/cc")
    assert cuda_error.host_problem() is None


def test_parameters_select_exactly_one_way():
    assert REGISTRY["cuda-error"] is CudaError and CudaError.activity == "inject_cuda_error"
    for bad in ({}, {"nth_launch": 3, "fraction": 0.5}):
        with pytest.raises(ExperimentError, match="exactly one of nth_launch"):
            make_fault("cuda-error", bad, "x")
    with pytest.raises(ExperimentError):
        make_fault("cuda-error", {"fraction": 1.5}, "x")
    sticky = make_fault("cuda-error", {"nth_launch": 1}, "x")
    loose = make_fault("cuda-error", {"fraction": 0.01, "sticky": False, "role": "worker"}, "x")
    assert sticky.recovery_from == "injected" and loose.recovery_from == "cleared"
    e = shim_env("/x/shim.so", error=719, fraction=0.01, seed=3, sticky=False, titles=("VLLM::Worker",),
                 arm_file="/a", log_file="/l", preload="/other.so")
    assert e == {"LD_PRELOAD": "/x/shim.so:/other.so", "SPECCHAOS_CUDA_FAULT_ERROR": "719",
                 "SPECCHAOS_CUDA_FAULT_SEED": "3", "SPECCHAOS_CUDA_FAULT_STICKY": "0",
                 "SPECCHAOS_CUDA_FAULT_TITLES": "VLLM::Worker", "SPECCHAOS_CUDA_FAULT_FRACTION": "0.01",
                 "SPECCHAOS_CUDA_FAULT_ARM_FILE": "/a", "SPECCHAOS_CUDA_FAULT_LOG": "/l"}


def test_recover_after_a_crash_disarms_the_shim(tmp_path, monkeypatch):
    arm = tmp_path / "armed"
    arm.touch()
    CudaError.recover({"fault_id": "cuda-error-1", "facts": {"arm_file": str(arm)}})
    assert not arm.exists()
    monkeypatch.setenv("SPECCHAOS_STATE_DIR", str(tmp_path))   # no facts written: found by the fault's id
    by_id = tmp_path / "cuda-error" / "cuda-error-2" / "armed"
    by_id.parent.mkdir(parents=True)
    by_id.touch()
    CudaError.recover({"fault_id": "cuda-error-2", "facts": {}})
    assert not by_id.exists()
    CudaError.recover({"fault_id": "cuda-error-3", "facts": {}})   # nothing there: nothing to do

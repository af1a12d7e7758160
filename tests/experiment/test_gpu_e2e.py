"""A whole experiment with a GPU, without a GPU: the fake vLLM under the real supervisor
(:mod:`tests.experiment.fast_e2e`), whose worker "launches a kernel" per step through a
stub CUDA library (``FAKE_VLLM_CUDA_LIB``), the ``cuda-error`` fault's real shim (built by
the harness, preloaded by a planned restart, armed under load), and the fake NVML in
pynvml's place, so the real GPU sampler records two GPUs: GPU 0 healthy, GPU 1 with an XID
and ECC errors. The illegal address kills the worker, the supervisor restarts the server,
recovery passes; the verdict fails on GPU 1's checks alone, and passes when the same run is
re-judged with GPU 1's series removed."""

from __future__ import annotations

import json

import pytest

from faults import cuda_error
from harness.experiment.rejudge import rejudge
from tests.experiment.fast_e2e import run_fast
from tests.fakes.fake_nvml import install
from tests.procs import leaked_since, sut_pids

pytestmark = pytest.mark.timeout(180)

#: GPU 1's defects, seconds into the run: an XID 79 (fallen off the bus) and a corrected ECC
#: error every second (≥ 10 within the run's phases: ≥ 120/h over a 300 s window).
DEFECTS = {"events": [[3.0, "xid", 79]], "ecc_corrected": [[0, 0], [600, 600]]}
FAULT = {"type": "action", "name": "illegal-address-in-the-worker",
         "provider": {"type": "python", "module": "harness.experiment.actions", "func": "inject_cuda_error",
                      "arguments": {"server": "spec", "role": "worker", "error": "illegal_address", "nth_launch": 20,
                                    "duration_s": 1}}}


def test_a_cuda_error_and_gpu_defects_on_the_fake_stack(tmp_path, monkeypatch, cuda_native):
    before = sut_pids()
    monkeypatch.setenv("FAKE_VLLM_CUDA_LIB", str(cuda_native.stub))
    monkeypatch.setattr(cuda_error, "host_problem", lambda: None)   # the stub stands in for the GPU and its driver
    install(monkeypatch, {"gpus": [{}, DEFECTS]})
    code, rep, seconds, out = run_fast(tmp_path, "gpu", method=[FAULT])
    print(f"GPU end-to-end run on the fake stack: {seconds:.1f} s, verdict {rep['verdict']}")

    (fault,) = rep["faults"]
    assert fault["kind"] == "cuda-error" and fault["acted"], fault
    ev = fault["evidence"]["observations"]
    assert ev["error"] == 700 and ev["first"]["launch"] == 20 and ev["first"]["title"].startswith("VLLM::Worker")
    events = [json.loads(x) for x in (out / "timeline.jsonl").read_text().splitlines()]
    spec = [e for e in events if e.get("server") == "spec"]
    env = fault_env(out)
    assert [e["env"] for e in spec if e["event"] == "server_environment"] == [sorted(env)]
    assert "cuda_fault_shim-" in env["LD_PRELOAD"] and env["SPECCHAOS_CUDA_FAULT_TITLES"] == "VLLM::Worker"
    exits = [(e.get("reason"), e["expected"]) for e in spec if e["event"] == "server_exited"]
    assert ("environment", True) in exits and any(not expected for _, expected in exits)   # planned, then the crash
    assert rep["restarts"] == 1   # the supervisor brought the server back, without the shim
    (shim_log,) = (out / "cuda-error").glob("*/shim.jsonl")   # the shim's own log stays with the run
    assert [x["event"] for x in map(json.loads, shim_log.read_text().splitlines())] == ["armed", "error"]

    assert code == 1 and rep["verdict"] == "fail", rep["errors"]
    failed = sorted(c["name"] for c in rep["checks"] if c["passed"] is False)
    assert failed == ["gpu.gpu1.ecc_corrected_per_hour", "gpu.gpu1.xid_events"], failed
    gpu0 = [c for c in rep["checks"] if c["name"].startswith("gpu.gpu0.")]
    assert gpu0 and all(c["passed"] is not False for c in gpu0)
    assert {"gpu.gpu0.xid_events", "gpu.gpu0.temperature_max_c", "gpu.gpu0.baseline.throttle_reasons"} <= \
        {c["name"] for c in gpu0 if c["passed"]}
    assert rep["gpu"]["gpus"][1]["xid_events"][0]["xid"] == 79
    assert rep["recovery"]["time_to_healthy_s"] is not None

    # the same run with GPU 1's series taken out of gpu.jsonl: healthy, and the verdict passes
    lines = (out / "gpu.jsonl").read_text().splitlines()
    (out / "gpu.jsonl").write_text("".join(x + "\n" for x in lines if json.loads(x)["index"] == 0))
    again = rejudge(out)
    assert again["verdict"] == "pass", [c for c in again["checks"] if c["passed"] is False]
    assert not leaked_since(before, wait_s=10)


def fault_env(out) -> dict:
    """The environment the fault put on the server's restart, from the ledger's facts."""
    for line in (out / "ledger.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e.get("event") == "injected":
            return e["facts"]["env"]
    raise AssertionError("no injected entry in the ledger")

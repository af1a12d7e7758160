"""Server memory swing on recorded series: a swinging RSS fails, a steady one passes, a
killed-and-restarted server is no swing (judged per incarnation, the dying tree and the
loading one left out) while a leak inside one incarnation still fails, a KV-filling fault's
growth up to the KV cache is no swing but a leak beyond it is, too few samples are not
judged (N/J), a GPU's used memory is judged where gpu.jsonl has it (between restarts), and
without an NVIDIA GPU it is not judged (N/J) with the note, which the section carries too."""

from __future__ import annotations

import json

from harness.checks import server_memory
from harness.checks.base import RecordedRun
from harness.experiment.config import SpecchaosConfig
from harness.timeline import fault_summary
from tests.asserts import assert_failed

GIB = 1 << 30


def write(tmp_path, rss, *, server="spec", pid=lambda i: 100, step_s=0.5, lines=None):
    """One scrape per ``rss`` value (None = a failed scrape: server down)."""
    lines = [] if lines is None else lines
    for i, v in enumerate(rss):
        t = i * step_s
        if v is None:
            lines.append({"t": t, "server": server, "ok": False, "error": "ConnectError: refused", "rss_bytes": None,
                          "pid": None})
        else:
            lines.append({"t": t, "server": server, "ok": True, "pid": pid(i), "rss_bytes": int(v), "counters": {},
                          "per_position": {}, "gauges": {}, "histograms": {}})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(ln) + "\n" for ln in lines))
    return lines


def run_of(tmp_path, events=(), **limits) -> RecordedRun:
    """The RSS tests judge no GPU memory (``max_gpu_memory_swing`` None unless given)."""
    cfg = SpecchaosConfig.model_validate({"server_memory": {"max_gpu_memory_swing": None, **limits}})
    windows = {"baseline": (0.0, 10.0), "fault": (10.0, 20.0), "after": (20.0, 30.0)}
    return RecordedRun(records=[], reference={}, events=list(events), limits=cfg, windows=windows, run_dir=tmp_path)


def by_name(results):
    return {r.name: r for r in results}


def test_steady_rss_passes(tmp_path):
    write(tmp_path, [3 * GIB + (i % 3) * 2**20 for i in range(60)])
    res = by_name(server_memory.check(run_of(tmp_path)))
    assert set(res) == {f"server_memory.spec.{p}.rss_swing" for p in ("baseline", "fault", "after")}
    assert all(r.passed and r.observed < 0.01 for r in res.values())


def test_a_swinging_rss_fails(tmp_path):
    """A leak in the fault phase: 3 GiB growing to 4 GiB (33%)."""
    rss = [3 * GIB] * 20 + [3 * GIB + i * GIB / 19 for i in range(20)] + [4 * GIB] * 20
    write(tmp_path, rss)
    res = by_name(server_memory.check(run_of(tmp_path)))
    r = res["server_memory.spec.fault.rss_swing"]
    assert r.passed is False and round(r.observed, 3) == 0.333 and r.limit == 0.15
    assert "3072 → 4096 MiB" in r.detail
    assert res["server_memory.spec.baseline.rss_swing"].passed and res["server_memory.spec.after.rss_swing"].passed
    assert by_name(server_memory.check(run_of(tmp_path, max_rss_swing=0.5)))["server_memory.spec.fault.rss_swing"].passed


def test_a_killed_and_restarted_server_is_no_swing(tmp_path):
    """Old process at 3 GiB, down (gaps), a new one that answers at 1.5 GiB: each process is
    judged on its own, the ramp-up is never sampled (no /metrics while loading)."""
    rss = [3 * GIB] * 24 + [None] * 6 + [1.5 * GIB] * 30
    write(tmp_path, rss, pid=lambda i: 100 if i < 24 else 200)
    res = by_name(server_memory.check(run_of(tmp_path)))
    assert all(r.passed for r in res.values()), [r for r in res.values() if not r.passed]
    sec = server_memory.section(run_of(tmp_path))["servers"]["spec"]["fault"]
    assert sec["processes_judged"] == 2 and sec["swing"] == 0


def kill_events(kill_t=10.0, ready_t=16.0, server="spec"):
    """A kill's timeline: the worker SIGKILLed at ``kill_t`` (the ledger's fault event), the
    server's exit, its restart and the new incarnation ready at ``ready_t``."""
    return [{"t": kill_t, "source": "fault", "event": "fault_injected", "fault_id": "k1", "kind": "process-kill",
             "target": f"{server}/worker", "acting_at": kill_t, "recovery_from": "injected"},
            {"t": kill_t + 1.5, "source": "stack", "event": "server_exited", "server": server, "incarnation": 0},
            {"t": kill_t + 2.5, "source": "stack", "event": "server_started", "server": server, "incarnation": 1},
            {"t": ready_t, "source": "stack", "event": "server_ready", "server": server, "incarnation": 1}]


def kill_series(tmp_path, after=lambda i: 3.4 * GIB):
    """Issue 34's kill, as the scraper records it (0.5 s a scrape, fault phase 10–20 s): the
    tree of incarnation 0 at 3475 MiB; the SIGKILLed worker's memory reads as gone while it
    is still a member of the tree (1335 MiB under the same ``tree_pids``); gaps while the
    server is down; incarnation 1 answering /metrics while it loads (1.4 → 2.9 GiB) before
    its readiness probe passed at 16 s, then ``after(i)``."""
    rss = [3475 * MIB] * 22 + [1335 * MIB] * 3 + [None] * 3 + [(1.4 + 0.5 * k) * GIB for k in range(4)]
    rss += [after(i) for i in range(32, 60)]
    inc = [0] * 25 + [None] * 3 + [1] * 32
    lines = write(tmp_path, rss, pid=lambda i: 100 if i < 25 else 200)
    for ln, n in zip(lines, inc):
        if ln["ok"]:
            ln["incarnation"] = n
            ln["tree_pids"] = [100, 101, 102] if n == 0 else [200, 201, 202]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(ln) + "\n" for ln in lines))


def test_a_kill_judged_per_incarnation_is_no_swing(tmp_path):
    """Issue 34: ``server_memory.spec.fault.rss_swing`` failed at 1.60 (1335 → 3475 MiB) on a
    healthy stack. The dying tree (after the kill's ``acting_at``) and the loading one
    (before its ``server_ready``) are the server down, judged neither way; each incarnation's
    own samples are steady: no swing."""
    kill_series(tmp_path)
    run = run_of(tmp_path, kill_events(), max_gpu_memory_swing=None)
    run.faults = fault_summary(run.events)
    res = by_name(server_memory.check(run))
    assert all(r.passed is True for r in res.values()), {n: r.detail for n, r in res.items()}
    assert "none across a restart" in res["server_memory.spec.fault.rss_swing"].detail
    # without the timeline (no kill, no readiness recorded) the dying tree is issue 34's swing
    r = by_name(server_memory.check(run_of(tmp_path)))["server_memory.spec.fault.rss_swing"]
    assert r.passed is False and round(r.observed, 2) == 1.60 and "1335 → 3475 MiB over 5 samples" in r.detail


def test_a_leak_inside_one_incarnation_still_fails_after_a_kill(tmp_path):
    """The restarted incarnation leaks (3.3 GiB growing 4 % a second): its after phase fails."""
    kill_series(tmp_path, after=lambda i: 3.3 * GIB * (1 + 0.02 * (i - 32)))
    run = run_of(tmp_path, kill_events(), max_gpu_memory_swing=None)
    res = by_name(server_memory.check(run))
    assert res["server_memory.spec.after.rss_swing"].passed is False
    assert res["server_memory.spec.baseline.rss_swing"].passed is True


def test_down_spans_end_at_the_next_readiness():
    spans = server_memory.down_spans(kill_events(10.0, 15.0) + kill_events(40.0, 52.0, server="ref")
                                     + [{"t": 70.0, "source": "stack", "event": "server_respeculating",
                                         "server": "spec"}])
    assert spans == {"spec": [(10.0, 15.0), (70.0, float("inf"))], "ref": [(40.0, 52.0)]}   # merged, in order


def test_a_gpu_is_judged_between_restarts(tmp_path):
    """GPU memory falls when the killed server's processes free it and rises as the new one
    loads: no swing; a leak between restarts still fails."""
    write(tmp_path, [GIB] * 60)
    ev = {"t": 0, "source": "gpu", "event": "gpu_telemetry", "available": True, "gpus": 1}

    def gpu(mem):
        (tmp_path / "gpu.jsonl").write_text("".join(
            json.dumps({"t": i * 0.5, "index": 0, "memory_used_bytes": m}) + "\n" for i, m in enumerate(mem)))

    gpu([60 * GIB] * 20 + [20 * GIB] * 6 + [40 * GIB, 50 * GIB, 58 * GIB, 60 * GIB] + [60 * GIB] * 30)
    res = by_name(server_memory.check(run_of(tmp_path, [ev, *kill_events()], max_gpu_memory_swing=0.15)))
    gres = {n: r for n, r in res.items() if ".gpu0." in n}
    assert len(gres) == 3 and all(r.passed is True for r in gres.values()), {n: r.detail for n, r in gres.items()}
    assert "stretch(es) between restarts" in gres["server_memory.gpu0.fault.memory_swing"].detail
    gpu([60 * GIB] * 20 + [20 * GIB] * 10 + [60 * GIB * (1 + 0.01 * i) for i in range(30)])
    res = by_name(server_memory.check(run_of(tmp_path, [ev, *kill_events()], max_gpu_memory_swing=0.15)))
    assert res["server_memory.gpu0.after.memory_swing"].passed is False


def test_settle_s_skips_a_process_s_first_seconds(tmp_path):
    rss = [2 * GIB + i * 0.05 * GIB for i in range(8)] + [2.4 * GIB] * 52   # grows 20% in its first 4 s
    write(tmp_path, rss)
    assert_failed(by_name(server_memory.check(run_of(tmp_path)))["server_memory.spec.baseline.rss_swing"])
    assert by_name(server_memory.check(run_of(tmp_path, settle_s=4.0)))["server_memory.spec.baseline.rss_swing"].passed


def test_too_few_samples_are_not_judged_and_say_so(tmp_path):
    write(tmp_path, [GIB, 2 * GIB, GIB])
    r = by_name(server_memory.check(run_of(tmp_path)))["server_memory.spec.baseline.rss_swing"]
    assert r.passed is None and not r.judged and not r.failed and r.observed is None
    assert r.detail.startswith("not judged: no RSS of one server process tree with ≥ 4 samples")


def test_gpu_memory_swing_is_judged_from_gpu_jsonl(tmp_path):
    write(tmp_path, [GIB] * 60)
    mem = [40 * GIB] * 20 + [40 * GIB, 60 * GIB] * 10 + [40 * GIB] * 20
    (tmp_path / "gpu.jsonl").write_text("".join(
        json.dumps({"t": i * 0.5, "index": 0, "name": "H200", "memory_used_bytes": m}) + "\n" for i, m in enumerate(mem)))
    ev = {"t": 0, "source": "gpu", "event": "gpu_telemetry", "available": True, "gpus": 1}
    res = by_name(server_memory.check(run_of(tmp_path, [ev], max_gpu_memory_swing=0.15)))
    assert_failed(res["server_memory.gpu0.fault.memory_swing"])
    assert res["server_memory.gpu0.baseline.memory_swing"].passed
    assert server_memory.section(run_of(tmp_path, [ev]))["gpu_note"] is None


def test_without_a_gpu_the_section_says_so(tmp_path):
    write(tmp_path, [GIB] * 60)
    ev = {"t": 0, "source": "gpu", "event": "gpu_telemetry", "available": False,
          "note": "no NVIDIA GPU on this host (NVML: NVML Shared Library Not Found)"}
    res = server_memory.check(run_of(tmp_path, [ev], max_gpu_memory_swing=0.15))
    (nj,) = [r for r in res if ".gpu" in r.name]     # one check, not judged, with the note
    assert nj.name == "server_memory.gpu.memory_swing" and nj.passed is None and nj.detail == f"not judged: {ev['note']}"
    assert server_memory.section(run_of(tmp_path, [ev]))["gpu_note"].startswith("no NVIDIA GPU on this host")


def test_a_run_without_metrics_has_no_rss_checks(tmp_path):
    assert server_memory.check(run_of(tmp_path)) == []
    assert "no metrics.jsonl" in server_memory.section(run_of(tmp_path))["note"]


def test_a_worker_killed_while_the_api_still_answers_is_no_swing(tmp_path):
    """Seen on the real stack: the worker is SIGKILLed, the API process answers /metrics for
    another second with the worker's RSS gone from its tree (3.3 → 1.25 GiB): that tree lost a
    process — the fault — and is judged apart, not as a swing of the whole one."""
    lines = write(tmp_path, [3.3 * GIB] * 16 + [1.25 * GIB] * 8 + [None] * 10 + [3.0 * GIB] * 26,
                  pid=lambda i: 100 if i < 24 else 200)
    for i, ln in enumerate(lines):
        if ln["ok"]:
            ln["tree_pids"] = [100, 101, 102, 103] if i < 16 else ([100, 101, 102] if i < 24 else [200, 201, 202, 203])
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(ln) + "\n" for ln in lines))
    res = by_name(server_memory.check(run_of(tmp_path)))
    assert all(r.passed for r in res.values()), [r for r in res.values() if not r.passed]
    for ln in lines:                       # the same series without the tree's membership: a swing
        ln.pop("tree_pids", None)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(ln) + "\n" for ln in lines))
    assert_failed(by_name(server_memory.check(run_of(tmp_path)))["server_memory.spec.baseline.rss_swing"])


MIB = 1 << 20
#: The run of issue 17: baseline 30 s, a 99.5 s fault phase (199 scrapes at 0.5 s), after 30 s.
KV_WINDOWS = {"baseline": (0.0, 30.0), "fault": (30.0, 129.5), "after": (129.5, 159.5)}


def kv_pressure(acting_at=30.0, cleared_at=45.0, target="spec/kv-cache", kind="kv-pressure"):
    """The ledger's events of one fault (``fault_injected`` → evidence → ``fault_cleared``)."""
    return [{"t": acting_at, "source": "fault", "event": "fault_injected", "fault_id": "f1", "kind": kind,
             "target": target, "acting_at": acting_at},
            {"t": acting_at + 1, "source": "fault", "event": "fault_evidence", "fault_id": "f1", "acted": True},
            {"t": cleared_at, "source": "fault", "event": "fault_cleared", "fault_id": "f1"}]


def kv_run(tmp_path, events=(), kv_cache_gib=1.0) -> RecordedRun:
    cfg = SpecchaosConfig.model_validate({"stack": {"kv_cache_gib": kv_cache_gib}})
    return RecordedRun(records=[], reference={}, events=list(events), limits=cfg, windows=dict(KV_WINDOWS),
                       faults=fault_summary(list(events)), run_dir=tmp_path)


def first_touch_series():
    """Issue 17's tree: 2207 MiB through the baseline; while kv-pressure fills the cache (15 s)
    it rises to 2778 MiB and stays there: 199 samples in the fault phase, 2207 → 2778 MiB."""
    out = []
    for i in range(int(159.5 / 0.5)):
        t = i * 0.5
        rise = min(1.0, max(0.0, (t - 30.0) / 20.0))     # 20 s of growth to the ceiling, then flat
        out.append((2207 + 571 * rise) * MIB + (i % 3) * MIB)
    return out


def test_first_touch_of_the_kv_cache_under_kv_pressure_passes(tmp_path):
    """The recorded 2207 → 2778 MiB (plain swing 0.26 > 0.15) while kv-pressure acted on the
    server: within stack.kv_cache_gib (1 GiB), so no swing; the same series with no
    KV-filling fault (or one on another server) still fails as it did."""
    write(tmp_path, first_touch_series())
    r = by_name(server_memory.check(kv_run(tmp_path, kv_pressure())))["server_memory.spec.fault.rss_swing"]
    assert r.passed is True and r.observed == 0.0 and r.limit == 0.15, r
    assert "2207 → 2780 MiB over 199 samples" in r.detail and "plain (max − min) ÷ min 0.260" in r.detail
    assert "stack.kv_cache_gib, 1024 MiB" in r.detail
    sec = server_memory.section(kv_run(tmp_path, kv_pressure()))["servers"]["spec"]
    assert sec["fault"]["allowance_bytes"] == GIB and round(sec["fault"]["plain_swing"], 2) == 0.26
    assert sec["baseline"]["allowance_bytes"] == 0 and sec["after"]["allowance_bytes"] == 0
    for events in ((), kv_pressure(target="ref/kv-cache"), kv_pressure(kind="cpu-throttle")):
        r = by_name(server_memory.check(kv_run(tmp_path, events)))["server_memory.spec.fault.rss_swing"]
        assert r.passed is False and round(r.observed, 2) == 0.26 and "swing = (max − min) ÷ min" in r.detail


def test_a_leak_beyond_the_kv_cache_under_kv_pressure_fails(tmp_path):
    """Growth without bound: 2207 MiB growing 30 MiB/s from the fault on, through the after
    phase. The fault phase grows ~2.9 GiB, beyond the 1 GiB KV cache: fails; the after phase
    (no KV-filling fault, no allowance) fails too."""
    write(tmp_path, [(2207 + 30 * max(0.0, i * 0.5 - 30.0)) * MIB for i in range(int(159.5 / 0.5))])
    res = by_name(server_memory.check(kv_run(tmp_path, kv_pressure())))
    fault, after = res["server_memory.spec.fault.rss_swing"], res["server_memory.spec.after.rss_swing"]
    assert fault.passed is False and fault.observed > 0.15, fault
    assert after.passed is False and "swing = (max − min) ÷ min" in after.detail, after
    assert res["server_memory.spec.baseline.rss_swing"].passed is True


def test_growth_that_goes_on_after_the_kv_fault_fails_in_the_later_phase(tmp_path):
    """The first-touch ceiling of issue 17 in the fault phase, then growth that does not stop
    (20 MiB/s through the after phase): the after phase is judged without an allowance."""
    write(tmp_path, [v + 20 * max(0.0, i * 0.5 - 129.5) * MIB for i, v in enumerate(first_touch_series())])
    res = by_name(server_memory.check(kv_run(tmp_path, kv_pressure())))
    assert res["server_memory.spec.fault.rss_swing"].passed is True
    assert res["server_memory.spec.after.rss_swing"].passed is False


def test_a_smaller_kv_cache_gives_a_smaller_allowance(tmp_path):
    write(tmp_path, first_touch_series())
    res = by_name(server_memory.check(kv_run(tmp_path, kv_pressure(), kv_cache_gib=0.125)))
    r = res["server_memory.spec.fault.rss_swing"]
    assert r.passed is False and round(r.observed, 3) == round((2780 - 2207 - 128) / 2207, 3), r

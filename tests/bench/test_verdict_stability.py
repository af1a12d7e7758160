"""bench/verdict_stability.py: its summary (a pure function of the runs) over hand-made
reports, bad arguments, the pooled loop (``--pooled``: in this process on shared stacks) on
the fake vLLM and its interruption, the loop through the real CLI on the fake vLLM (nightly),
and — in the nightly tier — every shipped experiment three times on the real stack, pooled,
every verdict the same."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.experiment.fast_e2e import fast_experiment

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "verdict_stability.py"

spec = importlib.util.spec_from_file_location("bench_verdict_stability", SCRIPT)
vs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vs)


def report(verdict: str = "pass", ttft_s: float | None = 0.1, tpot_s: float | None = 0.01,
           failed: tuple[str, ...] = (), errors: tuple[str, ...] = ()) -> dict:
    baseline = {}
    if ttft_s is not None:
        baseline["ttft_s"] = {"n": 50, "p50": ttft_s, "p95": ttft_s * 2}
    if tpot_s is not None:
        baseline["tpot_s"] = {"n": 50, "p50": tpot_s, "p95": tpot_s * 2}
    checks = [{"name": "slo.baseline.ttft_p95_s", "passed": True}, {"name": "health.spec", "passed": None}]
    checks += [{"name": n, "passed": False} for n in failed]
    return {"verdict": verdict, "phases": {"baseline": baseline, "fault": {"ttft_s": {"p50": 9.9}}},
            "checks": checks, "errors": list(errors)}


def runs(name: str, *reports: dict | None, wall_s: float = 100.0) -> list[dict]:
    return [{"experiment": name, "repeat": i, "report": r, "wall_s": wall_s + i, "exit_code": 0 if r else 2}
            for i, r in enumerate(reports, 1)]


def test_the_same_verdict_every_time_agrees_and_a_different_one_does_not():
    rows = vs.summarize(runs("kill", report(), report(), report())
                        + runs("abort", report(), report("fail", failed=("degradation.x",)), report()))
    kill, abort = rows
    assert kill["experiment"] == "kill" and kill["seen"] == "pass×3" and kill["agree"] is True
    assert kill["failing"] == [[], [], []] and kill["errors"] == [None, None, None]
    assert kill["wall_s"] == [101.0, 102.0, 103.0]
    assert abort["verdicts"] == ["pass", "fail", "pass"] and abort["seen"] == "pass×2 fail×1"
    assert abort["agree"] is False
    assert abort["failing"] == [[], ["degradation.x"], []]   # passed: None (not judged) is not a failure
    assert vs.last_line(rows)["agreed"] is False
    assert vs.last_line(rows[:1]) == {"agreed": True, "experiments": {"kill": {
        k: kill[k] for k in ("verdicts", "agree", "ttft_p50_ms", "ttft_spread", "tpot_p50_ms", "tpot_spread", "wall_s")}}}


def test_a_missing_report_is_an_error_verdict():
    row, = vs.summarize(runs("kill", report(), None, report()))
    assert row["verdicts"] == ["pass", "error", "pass"] and row["agree"] is False
    assert row["errors"] == [None, "no report.json (exit 2)", None]
    assert row["ttft_p50_ms"] == [100.0, None, 100.0]
    assert row["ttft_spread"]["n"] == 2                       # the missing repeat left out, not zero
    # an error reported three times is the same verdict three times (the table shows why)
    row, = vs.summarize(runs("bad", report("error", errors=("fault left no evidence",)), None,
                             report("error", ttft_s=None, tpot_s=None)))
    assert row["seen"] == "error×3" and row["agree"] is True
    assert row["errors"][0] == "fault left no evidence" and row["ttft_spread"]["dev"] is None


def test_spread_of_the_baseline_p50s():
    # medians 100 ms: 95, 100, 108 → range 13 %, largest deviation 8 %: within ±10 %
    row, = vs.summarize(runs("x", report(ttft_s=0.095, tpot_s=0.010), report(ttft_s=0.100, tpot_s=0.0125),
                             report(ttft_s=0.108, tpot_s=0.009)))
    assert row["ttft_p50_ms"] == [95.0, 100.0, 108.0]
    assert row["ttft_spread"] == {"n": 3, "median": 100.0, "range": 0.13, "dev": 0.08, "ok": True}
    # TPOT 9, 10, 12.5 ms around 10: 25 % over the median
    assert row["tpot_spread"] == {"n": 3, "median": 10.0, "range": 0.35, "dev": 0.25, "ok": False}
    # two repeats: the median is their mean
    assert vs.spread([90.0, 110.0]) == {"n": 2, "median": 100.0, "range": 0.2, "dev": 0.1, "ok": True}


def test_the_ten_percent_mark_and_what_cannot_be_judged():
    assert vs.spread([100.0, 110.0, 90.0])["ok"] is True          # exactly ±10 %: within
    assert vs.spread([100.0, 110.5, 100.0])["ok"] is False
    assert vs.spread([100.0, 89.0, 100.0])["dev"] == 0.11
    assert vs.spread([42.0]) == {"n": 1, "median": 42.0, "range": None, "dev": None, "ok": None}
    assert vs.spread([None, None])["ok"] is None
    assert vs.spread([0.0, 0.0])["ok"] is None


def test_the_table_says_agreement_spread_failures_and_errors():
    rows = vs.summarize(runs("kill", report(), report()) +
                        runs("abort", report(ttft_s=0.1), report("fail", ttft_s=0.2, failed=("a.b", "c.d")))
                        + runs("gone", None))
    text = vs.render(rows)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["experiment", "verdicts", "agree"]
    kill = next(ln for ln in lines if ln.startswith("kill"))
    assert "pass×2" in kill and " yes " in kill and "100.0 100.0" in kill and "dev ±0.0% OK" in kill
    abort = next(ln for ln in lines if ln.startswith("abort"))
    assert " NO " in abort and "OVER" in abort
    assert "  abort #2 fail: failed a.b, c.d" in lines
    assert "  gone #1 error: no report.json (exit 2)" in lines
    assert lines[-1].startswith("2/3 experiments gave the same verdict in every repeat")


def test_summarize_reads_saved_runs_again(tmp_path, capsys):
    for i, rep in enumerate([report(), report("fail", failed=("x.y",))], 1):
        (tmp_path / "kill" / str(i)).mkdir(parents=True)
        (tmp_path / "kill" / str(i) / "report.json").write_text(json.dumps(rep))
    (tmp_path / "kill" / "3").mkdir()                      # a run that wrote no report
    assert vs.main(["--summarize", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    last = json.loads(out.strip().splitlines()[-1])
    assert last["experiments"]["kill"]["verdicts"] == ["pass", "fail", "error"] and last["agreed"] is False
    # with stability.json: its list of runs (and wall times) is what counts
    (tmp_path / "stability.json").write_text(json.dumps({"runs": [
        {"experiment": "kill", "repeat": 1, "dir": str(tmp_path / "kill" / "1"), "wall_s": 12.5, "exit_code": 0}]}))
    assert vs.main(["--summarize", str(tmp_path)]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["experiments"]["kill"]["verdicts"] == ["pass"] and last["experiments"]["kill"]["wall_s"] == [12.5]


def test_the_short_profile_is_a_labelled_copy(tmp_path):
    src = ROOT / "experiments" / "kill-draft-worker.yaml"
    import yaml
    doc = yaml.safe_load(vs.short_copy(src, tmp_path / "s.yaml").read_text())
    own = yaml.safe_load(src.read_text())["configuration"]["specchaos"]["phases"]
    phases = doc["configuration"]["specchaos"]["phases"]
    assert phases == {**own, **vs.SHORT_PHASES} and phases["fault_timeout_s"] == own["fault_timeout_s"]


def test_the_busy_loop_spins_on_one_core_and_is_gone_after_stop():
    core = max(os.sched_getaffinity(0))
    hog = vs.Hog(core, 60)
    try:
        p = psutil.Process(hog.proc.pid)
        assert p.cpu_affinity() == [core]
        p.cpu_percent()
        time.sleep(0.5)
        assert p.cpu_percent() > 20          # busy (generous: the machine is shared)
    finally:
        hog.stop()
    assert hog.proc.returncode is not None and not psutil.pid_exists(hog.proc.pid)
    hog.stop()                                # twice is fine
    # bounded on its own: it stops when its time is up
    short = vs.Hog(core, 0.3)
    assert short.proc.wait(timeout=30) == 0


@pytest.mark.parametrize("args,word", [(["--repeats=0"], "--repeats"), (["no-such.yaml"], "no-such.yaml"),
                                       (["--summarize", "/nonexistent-dir"], "--summarize"),
                                       (["--summarize", "/tmp", "--busy"], "--busy"),
                                       (["--busy-core", "0"], "--busy-core"),
                                       (["--busy-max-s=0"], "--busy-max-s")])
def test_bad_arguments_exit_2_with_one_line(args, word):
    p = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert p.stderr.strip().count("\n") == 0 and word in p.stderr, p.stderr
    assert p.stdout == ""


def test_an_invalid_experiment_is_refused_before_anything_runs(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("title: no configuration\nmethod: []\n")
    p = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "out"), str(bad)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert p.stderr.strip().count("\n") == 0 and "specchaos" in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


def test_pooled_runs_are_ordered_by_stack_key():
    a, b, c, d = (Path(f"/x/{n}.yaml") for n in "abcd")
    keys = {a: "k1", b: "k2", c: "k1", d: "k3"}
    assert vs.pool_order([a, b, c, d], keys) == [a, c, b, d]
    assert vs.pool_order([b, a, d, c], keys) == [b, a, c, d]


def test_the_table_and_last_line_say_started_or_reused_only_for_pooled_runs():
    plain = vs.summarize(runs("kill", report(), report()))
    assert plain[0]["stack"] == [None, None]
    assert "stack" not in vs.render(plain).splitlines()[0] and "stack pool" not in vs.render(plain)
    assert "stack" not in vs.last_line(plain)["experiments"]["kill"] and "pool" not in vs.last_line(plain)
    rs = runs("kill", report(), report(), None)
    for r, use in zip(rs, ("started", "reused", "none")):
        r["stack"] = use
    rows = vs.summarize(rs)
    pool = {"starts": 1, "reuses": 1}
    text = vs.render(rows, pool)
    assert text.splitlines()[0].split()[-1] == "stack" and "started reused none" in text.splitlines()[2]
    assert text.splitlines()[-1] == "stack pool: 1 started, 1 reused"
    last = vs.last_line(rows, pool)
    assert last["pool"] == pool and last["experiments"]["kill"]["stack"] == ["started", "reused", "none"]


def _stub_run(tmp_path, monkeypatch, second_run):
    """``runner.run`` replaced: the first run writes a pass report and a ``stack_pooled``
    event (uses 1), the second calls ``second_run(out_dir)``; ``StackPool.close`` recorded."""
    from harness.experiment import runner
    from harness.stack.pool import StackPool
    calls: list[str] = []

    def run(path, out_dir, progress=False):
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        calls.append(str(out_dir))
        if len(calls) == 1:
            (out_dir / "timeline.jsonl").write_text(json.dumps(
                {"t": 1.0, "source": "stack", "event": "stack_pooled", "uses": 1, "starts": 1}) + "\n")
            rep = report()
            (out_dir / "report.json").write_text(json.dumps(rep))
            return 0, rep
        return second_run(out_dir)

    closed: list[bool] = []
    real_close = StackPool.close
    monkeypatch.setattr(runner, "run", run)
    monkeypatch.setattr(StackPool, "close", lambda self: (closed.append(True), real_close(self))[1])
    return fast_experiment(tmp_path, "stub"), calls, closed


def _sigterm_now(out_dir):
    os.kill(os.getpid(), signal.SIGTERM)   # outside Chaos Toolkit's handler: this script's own
    time.sleep(10)
    raise AssertionError("SIGTERM did not stop the run")


def _runner_caught_sigint(out_dir):
    rep = report("error", errors=("interrupted by SIGINT during the baseline phase",))
    (out_dir / "report.json").write_text(json.dumps(rep))
    return 2, rep


@pytest.mark.parametrize("second_run", [_sigterm_now, _runner_caught_sigint])
def test_an_interrupted_pooled_run_closes_the_pool_and_prints_the_partial_table(tmp_path, monkeypatch, capsys,
                                                                                 second_run):
    """SIGTERM reaching this script, or a signal the runner caught (its report says
    ``interrupted by ...``): exit 2, the pool closed and no longer the session's provider,
    SIGTERM's handler as before, the finished run's table printed (the interrupted run left
    out), no further run started."""
    from harness.experiment import session
    exp, calls, closed = _stub_run(tmp_path, monkeypatch, second_run)
    before = signal.getsignal(signal.SIGTERM)
    cwd = os.getcwd()
    assert vs.main(["--pooled", "--repeats", "3", "--out", str(tmp_path / "out"), str(exp)]) == 2
    assert len(calls) == 2 and closed == [True] and session.stack_provider is None
    assert signal.getsignal(signal.SIGTERM) is before and os.getcwd() == cwd
    captured = capsys.readouterr()
    assert "interrupted" in captured.err and captured.err.count("\n") == 1
    assert "stub 1/3: pass (exit 0) in " in captured.out and "; stack started" in captured.out
    assert "stub 2/3" not in captured.out
    table = captured.out.splitlines()
    assert any(ln.startswith("stub ") and "pass×1" in ln and ln.endswith("started") for ln in table), captured.out
    assert table[-1] == "stack pool: 0 started, 0 reused"   # the stub started none
    saved = json.loads((tmp_path / "out" / "stability.json").read_text())
    assert [(r["repeat"], r["stack"], r["stack_uses"]) for r in saved["runs"]] == [(1, "started", 1)]
    assert saved["settings"]["pooled"] is True and saved["pool"] == {"starts": 0, "reuses": 0}


@pytest.mark.nightly   # the nightly tier runs the pooled loop on the real stack (below)
@pytest.mark.timeout(120)
def test_pooled_repeats_share_one_started_stack_on_the_fake_vllm(tmp_path):
    """``--pooled`` end to end (the runner in the script's process, the fake vLLM under the
    real supervisor, registered by ``$SPECCHAOS_LAUNCHERS``): two runs of one experiment, the
    first starts the stack and the second reuses it; both judged pass; the lines, the table,
    the last line and stability.json say so, ``--summarize`` prints the same again, and no
    server of the pool is left running."""
    exp = fast_experiment(tmp_path, "fast-pool", phases={"warmup_s": 0.5, "baseline_s": 3, "after_s": 2})
    out = tmp_path / "out"
    env = dict(os.environ, SPECCHAOS_LAUNCHERS="fake=tests.fakes.stack:FakeStack")
    p = subprocess.run([sys.executable, str(SCRIPT), "--pooled", "--repeats", "2", "--out", str(out), str(exp)],
                       capture_output=True, text=True, timeout=110, cwd=tmp_path, env=env)
    print(p.stdout)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    assert "fast-pool 1/2: pass (exit 0) in " in p.stdout and "; stack started\n" in p.stdout
    assert "fast-pool 2/2: pass (exit 0) in " in p.stdout and "; stack reused (use 2)\n" in p.stdout
    assert "stack pool: 1 started, 1 reused" in p.stdout
    last = json.loads(p.stdout.strip().splitlines()[-1])
    assert last["agreed"] is True and last["pool"] == {"starts": 1, "reuses": 1}
    row = last["experiments"]["fast-pool"]
    assert row["verdicts"] == ["pass", "pass"] and row["stack"] == ["started", "reused"]
    assert all(v > 0 for v in row["ttft_p50_ms"] + row["tpot_p50_ms"] + row["wall_s"])
    saved = json.loads((out / "stability.json").read_text())
    assert saved["pool"] == {"starts": 1, "reuses": 1} and saved["settings"]["pooled"] is True
    assert [(r["stack"], r["stack_uses"], r["exit_code"]) for r in saved["runs"]] == [("started", 1, 0), ("reused", 2, 0)]
    log2 = (out / "fast-pool" / "2.log").read_text()
    assert "reusing the started stack" in log2 and (out / "fast-pool" / "2" / "report.json").exists()
    stacks = list((out / "stacks").glob("stack-*"))
    assert len(stacks) == 1
    pids = {e["pid"] for e in map(json.loads, (out / "fast-pool" / "1" / "timeline.jsonl").read_text().splitlines())
            if e.get("event") == "server_started"}
    assert pids and not [q for q in pids if psutil.pid_exists(q) and psutil.Process(q).status() != psutil.STATUS_ZOMBIE]
    again = subprocess.run([sys.executable, str(SCRIPT), "--summarize", str(out)], capture_output=True, text=True,
                           timeout=60, cwd=ROOT)
    assert again.returncode == 0 and json.loads(again.stdout.strip().splitlines()[-1]) == last
    assert "stack pool: 1 started, 1 reused" in again.stdout


@pytest.mark.nightly
@pytest.mark.timeout(300)
def test_two_repeats_on_the_fake_vllm_end_to_end(tmp_path):
    """The loop through the real CLI (fake vLLM under the real supervisor, registered for the
    subprocesses by ``$SPECCHAOS_LAUNCHERS``): two runs, each judged (~50 s, nightly: make
    test runs the pooled loop, the nightly tier's mode, on the fake); the exit code, the
    table, the last line and stability.json agree with each other, and ``--summarize``
    prints the same rows again. The verdicts themselves are not asserted: on this shared
    host the fast kill experiment has been seen to fail ``fail_fast.*`` when no request
    happened to be in flight at the kill, which is what this script exists to show."""
    exp = fast_experiment(tmp_path, "fast-stab", phases={"warmup_s": 0.5, "baseline_s": 3, "after_s": 2})
    out = tmp_path / "out"
    env = dict(os.environ, SPECCHAOS_LAUNCHERS="fake=tests.fakes.stack:FakeStack")
    p = subprocess.run([sys.executable, str(SCRIPT), "--repeats", "2", "--out", str(out), str(exp)],
                       capture_output=True, text=True, timeout=280, cwd=ROOT, env=env)
    print(p.stdout)
    assert p.returncode in (0, 1), (p.stdout[-3000:], p.stderr[-3000:])
    last = json.loads(p.stdout.strip().splitlines()[-1])
    row = last["experiments"]["fast-stab"]
    assert set(row["verdicts"]) <= {"pass", "fail"} and len(row["verdicts"]) == 2, p.stdout
    assert row["agree"] is (row["verdicts"][0] == row["verdicts"][1]) and last["agreed"] is row["agree"]
    assert p.returncode == (0 if row["agree"] else 1)
    assert all(v > 0 for v in row["ttft_p50_ms"] + row["tpot_p50_ms"]) and row["ttft_spread"]["n"] == 2
    assert all(w > 0 for w in row["wall_s"])
    for i, v in enumerate(row["verdicts"], 1):
        assert f"fast-stab {i}/2: {v} (exit {0 if v == 'pass' else 1})" in p.stdout
        assert (f"fast-stab #{i} fail: failed " in p.stdout) is (v == "fail")
    saved = json.loads((out / "stability.json").read_text())
    assert [r["repeat"] for r in saved["runs"]] == [1, 2] and saved["settings"]["busy"] is False
    assert saved["rows"][0]["verdicts"] == row["verdicts"]
    assert (out / "fast-stab" / "1" / "report.json").exists() and (out / "fast-stab" / "2.log").exists()
    again = subprocess.run([sys.executable, str(SCRIPT), "--summarize", str(out)], capture_output=True, text=True,
                           timeout=60, cwd=ROOT)
    assert again.returncode == p.returncode and json.loads(again.stdout.strip().splitlines()[-1]) == last
    # the same --out again would mix runs: refused before anything runs
    p = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), str(exp)], capture_output=True, text=True,
                       timeout=60, cwd=ROOT, env=env)
    assert p.returncode == 2 and "already holds runs" in p.stderr


@pytest.mark.nightly
@pytest.mark.stack
@pytest.mark.own_stack   # its runs start their own stacks: before the session's pool starts one
@pytest.mark.timeout(7200)
def test_every_shipped_experiment_gives_the_same_verdict_three_times(tmp_path):
    """Every ``experiments/*.yaml`` with its own phases, three runs each on the real stack,
    pooled as the gate runs them (``--pooled``: runs of one stack configuration share a
    started stack): the same verdict every time (exit 0), and never ``error`` (a run that
    could not be judged is no verdict a gate can use). The table (with the baseline p50
    spreads and each run's stack: started or reused) is printed."""
    p = subprocess.run([sys.executable, str(SCRIPT), "--pooled", "--repeats", "3", "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=7100, cwd=ROOT)
    print(p.stdout)
    print(p.stderr[-3000:], file=sys.stderr)
    assert p.returncode == 0, p.stdout[-6000:]
    saved = json.loads((tmp_path / "out" / "stability.json").read_text())
    rows = saved["rows"]
    # every run got a stack from the pool: started or reused, never none
    assert saved["pool"]["starts"] + saved["pool"]["reuses"] == len(saved["runs"]), saved["pool"]
    errors = {r["experiment"]: r["verdicts"] for r in rows if "error" in r["verdicts"]}
    assert not errors, errors


def test_the_default_files_leave_out_gpu_experiments_on_a_host_without_a_gpu(capsys, monkeypatch):
    from harness import gpu

    assert vs.needs_gpu(ROOT / "experiments" / "gpu-health.yaml")
    assert not vs.needs_gpu(ROOT / "experiments" / "kill-draft-worker.yaml")
    monkeypatch.setattr(gpu, "unavailable", lambda: "no NVIDIA GPU on this host (NVML: test)")
    names = [f.name for f in vs.experiment_files([])]
    assert "gpu-health.yaml" not in names and "kill-draft-worker.yaml" in names
    assert "gpu-health.yaml: left out, it runs on GPU hosts only (no NVIDIA GPU on this host (NVML: test))" \
        in capsys.readouterr().err
    monkeypatch.setattr(gpu, "unavailable", lambda: None)
    assert "gpu-health.yaml" in [f.name for f in vs.experiment_files([])]

"""``specchaos compare`` on synthetic run directories with known answers (fast tier): A/A
pairs drawn from one distribution, with a run-level random effect as a host gives, never
exit 1 with repeats; one run a side never exits 1, however large the change; a real
regression (TTFT +50 % on every run, acceptance 20 % against 100 %) with three repeats a
side exits 1; different settings are refused (exit 2, one line each) unless allowed; a
single bucket is not printed twice; an A/A calibration writes tolerances that compare
reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.experiment.compare import calibrate, compare, read_side
from harness.experiment.config import SpecchaosConfig
from harness.load.records import write_records
from tests.experiment.test_bad_input import assert_one_line_error, cli
from tests.factories import make_record, phase_events

PHASE_S = 30.0


def write_run(d: Path, seed: int, *, ttft_s: float = 0.10, run_sd: float = 0.05, acceptance: float = 0.8,
              n: int = 80, buckets: tuple[str, ...] = ("short",), config: dict[str, Any] | None = None,
              overrides: list[dict[str, Any]] | None = None, fault_args: dict[str, Any] | None = None,
              host: float | None = None) -> Path:
    """One synthetic run directory: ``n`` complete requests per phase (baseline, after)
    with lognormal TTFT around ``ttft_s`` and 4 output chunks, every latency of the run
    scaled by one run-level factor ``lognormal(0, run_sd)`` (the host's run-to-run
    noise; ``host`` sets it); report.json with per-run throughput, goodput, acceptance and
    recovery times."""
    rng = np.random.default_rng([seed, 5])
    drawn = float(rng.lognormal(0, run_sd))
    host = drawn if host is None else host
    records, t0 = [], 1000.0
    phases: dict[str, Any] = {}
    for i, phase in enumerate(("baseline", "after")):
        start = t0 + i * PHASE_S
        for k in range(n):
            gap = 0.02 * host * float(rng.lognormal(0, 0.2))
            records.append(make_record(send_time=start + 0.1 + k * (PHASE_S - 1) / n, prompt_id=k,
                                       ttft=ttft_s * host * float(rng.lognormal(0, 0.25)), gaps=[gap] * 3,
                                       prompt_class=buckets[k % len(buckets)], logical_id=f"{seed}-{phase}-{k}"))
        phases[phase] = {"output_throughput_tps": 100 / host * float(rng.lognormal(0, 0.02)),
                         "goodput_rps": 2.5 / host * float(rng.lognormal(0, 0.02))}
    d.mkdir(parents=True)
    write_records(d / "records.jsonl", records)
    (d / "timeline.jsonl").write_text("".join(json.dumps(e) + "\n" for e in
                                              phase_events({"baseline": t0, "after": t0 + PHASE_S}, t0 + 2 * PHASE_S)))
    (d / "config.json").write_text(SpecchaosConfig.model_validate(config or {}).model_dump_json())
    (d / "experiment.json").write_text(json.dumps({"title": "synthetic", "method": [
        {"type": "action", "name": "kill-draft-worker",
         "provider": {"type": "python", "func": "kill_process", "arguments": fault_args or {"role": "draft"}}}]}))
    acc = {ph: {"acceptance_rate": min(1.0, acceptance + float(rng.normal(0, 0.01)))} for ph in phases}
    report = {"experiment": "synthetic", "verdict": "pass", "stack": {"launcher": "fake", "vllm_version": "0.0-test"},
              "load": {"plan_digest": "d" * 64}, "phases": phases,
              "speculation": {"servers": {"spec": {"phases": acc}}},
              "recovery": {"time_to_healthy_s": 20 * host, "time_to_first_success_s": 21 * host,
                           "time_to_slo_s": 25 * host}}
    if overrides:
        report["overrides"] = overrides
    (d / "report.json").write_text(json.dumps(report))
    return d


def side(root: Path, name: str, seeds: range | list[int], **kw: Any) -> Path:
    """A directory of runs (as ``run --repeat`` writes it), one per seed."""
    for i, s in enumerate(seeds):
        write_run(root / name / f"repeat-{i + 1}", s, **kw)
    return root / name


def test_aa_pairs_with_repeats_never_exit_1(tmp_path):
    """Twelve A/A pairs (2 or 3 runs a side; noisy hosts with a 5-10 % run-level spread):
    no regression, exit 0 every time — the comparison's point estimates do move by more
    than the 10 % tolerance between runs of one distribution."""
    moved = 0
    for seed in range(12):
        k = 2 + seed % 2
        run_sd = 0.05 if seed < 6 else 0.10
        a = side(tmp_path / str(seed), "A", range(seed * 10, seed * 10 + k), run_sd=run_sd)
        b = side(tmp_path / str(seed), "B", range(seed * 10 + 5, seed * 10 + 5 + k), run_sd=run_sd)
        res = cli("compare", str(a), str(b), "--resamples", "200", "--json", str(tmp_path / f"{seed}.json"))
        assert res.returncode == 0, res.stdout[-3000:]
        result = json.loads((tmp_path / f"{seed}.json").read_text())
        assert result["verdict"] == "no_regression" and result["regressions"] == 0
        moved += sum(1 for r in result["rows"] if r["change"] is not None and r["change"] > r["tolerance"])
    assert moved > 0   # noise that a gate on point estimates would have called a regression


def test_one_run_a_side_never_exits_1_and_says_why(tmp_path):
    """Even a +50 % TTFT on one run is no verdict: the deltas, 'needs repeats', exit 0."""
    a = write_run(tmp_path / "a", 1)
    b = write_run(tmp_path / "b", 2, ttft_s=0.15)
    res = cli("compare", str(a), str(b), "--json", str(tmp_path / "c.json"), "--allure-dir", str(tmp_path / "al"))
    assert res.returncode == 0, res.stdout
    assert "no verdict" in res.stdout and "--repeat" in res.stdout
    result = json.loads((tmp_path / "c.json").read_text())
    assert result["verdict"] == "needs_repeats" and result["regressions"] == 0
    ttft = next(r for r in result["rows"] if (r["phase"], r["figure"]) == ("after", "ttft_s p50"))
    assert ttft["change"] > 0.3 and ttft["verdict"] == "needs_repeats" and ttft["low"] is None
    (allure,) = (tmp_path / "al").glob("*-result.json")
    assert json.loads(allure.read_text())["status"] == "skipped"
    # three runs against one: still no verdict
    many = side(tmp_path, "many", range(10, 13))
    assert cli("compare", str(many), str(b)).returncode == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ttft_50_percent_slower_on_every_run_is_a_regression(tmp_path, seed):
    """Three repeats a side on a host whose runs differ by about 3 %."""
    a = side(tmp_path, "A", range(seed * 10, seed * 10 + 3), n=150, run_sd=0.03)
    b = side(tmp_path, "B", range(seed * 10 + 5, seed * 10 + 8), ttft_s=0.15, n=150, run_sd=0.03)
    res = cli("compare", str(a), str(b), "--json", str(tmp_path / "c.json"), "--resamples", "300")
    assert res.returncode == 1, res.stdout[-3000:]
    result = json.loads((tmp_path / "c.json").read_text())
    regressed = {(r["phase"], r["figure"]) for r in result["rows"] if r["verdict"] == "regression"}
    assert regressed and all(f.startswith(("ttft_s", "e2e_s")) for _, f in regressed), regressed
    assert all(r["p_regression_adj"] <= 0.05 and r["p_regression_adj"] >= r["p_regression"]
               for r in result["rows"] if r["verdict"] == "regression")
    row = next(r for r in result["rows"] if (r["phase"], r["figure"]) == ("after", "ttft_s p50"))
    assert row["change"] == pytest.approx(0.5, abs=0.15) and row["runs_a"] == row["runs_b"] == 3
    assert "REGRESSION" in res.stdout and "Benjamini" in res.stdout


def test_acceptance_20_percent_against_100_percent_is_a_regression(tmp_path):
    a = side(tmp_path, "A", range(0, 3), acceptance=1.0)
    b = side(tmp_path, "B", range(0, 3), acceptance=0.2)   # the same requests: only acceptance moved
    res = cli("compare", str(a), str(b), "--json", str(tmp_path / "c.json"), "--correction", "holm")
    assert res.returncode == 1, res.stdout[-3000:]
    result = json.loads((tmp_path / "c.json").read_text())
    assert {r["figure"] for r in result["rows"] if r["verdict"] == "regression"} == {"acceptance_rate"}
    assert result["correction"] == "holm"


def test_the_family_correction_decides_a_borderline_figure(tmp_path):
    """The same comparison with and without the correction: adjusting for the family
    never adds regressions, and the adjusted p-value is never below the raw one."""
    a = side(tmp_path, "A", range(0, 3))
    b = side(tmp_path, "B", range(10, 13), ttft_s=0.12)
    sa, sb = read_side(a), read_side(b)
    raw = compare(sa, sb, correction="none", resamples=300)
    bh = compare(sa, sb, correction="bh", resamples=300)
    holm = compare(sa, sb, correction="holm", resamples=300)
    assert raw["regressions"] >= bh["regressions"] >= holm["regressions"]
    assert all(x["p_regression_adj"] >= x["p_regression"] for x in holm["rows"] if x["p_regression"] is not None)
    assert bh["family"] == len([x for x in bh["rows"] if x["p_regression"] is not None]) > 20


def test_different_settings_are_refused_one_line_each_and_allowed_on_request(tmp_path):
    a = side(tmp_path, "A", range(0, 2), config={"load": {"users": 3}})
    b = side(tmp_path, "B", range(2, 4), config={"load": {"users": 5}, "slo": {"ttft_p95_s": 9.0}},
             overrides=[{"path": "slo.ttft_p95_s", "value": 9.0, "source": "--set"}])
    res = cli("compare", str(a), str(b))
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert any("load.users: A 3, B 5" in ln for ln in lines), lines
    assert any("slo.ttft_p95_s" in ln and "B: --set slo.ttft_p95_s=9.0" in ln for ln in lines), lines
    assert lines[-1].startswith("specchaos: error: refusing to compare") and "--allow-different" in lines[-1]
    assert all(ln.startswith("specchaos: error: ") for ln in lines) and "Traceback" not in res.stderr
    allowed = cli("compare", str(a), str(b), "--allow-different")
    assert allowed.returncode == 0, allowed.stderr
    assert "settings that differ (allowed): settings differ: load.users" in allowed.stdout
    partly = cli("compare", str(a), str(b), "--allow-different-in", "load")
    assert partly.returncode == 2 and "slo.ttft_p95_s" in partly.stderr and "load.users" not in partly.stderr
    assert cli("compare", str(a), str(b), "--allow-different-in", "load", "--allow-different-in",
               "slo").returncode == 0


def test_a_fault_argument_or_a_run_of_a_side_that_differs_is_named(tmp_path):
    a = side(tmp_path, "A", range(0, 2))
    b = side(tmp_path, "B", range(2, 4), fault_args={"role": "target"})
    res = cli("compare", str(a), str(b))
    assert res.returncode == 2 and "method[0].provider.arguments.role: A \"draft\", B \"target\"" in res.stderr
    write_run(tmp_path / "A" / "repeat-3", 9, config={"load": {"max_tokens": 7}})
    res = cli("compare", str(a), str(a))
    assert res.returncode == 2 and "between the runs of A: load.max_tokens" in res.stderr


def test_a_single_bucket_is_not_printed_twice(tmp_path):
    one = compare(read_side(side(tmp_path, "one", range(0, 2))), read_side(side(tmp_path, "one2", range(2, 4))),
                  resamples=50)
    assert {r["bucket"] for r in one["rows"]} == {"all"}
    two = compare(read_side(side(tmp_path, "two", range(0, 2), buckets=("short", "long"))),
                  read_side(side(tmp_path, "two2", range(2, 4), buckets=("short", "long"))), resamples=50)
    assert {r["bucket"] for r in two["rows"]} == {"all", "short", "long"}


def test_an_aa_calibration_sets_tolerances_at_least_its_spread(tmp_path):
    """Three A/A runs with the same requests on hosts 1.0, 1.3 and 1.1 times as slow: the
    TTFT p50's spread is 1.3 / 1.0 − 1 = 30 %, the error rate's 0; compare takes the larger
    of the spread and the stated tolerance for each figure, and says which."""
    for i, host in enumerate((1.0, 1.3, 1.1)):
        write_run(tmp_path / "A" / f"repeat-{i + 1}", 7, host=host)
    tol = tmp_path / "tol.json"
    res = cli("compare", str(tmp_path / "A"), "--calibrate", str(tol))
    assert res.returncode == 0 and "written to" in res.stdout, res.stdout + res.stderr
    spread = json.loads(tol.read_text())
    assert spread["figures"]["after/all/ttft_s p50"] == {"spread": pytest.approx(0.3), "runs": 3, "kind": "relative"}
    assert spread["figures"]["after/all/error_rate"]["spread"] == 0
    assert calibrate([read_side(tmp_path / "A")]).figures.keys() == spread["figures"].keys()
    b = side(tmp_path, "B", range(5, 8))
    out = tmp_path / "c.json"
    res = cli("compare", str(tmp_path / "A"), str(b), "--tolerance-file", str(tol), "--json", str(out))
    assert res.returncode == 0, res.stdout
    rows = {(r["phase"], r["figure"]): r for r in json.loads(out.read_text())["rows"]}
    assert rows["after", "ttft_s p50"]["tolerance"] == pytest.approx(0.3)
    assert rows["after", "ttft_s p50"]["tolerance_from"] == "calibrated" and "(A/A)" in res.stdout
    assert rows["after", "error_rate"]["tolerance"] == 0.01 and rows["after", "error_rate"]["tolerance_from"] == "stated"


@pytest.mark.parametrize("args, needles", [
    (["{A}", "--calibrate", "{T}"], ["--calibrate", "at least two runs"]),
    (["{A}"], ["missing the candidate B", "--calibrate"]),
    (["{A}", "{A}", "--tolerance-file", "{T}"], ["--tolerance-file", "no such tolerance file"]),
    (["{A}", "{A}", "--correction", "bonferroni"], ["--correction", "bh, holm, none"]),
])
def test_bad_input_is_one_line(tmp_path, args, needles):
    a = write_run(tmp_path / "A", 1)
    res = cli("compare", *(x.replace("{A}", str(a)).replace("{T}", str(tmp_path / "t.json")) for x in args))
    assert_one_line_error(res, *needles)


def test_a_file_that_is_no_tolerance_file_is_named(tmp_path):
    a = write_run(tmp_path / "A", 1)
    (tmp_path / "t.json").write_text(json.dumps({"figures": {"x": {"spread": "wide"}}}))
    assert_one_line_error(cli("compare", str(a), str(a), "--tolerance-file", str(tmp_path / "t.json")),
                          "not a tolerance file")

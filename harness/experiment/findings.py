"""The findings catalogue: real behaviours of the engine under test that specchaos found,
each kept where a platform team (and the engine's maintainers) can run, read and forward it.

A finding is a directory ``experiments/findings/NAME/`` holding:

* ``finding.json`` — what it is: ``{"title", "found_on": {"engine", "version", "date"},
  "status" ("open" | "fixed"), "servers": ["spec"] or ["spec", "plain"], "expected":
  {"verdict", "failed_checks"}, "related": [public threads]}``; ``expected`` is what
  ``experiment.yaml`` must produce on the engine it was found on;
* ``experiment.yaml`` — the specchaos experiment that shows it (full length: nightly);
* ``repro.py`` — a harness-free reproduction (standard library only) against servers the
  command ``repro.py --print-servers`` starts; its last output line is JSON
  ``{"reproduces": bool, "summary": str, ...}``, exit 0 when it ran, 2 when it could not;
* ``FINDING.md`` — engine and version, minimal trigger, observed vs expected, the checks
  that catch it, related public threads, status.

:func:`check_finding` runs a finding's reproduction (its CI form: seconds on a started
stack) and says its :data:`STATUSES` value on the engine that answered. ``specchaos
findings`` (:func:`run_findings`) does it for the catalogue: a report, not a gate (exit 0)
unless ``--require-all``.
"""

from __future__ import annotations

import json
import logging
import subprocess
from importlib import resources
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from packaging.version import InvalidVersion, Version

from harness.errors import ExperimentError
from harness.experiment.validate import load_experiment
from harness.stack.pool import StackPool
from harness.stack.vllm import vllm_distribution
from harness.timeline import Timeline

__all__ = ["Finding", "FindingResult", "STATUSES", "check_finding", "load_findings", "run_findings", "server_version",
           "shipped_findings_dir", "status_of"]

log = logging.getLogger(__name__)

#: A finding's status on the engine that answered: it shows (``reproduces``); it does not, on
#: a release newer than the one it was found on (``fixed``); it does not, on the same or an
#: older release or an engine that is not that one (``not reproducible here``); the
#: reproduction could not run (``cannot run``: a server did not answer).
STATUSES = ("reproduces", "fixed", "not reproducible here", "cannot run")


@dataclass(frozen=True)
class Finding:
    """One catalogued finding (see module doc); ``path`` is its directory."""

    name: str
    path: Path
    title: str
    engine: str
    version: str
    servers: tuple[str, ...]
    expected: dict[str, Any] = field(default_factory=dict)
    related: tuple[str, ...] = ()
    status: str = "open"

    @property
    def repro(self) -> Path:
        return self.path / "repro.py"

    @property
    def experiment(self) -> Path:
        return self.path / "experiment.yaml"


@dataclass
class FindingResult:
    """What one reproduction said: ``status`` (:data:`STATUSES`), its ``summary`` line, the
    engine version that answered, and the reproduction's own JSON (``detail``)."""

    finding: Finding
    status: str
    summary: str
    engine_version: str
    detail: dict[str, Any] = field(default_factory=dict)


def shipped_findings_dir() -> Path:
    """The shipped catalogue: package data ``harness/experiments_data/findings`` (in a
    checkout, ``experiments/findings``)."""
    return Path(str(resources.files("harness") / "experiments_data" / "findings"))


def load_findings(root: str | Path, names: list[str] | None = None) -> list[Finding]:
    """The findings under ``root`` (``experiments/findings``), sorted by name, or those named.

    Raises:
        ExperimentError: a named finding that does not exist, or a ``finding.json`` that is
            not the shape the module doc gives (naming the file and field).
    """
    root = Path(root)
    dirs = sorted(p for p in root.iterdir() if (p / "finding.json").is_file()) if root.is_dir() else []
    if names:
        known = {d.name for d in dirs}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ExperimentError(f"no finding named {unknown[0]!r}", where=str(root),
                                  hint=f"known: {', '.join(sorted(known)) or 'none'}")
        dirs = [d for d in dirs if d.name in names]
    out = []
    for d in dirs:
        where = str(d / "finding.json")
        try:
            meta = json.loads((d / "finding.json").read_text(encoding="utf-8"))
            found = meta["found_on"]
            out.append(Finding(name=d.name, path=d, title=str(meta["title"]), engine=str(found["engine"]),
                               version=str(found["version"]), servers=tuple(meta.get("servers", ["spec", "plain"])),
                               expected=dict(meta.get("expected", {})), related=tuple(meta.get("related", [])),
                               status=str(meta.get("status", "open"))))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ExperimentError(f"not a finding description: {exc!r}", where=where,
                                  hint="see harness/experiment/findings.py for its fields") from None
        for f in ("repro.py", "FINDING.md"):
            if not (d / f).is_file():
                raise ExperimentError(f"a finding needs {f}", where=str(d))
    return out


def _newer(engine_version: str, found: str) -> bool:
    try:
        return Version(engine_version) > Version(found)
    except InvalidVersion:
        return False


def status_of(reproduces: bool, engine: str, engine_version: str, finding: Finding) -> str:
    """``reproduces``; else ``fixed`` when the answering engine is the finding's, at a newer
    release; else ``not reproducible here``."""
    if reproduces:
        return "reproduces"
    if engine == finding.engine and _newer(engine_version, finding.version):
        return "fixed"
    return "not reproducible here"


def check_finding(finding: Finding, urls: dict[str, str], *, engine: str, engine_version: str,
                  timeout_s: float = 600.0) -> FindingResult:
    """Run ``finding``'s ``repro.py`` against ``urls`` (``{"spec": URL, "plain": URL}``,
    loopback) in a child process, and judge what it printed.

    Returns:
        The result; ``cannot run`` (with the reproduction's last error line) when it exited
        2, timed out or printed no JSON line.
    """
    cmd = [sys.executable, str(finding.repro)]
    for role in finding.servers:
        cmd += [f"--{role}", urls[role]]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return FindingResult(finding, "cannot run", f"repro.py ran past {timeout_s:.0f} s", engine_version)
    lines = proc.stdout.strip().splitlines()
    try:
        detail = json.loads(lines[-1]) if lines else None
    except ValueError:
        detail = None
    if proc.returncode != 0 or not isinstance(detail, dict) or "reproduces" not in detail:
        why = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return FindingResult(finding, "cannot run", f"repro.py exit {proc.returncode}: {why}", engine_version)
    status = status_of(bool(detail["reproduces"]), engine, engine_version, finding)
    return FindingResult(finding, status, str(detail.get("summary", "")), engine_version, detail)


def server_version(base_url: str, timeout_s: float = 10.0) -> str:
    """The vLLM version a server reports (``GET /version``), or ``"unknown"``."""
    try:
        resp = httpx.get(base_url.rstrip("/") + "/version", timeout=timeout_s)
        return str(resp.json().get("version", "unknown"))
    except (httpx.HTTPError, ValueError, AttributeError):
        return "unknown"


def run_findings(findings: list[Finding], *, urls: dict[str, str] | None = None, work_dir: Path,
                 timeout_s: float = 600.0) -> list[FindingResult]:
    """Each finding's reproduction on the servers at ``urls`` (``{"spec", "plain"}``), or,
    without, on a stack started from the finding's experiment (``stack`` block, with its
    reference server as the plain one; findings with the same stack share one start, in
    ``work_dir``), stopped at the end.

    Raises:
        SpecchaosError: a finding's experiment does not validate, or its stack cannot start.
    """
    engine = (vllm_distribution() or ("unknown", ""))[0]
    results: list[FindingResult] = []
    if urls is not None:
        version = server_version(urls["spec"])
        for f in findings:
            results.append(check_finding(f, urls, engine=engine, engine_version=version, timeout_s=timeout_s))
        return results
    with StackPool(work_dir / "stacks") as pool:
        for f in findings:
            exp = load_experiment(f.experiment)
            cfg = exp.cfg.stack.model_copy(update={"reference": True})
            run_dir = work_dir / f.name
            run_dir.mkdir(parents=True, exist_ok=True)
            stack = pool.acquire(cfg, run_dir, Timeline(run_dir / "timeline.jsonl"))
            try:
                here = {"spec": stack.servers["spec"].base_url, "plain": stack.servers["ref"].base_url}
                results.append(check_finding(f, here, engine=engine, engine_version=server_version(here["spec"]),
                                             timeout_s=timeout_s))
            finally:
                pool.release(stack, run_dir, clean=True)
    return results

"""The docs site: ``mkdocs build --strict`` (every page in the nav builds, the reference
pages are generated from the code, every Markdown link and anchor resolves) and a link
check over the built HTML (:mod:`tests.docs.links`), offline."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from faults.registry import REGISTRY
from harness.checks.registry import CHECKS
from tests.docs.links import check_site, parse_page

ROOT = Path(__file__).resolve().parents[2]
IN_CI = os.environ.get("CI", "").lower() == "true" or os.environ.get("SPECCHAOS_REQUIRE_REPORT_TOOLS") == "1"


def mkdocs_build(site: Path, config: Path = ROOT / "mkdocs.yml") -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` of ``config`` into ``site``, from the repository root (the
    snippets' base path) with this checkout's packages first on the path."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        (pytest.fail if IN_CI else pytest.skip)("mkdocs or mkdocs-material is not installed (the docs extra)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               NO_MKDOCS_2_WARNING="1", DISABLE_MKDOCS_2_WARNING="true")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)


def test_the_site_builds_strict_with_the_reference_generated_and_every_internal_link_resolves(tmp_path):
    """One build (the slow part) for both: the links of the built site, and the reference
    pages generated from the registries, the configuration model and the CLI."""
    site = tmp_path / "site"
    res = mkdocs_build(site)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (site / "index.html").is_file()
    problems = check_site(site)
    assert not problems, "\n".join(problems)

    faults = (site / "reference" / "faults" / "index.html").read_text(encoding="utf-8")
    for kind, cls in REGISTRY.items():
        assert f'id="{kind}"' in faults and cls.activity in faults, kind
    checks = parse_page((site / "reference" / "checks" / "index.html").read_text(encoding="utf-8"))
    assert {name.replace("_", "-") for name in CHECKS} <= checks.ids
    config = (site / "reference" / "configuration" / "index.html").read_text(encoding="utf-8")
    for block in ("specchaos-stack", "specchaos-load-profile", "specchaos-safeguards", "specchaos-stack-breaker"):
        assert f'id="{block}"' in config, block
    cli = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    for command in ("specchaos run", "specchaos validate", "specchaos report", "specchaos models build"):
        assert command in cli, command
    assert "schema_version" in (site / "reference" / "report" / "index.html").read_text(encoding="utf-8")
    assert not (site / "gen_reference.py").exists()


def test_the_link_check_reports_broken_links(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "index.html").write_text(
        '<h1 id="top">x</h1><a href="a/">ok</a><a href="#top">ok</a><a href="a/#here">ok</a>'
        '<a href="missing.html">1</a><a href="#nowhere">2</a><a href="a/#gone">3</a>'
        '<a href="https://">4</a><a href="ftp://example.org/x">5</a><a href="../outside.html">6</a>'
        '<img src="pic.png"><a href="https://example.org/page#frag">ok</a><a href="mailto:me@example.org">ok</a>')
    (tmp_path / "a" / "index.html").write_text('<p id="here">y</p><a href="../index.html#top">ok</a>')
    problems = check_site(tmp_path)
    assert len(problems) == 7, problems
    for bad in ("missing.html", "#nowhere", "a/#gone", "https://", "ftp://", "../outside.html", "pic.png"):
        assert any(f": {bad}" in p for p in problems), bad


def test_a_broken_link_in_a_page_fails_the_strict_build(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[gone](nowhere.md) and [anchor](#missing)\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text(f"site_name: t\ndocs_dir: {docs}\ntheme: {{name: material, font: false}}\n"
                      "validation: {anchors: warn, unrecognized_links: warn}\n")
    res = mkdocs_build(tmp_path / "site", config)
    assert res.returncode != 0
    assert "nowhere.md" in res.stderr and "#missing" in res.stderr

"""The README is one screen of a newcomer's first hour: short, its relative links resolve,
and the minimal experiment it shows is the shipped ``experiments/minimal.yaml``."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MINIMAL = ROOT / "experiments" / "minimal.yaml"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces → '-'."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(md: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", md.read_text(encoding="utf-8"), flags=re.S)
    return {github_anchor(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*$", text, re.M)}


def broken_links(md: Path) -> list[str]:
    """Relative links of ``md`` whose file (or Markdown heading) does not exist."""
    text = re.sub(r"```.*?```", "", md.read_text(encoding="utf-8"), flags=re.S)
    bad = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, frag = target.partition("#")
        dest = (md.parent / path).resolve() if path else md
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif frag and dest.suffix == ".md" and frag not in anchors(dest):
            bad.append(f"{target}: no heading #{frag}")
    return bad


def test_the_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move the detail into docs/"


def test_every_relative_link_in_the_readme_resolves():
    assert LINK.findall(README.read_text(encoding="utf-8")), "the README links into the docs"
    assert broken_links(README) == []


def test_the_link_check_finds_a_broken_link(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# A page\n\n## Some Section: here\n")
    md = tmp_path / "README.md"
    md.write_text("# Title\n\n[ok](docs/page.md#some-section-here) [ok](#title) [web](https://example.org)\n"
                  "[gone](docs/nope.md) [bad anchor](docs/page.md#nope) ![img](pic.png)\n"
                  "```\n[in code](ignored.md)\n```\n")
    assert broken_links(md) == ["docs/nope.md: no such file", "docs/page.md#nope: no heading #nope",
                                "pic.png: no such file"]


def test_the_readme_shows_the_shipped_minimal_experiment():
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    shipped = MINIMAL.read_text(encoding="utf-8")
    assert shipped in blocks, "the README's minimal experiment differs from experiments/minimal.yaml"
    assert len(shipped.splitlines()) <= 35

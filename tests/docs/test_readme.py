"""The README is one screen of a newcomer's first hour: short, its relative links resolve,
and the minimal experiment it shows is the shipped ``experiments/minimal.yaml``. Every vLLM
server command the README, the docs and the experiments' comments show runs the project's
virtualenv's python and listens on the loopback only."""

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


#: A command line that starts vLLM's OpenAI server (continuation lines joined).
_SERVER_COMMAND = re.compile(r"(?:^|(?<=`))[^`\n]*-m vllm\.entrypoints\.openai\.api_server(?:[^`\n]*\\\n)*[^`\n]*",
                             re.M)


def server_commands() -> dict[str, list[str]]:
    """Every command in the docs, the README and the experiments' comments that starts vLLM's
    OpenAI server: ``{file: [command, ...]}`` (a process named in a sentence is no command)."""
    files = [README, *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "experiments").rglob("*.yaml"))]
    out = {}
    for f in files:
        text = f.read_text(encoding="utf-8")
        if f.suffix == ".yaml":   # comments: "# ..." lines, joined into one
            text = " ".join(line.lstrip("# ").rstrip() for line in text.splitlines() if line.lstrip().startswith("#"))
        found = [m.group(0) for m in _SERVER_COMMAND.finditer(text) if "--model" in m.group(0)]
        if found:
            out[str(f.relative_to(ROOT))] = found
    return out


def test_every_server_command_shown_uses_the_venvs_python_on_the_loopback():
    commands = server_commands()
    assert {"docs/guides/external-endpoint.md", "experiments/external-endpoint.yaml"} <= set(commands)
    bad = {f: c for f, cs in commands.items() for c in cs
           if ".venv/bin/python -m vllm" not in c or "--host 127.0.0.1" not in c}
    assert not bad, bad

"""Generate the reference pages of the docs site from the code, at ``mkdocs build``.

A mkdocs hook (``hooks:`` in ``mkdocs.yml``): its ``on_files`` adds the pages to the build,
nothing is written into ``docs/`` or committed, so the reference follows the code by itself:

* ``reference/cli.md``: the ``specchaos`` command, from its typer app (typer's own
  Markdown renderer, :func:`typer.cli.get_docs_for_click`);
* ``reference/faults.md``: every family of :data:`faults.registry.REGISTRY`, its typed
  Chaos Toolkit action and the action's arguments from the family's pydantic ``Params``
  model (plus the arguments every fault action takes, :class:`FaultTiming`), and the
  process roles (:data:`harness.stack.base.ROLE_DOCS`);
* ``reference/activities.md``: the actions and probes an experiment calls
  (:mod:`harness.experiment.actions`, :mod:`harness.experiment.probes`), with their signatures;
* ``reference/checks.md``: every family of :data:`harness.checks.registry.CHECKS`, in the
  judge's order, with its module's documentation and its ``report.json`` section;
* ``reference/configuration.md``: ``configuration.specchaos`` from the JSON Schema of
  :class:`harness.experiment.config.SpecchaosConfig`, one table per block;
* ``reference/report.md``: ``report.json`` as :mod:`harness.report.json_report` defines it.

Field descriptions come from the JSON Schema (``Field(description=...)``) or, where the
code documents a field with a ``#:`` comment above it, from that comment.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
import textwrap
import typing
from pathlib import Path
from typing import Any, Iterator

from pydantic import BaseModel

FENCE = "```"


# --- text helpers ---------------------------------------------------------------------

def rst_to_md(text: str) -> str:
    """Docstring (reStructuredText as the code writes it) → Markdown: ````x```` and
    Sphinx roles become code spans, ``::`` literal blocks become fenced blocks, Google-style
    ``Args:``/``Raises:`` stay as text."""
    text = inline_md(inspect.cleandoc(text or ""))
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.rstrip().endswith("::") and not line.strip().startswith(".."):
            head = line.rstrip()[:-2].rstrip()
            out.append(head + (":" if head and not head.endswith(":") else ""))
            i += 1
            block: list[str] = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
                block.append(lines[i])
                i += 1
            while block and not block[-1].strip():
                block.pop()
            while block and not block[0].strip():
                block.pop(0)
            out += ["", FENCE, textwrap.dedent("\n".join(block)), FENCE, ""]
            continue
        out.append(line)
        i += 1
    return "\n".join(out).strip() + "\n"


def inline_md(text: str) -> str:
    """Sphinx roles and ````literals```` → Markdown code spans."""
    text = re.sub(r":(?:mod|class|func|meth|data|attr|exc|obj):`~?([^`]+)`", lambda m: f"`{m.group(1)}`", text)
    return re.sub(r"``(.+?)``", r"`\1`", text)


def cell(text: Any) -> str:
    """One Markdown table cell: no newlines, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def first_sentence(doc: str | None) -> str:
    doc = inspect.cleandoc(doc or "")
    para = doc.split("\n\n", 1)[0]
    return inline_md(" ".join(para.split()))


def comment_docs(cls: type) -> dict[str, str]:
    """``#:`` comments written above the fields of a class (Sphinx's attribute doc
    comments): ``{field: text}``."""
    docs: dict[str, str] = {}
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return docs
    pending: list[str] = []
    for raw in source.splitlines():
        line = raw.strip()
        if line.startswith("#:"):
            pending.append(line[2:].strip())
            continue
        m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)\s*:", line)
        if m and pending:
            docs[m.group(1)] = " ".join(pending)
        pending = []
    return docs


# --- JSON Schema rendering ------------------------------------------------------------

def schema_type(s: dict[str, Any], defs_anchor: dict[str, str]) -> str:
    """A JSON Schema node as a short type: ``number``, ``string or null``, ``"a" | "b"``,
    ``list of number``, a link to a nested block."""
    if "$ref" in s:
        name = s["$ref"].rsplit("/", 1)[-1]
        anchor = defs_anchor.get(name)
        return f"[{name}](#{anchor})" if anchor else name
    if "const" in s:
        return json.dumps(s["const"])
    if "enum" in s:
        return ", ".join(f"`{json.dumps(v)}`" for v in s["enum"])
    for key in ("anyOf", "oneOf", "allOf"):
        if key in s:
            return " or ".join(schema_type(x, defs_anchor) for x in s[key])
    t = s.get("type")
    if t == "array":
        return f"list of {schema_type(s.get('items') or {}, defs_anchor)}"
    if t == "object":
        extra = s.get("additionalProperties")
        if isinstance(extra, dict):
            return f"map of {schema_type(extra, defs_anchor)}"
        return "object"
    if isinstance(t, list):
        return " or ".join(t)
    return t or "any"


def constraints(s: dict[str, Any]) -> str:
    parts = []
    for node in [s, *s.get("anyOf", [])]:
        for key, sym in (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<"),
                         ("minLength", "length ≥"), ("minItems", "items ≥")):
            if key in node:
                parts.append(f"{sym} {node[key]}")
        if "pattern" in node:
            parts.append(f"matches `{node['pattern']}`")
    return ", ".join(parts)


def default_of(s: dict[str, Any], required: bool) -> str:
    if required:
        return "**required**"
    if "default" not in s:
        return "see below" if "$ref" in s or any("$ref" in x for x in s.get("anyOf", [])) else "—"
    return f"`{json.dumps(s['default'])}`"


def model_classes(root: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Every pydantic model reachable from ``root``'s fields, by class name (the JSON
    Schema's ``$defs`` keys)."""
    found: dict[str, type[BaseModel]] = {}

    def walk(tp: Any) -> None:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if tp.__name__ in found:
                return
            found[tp.__name__] = tp
            for f in tp.model_fields.values():
                walk(f.annotation)
            return
        for arg in typing.get_args(tp):
            walk(arg)

    walk(root)
    return found


def field_rows(schema: dict[str, Any], cls: type | None, defs_anchor: dict[str, str]) -> Iterator[str]:
    """A Markdown table of ``schema``'s fields: type, default, constraints, description (the
    schema's, the class's ``#:`` comment, else the first sentence of a nested model's doc)."""
    notes = comment_docs(cls) if cls is not None else {}
    defs = {name: sub.get("description", "") for name, sub in (schema.get("$defs") or {}).items()}
    models = model_classes(cls) if isinstance(cls, type) and issubclass(cls, BaseModel) else {}
    required = set(schema.get("required", []))
    yield "| field | type | default | constraints | description |"
    yield "| --- | --- | --- | --- | --- |"
    for name, prop in (schema.get("properties") or {}).items():
        desc = prop.get("description") or notes.get(name, "")
        if not desc:
            refs = [ref for field, ref in nested_refs({"properties": {name: prop}})]
            if refs:
                para = first_sentence(defs.get(refs[0]) or (models[refs[0]].__doc__ if refs[0] in models else ""))
                desc = re.split(r"(?<=\.)\s", para, maxsplit=1)[0]
        desc = inline_md(desc)
        yield (f"| `{name}` | {cell(schema_type(prop, defs_anchor))} | {cell(default_of(prop, name in required))} "
               f"| {cell(constraints(prop))} | {cell(desc)} |")


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def heading(level: int, text: str, anchor: str | None = None) -> str:
    """A Markdown heading with an explicit anchor (attr_list), so links need not guess the
    toc extension's slugs."""
    return f"{'#' * level} {text} {{ #{anchor or slug(text)} }}"


def nested_refs(schema: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """``(field, $defs name)`` of every field of ``schema`` that is (a list or map of, or
    optionally) a nested model."""
    for name, prop in (schema.get("properties") or {}).items():
        stack = [prop]
        while stack:
            node = stack.pop()
            if "$ref" in node:
                yield name, node["$ref"].rsplit("/", 1)[-1]
                break
            stack += node.get("anyOf", []) + node.get("oneOf", [])
            if isinstance(node.get("items"), dict):
                stack.append(node["items"])
            if isinstance(node.get("additionalProperties"), dict):
                stack.append(node["additionalProperties"])


def model_sections(model: Any, root: str) -> tuple[list[str], dict[str, Any], dict[str, str]]:
    """The field table of ``model`` (a pydantic model class) and one section per nested model,
    each at the first dotted path from ``root`` that reaches it, depth first: (Markdown lines
    starting with the root's table, the schema, the anchors)."""
    schema = model.model_json_schema()
    defs = schema.get("$defs", {})
    classes = model_classes(model)
    order: list[tuple[str, str]] = []   # (path, $defs name)
    seen: set[str] = set()

    def visit(path: str, node: dict[str, Any]) -> None:
        for field, ref in nested_refs(node):
            if ref not in seen:
                seen.add(ref)
                order.append((f"{path}.{field}", ref))
                visit(f"{path}.{field}", defs.get(ref, {}))

    visit(root, schema)
    anchors = {ref: slug(path) for path, ref in order}
    lines = [rst_to_md(model.__doc__ or ""), heading(2, root), "", *field_rows(schema, model, anchors), ""]
    for path, ref in order:
        sub = defs.get(ref, {})
        lines += [heading(2, path), "", f"Model `{ref}`" + (f" (`{classes[ref].__module__}`)" if ref in classes else "")
                  + ".", ""]
        doc = sub.get("description") or (classes[ref].__doc__ if ref in classes else "")
        if doc:
            lines += [rst_to_md(doc)]
        lines += [*field_rows(sub, classes.get(ref), anchors), ""]
    return lines, schema, anchors


def configuration_page() -> str:
    from harness.experiment.config import SpecchaosConfig

    body, _, _ = model_sections(SpecchaosConfig, "specchaos")
    return "\n".join([
        "# Configuration: `configuration.specchaos`", "",
        "Generated from the JSON Schema of `harness.experiment.config.SpecchaosConfig` at docs build time. "
        "Every block and every field is optional: what an experiment leaves out takes the default shown "
        "(`specchaos validate FILE` prints the first field that does not validate, with its path). Unknown "
        "fields are errors. Durations are seconds (`*_s`), sizes GiB (`*_gib`), rates fractions in [0, 1].",
        "", *body])


# --- faults ---------------------------------------------------------------------------

def faults_page() -> str:
    from faults.registry import REGISTRY
    from harness.experiment.actions import FaultTiming
    from harness.stack.base import ROLE_DOCS

    lines = ["# Fault families", "",
             "Generated from the fault registry (`faults/registry.py`) at docs build time. Each family is one "
             "module under `faults/` and one typed Chaos Toolkit action in `harness.experiment.actions`, whose "
             "arguments are the family's parameter model; `specchaos faults` prints the same list.", "",
             "| family | action | what it does |", "| --- | --- | --- |"]
    for kind, cls in sorted(REGISTRY.items()):
        doc = cls.__dict__.get("__doc__") or inspect.getmodule(cls).__doc__
        lines.append(f"| [`{kind}`](#{slug(kind)}) | `{cls.activity}` | {cell(first_sentence(doc))} |")
    lines += ["", "## Arguments of every fault action", "",
              rst_to_md(FaultTiming.__doc__ or ""), *field_rows(FaultTiming.model_json_schema(), FaultTiming, {}), "",
              "## Process roles", "", "The `role` (or `roles`) argument names processes of a vLLM server:", "",
              "| role | process |", "| --- | --- |"]
    lines += [f"| `{role}` | {cell(what)} |" for role, what in ROLE_DOCS.items()]
    lines.append("")
    for kind, cls in sorted(REGISTRY.items()):
        module = inspect.getmodule(cls)
        path = module.__name__.replace(".", "/") + ".py"
        params = cls.Params
        pschema = params.model_json_schema()
        anchors = {name: slug(f"{kind}-{name}") for name in pschema.get("$defs", {})}
        lines += [heading(2, kind), "", f"Action `{cls.activity}` · module `{path}` · parameters `{params.__name__}`.", "",
                  rst_to_md(module.__doc__ or ""), "### Arguments", "", *field_rows(pschema, params, anchors), ""]
        for name, sub in pschema.get("$defs", {}).items():
            sub_cls = model_classes(params).get(name)
            lines += [heading(3, f"{kind}: {name}", anchors[name]), "", rst_to_md(sub.get("description") or ""),
                      *field_rows(sub, sub_cls, anchors), ""]
    return "\n".join(lines)


# --- checks ---------------------------------------------------------------------------

def checks_page() -> str:
    from harness.checks.registry import CHECKS
    from harness.checks.required import DEFAULTS, SOAK_DEFAULT

    lines = ["# Check families", "",
             "Generated from the check registry (`harness/checks/registry.py`) at docs build time, in the order "
             "the judge runs them. Each family is a pure function of the recorded run "
             "(`check(run: RecordedRun) -> list[CheckResult]`); a family with a section also writes "
             "`report.json[family]`. A check's name starts with its family (`slo.baseline.ttft_p95_s`).", "",
             "| family | module | report.json section | what it judges |", "| --- | --- | --- | --- |"]
    for name, fam in CHECKS.items():
        module = inspect.getmodule(fam.check)
        lines.append(f"| [`{name}`](#{slug(name)}) | `{module.__name__}` | {'yes' if fam.section else '—'} "
                     f"| {cell(first_sentence(module.__doc__))} |")
    lines += ["", heading(2, "Required by default"), "",
              "What a run requires to be judged when its experiment has no `judge.required` "
              "(`harness/checks/required.py`; a required check not judged makes the verdict error):", "",
              "| fault kind | required |", "| --- | --- |"]
    lines += [f"| `{kind}` | {', '.join(f'`{n}`' for n in names)} |" for kind, names in DEFAULTS.items()]
    lines += [f"| soak (`soak.enabled`) | {', '.join(f'`{n}`' for n in SOAK_DEFAULT)} |", ""]
    for name, fam in CHECKS.items():
        module = inspect.getmodule(fam.check)
        path = module.__name__.replace(".", "/") + ".py"
        section = f"`report.json[\"{name}\"]`" if fam.section else "none"
        lines += [heading(2, name), "", f"Module `{path}` · section {section}.", "", rst_to_md(module.__doc__ or ""), ""]
    return "\n".join(lines)


# --- report.json ----------------------------------------------------------------------

def report_page() -> str:
    from harness.checks.base import CheckResult
    from harness.checks.registry import CHECKS, RESERVED_NAMES
    from harness.report import json_report
    from harness.report.schema import Report

    sections = [name for name, fam in CHECKS.items() if fam.section]
    body, _, _ = model_sections(Report, "report")
    lines = ["# report.json", "",
             f"Generated from the JSON Schema of `harness.report.schema.Report` (published as "
             f"`schemas/report.v1.schema.json`, [JSON Schemas](schemas.md)), `harness/report/json_report.py` and "
             f"the check registry at docs build time. `schema_version` is {json_report.SCHEMA_VERSION}. Sections "
             f"the schema leaves open are described by their check family.", "",
             "## Keys the judge writes", "", ", ".join(f"`{k}`" for k in sorted(RESERVED_NAMES)), "",
             "## Sections of the check families", "",
             "Each of these keys holds the section of the check family of the same name "
             "([Check families](checks.md)):", "", ", ".join(f"[`{s}`](checks.md#{slug(s)})" for s in sections), "",
             "## A check result (`checks[]`)", "", rst_to_md(CheckResult.__doc__ or ""),
             "`judged` is added in report.json: false when `passed` is null.", "",
             "## The whole file, as the schema gives it", "", *body,
             "## In words", "", rst_to_md(json_report.__doc__ or ""), ""]
    return "\n".join(lines)


# --- actions and probes ---------------------------------------------------------------

def signature_text(func: Any) -> str:
    """``(a: float | None = None) -> dict`` with the annotations as written (they are strings
    under ``from __future__ import annotations``)."""
    def ann(a: Any) -> str:
        return a if isinstance(a, str) else getattr(a, "__name__", str(a))

    sig = inspect.signature(func)
    params = []
    for p in sig.parameters.values():
        text = p.name + (f": {ann(p.annotation)}" if p.annotation is not p.empty else "")
        if p.default is not p.empty:
            text += f" = {p.default!r}"
        params.append(text)
    ret = f" -> {ann(sig.return_annotation)}" if sig.return_annotation is not sig.empty else ""
    return f"({', '.join(params)}){ret}"


def activities_page() -> str:
    from faults.registry import REGISTRY
    from harness.experiment import actions, probes

    fault_actions = {cls.activity: kind for kind, cls in REGISTRY.items()}
    lines = ["# Actions and probes", "",
             "Generated from `harness.experiment.actions` and `harness.experiment.probes` (their `__all__`) at "
             "docs build time: what an experiment's activities may call, with `type: python` and the module "
             "below. `chaos discover specchaos --no-install` lists the same.", ""]
    for module in (probes, actions):
        kind = "probe" if module is probes else "action"
        lines += [heading(2, f"{kind.capitalize()}s: {module.__name__}", f"{kind}s"), ""]
        for name in module.__all__:
            func = getattr(module, name)
            if name in fault_actions:
                lines += [heading(3, name), "",
                          f"The typed action of the fault family [`{fault_actions[name]}`](faults.md#"
                          f"{slug(fault_actions[name])}): its arguments are the family's, plus `duration_s` and "
                          f"`evidence_timeout_s`.", ""]
                continue
            sig = signature_text(func)
            lines += [heading(3, name), "", f"{FENCE}python", f"{name}{sig}", FENCE, "",
                      rst_to_md(func.__doc__ or ""), ""]
    return "\n".join(lines)


# --- CLI ------------------------------------------------------------------------------

def cli_page() -> str:
    import click
    import typer
    from typer.cli import get_docs_for_click

    from harness.cli import app

    command = typer.main.get_command(app)
    ctx = click.Context(command, info_name="specchaos")
    text = get_docs_for_click(obj=command, ctx=ctx, name="specchaos", title="The specchaos command")
    return ("<!-- generated from harness/cli.py (typer) at docs build time -->\n" + text)


PAGES = {
    "reference/cli.md": cli_page,
    "reference/faults.md": faults_page,
    "reference/activities.md": activities_page,
    "reference/checks.md": checks_page,
    "reference/configuration.md": configuration_page,
    "reference/report.md": report_page,
}


def render_pages() -> dict[str, str]:
    """Every reference page: ``{path under docs/: markdown}``."""
    return {path: render() for path, render in PAGES.items()}


def on_files(files, config):
    """mkdocs hook (``hooks:`` in ``mkdocs.yml``): add the generated pages to the build."""
    from mkdocs.structure.files import File

    root = str(Path(config["config_file_path"]).resolve().parent)
    if root not in sys.path:   # the checkout's packages, also where specchaos is not installed
        sys.path.insert(0, root)
    for path, text in render_pages().items():
        files.append(File.generated(config, path, content=text))
    return files


if __name__ == "__main__":   # by hand: print one page, e.g. reference/faults.md
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    print(PAGES[sys.argv[1]]() if len(sys.argv) > 1 else "\n".join(PAGES))

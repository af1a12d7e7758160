"""The house rules, checked on the source with the standard library's ``ast``:

* layers import downwards only: a package imports its own modules and packages of a
  lower layer, never one above (so the experiment layer only composes, and there is no
  package cycle);
* no module under stack, load, metrics, checks or faults imports ``harness.experiment``
  or ``harness.report``;
* an import inside a function only defers a heavy dependency, and says so in a comment;
* no fault family imports another (issue 18): what several share (process targets,
  engine metrics, the duty cycle, the proxy) lives below them in ``faults``; only the
  registry (and what builds on it) knows every family;
* no fault family imports a mechanism's module, the cgroup library or the Docker client
  (issue 31): a family states what, :mod:`faults.mechanisms` (the package: its selector)
  says how.

Imports under ``if TYPE_CHECKING:`` are typing only and not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Layer of each package (modules directly under harness/ are the base: errors, clock,
#: timeline, state, net, proc). Imports may only go to a strictly lower layer or stay
#: inside the same package.
LAYERS = {
    "harness": 0,
    "harness.stack": 1,
    "harness.load": 1,
    "harness.metrics": 2,
    "harness.checks": 3,
    "faults": 3,
    "harness.report": 4,
    "harness.experiment": 5,
    "harness.cli": 6,
    "harness.pytest_plugin": 6,
    "chaosspecchaos": 6,
}
LOWER = ("harness.stack", "harness.load", "harness.metrics", "harness.checks", "faults")
UPPER = ("harness.experiment", "harness.report")


def modules() -> dict[str, Path]:
    out = {}
    for top in ("harness", "faults", "chaosspecchaos"):
        for p in sorted((ROOT / top).rglob("*.py")):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = p
    return out


def package_of(mod: str) -> str:
    """``harness.stack.local`` → ``harness.stack``; ``harness.errors`` → ``harness``;
    ``harness.cli`` → ``harness.cli``; ``faults.x`` → ``faults``."""
    parts = mod.split(".")
    if parts[0] in ("faults", "chaosspecchaos"):
        return parts[0]
    if mod in ("harness.cli", "harness.pytest_plugin"):
        return mod
    if len(parts) >= 2 and f"harness.{parts[1]}" in LAYERS:
        return f"harness.{parts[1]}"
    return "harness"


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """``(imported module, line, inside a function)`` of every runtime absolute import."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, in_func: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if _type_checking(child):
                continue
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, in_func) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                found.append((child.module, child.lineno, in_func))
            visit(child, in_func or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return found


def edges() -> list[tuple[str, str, str, int, bool]]:
    """``(from package, to package, from module, line, in function)`` for imports of our code."""
    out = []
    for mod, path in modules().items():
        for target, line, in_func in imports(path):
            if target.split(".")[0] not in ("harness", "faults", "chaosspecchaos"):
                continue
            out.append((package_of(mod), package_of(target), mod, line, in_func))
    return out


def test_every_package_has_a_layer():
    assert {package_of(m) for m in modules()} <= set(LAYERS)


def test_layers_import_downwards_only():
    bad = [f"{mod}:{line} imports {dst} (layer {LAYERS[dst]}) from {src} (layer {LAYERS[src]})"
           for src, dst, mod, line, _ in edges() if src != dst and LAYERS[dst] >= LAYERS[src]]
    assert not bad, "\n".join(bad)


def test_lower_layers_never_import_experiment_or_report():
    bad = [f"{mod}:{line} imports {dst}" for src, dst, mod, line, _ in edges()
           if src in LOWER and dst in UPPER]
    assert not bad, "\n".join(bad)


def test_no_package_cycles():
    graph: dict[str, set[str]] = {}
    for src, dst, *_ in edges():
        if src != dst:
            graph.setdefault(src, set()).add(dst)
    state: dict[str, int] = {}

    def dfs(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path + [node, nxt]
            if state.get(nxt) is None and (cycle := dfs(nxt, path + [node])):
                return cycle
        state[node] = 2
        return None

    for node in sorted(graph):
        if state.get(node) is None:
            cycle = dfs(node, [])
            assert cycle is None, " -> ".join(cycle)


def test_imports_inside_functions_defer_heavy_dependencies_with_a_comment():
    bad = []
    for mod, path in modules().items():
        lines = path.read_text(encoding="utf-8").splitlines()
        for target, line, in_func in imports(path):
            if not in_func:
                continue
            near = " ".join(lines[max(0, line - 3):line])
            if "#" not in near or "defer" not in near.lower():
                bad.append(f"{mod}:{line} imports {target} inside a function without a '# deferred: ...' comment")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("rule", ["layers", "cycles"])
def test_the_scan_can_fail(tmp_path, monkeypatch, rule):
    """The scan catches a violation: a fake lower module importing the experiment layer
    (which also closes a cycle, since the experiment layer imports the checks)."""
    bad = ROOT / "harness" / "checks" / "_scan_probe.py"
    bad.write_text("from harness.experiment.config import SpecchaosConfig\n", encoding="utf-8")
    try:
        with pytest.raises(AssertionError):
            if rule == "layers":
                test_layers_import_downwards_only()
            else:
                test_no_package_cycles()
    finally:
        bad.unlink()


def family_modules() -> set[str]:
    """The module of every registered fault family (``faults.process_kill``...)."""
    from faults.registry import REGISTRY  # deferred: the scan above needs no import of our code
    return {cls.__module__ for cls in REGISTRY.values()}


def family_imports(mods: dict[str, Path], families: set[str]) -> list[str]:
    """``"module:line imports family"`` for each import of a family module by another
    family module."""
    return [f"{mod}:{line} imports {target}" for mod, path in mods.items() if mod in families
            for target, line, _ in imports(path) if target in families and target != mod]


def test_no_fault_family_imports_another():
    families = family_modules()
    assert len(families) >= 10, families
    bad = family_imports(modules(), families)
    assert not bad, "\n".join(bad)


def test_the_family_rule_can_fail(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from faults.process_kill import ProcessKill\n", encoding="utf-8")
    families = family_modules() | {"faults.probe"}
    assert family_imports({"faults.probe": probe}, families) == ["faults.probe:1 imports faults.process_kill"]


#: What a family may not import: a mechanism module (``faults.mechanisms.<name>``; the
#: package itself, the selector, it may), the cgroup library, the Docker client.
HOW = ("faults.mechanisms.", "faults.cgroup", "docker")


def names_imported(path: Path) -> list[tuple[str, int]]:
    """``(dotted name, line)`` of every module imported, ``from`` imports of our modules
    included (``from faults import cgroup`` gives ``faults`` and ``faults.cgroup``)."""
    ours = modules()
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.module, node.lineno)] + [(f"{node.module}.{a.name}", node.lineno) for a in node.names
                                                   if f"{node.module}.{a.name}" in ours]
    return out


def how_imports(mods: dict[str, Path], families: set[str]) -> list[str]:
    """``"module:line imports name"`` for each import by a family module of what :data:`HOW` names."""
    return [f"{mod}:{line} imports {name}" for mod, path in mods.items() if mod in families
            for name, line in names_imported(path)
            if any(name.startswith(h) if h.endswith(".") else name == h or name.startswith(h + ".") for h in HOW)]


def test_no_fault_family_drives_a_mechanism_directly():
    bad = how_imports(modules(), family_modules())
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("line", ["from faults import cgroup", "from faults.mechanisms.container import pause",
                                  "import docker.errors", "from faults.cgroup import TreeCgroup"])
def test_the_mechanism_rule_can_fail(tmp_path, line):
    probe = tmp_path / "probe.py"
    probe.write_text(f"from faults.mechanisms import select\n{line}\n", encoding="utf-8")
    assert len(how_imports({"faults.probe": probe}, family_modules() | {"faults.probe"})) >= 1

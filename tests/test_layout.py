"""The folders show the architecture: lower layers never import higher ones, and every module is
described in docs/architecture.md (one line each)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "ablate"
# bottom to top; ablate.config (the one typed config) and ablate.schema (its typed YAML) sit below all of them
LAYERS = ["rl", "tasks", "runs", "train", "experiments", "analysis", "cli"]


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "ablate" or len(parts) < 2 or parts[1] not in LAYERS:
        return None
    return LAYERS.index(parts[1])


def imported_modules(path: Path) -> set[str]:
    """Every `ablate...` module a file imports, at any depth (lazy imports inside functions count too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}  # `from ablate.rl import losses`
    return {m for m in out if m.startswith("ablate")}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def test_lower_layers_never_import_higher_ones():
    violations = []
    for path in sorted(PKG.rglob("*.py")):
        here = layer_of(module_name(path))
        for target in imported_modules(path):
            there = layer_of(target)
            if here is not None and there is not None and there > here:
                violations.append(f"{path.relative_to(ROOT)} imports {target}")
    assert not violations, "upward imports:\n" + "\n".join(violations)


def test_config_imports_nothing_of_ablate_but_the_schema_presets_rollout_sections_and_resource_checks():
    # the presets table is plain data that imports nothing of ablate itself; the rollout engine's sections
    # are config built from the schema's domains; the resource checks look at files, importing nothing of ablate
    assert {".".join(m.split(".")[:2]) for m in imported_modules(PKG / "config.py")} == {
        "ablate.schema", "ablate.presets", "ablate.rollout_config", "ablate.resources"}
    assert {".".join(m.split(".")[:2]) for m in imported_modules(PKG / "resources.py")} <= {"ablate.config"}
    assert {".".join(m.split(".")[:2]) for m in imported_modules(PKG / "rollout_config.py")} == {"ablate.schema"}
    assert imported_modules(PKG / "schema.py") == set()
    assert imported_modules(PKG / "presets.py") == set()


def test_every_module_is_described_in_the_architecture_doc():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    missing = [str(p.relative_to(ROOT)) for p in sorted(PKG.rglob("*.py"))
               if p.name != "__init__.py" and str(p.relative_to(ROOT)) not in doc]
    assert not missing, "modules without a line in docs/architecture.md: " + ", ".join(missing)


def test_no_file_refers_outside_the_repository():
    """The design reference lives in docs/ now; nothing points readers at a folder a clone lacks."""
    offenders = []
    for path in ROOT.rglob("*"):
        if ".venv" in path.parts or ".git" in path.parts or not path.is_file() or path.suffix not in (
                ".py", ".md", ".yaml", ".toml", ".sh") or path == Path(__file__):
            continue
        text = path.read_text(errors="ignore")
        if "DESIGN.md" in text or "shared folder" in text or "../shared" in text:
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, "files that refer to DESIGN.md / the shared folder: " + ", ".join(offenders)


def runtime_nodes(tree: ast.AST):
    """Every node of `tree` but those of `if TYPE_CHECKING:` blocks (read by type checkers only)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for orelse in node.orelse for n in [orelse, *runtime_nodes(orelse)])
            continue
        yield node
        yield from runtime_nodes(node)


def import_graph() -> dict[str, set[str]]:
    """module -> the ablate modules it imports when it runs, at any depth (imports inside functions count:
    a cycle through one only waits for the first call to bite; those under `if TYPE_CHECKING:` never run).
    `from a.b import c` is an edge to the module a.b.c when there is one, else to a.b."""
    paths = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for mod, path in paths.items():
        edges = set()
        for node in runtime_nodes(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                edges |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in paths else node.module
                          for a in node.names}
        graph[mod] = {m for m in edges if m in paths and m != mod}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[tuple[list[str], list[str]]]:
    """Per strongly connected component of more than one module (Tarjan's algorithm): one cycle through it
    (a -> b -> ... -> a, the shortest way back to its first module) and the component's modules off
    that cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles = []
    for component in components:
        start = min(component)
        paths = {start: [start]}
        todo = [start]
        while todo:  # breadth first inside the component: the shortest way back to `start`
            v = todo.pop(0)
            for w in sorted(graph[v] & component):
                if w == start:
                    cycles.append(([*paths[v], start], sorted(component - set(paths[v]))))
                    todo = []
                    break
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    todo.append(w)
    return cycles


def test_import_cycles_are_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"}}
    assert sorted(import_cycles(graph)) == [(["a", "b", "c", "a"], []), (["e", "f", "e"], [])]
    assert import_cycles({"a": {"b", "c"}, "b": {"a"}, "c": {"b"}}) == [(["a", "b", "a"], ["c"])]
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_imports_under_type_checking_are_not_edges_but_function_level_ones_are():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import ablate.x\nelse:\n"
                     "    import ablate.y\ndef f():\n    import ablate.z\n")
    names = {a.name for n in runtime_nodes(tree) if isinstance(n, ast.Import) for a in n.names}
    assert names == {"ablate.y", "ablate.z"}


def test_no_import_cycle_among_the_package_modules():
    cycles = import_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) + (f" (also in the circle: {', '.join(rest)})" if rest else "")
                                                    for c, rest in cycles)

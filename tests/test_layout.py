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

"""The package's layers (docs/layout.md): each module imports only from its own layer or those below,
and a recipe imports another recipe only where the data flows that way. Read from the code's own
imports (every import statement, also those inside functions)."""

import ast
from pathlib import Path

import pytest

from conftest import ROOT

LIB = ROOT / "workflow" / "lib"

# Bottom to top; a module's layer is that of the longest prefix naming it.
LAYERS = (
    ("encoder_study.core", 0),
    ("encoder_study", 0),  # the package's own __init__: the version
    ("encoder_study.provenance", 1),  # the fragment writer, its reader (records), seals, code inputs
    ("encoder_study.provenance.records", 1),
    ("encoder_study.data", 2),
    ("encoder_study.onnx", 3),
    ("encoder_study.encoders", 4),
    ("encoder_study.recipes", 5),
    # The readers of a finished run: they read what the recipes wrote.
    ("encoder_study.provenance.verify", 6),
    ("encoder_study.provenance.join", 6),
    ("encoder_study.provenance.lineage", 6),
    ("encoder_study.provenance.crate", 6),
    ("encoder_study.provenance.recorded", 6),
    ("encoder_study.provenance.command", 6),
    ("encoder_study.report", 6),
    ("encoder_study.cli", 7),
)
# (importing recipe, imported recipe): the write-back reads the tagging runs' pipelines and scores them
# as tagging does; the preflight checks what acquisition reads (export's Hub patterns) and its device
# check runs one step of the tagging and student recipes' own training (not copies of it).
DATA_FLOWS = {("writeback", "tagging"), ("preflight", "export"), ("preflight", "tagging"),
              ("preflight", "student")}


def layer(module: str) -> int:
    matches = [(len(prefix), number) for prefix, number in LAYERS
               if module == prefix or module.startswith(prefix + ".")]
    return max(matches)[1]


def recipe(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "recipes" else None


def modules() -> dict[str, Path]:
    found = {}
    for path in (LIB / "encoder_study").rglob("*.py"):
        parts = list(path.relative_to(LIB).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `module` imports anywhere in its file (a name from a module counts as
    that module; a submodule by name as the submodule)."""
    here = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = here.split(".")
                base = parts[: len(parts) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "encoder_study":
                found |= {f"{target}.{a.name}" if f"{target}.{a.name}" in known else target
                          for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "encoder_study"}
    return found


def problems(edges: set[tuple[str, str]]) -> list[str]:
    lines = []
    for source, target in sorted(edges):
        if layer(target) > layer(source):
            lines.append(f"{source} (layer {layer(source)}) imports {target} (layer {layer(target)})")
        a, b = recipe(source), recipe(target)
        if a and b and a != b and (a, b) not in DATA_FLOWS:
            lines.append(f"recipe {a} imports recipe {b} ({source} -> {target}); no data flows that way")
    return lines


def package_edges() -> set[tuple[str, str]]:
    found = modules()
    return {(m, t) for m, path in found.items() for t in imports(m, path, set(found)) if t != m}


def test_every_module_has_a_layer():
    assert all(layer(m) is not None for m in modules())


def test_no_module_imports_from_a_layer_above_it_and_recipes_only_where_data_flows():
    edges = package_edges()
    assert len(edges) > 200  # the walk reads the package
    assert problems(edges) == []


@pytest.mark.parametrize(("edge", "expected"), [
    (("encoder_study.core.files", "encoder_study.encoders.tokens"), "imports encoder_study.encoders.tokens"),
    (("encoder_study.onnx.patch", "encoder_study.recipes.tagging.pipeline"), "(layer 5)"),
    (("encoder_study.recipes.tagging.train", "encoder_study.recipes.writeback"), "no data flows that way"),
    (("encoder_study.recipes.student.distill", "encoder_study.provenance.lineage"), "(layer 6)"),
])
def test_the_check_finds_an_import_against_the_layers(edge, expected):
    """The check can fail: each of these edges, added to the real ones, is named."""
    found = problems(package_edges() | {edge})
    assert len(found) == 1 and expected in found[0]

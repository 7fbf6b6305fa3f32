"""Which package files a command runs: the module, everything it imports from the package, transitively.

Snakemake does not rerun a rule when an imported module changes, so the workflow lists these
files as the rule's inputs. Standard library only: the Snakefile imports this at parse time.
"""

from __future__ import annotations

import ast
from pathlib import Path

ALWAYS = ("__init__", "cli")  # the package's import and the dispatcher run for every command


def imports(package_dir: Path, module: str) -> set[str]:
    """Modules of the package that `module` imports, relatively or by the package's name."""
    package = package_dir.name
    tree = ast.parse((package_dir / f"{module}.py").read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                names = [node.module.split(".")[0]]
            elif node.level == 1 or node.module == package:
                names = [alias.name for alias in node.names]
            elif (node.module or "").startswith(package + "."):
                names = [node.module.split(".")[1]]
            else:
                continue
        elif isinstance(node, ast.Import):
            names = [a.name.split(".")[1] for a in node.names if a.name.startswith(package + ".")]
        else:
            continue
        found.update(n for n in names if (package_dir / f"{n}.py").exists() or (package_dir / n).is_dir())
    return found


def _sources(package_dir: Path, name: str) -> list[Path]:
    """A module's file, or every file of a subpackage."""
    if (package_dir / name).is_dir():
        return sorted((package_dir / name).rglob("*.py"))
    return [package_dir / f"{name}.py"]


def code_files(package_dir: str | Path, module: str) -> list[str]:
    package_dir = Path(package_dir)
    seen: set[str] = set()
    todo = [module, *ALWAYS]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if (package_dir / f"{name}.py").exists():
            todo.extend(imports(package_dir, name))
        else:  # a subpackage: follow the imports of each of its files
            for path in _sources(package_dir, name):
                sub = path.relative_to(package_dir / name).with_suffix("").as_posix().replace("/", ".")
                todo.extend(_subpackage_imports(package_dir, name, sub))
    return sorted(str(p) for n in seen for p in _sources(package_dir, n))


def _subpackage_imports(package_dir: Path, subpackage: str, module: str) -> set[str]:
    """Imports of a subpackage's module that reach the parent package (`from .. import x`)."""
    path = package_dir / subpackage / f"{module}.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 2:
            names = [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
            found.update(n for n in names if (package_dir / f"{n}.py").exists() or (package_dir / n).is_dir())
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package_dir.name + "."):
            found.add(node.module.split(".")[1])
    return found

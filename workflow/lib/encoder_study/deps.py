"""Which package files a command runs: its module, what it imports from the package, transitively.

Snakemake does not rerun a rule when an imported module changes, so the workflow lists these files
as the rule's inputs. Resolution is per file: `from ..tagging import train` brings
`tagging/__init__.py` and `tagging/train.py`, not the rest of `tagging/`. Given a subcommand's
function, only the imports that function reaches count (the module's top-level imports, its own
body, and the module-level functions and classes it names, transitively), so that `tagging train`
does not depend on what `tagging step-time` imports. Standard library only: the Snakefile imports
this at parse time.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

# The package's import and the dispatcher run for every command.
ALWAYS = ("encoder_study", "encoder_study.cli")


def _file(root: Path, module: str) -> Path | None:
    """The file of a dotted module name under `root` (the folder holding the package), if any."""
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _is_package(root: Path, module: str) -> bool:
    return (root.joinpath(*module.split(".")) / "__init__.py").is_file()


def _imported(root: Path, module: str, nodes: list[ast.AST]) -> set[str]:
    """Dotted names of the package's modules imported anywhere inside `nodes`."""
    package = module.split(".")[0]
    here = module if _is_package(root, module) else module.rpartition(".")[0]
    found: set[str] = set()
    for node in (n for top in nodes for n in ast.walk(top)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == package)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = here.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if target.split(".")[0] != package:
                continue
            found.add(target)
            # `from x import y` imports module x.y when y is a module rather than a name in x.
            found.update(f"{target}.{a.name}" for a in node.names if _file(root, f"{target}.{a.name}"))
    return {name for name in found if _file(root, name)}


def _reached(tree: ast.Module, function: str) -> list[ast.AST]:
    """The top-level statements that are not definitions, plus `function` and what it names."""
    defined = {n.name: n for n in tree.body
               if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    if function not in defined:
        raise KeyError(f"no function {function!r} at the top level")
    nodes: list[ast.AST] = [n for n in tree.body if n.__class__ not in
                            (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)]
    todo, seen = [function], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        nodes.append(defined[name])
        todo.extend(n.id for n in ast.walk(defined[name]) if isinstance(n, ast.Name) and n.id in defined)
    return nodes


@functools.cache
def _tree(path: Path) -> ast.Module:
    """A file's syntax tree, parsed once per process (a Snakefile asks for it once per rule)."""
    return ast.parse(path.read_text(encoding="utf-8"))


@functools.cache
def _module_imports(root: Path, module: str) -> frozenset[str]:
    return frozenset(_imported(root, module, [_tree(_file(root, module))]))


def code_files(root: str | Path, module: str, function: str | None = None) -> list[str]:
    """Every package file that running `module` (or only its `function`) executes, sorted.

    `root` is the folder that holds the package (workflow/lib); `module` is dotted
    (`encoder_study.commands.tagging`).
    """
    root = Path(root)
    seen: set[str] = set()
    todo = [module, *ALWAYS]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # parents' __init__ run first
        if name == module and function:
            todo.extend(_imported(root, name, _reached(_tree(_file(root, name)), function)))
        else:
            todo.extend(_module_imports(root, name))
    return sorted(str(_file(root, name)) for name in seen)

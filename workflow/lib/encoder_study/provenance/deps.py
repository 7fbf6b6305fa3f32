"""Which package files a command runs: its module, what it imports from the package, transitively.

Snakemake does not rerun a rule when an imported module changes, so the workflow lists these files
as the rule's inputs. Resolution is per file: `from ..tagging import train` brings
`tagging/__init__.py` and `tagging/train.py`, not the rest of `tagging/`. Given a subcommand's
function, only the imports that function reaches count (the module's top-level imports, its own
body, and the module-level functions and classes it names, transitively), so that `tagging train`
does not depend on what `tagging step-time` imports. Standard library only: the Snakefile imports
this at parse time.

Parsing the package is most of the walk's time, paid by every `snakemake` command, so with
`cache` (the Snakefile gives .snakemake/encoder-study/deps.json) each file's imports and names are
kept under the SHA-256 of its bytes: a file whose bytes changed is parsed again, whatever its size
or time stamps; the cache is disposable, and one that cannot be read or written is ignored.

A rule's code inputs are not the files themselves but their code stamps (`code_stamp`): one small
JSON file per module that holds the SHA-256 of the code the interpreter runs (the module's syntax
tree without docstrings, written back out by `ast.unparse`, so comments, blank lines, layout and
docstrings do not count) and is rewritten only when that code changes. An edit that changes no code
then leaves every stamp, and so every job, as it was; a real change rewrites the file's stamp, which
names the functions and classes that changed, and Snakemake's reason names the stamp. The crate
and `verify` still hash each file's exact bytes.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

from ..core import files

DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
# What a summary holds; a cache written by another format or Python (its parser) is not read.
CACHE_FORMAT = {"format": 2, "python": f"{sys.version_info[0]}.{sys.version_info[1]}"}

# The package's import and the dispatcher run for every command.
ALWAYS = ("encoder_study", "encoder_study.cli")
# Code that cannot change what a job writes, so it is no rule's code input: a download's bytes are the
# source's, checked against the pinned SHA-256 (or recorded, unpinned), however they are fetched. A fix
# to a download then refetches nothing and so retrains nothing (docs/reruns.md); a failed download
# wrote nothing and reruns anyway.
FETCHING = ("encoder_study.core.download", "encoder_study.data.fetch",
            "encoder_study.recipes.tagging.spacy_fetch")


def _file(root: Path, module: str) -> Path | None:
    """The file of a dotted module name under `root` (the folder holding the package), if any."""
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _is_package(root: Path, module: str) -> bool:
    return (root.joinpath(*module.split(".")) / "__init__.py").is_file()


def _raw_imports(nodes: list[ast.AST]) -> list[list]:
    """Every import statement anywhere inside `nodes`, as written: [level, module, names or None]."""
    found: list[list] = []
    for node in (n for top in nodes for n in ast.walk(top)):
        if isinstance(node, ast.Import):
            found.extend([0, a.name, None] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.append([node.level, node.module or "", [a.name for a in node.names]])
    return found


def _summary(tree: ast.Module) -> dict:
    """What the walk needs of a file: its imports (all; outside definitions; per top-level definition)
    and, per definition, the other top-level definitions it names; and its code's digests (`_code`)."""
    defined = {n.name: n for n in tree.body if isinstance(n, DEFINITIONS)}
    return {"all": _raw_imports([tree]),
            "top": _raw_imports([n for n in tree.body if not isinstance(n, DEFINITIONS)]),
            "defs": {name: {"imports": _raw_imports([node]),
                            "names": sorted({n.id for n in ast.walk(node)
                                             if isinstance(n, ast.Name) and n.id in defined})}
                     for name, node in defined.items()},
            **_code(tree)}


# The key of a module's statements outside its functions and classes, among the definitions' names.
MODULE_LEVEL = "(module level)"


def _without_docstrings(tree: ast.Module) -> ast.Module:
    """`tree` with the docstring of the module and of every function and class taken out (a body left
    empty gets `pass`, which runs the same). Changes `tree` in place."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, *DEFINITIONS)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                node.body = node.body[1:] or [ast.Pass()]
    return tree


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _code(tree: ast.Module) -> dict:
    """The SHA-256 of the code a file runs, and of each top-level function and class (to name what
    changed); statements outside them count together, under MODULE_LEVEL. `ast.unparse` writes the
    same text for the same tree, whatever the comments, layout, quotes or docstrings were."""
    tree = _without_docstrings(tree)
    parts: dict[str, list[str]] = {}
    for node in tree.body:
        name = node.name if isinstance(node, DEFINITIONS) else MODULE_LEVEL
        parts.setdefault(name, []).append(ast.unparse(node))
    return {"code": _digest(ast.unparse(tree)),
            "definitions": {name: _digest("\n".join(texts)) for name, texts in sorted(parts.items())}}


def _imported(root: Path, module: str, raw: list[list]) -> set[str]:
    """Dotted names of the package's modules that the imports `raw` (of `module`) bring."""
    package = module.split(".")[0]
    here = module if _is_package(root, module) else module.rpartition(".")[0]
    found: set[str] = set()
    for level, name, names in raw:
        if names is None:  # import a.b
            if name.split(".")[0] == package:
                found.add(name)
            continue
        if level:
            parts = here.split(".")
            base = ".".join(parts[: len(parts) - level + 1])
            target = f"{base}.{name}" if name else base
        else:
            target = name
        if target.split(".")[0] != package:
            continue
        found.add(target)
        # `from x import y` imports module x.y when y is a module rather than a name in x.
        found.update(f"{target}.{a}" for a in names if _file(root, f"{target}.{a}"))
    return {name for name in found if _file(root, name)}


def _reached(summary: dict, function: str) -> list[list]:
    """The imports of the top-level statements that are not definitions, plus those of `function` and
    of the definitions it names, transitively."""
    defined = summary["defs"]
    if function not in defined:
        raise KeyError(f"no function {function!r} at the top level")
    raw = list(summary["top"])
    todo, seen = [function], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        raw.extend(defined[name]["imports"])
        todo.extend(defined[name]["names"])
    return raw


def _readable(path: str) -> None:
    """mkstemp makes 0600; others sharing the folder read it too."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


class _Cache:
    """File summaries by the SHA-256 of the file's bytes, read once per process from `path`."""

    def __init__(self, path: Path | None):
        self.path, self.entries, self.used, self.dirty = path, {}, set(), False
        if path is None:
            return
        try:
            data = files.read_json(path, "the import walker's cache", "remove it", kind=dict)
        except files.JsonError:
            return  # no cache yet, or a damaged one: parse, and write a new one
        if {k: data.get(k) for k in CACHE_FORMAT} == CACHE_FORMAT and isinstance(data.get("files"), dict):
            self.entries = data["files"]

    def summary(self, path: Path) -> dict:
        data = path.read_bytes()
        if self.path is None:
            return _summary(ast.parse(data))
        digest = hashlib.sha256(data).hexdigest()
        self.used.add(digest)
        if digest not in self.entries:
            self.entries[digest] = _summary(ast.parse(data))
            self.dirty = True
        return self.entries[digest]

    def save(self) -> None:
        if not self.dirty:
            return
        self.dirty = False
        if len(self.entries) > 2 * len(self.used) + 64:  # old versions of edited files: drop them
            self.entries = {d: s for d, s in self.entries.items() if d in self.used}
        tmp = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name, suffix=".tmp")
            _readable(tmp)
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump({**CACHE_FORMAT, "files": self.entries}, out, sort_keys=True)
            os.replace(tmp, self.path)  # whole or not at all, also with concurrent Snakemake processes
        except OSError:  # a read-only tree: the next run parses again
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)


@functools.cache
def _cache(path: Path | None) -> _Cache:
    return _Cache(path)


@functools.cache
def _file_summary(path: Path, cache: Path | None) -> dict:
    """A file's summary, made once per process (a Snakefile asks for it once per rule)."""
    return _cache(cache).summary(path)


@functools.cache
def _module_imports(root: Path, module: str, cache: Path | None) -> frozenset[str]:
    return frozenset(_imported(root, module, _file_summary(_file(root, module), cache)["all"]))


def code_files(root: str | Path, module: str, function: str | None = None,
               cache: str | Path | None = None) -> list[str]:
    """Every package file that running `module` (or only its `function`) executes, sorted; FETCHING's
    modules aside (and what only they import).

    `root` is the folder that holds the package (workflow/lib); `module` is dotted
    (`encoder_study.recipes.tagging.command`); `cache`, a JSON file of the files' summaries by content
    (see the module docstring), or None to parse every file.
    """
    root = Path(root)
    cache = None if cache is None else Path(cache).absolute()
    seen: set[str] = set()
    todo = [module, *ALWAYS]
    while todo:
        name = todo.pop()
        if name in seen or name in FETCHING:
            continue
        seen.add(name)
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # parents' __init__ run first
        if name == module and function:
            todo.extend(_imported(root, name, _reached(_file_summary(_file(root, name), cache), function)))
        else:
            todo.extend(_module_imports(root, name, cache))
    _cache(cache).save()
    return sorted(str(_file(root, name)) for name in seen)


# What a stamp holds; a stamp of another format is written anew (and so reruns what reads the file).
STAMP_FORMAT = 1


def _read_stamp(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == STAMP_FORMAT else None


@functools.cache
def code_stamp(source: str | Path, stamps: str | Path, root: str | Path,
               cache: str | Path | None = None) -> tuple[str, list[str] | None]:
    """The code stamp of package file `source`: `stamps`/<its path under `root`>.json (see the module
    docstring), and what changed since the stamp was last written: None when the stamp holds this code,
    else the changed definitions' names (empty for a new stamp).

    A stamp is rewritten only when the code changes, so its time stamp is the time of the last real
    change: Snakemake's mtime trigger reruns a job whose outputs are older. A new stamp takes the
    source's time, so that a finished run whose code is as it was stays finished. Made once per
    process: a Snakefile asks for each file once per rule.
    """
    source = Path(source)
    summary = _file_summary(source, None if cache is None else Path(cache).absolute())
    target = Path(stamps) / f"{source.relative_to(root).as_posix()}.json"
    old = _read_stamp(target)
    if old is not None and old.get("code") == summary["code"]:
        return str(target), None
    before = old.get("definitions", {}) if old is not None else {}
    now = summary["definitions"]
    changed = [] if old is None else sorted(n for n in {*before, *now} if before.get(n) != now.get(n))
    record = {"format": STAMP_FORMAT, "file": source.as_posix(), "code": summary["code"],
              "changed": changed, "definitions": now}
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".tmp")
    try:
        _readable(tmp)
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(record, out, indent=1, sort_keys=True)
            out.write("\n")
        if old is None:
            times = source.stat()
            os.utime(tmp, ns=(times.st_atime_ns, times.st_mtime_ns))
        os.replace(tmp, target)  # whole or not at all, also with concurrent Snakemake processes
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return str(target), changed

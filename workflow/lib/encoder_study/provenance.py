"""Provenance fragments: what a rule ran, on which code and machine, and the hashes of its files.

Each rule writes `provenance/<recipe>/<rule>[-<wildcards>].md`; `join` puts a recipe's fragments
into its PROVENANCE.md and `verify` re-hashes every file the fragments name (the commands:
`encoder-study provenance join|verify`).
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from . import files
from .tables import markdown_table

LIBRARIES = (
    "torch", "transformers", "tokenizers", "onnx", "onnxruntime", "numpy",
    "scipy", "pandas", "snakemake", "huggingface-hub", "safetensors", "encoder-study",
)
FILES_HEADING = "## Files"
JOINED_NAME = "PROVENANCE.md"


def library_versions(names: Iterable[str] = LIBRARIES) -> dict[str, str]:
    versions = {}
    for name in sorted(names):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def code_version(root: str | os.PathLike = ".") -> str:
    """`<commit> (clean)` or `<commit> (dirty: N files)`; `not a git checkout` outside one."""
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        changed = [line for line in git("status", "--porcelain").splitlines() if line]
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"
    return f"{commit} (clean)" if not changed else f"{commit} (dirty: {len(changed)} files)"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, str]:
    return {
        "cpu": cpu_model(),
        "cores": str(os.cpu_count()),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
    }


def _expand(paths: Iterable[str | os.PathLike]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        out.extend(files.list_files(p) if p.is_dir() else [p])
    return out


class Fragment:
    """Collects what one rule did and writes its fragment atomically.

    Use as a context manager around the rule's work; the fragment is written only on success,
    after the outputs exist, so its hashes are those of the finished files.
    """

    def __init__(self, path: str | os.PathLike, settings: dict | None = None,
                 threads: int | None = None, argv: list[str] | None = None):
        self.path = Path(path)
        # Rule names are identifiers, so the first '-' of the stem starts the wildcards.
        self.rule, _, self.wildcards = self.path.stem.partition("-")
        self.settings = dict(settings or {})
        self.threads = threads
        self.argv = list(sys.argv if argv is None else argv)
        self.inputs: list[str | os.PathLike] = []
        self.outputs: list[str | os.PathLike] = []
        self.notes: list[str] = []
        self.tables: list[tuple[str, str]] = []

    def __enter__(self) -> Fragment:
        self.started = dt.datetime.now(dt.UTC)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.write()
        return False

    def table(self, title: str, markdown: str) -> None:
        self.tables.append((title, markdown))

    def note(self, text: str) -> None:
        self.notes.append(text)

    def render(self) -> str:
        finished = dt.datetime.now(dt.UTC)
        wildcards = self.wildcards
        title = f"{self.rule}" + (f" ({wildcards})" if wildcards else "")
        program = Path(self.argv[0]).name if self.argv else ""
        if program in ("cli.py", "encoder-study"):  # the entry point re-executes itself as cli.py
            program = "encoder-study"
        command = shlex.join([program, *self.argv[1:]]) if self.argv else ""
        about = [
            ("rule", self.rule),
            ("recipe", self.path.parent.name),
            ("wildcards", wildcards or "none"),
            ("command", f"`{command}`"),
            ("code", code_version()),
            ("started (UTC)", self.started.isoformat(timespec="seconds")),
            ("finished (UTC)", finished.isoformat(timespec="seconds")),
            ("seconds", f"{time.perf_counter() - self._t0:.1f}"),
            ("threads", self.threads if self.threads is not None else "default"),
            *machine().items(),
        ]
        parts = [f"# {title}\n\n", markdown_table(["what", "value"], about)]
        if self.settings:
            parts += ["\n## Settings\n\n", markdown_table(
                ["setting", "value"], sorted((k, v) for k, v in self.settings.items()))]
        parts += ["\n## Libraries\n\n", markdown_table(["package", "version"], library_versions().items())]
        rows = []
        for role, paths in (("input", self.inputs), ("output", self.outputs)):
            for p in _expand(paths):
                if p.resolve() == self.path.resolve():
                    continue
                rows.append((role, p.as_posix(), p.stat().st_size, files.sha256_file(p)))
        parts += [f"\n{FILES_HEADING}\n\n", markdown_table(["role", "path", "bytes", "sha256"], rows, "llrl")]
        for title_, table in self.tables:
            parts += [f"\n## {title_}\n\n", table]
        if self.notes:
            parts += ["\n## Notes\n\n", "".join(f"- {n}\n" for n in self.notes)]
        return "".join(parts)

    def write(self) -> None:
        files.write_text(self.path, self.render())


_ROW = re.compile(r"^\|\s*(input|output)\s*\|\s*(.+?)\s*\|\s*(\d+)\s*\|\s*([0-9a-f]{64})\s*\|$")


def fragment_files(text: str) -> list[tuple[str, str, int, str]]:
    """(role, path, bytes, sha256) of every row of a fragment's Files table."""
    rows, inside = [], False
    for line in text.splitlines():
        if line.startswith("## "):
            inside = line.strip() == FILES_HEADING
            continue
        if inside and (m := _ROW.match(line.strip())):
            rows.append((m[1], m[2].replace("\\|", "|"), int(m[3]), m[4]))
    return rows


def fragments_under(root: str | os.PathLike) -> list[Path]:
    return sorted(p for p in Path(root).rglob("*.md") if p.name != JOINED_NAME)


def verify(root: str | os.PathLike, base: str | os.PathLike) -> list[str]:
    """Re-hash every file every fragment names; return one line per difference (empty: all match)."""
    problems: list[str] = []
    fragments = fragments_under(root)
    if not fragments:
        return [f"{root}: no provenance fragments found; run the workflow first"]
    for frag in fragments:
        rows = fragment_files(frag.read_text(encoding="utf-8"))
        if not rows:
            problems.append(f"{frag}: names no files (a fragment without a Files table)")
        for _role, name, size, digest in rows:
            path = Path(base) / name
            if not path.is_file():
                problems.append(f"{frag}: {name} is missing")
                continue
            actual = files.sha256_file(path)
            if actual != digest:
                problems.append(f"{frag}: {name} changed: recorded sha256 {digest} ({size} bytes), "
                                f"now {actual} ({path.stat().st_size} bytes)")
    return problems


def join(recipe: str, fragments: list[str | os.PathLike], target: str | os.PathLike) -> None:
    """Write a recipe's PROVENANCE.md: a contents list, then every fragment in the order given."""
    fragments = [Path(f) for f in fragments]
    parts = [
        f"# Provenance of the `{recipe}` recipe\n\n",
        "Fragments in the order the workflow runs them; `encoder-study provenance verify` (or "
        "`snakemake --cores 1 verify`) re-hashes every file they name.\n\n",
        "".join(f"- [{f.stem}](#{f.stem.lower()})\n" for f in fragments),
    ]
    for f in fragments:
        body = f.read_text(encoding="utf-8")
        # Demote headings one level so the recipe's title stays the only top-level heading.
        body = re.sub(r"^(#+) ", r"#\1 ", body, flags=re.MULTILINE)
        parts += ["\n", f'<a id="{f.stem.lower()}"></a>\n\n', body]
    files.write_text(target, "".join(parts))


def add_arguments(parser) -> None:
    """The argument every rule's command takes: where its fragment goes (which also names the rule)."""
    parser.add_argument("--provenance", required=True,
                        help="fragment to write: provenance/<recipe>/<rule>[-<wildcards>].md")


def settings(args, skip: tuple[str, ...] = ()) -> dict:
    """A command's arguments as the fragment's Settings table, without the provenance plumbing (and
    without `run`, the function a subcommand names: cli.py's dispatch, not a setting)."""
    return {k: v for k, v in sorted(vars(args).items()) if k not in ("provenance", "run", *skip)}

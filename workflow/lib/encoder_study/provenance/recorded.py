"""Before a run starts: the files its jobs will read, checked against the fragments that recorded them.

Snakemake deletes a job's outputs before it runs the job. A job that then refuses a damaged input (a
truncated model.onnx, a treebank cut short) has already lost its good results, and a file changed
after it was written is newer than the rule's inputs, so Snakemake never plans the rule that would
write it again. `damaged` runs from the workflow's `onstart` handler, once the DAG is built and before
any job starts (or any output is deleted): every input of a job that will run, unless a job of the same
run writes it, must still have the size and SHA-256 that the fragment of the rule that wrote it
records, and so must the other files that rule wrote beside it (the weights behind a source.json).
A size costs a stat; hashes come through `HashCache`, so a file is read once after it
changes. Standard library only, as everything the Snakefile imports.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .. import provenance
from ..core import files
from .records import read_record
from .verify import HashCache


@dataclass(frozen=True)
class Written:
    """What a fragment's twin records of one file its rule wrote."""

    bytes: int
    sha256: str
    rule: str
    twin: Path  # the fragment's JSON twin


def written(root: str | os.PathLike) -> dict[str, Written]:
    """Normalised path -> its record, for every output the fragment twins under `root` list. A twin
    without its Markdown (a job that died between them) or that is not a twin is skipped."""
    found: dict[str, Written] = {}
    for path in sorted(Path(root).rglob("*.json")):
        if not provenance.twin(path).is_file():
            continue
        try:
            record = read_record(path)
        except provenance.ProvenanceError:
            continue  # `verify` names a broken twin; it says nothing about the files
        for row in record.get("files", []):
            if row.get("role") == "output":
                entry = Written(row["bytes"], row["sha256"], record["rule"], path)
                found[os.path.normpath(row["path"])] = entry
    return found


def damaged(inputs: Iterable[str], produced: Iterable[str], declared: Iterable[str],
            root: str | os.PathLike, cache: HashCache) -> list[str]:
    """One line per file that differs from its record: the inputs (normalised paths) that no job of
    the run writes (`produced`) and the files their rules wrote beside them. `declared`: every output
    the workflow's jobs declare, which `snakemake -f` can rebuild."""
    records = written(root)
    produced, declared = set(produced), set(declared)
    by_twin: dict[Path, list[str]] = {}
    for path, entry in records.items():
        by_twin.setdefault(entry.twin, []).append(path)
    rerun = {records[p].twin for p in produced if p in records}  # rules this run writes again
    twins = {records[i].twin for i in set(inputs) - produced if i in records} - rerun
    to_check = sorted({p for twin in twins for p in by_twin[twin]} - produced)
    problems = []
    for path in to_check:
        entry = records[path]
        if not Path(path).is_file():
            continue  # a missing input is Snakemake's to rebuild
        size = Path(path).stat().st_size
        if size != entry.bytes:
            found = f"{size:,} bytes, but rule {entry.rule} wrote {entry.bytes:,}"
        elif (digest := cache.sha256(Path(path))) != entry.sha256:
            found = f"SHA-256 {digest}, but rule {entry.rule} wrote {entry.sha256}"
        else:
            continue
        target = path if path in declared else _declared_sibling(by_twin[entry.twin], declared, entry.twin)
        problems.append(f"{path}: {found} ({entry.twin}); it changed after it was written. Nothing was "
                        f"run or deleted: {files.rebuild(target)}")
    return problems


def _declared_sibling(paths: list[str], declared: set[str], twin: Path) -> str:
    """The output of the same rule that `snakemake -f` takes (else the fragment, which every rule
    declares)."""
    return next((p for p in sorted(paths) if p in declared), os.path.normpath(provenance.twin(twin)))

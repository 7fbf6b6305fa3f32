"""Which rules, commands, code and inputs made a file, or one row of a table: `provenance explain`.

The fragments' JSON twins (encoder_study.provenance) name every job's inputs and outputs with their
SHA-256. The chain of a file is the job whose outputs include it, then, recursively, the jobs that made
that job's inputs, down to files no job made (a model's source, a treebank, a config file).

For one row of a table the chain is narrowed at the table's own job: an input that names a row of the
table in its path (a run's folder, a split's file) is kept only when every row value it names is a
value of the chosen row, so `scores.csv --row minilm-finetuned,test` follows the run's test
predictions and the test treebank, not the other runs or the dev split. Inputs that name no row (the
code, a config) are kept. Deeper jobs keep all their inputs: a run trained on the dev split too.
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path

from . import files, provenance, tables
from .errors import UserError


class ExplainError(UserError):
    pass


def _key(path: str | os.PathLike) -> str:
    return posixpath.normpath(Path(path).as_posix())


@dataclass
class Index:
    """Every twin under a root, and which twin made each output path."""
    records: dict[str, dict] = field(default_factory=dict)  # twin path -> record
    made_by: dict[str, str] = field(default_factory=dict)  # output path -> twin path

    @classmethod
    def load(cls, root: str | os.PathLike) -> Index:
        index = cls()
        for path, record in provenance.records_under(root):
            index.records[path.as_posix()] = record
            for entry in record["files"]:
                if entry["role"] == "output":
                    index.made_by[_key(entry["path"])] = path.as_posix()
        if not index.records:
            raise ExplainError(f"{root}: no provenance fragments with JSON twins; run the workflow first "
                               f"(fragments written before the twins existed have none: rerun their rules)")
        return index

    def producer(self, path: str | os.PathLike) -> str | None:
        return self.made_by.get(_key(path))


def select_row(table: str | os.PathLike, key: list[str]) -> dict[str, str]:
    """The one row of a CSV whose cells contain the key's values in column order (a subsequence).

    `minilm-finetuned,test` selects run=minilm-finetuned, split=test in scores.csv; ExplainError lists
    the candidates when none or several rows match.
    """
    rows = tables.read_csv(table)
    if not rows:
        raise ExplainError(f"{table}: has no rows")

    def matches(row: dict[str, str]) -> bool:
        values = iter(row.values())
        return all(any(v == k for v in values) for k in key)

    found = [row for row in rows if matches(row)]
    if len(found) == 1:
        return found[0]
    columns = list(rows[0])
    shown = [",".join(r[c] for c in columns[:3]) for r in (found or rows)][:10]
    what = "no row" if not found else f"{len(found)} rows"
    raise ExplainError(f"{table}: {what} match --row {','.join(key)} (values matched in column order, "
                       f"columns {', '.join(columns)}); give values of one row, e.g. "
                       + "; ".join(shown))


def _named(path: str, values: set[str]) -> set[str]:
    """The table values a path names: whole folder names, or dot-separated parts of the file name."""
    parts = Path(path).parts
    if not parts:
        return set()
    return (set(parts[:-1]) | set(parts[-1].split(".")) | {parts[-1]}) & values


def _row_inputs(record: dict, table: str, row: dict[str, str]) -> list[dict]:
    """The table job's inputs that belong to `row` (see the module's docstring)."""
    text = re.compile(r"[^\W\d]")  # a value with a letter in it can name a folder; numbers cannot
    every = {v for r in tables.read_csv(table) for v in r.values() if v and text.search(v)}
    chosen = set(row.values())
    return [e for e in record["files"] if e["role"] == "input" and _named(e["path"], every) <= chosen]


def explain(root: str | os.PathLike, target: str | os.PathLike, row: list[str] | None = None,
            base: str | os.PathLike = ".") -> str:
    """The chain that made `target` (and, given `row`, that row of it) as indented text."""
    index = Index.load(root)
    target = _key(target)
    producer = index.producer(target)
    if producer is None:
        raise ExplainError(f"{target}: no fragment under {root} names it as an output; give a file the "
                           f"workflow writes (e.g. results/tagging/scores.csv)")
    lines = []
    path = Path(base) / target
    recorded = next(e for e in index.records[producer]["files"] if _key(e["path"]) == target)
    now = files.sha256_file(path) if path.is_file() else None
    state = ("matches the record" if now == recorded["sha256"] else
             "MISSING now" if now is None else f"CHANGED since: now {now}")
    lines.append(f"{target}  {recorded['bytes']} bytes  sha256 {recorded['sha256']}  ({state})")
    inputs = None
    if row:
        chosen = select_row(path, row)
        lines.append("row: " + ", ".join(f"{k}={v}" for k, v in chosen.items()))
        inputs = _row_inputs(index.records[producer], path, chosen)
    seen: set[str] = set()
    _job(index, producer, inputs, 1, seen, lines)
    return "\n".join(lines) + "\n"


def _job(index: Index, twin: str, inputs: list[dict] | None, depth: int, seen: set[str],
         lines: list[str]) -> None:
    pad = "  " * depth
    record = index.records[twin]
    name = provenance.record_name(record)
    if twin in seen:
        lines.append(f"{pad}made by {name} (shown above)")
        return
    seen.add(twin)
    lines.append(f"{pad}made by {name}: rule {record['rule']} of recipe {record['recipe']} ({twin})")
    lines.append(f"{pad}  command: {record['command']}")
    code = provenance.describe_code(record["code"])
    lines.append(f"{pad}  code: {code}, encoder-study {record['version']}, finished {record['finished']} UTC")
    all_inputs = [e for e in record["files"] if e["role"] == "input"]
    inputs = all_inputs if inputs is None else inputs
    if not all_inputs:
        lines.append(f"{pad}  inputs: none recorded (settings: "
                     + ", ".join(f"{k}={v}" for k, v in record["settings"].items()) + ")")
    elif len(inputs) < len(all_inputs):
        lines.append(f"{pad}  inputs for this row: {len(inputs)} of {len(all_inputs)}")
    else:
        lines.append(f"{pad}  inputs:")
    for entry in inputs:
        lines.append(f"{pad}  - {entry['path']}  {entry['bytes']} bytes  sha256 {entry['sha256']}")
        producer = index.producer(entry["path"])
        if producer is None:
            lines.append(f"{pad}      a source: no job made it")
        else:
            _job(index, producer, None, depth + 3, seen, lines)

"""Which rules, commands, code and inputs made a file, or one row of a table: `provenance explain`.

The fragments' JSON twins (encoder_study.provenance) name every job's inputs and outputs with their
SHA-256. The chain of a file is the job whose outputs include it, then, recursively, the jobs that made
that job's inputs, down to files no job made (a model's source, a treebank, a config file).

For one row of a table the chain is narrowed at the table's own job: an input that names a row of the
table in its path (a run's folder, a split's file) is kept only when every row value it names is a
value of the chosen row, so `scores.csv --row minilm-finetuned,test` follows the run's test
predictions and the test treebank, not the other runs or the dev split. Inputs that name no row (the
code, a config) are kept. Deeper jobs keep all their inputs: a run trained on the dev split too.

Every file printed is hashed again and marked when it changed or is missing since its job recorded
it. The target table's rows (or the chosen row) are checked too (`check_row`): an estimate must lie in
its own interval, and a UPOS score must be what the predictions it names give against the gold
treebank (tokens, sentences, accuracy; a comparison's difference too). `table_problems` runs the
row checks over every table the fragments name (`provenance verify` adds them to its own).
"""

from __future__ import annotations

import math
import os
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path

from .. import provenance
from ..core import files, tables
from ..core.errors import UserError
from .records import record_name, records_under


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
        for path, record in records_under(root):
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


@dataclass
class Explained:
    text: str  # the chain, as indented lines
    problems: list[str]  # each changed or missing file, each failed row check; empty when all hold


class Hashes:
    """Each file's SHA-256 now, read once however often the chain names it."""

    def __init__(self, base: str | os.PathLike):
        self.base, self.now, self.problems, self.named = Path(base), {}, [], set()

    def mark(self, entry: dict, job: str) -> str:
        """How the file of a recorded entry stands now: `matches`, `MISSING now` or `CHANGED ...`;
        a difference is also added to `problems` (once per file)."""
        key = _key(entry["path"])
        if key not in self.now:
            path = self.base / key
            self.now[key] = (files.sha256_file(path), path.stat().st_size) if path.is_file() else None
        now = self.now[key]
        if now is not None and now[0] == entry["sha256"]:
            return "matches"
        state = "MISSING now" if now is None else f"CHANGED since: now {now[0]} ({now[1]} bytes)"
        if key not in self.named:
            self.named.add(key)
            self.problems.append(f"{key}: {state}; {job} recorded sha256 {entry['sha256']} "
                                 f"({entry['bytes']} bytes)")
        return state


def explain(root: str | os.PathLike, target: str | os.PathLike, row: list[str] | None = None,
            base: str | os.PathLike = ".") -> Explained:
    """The chain that made `target` (and, given `row`, that row of it) as indented text, every file
    marked by how it stands now, and the problems found (see the module's docstring)."""
    index = Index.load(root)
    target = _key(target)
    producer = index.producer(target)
    if producer is None:
        raise ExplainError(f"{target}: no fragment under {root} names it as an output; give a file the "
                           f"workflow writes (e.g. results/tagging/scores.csv)")
    hashes = Hashes(base)
    record = index.records[producer]
    recorded = next(e for e in record["files"] if _key(e["path"]) == target)
    state = hashes.mark(recorded, record_name(record))
    state = "matches the record" if state == "matches" else state
    lines = [f"{target}  {recorded['bytes']} bytes  sha256 {recorded['sha256']}  ({state})"]
    path = Path(base) / target
    inputs, row_lines = None, []
    if row:
        chosen = select_row(path, row)
        lines.append("row: " + ", ".join(f"{k}={v}" for k, v in chosen.items()))
        inputs = _row_inputs(record, path, chosen)
        checked = check_row(chosen, record, Predictions(base))
        lines += [f"row check: {c}" for c in checked.passed]
        lines += [f"row check FAILED: {p}" for p in checked.problems]
        row_lines = [f"{target} row {_label(chosen)}: {p}" for p in checked.problems]
    elif path.suffix == ".csv" and path.is_file():
        row_lines = _table_rows(target, path, record, Predictions(base))
        lines += [f"row check FAILED: {p}" for p in row_lines]
    _job(index, producer, inputs, 1, set(), lines, hashes)
    problems = hashes.problems + row_lines
    lines.append(f"check: {len(hashes.now)} file(s) hashed again: "
                 + (f"{len(hashes.problems)} changed or missing" if hashes.problems else "every one matches")
                 + (f"; {len(row_lines)} row problem(s)" if row_lines else ""))
    return Explained("\n".join(lines) + "\n", problems)


def _job(index: Index, twin: str, inputs: list[dict] | None, depth: int, seen: set[str],
         lines: list[str], hashes: Hashes) -> None:
    pad = "  " * depth
    record = index.records[twin]
    name = record_name(record)
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
        state = hashes.mark(entry, name)
        lines.append(f"{pad}  - {entry['path']}  {entry['bytes']} bytes  sha256 {entry['sha256']}  ({state})")
        producer = index.producer(entry["path"])
        if producer is None:
            lines.append(f"{pad}      a source: no job made it")
        else:
            _job(index, producer, None, depth + 3, seen, lines, hashes)


# -- rows checked against themselves and against their predictions -----------------------------------

# The estimate a row's ci_low and ci_high are the interval of: scores' and agreement's UPOS, a
# comparison's difference.
INTERVAL_VALUES = ("upos", "diff")
# (column naming a run, column holding its UPOS): a score row's run, a comparison's two runs.
SCORED = (("run", "upos"), ("a", "upos_a"), ("b", "upos_b"))
# Scores are 100 * correct / tokens in float64; an edit changes far more than this.
TOLERANCE = 1e-9


@dataclass
class RowCheck:
    passed: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Counts:
    tokens: int
    sentences: int
    correct: int

    @property
    def upos(self) -> float:
        return 100.0 * self.correct / self.tokens if self.tokens else math.nan


class Predictions:
    """Counts of a predictions file against its gold file, each pair read once. None when a file is
    missing (verify names it); a message when the two cannot be compared."""

    def __init__(self, base: str | os.PathLike):
        self.base, self.found = Path(base), {}

    def counts(self, pred: str, gold: str) -> Counts | str | None:
        if (pred, gold) not in self.found:
            self.found[pred, gold] = self._read(self.base / pred, self.base / gold)
        return self.found[pred, gold]

    @staticmethod
    def _read(pred: Path, gold: Path) -> Counts | str | None:
        from ..data.conllu import read_conllu

        if not (pred.is_file() and gold.is_file()):
            return None
        try:
            ours, theirs = read_conllu(pred), read_conllu(gold)
        except UserError as err:
            return str(err)
        if [len(s.words) for s in ours] != [len(s.words) for s in theirs]:
            return f"{pred} does not have the words of {gold} (sentences or words differ)"
        correct = sum(a.upos == b.upos for p, g in zip(ours, theirs, strict=True)
                      for a, b in zip(p.words, g.words, strict=True))
        return Counts(sum(len(s.words) for s in ours), len(ours), correct)


def check_row(row: dict[str, str], record: dict, predictions: Predictions) -> RowCheck:
    """A row of a table `record`'s job wrote: its estimate inside its own interval, and its scores,
    tokens and sentences equal to what the predictions and gold files of that job give."""
    result = RowCheck()
    _check_interval(row, result)
    _check_predictions(row, record, predictions, result)
    return result


def _number(row: dict[str, str], column: str) -> float:
    try:
        return float(row[column])
    except ValueError:
        return math.nan


def _check_interval(row: dict[str, str], result: RowCheck) -> None:
    name = next((c for c in INTERVAL_VALUES if c in row), None)
    if name is None or "ci_low" not in row or "ci_high" not in row:
        return
    value, low, high = (_number(row, c) for c in (name, "ci_low", "ci_high"))
    interval = f"[{row['ci_low']}, {row['ci_high']}]"
    if low <= value <= high:
        result.passed.append(f"{name} {row[name]} lies inside its interval {interval}")
    else:
        result.problems.append(f"{name} {row[name]} lies outside its own interval {interval}")


def _find(record: dict, name: str, folder: str | None) -> str | None:
    """The path of a file of the job named `name` (in a folder named `folder`), its outputs first."""
    found = [e for e in record["files"] if Path(e["path"]).name == name
             and (folder is None or Path(e["path"]).parent.name == folder)]
    found.sort(key=lambda e: e["role"] != "output")
    return found[0]["path"] if found else None


def _check_predictions(row: dict[str, str], record: dict, predictions: Predictions,
                       result: RowCheck) -> None:
    if not {"split", "tokens", "sentences"} <= row.keys():
        return
    gold = _find(record, f"{row['split']}.conllu", None)
    seen: dict[str, Counts] = {}
    for run, column in SCORED:
        if run not in row or column not in row:
            continue
        pred = _find(record, f"{row['split']}.pred.conllu", row[run])
        counts = predictions.counts(pred, gold) if pred and gold else None
        if isinstance(counts, str):
            result.problems.append(counts)
        elif counts is not None:
            seen[column] = counts
            _compare(row, column, counts, f"{pred} against {gold}", result)
    if "diff" in row and {"upos_a", "upos_b"} <= seen.keys():
        a, b = seen["upos_a"], seen["upos_b"]
        diff = 100.0 * (a.correct - b.correct) / a.tokens
        if not math.isclose(_number(row, "diff"), diff, rel_tol=0, abs_tol=TOLERANCE):
            result.problems.append(f"diff {row['diff']} but the two runs' predictions give {diff!r}")


def _compare(row: dict[str, str], column: str, counts: Counts, source: str, result: RowCheck) -> None:
    wrong = [f"{name} {row[name]} but {source} gives {value}"
             for name, value in (("tokens", counts.tokens), ("sentences", counts.sentences))
             if row[name] != str(value)]
    if not math.isclose(_number(row, column), counts.upos, rel_tol=0, abs_tol=TOLERANCE):
        wrong.append(f"{column} {row[column]} but {source} gives {counts.upos!r} "
                     f"({counts.correct} of {counts.tokens} tokens right)")
    result.problems += wrong
    if not wrong:
        result.passed.append(f"{column}, tokens and sentences are what {source} gives")


def _label(row: dict[str, str]) -> str:
    """A row's cells that name things (not numbers), comma-separated: what `--row` takes."""
    text = re.compile(r"[^\W\d]")
    return ",".join(v for v in row.values() if v and text.search(v))


def _table_rows(name: str, path: Path, record: dict, predictions: Predictions) -> list[str]:
    """One line per failed check of any row of the table at `path` (recorded as `name`)."""
    return [f"{name} row {_label(row)}: {problem}" for row in tables.read_csv(path)
            for problem in check_row(row, record, predictions).problems]


def table_problems(root: str | os.PathLike, base: str | os.PathLike = ".") -> list[str]:
    """The row checks of every CSV table the fragments under `root` name as an output."""
    predictions, problems = Predictions(base), []
    for _, record in records_under(root):
        for entry in record["files"]:
            path = Path(base) / entry["path"]
            if entry["role"] == "output" and path.suffix == ".csv" and path.is_file():
                problems += _table_rows(entry["path"], path, record, predictions)
    return problems

"""Reading what the fragment writer wrote: the JSON twins under a folder, and the environment files
they name. What every reader of a run (verify, explain, the crate, the report) starts from."""

from __future__ import annotations

import os
from pathlib import Path

from ..core import files
from . import ENVIRONMENT_FORMAT, JOINED_NAME, RECORD_FORMAT, ProvenanceError, twin


def read_environment(path: str | os.PathLike) -> dict:
    """An environment file (`environment_file`); ProvenanceError when it is not one."""
    data = files.read_json(path, "a run's environment file", "rerun a rule to write it again",
                           kind=dict, error=ProvenanceError)
    if data.get("format") != ENVIRONMENT_FORMAT or not isinstance(data.get("distributions"), dict):
        raise ProvenanceError(f"{path}: not an environment file (no \"format\": \"{ENVIRONMENT_FORMAT}\")")
    return data


def fragments_under(root: str | os.PathLike) -> list[Path]:
    """The Markdown fragments under `root` (every .md but the joined PROVENANCE.md files)."""
    return sorted(p for p in Path(root).rglob("*.md") if p.name != JOINED_NAME)


def read_record(path: str | os.PathLike) -> dict:
    """A fragment's JSON twin; ProvenanceError (naming the file and the fix) when it is not one."""
    path = Path(path)
    record = files.read_json(path, "a provenance fragment's twin", "rerun the rule that writes it",
                             error=ProvenanceError)
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        raise ProvenanceError(f"{path}: not a provenance fragment's twin (no \"format\": "
                              f"\"{RECORD_FORMAT}\"); remove it or rerun the rule that writes it")
    return record


def records_under(root: str | os.PathLike) -> list[tuple[Path, dict]]:
    """(path, record) of every JSON twin under `root`, sorted by path; other JSON files are skipped."""
    found = []
    for path in sorted(Path(root).rglob("*.json")):
        try:
            found.append((path, read_record(path)))
        except ProvenanceError:
            if twin(path).is_file():  # a fragment's twin that is broken is an error, not another file
                raise
    return found


def record_name(record: dict) -> str:
    """`<recipe>/<rule>[-<wildcards>]`: where a record's fragment lives under provenance/."""
    return f"{record['recipe']}/{record['rule']}" + (f"-{record['wildcards']}" if record["wildcards"] else "")

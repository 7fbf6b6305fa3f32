"""Check every file a manifest lists (retrieval.json, or an export's export.json) without running it."""

from __future__ import annotations

import os
from pathlib import Path

from ...core import files

MANIFEST_WHAT = "a manifest with a 'files' list"


def verify(directory: str | os.PathLike, manifest_name: str) -> list[str]:
    """One line per missing or changed file the manifest lists (empty: all match). Runs nothing."""
    directory = Path(directory)
    path = directory / manifest_name
    try:
        entries = files.read_json(path, MANIFEST_WHAT, "export the graph again", kind=dict)["files"]
    except files.JsonError as err:
        return [str(err)]
    except KeyError:
        return [f"{path}: expected {MANIFEST_WHAT}, found no 'files'"]
    problems = []
    for entry in entries:
        target = directory / entry["path"]
        if not target.is_file():
            problems.append(f"{target} is missing (expected {entry['bytes']} bytes, "
                            f"sha256 {entry['sha256']})")
            continue
        actual, size = files.sha256_file(target), target.stat().st_size
        if actual != entry["sha256"]:
            problems.append(f"{target} changed: expected {entry['bytes']} bytes, sha256 {entry['sha256']}; "
                            f"found {size} bytes, sha256 {actual}")
    return problems

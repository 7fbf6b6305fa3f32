"""`verify`: every file the fragments name, re-hashed against the recorded SHA-256, and with `env` the
recorded libraries and Python against the installed ones (command `encoder-study provenance verify`).
No job runs this, so a fix here reruns none."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from ..core import files
from . import JOINED_NAME, ProvenanceError, canonical_name, distributions, twin
from .records import fragments_under, read_environment, read_record, record_name, records_under

# `verify --fast`'s hashes, under the folder the recorded paths are relative to (see HashCache).
FAST_CACHE = ".snakemake/encoder-study/verify-hashes.json"


RACY_NS = 2_000_000_000  # a file changed this close to its hashing may change again unseen: not cached


class HashCache:
    """SHA-256 of files by their identity and state: (size, mtime_ns, ctime_ns, inode, device).

    What `verify --fast` trusts instead of reading a file again. A change keeps none of these only if
    it rewrites the file in place with the same size and then sets its mtime back; the kernel then
    still moves ctime, which no user call can set. Not kept: a file changed less than RACY_NS before
    it was hashed (a file system with coarse time stamps could change it again within the same
    tick), or changed while it was hashed. The cache file is disposable; an unreadable one is ignored.
    """

    def __init__(self, path: str | os.PathLike):
        self.path, self.hits, self.hashed, self.changed = Path(path), 0, 0, False
        try:
            data = files.read_json(self.path, "verify's hash cache", "remove it", kind=dict)
        except files.JsonError:
            data = {}
        ok = data.get("format") == 1 and isinstance(data.get("files"), dict)
        self.entries = data["files"] if ok else {}

    @staticmethod
    def _state(stat: os.stat_result) -> list[int]:
        return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino, stat.st_dev]

    def sha256(self, path: Path) -> str:
        key = os.path.realpath(path)
        before = path.stat()
        entry = self.entries.get(key)
        if isinstance(entry, list) and entry[:-1] == self._state(before):
            self.hits += 1
            return entry[-1]
        started = time.time_ns()
        digest = files.sha256_file(path)
        self.hashed += 1
        after = path.stat()
        if (self._state(after) == self._state(before)
                and max(after.st_mtime_ns, after.st_ctime_ns) < started - RACY_NS):
            self.entries[key] = [*self._state(after), digest]
            self.changed = True
        elif self.entries.pop(key, None) is not None:
            self.changed = True
        return digest

    def save(self) -> None:
        """Write the cache (atomically); a folder that cannot be written leaves it as it was."""
        if not self.changed:
            return
        try:
            files.write_text(self.path, json.dumps({"format": 1, "files": self.entries}, sort_keys=True))
        except OSError:
            pass


def verify(root: str | os.PathLike, base: str | os.PathLike, env: bool = False,
           cache: HashCache | None = None) -> list[str]:
    """Re-hash every file the JSON twins name; return one line per difference (empty: all match).

    Also a difference: a Markdown fragment without its twin, a twin without its Markdown, and a
    Markdown that is not the one its twin was written with. With `env`, also each library version and
    Python version that differs from the installed one (`environment_differences`). A file named by
    several fragments is read once. With `cache` (`verify --fast`), a file whose size, times and inode
    are those it was hashed with is not read again (HashCache says what that trusts); the caller saves it.
    """
    problems: list[str] = []
    hashed: dict[tuple[int, int], str] = {}  # (device, inode) -> SHA-256: each file read once

    def sha256(target: Path) -> str:
        stat = target.stat()
        key = (stat.st_dev, stat.st_ino)
        if key not in hashed:
            hashed[key] = cache.sha256(target) if cache is not None else files.sha256_file(target)
        return hashed[key]

    environments: dict[Path, str] = {}  # a few small files every fragment names: read each once

    markdown = fragments_under(root)
    try:
        records = records_under(root)
    except ProvenanceError as err:
        return [str(err)]
    if not markdown and not records:
        return [f"{root}: no provenance fragments found; run the workflow first"]
    twins = {path for path, _ in records}
    for frag in markdown:
        if twin(frag) not in twins:
            problems.append(f"{frag}: no JSON twin ({twin(frag).name}); rerun its rule to write both")
    for path, record in records:
        frag = twin(path)
        if not frag.is_file():
            problems.append(f"{path}: its Markdown fragment {frag.name} is missing; rerun its rule")
        elif files.sha256_file(frag) != record.get("markdown", {}).get("sha256"):
            problems.append(f"{frag}: differs from the Markdown its twin {path.name} was written with; "
                            f"rerun its rule")
        if not record["files"]:
            problems.append(f"{path}: names no files")
        problems += _environment_problems(path, record, base, environments)
        for entry in record["files"]:
            name, size, digest = entry["path"], entry["bytes"], entry["sha256"]
            target = Path(base) / name
            if not target.is_file():
                problems.append(f"{path}: {name} is missing")
                continue
            actual = sha256(target)
            if actual != digest:
                hint = _changed_hint(name, path, root, base)
                problems.append(f"{path}: {name} changed: recorded sha256 {digest} ({size} bytes), "
                                f"now {actual} ({target.stat().st_size} bytes){hint}")
    if env:
        problems += environment_differences([r for _, r in records], base=base)
    return problems


def _changed_hint(name: str, reader: Path, root: str | os.PathLike, base: str | os.PathLike) -> str:
    """What a changed file under the fragments' root most likely is. A fragment that is whole (its
    Markdown the one its twin records) was rewritten by a later run of its own rule: the reader (the run
    crate reads every fragment) is stale, not the file. Anything else there (a joined PROVENANCE.md, a
    fragment that no longer matches its twin) changed since the run."""
    file = Path(name)
    if file.suffix not in (".md", ".json") or not file.is_relative_to(root):
        return ""
    markdown, record = Path(base) / file.with_suffix(".md"), Path(base) / file.with_suffix(".json")
    try:
        whole = (file.name != JOINED_NAME and markdown.is_file()
                 and files.sha256_file(markdown) == read_record(record).get("markdown", {}).get("sha256"))
    except ProvenanceError:
        whole = False
    if whole:
        return (f"; {name} was rewritten by a later run of its rule, so rerun the rule that wrote "
                f"{reader.name} (`all` rebuilds the run crate)")
    return (f"; {name} changed since the run (edited, or written again without its rule): restore it, or "
            "rerun `all` to write it and the run crate again")


def _environment_problems(path: Path, record: dict, base: str | os.PathLike, hashed: dict[Path, str]
                          ) -> list[str]:
    """The environment file a twin names, missing or not the one it names (twins written before
    environment files existed name none). `hashed` keeps each file's SHA-256 across calls."""
    entry = record.get("environment")
    if entry is None:
        return []
    target = Path(base) / entry["path"]
    if not target.is_file():
        return [f"{path}: its environment file {entry['path']} is missing; rerun its rule"]
    if target not in hashed:
        hashed[target] = files.sha256_file(target)
    if hashed[target] != entry["sha256"]:
        return [f"{path}: its environment file {entry['path']} changed: recorded sha256 {entry['sha256']}, "
                f"now {hashed[target]}"]
    return []


def environment_differences(records: list[dict], installed: dict[str, str] | None = None,
                            python: str | None = None, base: str | os.PathLike = ".") -> list[str]:
    """One line per library (and Python) whose recorded version differs from the installed one.

    Fragments may record different versions (jobs on other machines): each recorded version that
    differs is named with how many fragments and one example. Then the complete environments the
    fragments name (`environment_file`), each compared with the installed distributions: every
    version that differs, every distribution recorded but gone and every one installed since
    (`complete_differences`). `installed` (every distribution, canonical names) and `python` default
    to now.
    """
    if installed is None:
        installed = distributions()
    python = python or sys.version.split()[0]
    lines = _library_differences(records, installed, python)
    named = {line.split(":", 1)[0] for line in lines}
    return lines + [line for line in complete_differences(records, installed, python, base)
                    if line.split(":", 1)[0] not in named]


def _library_differences(records: list[dict], installed: dict[str, str], python: str) -> list[str]:
    """environment_differences for the short `libraries` list each fragment carries."""
    recorded: dict[str, dict[str, list[str]]] = {}
    for record in records:
        name = record_name(record)
        versions = {**record["libraries"], "python": record["machine"].get("python", "unknown")}
        for package, version in versions.items():
            recorded.setdefault(package, {}).setdefault(version, []).append(name)
    now = {**{p: installed.get(canonical_name(p), "not installed") for p in recorded}, "python": python}
    lines = []
    for package in sorted(recorded):
        for version, names in sorted(recorded[package].items()):
            if version != now.get(package, "not installed"):
                lines.append(f"{package}: recorded {version} by {len(names)} fragment(s) (e.g. {names[0]}), "
                             f"installed now {now.get(package, 'not installed')}")
    return lines


def complete_differences(records: list[dict], installed: dict[str, str], python: str,
                         base: str | os.PathLike = ".") -> list[str]:
    """Each complete environment the fragments name against `installed` (canonical name -> version)
    and `python`: one line per difference, naming the file and how many fragments ran in it."""
    users: dict[str, list[str]] = {}
    for record in records:
        if record.get("environment"):
            users.setdefault(record["environment"]["path"], []).append(record_name(record))
    lines = []
    for path, names in sorted(users.items()):
        where = f"in {path} ({len(names)} fragment(s), e.g. {names[0]})"
        try:
            recorded = read_environment(Path(base) / path)
        except ProvenanceError as err:
            lines.append(f"environment: {err}")
            continue
        then = {**recorded["distributions"], "python": recorded.get("python", "unknown")}
        now = {**installed, "python": python}
        for name in sorted(then.keys() | now.keys()):
            if name not in now:
                lines.append(f"{name}: recorded {then[name]} {where}, not installed now")
            elif name not in then:
                lines.append(f"{name}: installed now {now[name]}, not in the environment recorded {where}")
            elif then[name] != now[name]:
                lines.append(f"{name}: recorded {then[name]} {where}, installed now {now[name]}")
    return lines


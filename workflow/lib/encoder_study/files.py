"""Hashing and atomic writes: a reader never sees a half-written file."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

CHUNK = 1 << 20


class IntegrityError(RuntimeError):
    """A file is missing or its bytes are not the ones a manifest promises."""


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def list_files(root: str | os.PathLike) -> list[Path]:
    """Every regular file under `root`, sorted by relative POSIX path (a stable order for hashing)."""
    root = Path(root)
    if root.is_file():
        return [root]
    found = [p for p in root.rglob("*") if p.is_file()]
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def tree_sha256(root: str | os.PathLike) -> str:
    """SHA-256 of a directory: of the lines `<sha256>  <relative path>` of its files, sorted by path.

    The same digest `sha256sum` would give for the output of
    `find . -type f | sort | xargs sha256sum | sed 's|  ./|  |'`, so a user can check it by hand.
    """
    root = Path(root)
    if root.is_file():
        return sha256_file(root)
    lines = [f"{sha256_file(p)}  {p.relative_to(root).as_posix()}\n" for p in list_files(root)]
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def file_record(path: str | os.PathLike, relative_to: str | os.PathLike | None = None) -> dict:
    path = Path(path)
    name = path.relative_to(relative_to).as_posix() if relative_to is not None else path.as_posix()
    return {"path": name, "bytes": path.stat().st_size, "sha256": sha256_file(path)}


def check_file(path: str | os.PathLike, expected_sha256: str, what: str = "file") -> None:
    """Raise IntegrityError naming the file, the expected and the actual SHA-256."""
    path = Path(path)
    if not path.exists():
        raise IntegrityError(f"{what} {path} is missing (expected SHA-256 {expected_sha256})")
    actual = sha256_file(path)
    if actual != expected_sha256:
        raise IntegrityError(
            f"{what} {path} does not match: expected SHA-256 {expected_sha256}, actual {actual}; "
            "the file was changed or replaced after it was recorded: rebuild it or restore the original"
        )


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `target`; rename it onto `target` only if the block succeeds."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp_path, 0o666 & ~umask)  # mkstemp makes 0600; published files get the usual mode
    try:
        yield tmp_path
        os.replace(tmp_path, target)
    finally:
        tmp_path.unlink(missing_ok=True)


def write_text(target: str | os.PathLike, text: str) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(target: str | os.PathLike, data) -> None:
    """JSON with sorted keys and a final newline, so equal data gives equal bytes."""
    write_text(target, json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


@contextlib.contextmanager
def staging_dir(target: str | os.PathLike) -> Iterator[Path]:
    """A temporary directory beside `target`, removed afterwards whatever happens.

    The caller moves finished files into `target` with `publish`; on failure nothing reaches it.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def publish(staged: Path, target_dir: str | os.PathLike, names: list[str]) -> None:
    """Rename staged files into `target_dir` in the given order (put the manifest last)."""
    target_dir = Path(target_dir)
    target_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        os.replace(staged / name, target_dir / name)

"""Hashing, atomic writes and checked JSON: a reader never sees a half-written or unchecked file.

What every job imports; downloads live apart (`core.download`), so a fix to one reruns only the jobs
that download."""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from .errors import UserError

CHUNK = 1 << 20


class IntegrityError(UserError):
    """A file is missing or its bytes are not the ones a manifest promises."""


# errno -> (cause, way out) of the faults that stop a write whatever the program does.
WRITE_FAULTS = {
    errno.ENOSPC: ("no space left on device", "free space on that file system, then run again"),
    errno.EDQUOT: ("disk quota exceeded", "free space within your quota, then run again"),
    errno.EROFS: ("read-only file system", "write the results where the file system is writable"),
    errno.EACCES: ("permission denied", "change the permissions, or write the results elsewhere"),
    errno.EPERM: ("operation not permitted", "change the permissions, or write the results elsewhere"),
}
# Faults that only a write meets; a permission error may also be a read's.
WRITE_ONLY = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


class WriteError(UserError, OSError):
    """A file cannot be written: its file system is full or read-only, or its directory is not writable.

    Also an OSError (errno and filename set), so code that tolerates a failed write still catches it.
    """

    def __init__(self, code: int, path: str | os.PathLike, action: str = "write"):
        cause, fix = WRITE_FAULTS[code]
        self.message = f"cannot {action} {path}: {cause} ({errno.errorcode[code]}); {fix}"
        super().__init__(code, cause, str(path))

    def __str__(self) -> str:
        return self.message


def write_fault(err: BaseException, path: str | os.PathLike | None = None,
                writing: bool = True) -> WriteError | None:
    """`err` as a WriteError naming `path` (else the file the error names), if it is a full disk or a
    place that cannot be written; None for any other error. `writing` False: `err` may come from a read,
    so a permission error says "access" rather than "write"."""
    if isinstance(err, WriteError):
        return err
    if not isinstance(err, OSError) or err.errno not in WRITE_FAULTS:
        return None
    where = path if path is not None else err.filename
    action = "write" if writing or err.errno in WRITE_ONLY else "access"
    return WriteError(err.errno, where if where is not None else "a file", action)


def os_error(err: BaseException) -> OSError | None:
    """The OSError behind `err`: itself, or one a library reports in its own type with the system's
    words (safetensors, written in Rust: "I/O error: No space left on device (os error 28)")."""
    if isinstance(err, OSError):
        return err
    found = re.search(r"\(os error (\d+)\)", str(err))
    if found is None:
        return None
    code = int(found.group(1))
    return OSError(code, os.strerror(code))


def rebuild(path: str | os.PathLike) -> str:
    """The way out for a damaged workflow output: the command that writes it again."""
    return f"rebuild it: snakemake --cores all -f {os.path.normpath(path)}"


def _way_out(path: Path) -> str:
    """A workflow output (under results/) is rebuilt; any other file is a source to restore."""
    if "results" in Path(os.path.normpath(path)).parts:
        return rebuild(path)
    return "restore the original file"


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


# Every file check_file has read, in order: a file checked against a recorded hash is one the job reads,
# so provenance.Fragment lists these among its inputs (the weights a source.json names, say).
CHECKED: dict[Path, None] = {}  # an ordered set


def check_file(path: str | os.PathLike, expected_sha256: str, what: str = "file",
               fix: str | None = None) -> None:
    """Raise IntegrityError naming the file, the expected and the actual SHA-256 and `fix`, the way out
    (by default the command that rebuilds a workflow output, else "restore the original file");
    note the file in CHECKED."""
    path = Path(path)
    CHECKED[path] = None
    fix = fix or _way_out(path)
    if not path.exists():
        raise IntegrityError(f"{what} {path} is missing (expected SHA-256 {expected_sha256}); {fix}")
    actual = sha256_file(path)
    if actual != expected_sha256:
        raise IntegrityError(
            f"{what} {path} does not match: expected SHA-256 {expected_sha256}, actual {actual}; "
            f"the file was changed or replaced after it was recorded: {fix}")


# Temporary names beside a target: `.<name>.<host>-<pid>.<random>.tmp`. The host and the process id let
# a later writer of the same target remove what a killed one left (`sweep`), and only that.
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]


def _tmp_prefix(target: Path) -> str:
    return f".{target.name}.{_HOST}-{os.getpid()}."


def sweep(target: str | os.PathLike) -> list[Path]:
    """Remove the temporary files and directories of `target` whose writer, on this host, is gone
    (killed before it could clean up); return them. Those of a live process are kept."""
    target = Path(target)
    removed = []
    for leftover in target.parent.glob(glob.escape(f".{target.name}.") + "*.tmp"):
        owner = leftover.name[len(target.name) + 2:].split(".", 1)[0]
        host, _, pid = owner.partition("-")
        if host != _HOST or not pid.isdigit() or _alive(int(pid)):
            continue
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)
        removed.append(leftover)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@contextlib.contextmanager
def _named_faults(target: Path, stage: Path | None = None) -> Iterator[None]:
    """Turn a full disk or a place that cannot be written, met inside the block, into a WriteError naming
    `target` (a file written into `stage` is named by its place under `target`). A permission error
    counts only for a file beside `target` or in `stage`: elsewhere it may be a read's, left as it is."""
    try:
        yield
    except OSError as err:
        named = Path(err.filename) if isinstance(err.filename, str | os.PathLike) else None
        staged = stage is not None and named is not None and named.is_relative_to(stage)
        if err.errno not in WRITE_FAULTS or (isinstance(err, WriteError) and not staged):
            raise
        if err.errno not in WRITE_ONLY and not staged and (named is None or named.parent != target.parent):
            raise
        raise WriteError(err.errno, target / named.relative_to(stage) if staged else target) from err


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `target`; rename it onto `target` only if the block succeeds."""
    target = Path(target)
    with _named_faults(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        sweep(target)
        fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(target), suffix=".tmp", dir=target.parent)
        os.close(fd)
        tmp_path = Path(tmp)
        try:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp_path, 0o666 & ~umask)  # mkstemp makes 0600; published files get the usual mode
            yield tmp_path
            os.replace(tmp_path, target)
        finally:
            tmp_path.unlink(missing_ok=True)


def write_text(target: str | os.PathLike, text: str) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_torch(target: str | os.PathLike, obj) -> None:
    """torch.save(obj) to `target` atomically, with bytes that depend on `obj` alone.

    Through a buffer: torch.save names the archive inside the file after the path it writes to, so
    writing to the temporary name directly would make equal objects give different files.
    """
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    with atomic_path(target) as tmp:
        tmp.write_bytes(buffer.getvalue())


class CheckpointError(UserError):
    """A checkpoint cannot be resumed: it belongs to another run, or it is not a checkpoint."""


def check_same_run(path: str | os.PathLike, what: str, saved: dict, now: dict) -> None:
    """Refuse to resume a checkpoint whose `what` (a dict of settings) differs, naming each change."""
    if saved != now:
        changed = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
        details = ", ".join(f"{k}: {saved.get(k)!r} then, {now.get(k)!r} now" for k in changed)
        raise CheckpointError(f"{path} was written by a run with other {what} ({details}); resuming it "
                              "would not give the run asked for: delete it to start over")


class JsonError(UserError):
    """A JSON file is missing, unreadable, or not what its reader expects."""


def read_json(path: str | os.PathLike, what: str, fix: str, *, kind: type | None = None,
              error: type[UserError] = JsonError):
    """The JSON value in `path`, which should be `what` (e.g. "the model's export manifest").

    Anything else (missing, unreadable, not JSON, or not of type `kind`) raises `error` naming the file,
    what it should be, what was wrong and `fix`, the way to a good file (e.g. "re-export the model").
    """
    path = Path(path)
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise error(f"{path} is missing: expected {what}; {fix}") from err
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise error(f"{path}: cannot read {what} ({err}); {fix}") from err
    if kind is not None and not isinstance(value, kind):
        raise error(f"{path}: expected {what} (a JSON {_json_type(kind)}), found a JSON "
                    f"{_json_type(type(value))}; {fix}")
    return value


def _json_type(kind: type) -> str:
    return {dict: "object", list: "array", str: "string", int: "number", float: "number",
            bool: "boolean", type(None): "null"}.get(kind, kind.__name__)


def write_json(target: str | os.PathLike, data) -> None:
    """JSON with sorted keys and a final newline, so equal data gives equal bytes."""
    write_text(target, json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


@contextlib.contextmanager
def staging_dir(target: str | os.PathLike) -> Iterator[Path]:
    """A temporary directory beside `target`, removed afterwards whatever happens.

    The caller moves finished files into `target` with `publish`; on failure nothing reaches it.
    """
    target = Path(target)
    with _named_faults(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        sweep(target)
        tmp = Path(tempfile.mkdtemp(prefix=_tmp_prefix(target), suffix=".tmp", dir=target.parent))
    try:
        with _named_faults(target, stage=tmp):
            yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def publish(staged: Path, target_dir: str | os.PathLike, names: list[str]) -> None:
    """Rename staged files into `target_dir` in the given order (put the manifest last)."""
    target_dir = Path(target_dir)
    with _named_faults(target_dir):
        target_dir.mkdir(parents=True, exist_ok=True)
        for name in names:
            os.replace(staged / name, target_dir / name)


def replace_dir(staged: Path, target: str | os.PathLike) -> None:
    """Rename the finished directory `staged` onto `target`; a reader sees the old one or the new one.

    For an output that is a whole directory (its file list not known in advance), where `publish`
    moves named files. `staged` must be on the same filesystem (inside a `staging_dir` beside
    `target`); it gets the permissions a new directory would have, not mkdtemp's 0700.
    """
    target = Path(target)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staged, 0o777 & ~umask)
    old = None
    with _named_faults(target):
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=_tmp_prefix(target), suffix=".tmp", dir=target.parent))
            os.replace(target, old)  # onto an empty directory: allowed
        os.replace(staged, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# --- downloads ------------------------------------------------------------------------------------

def local_path(path_or_url: str) -> Path | None:
    """The filesystem path of a plain path or file:// URL; None for a network URL."""
    if path_or_url.startswith("file://"):
        return Path(urllib.parse.unquote(urllib.parse.urlparse(path_or_url).path))
    if "://" in path_or_url:
        return None
    return Path(path_or_url)


def pinned(sha256: str | None) -> str | None:
    """A pinned SHA-256 in lowercase, or None when none is pinned ('' or None).

    Anything else than 64 hexadecimal digits raises ValueError (callers wrap it in their own error).
    """
    if not sha256:
        return None
    value = sha256.strip().lower()
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise ValueError(f"{sha256!r} is not a SHA-256 (64 hexadecimal digits); give the file's SHA-256, "
                         "or an empty string to record it instead of checking it")
    return value

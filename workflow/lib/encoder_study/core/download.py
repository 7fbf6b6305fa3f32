"""Checked downloads: a URL (http, https, file://) or a local path copied to its place only when every
announced byte arrived and its SHA-256 is the pinned one; the jobs that fetch a source run it."""

from __future__ import annotations

import hashlib
import http.client
import os
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

from .errors import UserError
from .files import CHUNK, IntegrityError, atomic_path, local_path, pinned


class DownloadError(UserError):
    """A source cannot be read or downloaded; the message names it and the way around it."""


# The first word of the line an unpinned download prints (the rules that download show such lines).
PIN = "pin:"


def download(source: str, dest: str | os.PathLike, sha256: str | None = None, timeout: float = 60.0,
             validate: Callable[[Path], object] | None = None) -> str:
    """Copy a URL (http, https, file://) or a local path to `dest`; return the file's SHA-256.

    The bytes stream to a temporary file beside `dest`, hashed while they are copied; `dest` gets them
    only when every announced byte arrived (an HTTP Content-Length, a local file's size), the SHA-256
    matches `sha256` (if one is pinned) and `validate(temporary path)` (if given) returns without
    raising. A different hash raises IntegrityError naming the source, the expected and the actual
    SHA-256; a missing file, a failed or short transfer raises DownloadError; a full disk or a place
    that cannot be written raises WriteError. In every failure nothing is kept and `dest` is left as it
    was. Without a pin, the caller records the returned hash, and one line starting with PIN goes to
    stderr: the SHA-256 to put in the config.
    """
    expected = pinned(sha256)
    path = local_path(source)
    if path is not None and not path.is_file():
        raise DownloadError(f"{source}: no such file; give a path, a file:// URL or an http(s) URL")
    with atomic_path(dest) as tmp:  # renamed onto dest only when the block succeeds
        actual, size = _copy(source, path, tmp, timeout, dest)
        if expected and actual != expected:
            raise IntegrityError(
                f"download {source} does not match: expected SHA-256 {expected}, actual {actual}; the "
                f"source changed or the pin is wrong: check it, then fix the pin or restore the original "
                f"({dest} was left as it was)")
        if validate is not None:
            validate(tmp)
    if expected is None:
        print(f"{PIN} {source} is not pinned: its SHA-256 is {actual} ({size:,} bytes); put it in the "
              "config as the sha256 of this source, so that a later download is checked", file=sys.stderr,
              flush=True)
    return actual


def _open(source: str, path: Path | None, timeout: float):
    """The byte stream of `source` and the number of bytes it announces (None when it announces none)."""
    if path is not None:
        stream = open(path, "rb")
        return stream, os.fstat(stream.fileno()).st_size
    request = urllib.request.Request(source, headers={"User-Agent": "encoder-study"})
    stream = urllib.request.urlopen(request, timeout=timeout)
    length = stream.headers.get("Content-Length")
    return stream, int(length) if length and length.strip().isdigit() else None


def _copy(source: str, path: Path | None, tmp: Path, timeout: float, dest) -> tuple[str, int]:
    """Copy `source` to `tmp`; its SHA-256 and size. A failed or short transfer: DownloadError."""
    digest, received = hashlib.sha256(), 0
    try:
        stream, announced = _open(source, path, timeout)
    except OSError as err:  # URLError and HTTPError are OSErrors too
        raise DownloadError(f"{source}: download failed ({err}); on a machine without network, fetch the "
                            "file elsewhere and give its local path or file:// URL with its SHA-256") from err
    with stream, open(tmp, "wb") as out:
        while True:
            try:
                chunk = stream.read(CHUNK)
            except (OSError, http.client.HTTPException) as err:  # a reset, a timeout, a broken chunk
                raise DownloadError(f"{source}: the transfer broke after {received:,} bytes ({err!r}); "
                                    f"nothing was kept ({dest} was left as it was): run again") from err
            if not chunk:
                break
            digest.update(chunk)
            out.write(chunk)  # a full disk here is a WriteError naming dest (atomic_path)
            received += len(chunk)
    if announced is not None and received != announced:
        # Python's HTTP client ends a body at the connection's close without comparing it with
        # Content-Length (curl reports the same transfer as error 18).
        raise DownloadError(f"{source}: received {received:,} of the {announced:,} bytes announced "
                            f"({'Content-Length' if path is None else 'the file size'}): the transfer "
                            f"was cut short, so nothing was kept ({dest} was left as it was): run again")
    return digest.hexdigest(), received

"""Every download the data layer makes, each checked before it is kept: a treebank split (read as
CoNLL-U before it is renamed into place) and a text source (Tatoeba's export, the UDHR archive).
Apart from the readers, so that a change to how files are fetched reruns only the jobs that
fetch."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..core import download
from .conllu import Sentence, TreebankError, pinned, read_conllu
from .texts import TextError
from .texts import pinned as text_pinned


@dataclass(frozen=True)
class Fetched:
    path: Path
    sha256: str
    pinned: bool
    sentences: list[Sentence]


def treebank(source: str, dest: str | os.PathLike, sha256: str | None = None,
             timeout: float = 60.0) -> Fetched:
    """Download `source` (http(s) URL, file:// URL or path) to `dest`, check it, and read it.

    The bytes go to a temporary name beside `dest`, which gets them only when the SHA-256 matches the
    pin (if one is given) and the file reads as CoNLL-U; otherwise `dest` is left as it was. Without a
    pin, the returned hash is what the caller records.
    """
    expected = pinned(sha256)
    sentences: list[Sentence] = []

    def parse(tmp: Path) -> None:  # before the rename: a malformed file never reaches dest
        sentences.extend(read_conllu(tmp, name=source))

    try:
        actual = download.download(source, dest, expected, timeout=timeout, validate=parse)
    except download.DownloadError as err:
        raise TreebankError(str(err)) from err
    return Fetched(Path(dest), actual, expected is not None, sentences)



def text_source(source: str, dest: str | os.PathLike, sha256: str | None, timeout: float) -> str:
    """Copy a URL (http, https, file://) or a local path to `dest`; return the file's SHA-256.

    With `sha256` pinned, a different file raises IntegrityError (naming the source, the expected and
    the actual SHA-256) and `dest` is left as it was; without, the caller records the returned hash.
    See core.download.download.
    """
    expected = text_pinned(sha256, f"SHA-256 for {source}")
    try:
        return download.download(source, dest, expected, timeout=timeout)
    except download.DownloadError as err:
        raise TextError(str(err)) from err


"""spaCy's published pipeline wheel, downloaded and checked (rule tagging_spacy_fetch): apart from
`tagging.spacy` (which it does not import), so that a change to how it is fetched reruns only the
download, and a change to the spaCy runs does not download again."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

from ...core import download, files


def fetch_package(url: str, sha256: str, dest: str | os.PathLike, timeout: float) -> tuple[str, bool]:
    """Download the wheel to `dest`, checked against `sha256` if pinned and read as a zip archive.

    Returns (its SHA-256, whether it was pinned); without a pin the caller records the hash.
    """
    def readable(tmp: Path) -> None:
        if not zipfile.is_zipfile(tmp):
            raise download.DownloadError(f"{url}: not a wheel (zip archive); give the release asset's "
                                         "URL (<package>-<version>-py3-none-any.whl)")

    try:
        expected = files.pinned(sha256)
    except ValueError as err:
        raise download.DownloadError(f"{url}: {err}") from err
    actual = download.download(url, dest, expected, timeout=timeout, validate=readable)
    return actual, expected is not None


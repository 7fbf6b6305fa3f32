"""`export.json`: what an exported model came from, what made it, and every file's size and SHA-256.

A consumer calls `verified_model` before it reads an export, so a file changed after the export is
refused with its name and both hashes instead of silently giving other numbers.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..core import files
from ..core.errors import UserError

MANIFEST = "export.json"
ONNX_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "model.config.json"
MODEL_FILES = (ONNX_FILE, TOKENIZER_FILE, CONFIG_FILE)  # what an encoder reads from an export
EXPORT_FILES = (*MODEL_FILES, MANIFEST)  # an export directory's files, its manifest last


class ManifestError(UserError):
    pass


def write(directory: str | os.PathLike, record: dict, names: list[str]) -> dict:
    """Add `files` (name, bytes, sha256 of each of `names`) to `record` and write export.json."""
    directory = Path(directory)
    record = dict(record, files=[files.file_record(directory / n, directory) for n in sorted(names)])
    files.write_json(directory / MANIFEST, record)
    return record


def read(directory: str | os.PathLike) -> dict:
    return files.read_json(Path(directory) / MANIFEST, "an export manifest",
                           "export the model (snakemake export)", kind=dict, error=ManifestError)


def read_config(directory: str | os.PathLike, error: type[UserError] = ManifestError) -> dict:
    """The export's Hugging Face config (model.config.json); `error`, naming the file, if it is not one."""
    return files.read_json(Path(directory) / CONFIG_FILE, "the model's config", "re-export the model",
                           kind=dict, error=error)


def verified_model(directory: str | os.PathLike) -> dict:
    """Check every file export.json lists against its SHA-256; return the manifest."""
    directory = Path(directory)
    record = read(directory)
    files.CHECKED[directory / MANIFEST] = None  # read too: a job's fragment names it among its inputs
    for entry in record.get("files", []):
        files.check_file(directory / entry["path"], entry["sha256"], what="exported file")
    return record

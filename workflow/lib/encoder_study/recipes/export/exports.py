"""The study's first table: every ONNX export, where it came from, its size and SHA-256.

One row per manifest: each configured model's `export.json`, the distilled student's `export.json`,
and the retrieval graph's `retrieval.json` (its own row, beside the encoder it wraps). The facts are
the manifests' own: the size and SHA-256 of `model.onnx` are those the export recorded (and `verify`
re-checks), so the table reads no graph. A graph saved with external data counts its data file too.
"""

from __future__ import annotations

import os
from pathlib import Path

from ...core import files
from ...core.errors import UserError
from ...core.tables import csv_text, markdown
from ...onnx.manifest import ONNX_FILE

COLUMNS = ("export", "model", "role", "source_kind", "source", "opset", "onnx_bytes", "onnx_sha256",
           "external_data_bytes", "external_data_sha256", "manifest")
MARKDOWN_COLUMNS = (("export", "export", ""), ("role", "role", ""), ("source_kind", "source", ""),
                    ("source", "repository@revision, wheel==version, architecture and seed, or path", ""),
                    ("opset", "opset", ""), ("onnx_bytes", "ONNX bytes", "n"), ("onnx_sha256", "SHA-256", ""))


class ExportTableError(UserError):
    pass


def source_text(source: dict) -> tuple[str, str]:
    """(kind, where from) of an export's source record, as acquire wrote it."""
    kind = source.get("kind", "")
    if kind == "hf":
        return kind, f"{source['repo']}@{source['revision']}"
    if kind == "wheel":
        return kind, f"{source['package']}=={source['version']}"
    if kind == "tiny":
        return kind, f"{source['architecture']} seed {source['seed']}"
    if kind == "local":
        return kind, f"{source['path']} (sha256 {source.get('sha256') or 'not pinned'})"
    raise ExportTableError(f"unknown source kind {kind!r} in {source}; expected hf, wheel, tiny or local")


def row(manifest_path: str | os.PathLike) -> dict:
    """One row of the table from one manifest (export.json of a model or the student, retrieval.json)."""
    path = Path(manifest_path)
    record = files.read_json(path, "an export manifest", "export the model first", kind=dict,
                             error=ExportTableError)
    try:
        by_name = {entry["path"]: entry for entry in record["files"]}
        graph = by_name[ONNX_FILE]
        data = [e for name, e in sorted(by_name.items()) if name.startswith(ONNX_FILE + ".")]
        if record.get("source") == "student":  # the distilled student: made by the student recipe
            teacher = record["teacher"]["model"]
            role, kind = "student", "distilled"
            where = f"distilled from {teacher}; {record['distillation']['student']} sha256 " \
                    f"{record['distillation']['sha256']}"
        else:
            role = "retrieval graph" if "heads" in record else "encoder"
            kind, where = source_text(record["source"])
        opset = record["exporter"]["opset"]
    except KeyError as err:
        raise ExportTableError(f"{path}: no {err} entry; re-export the model with this version") from err
    export = "retrieval" if role == "retrieval graph" else record["model"]
    return {
        "export": export, "model": record["model"], "role": role, "source_kind": kind, "source": where,
        "opset": opset, "onnx_bytes": graph["bytes"] + sum(e["bytes"] for e in data),
        "onnx_sha256": graph["sha256"],
        "external_data_bytes": sum(e["bytes"] for e in data),
        "external_data_sha256": " ".join(e["sha256"] for e in data),
        "manifest": path.as_posix(),
    }


def write(manifests: list[str | os.PathLike], out: str | os.PathLike,
          markdown_out: str | os.PathLike) -> list[dict]:
    """The table of `manifests` in the order given, as CSV and Markdown; returns the rows."""
    rows = [row(m) for m in manifests]
    names = [r["export"] for r in rows]
    if len(set(names)) != len(names):
        raise ExportTableError(f"two manifests name the same export ({', '.join(names)}); give each once")
    files.write_text(out, csv_text(rows, COLUMNS))
    files.write_text(markdown_out, markdown_text(rows))
    return rows


def markdown_text(rows: list[dict]) -> str:
    return markdown(rows, MARKDOWN_COLUMNS)

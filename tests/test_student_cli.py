"""The student recipe's commands end to end on a tiny teacher: chunks, export, parity, provenance."""

from __future__ import annotations

import csv
import json

import pytest

from conftest import ROOT
from encoder_study import manifest, student, trainable

SHAPE = {"layers": 2, "width": 32, "heads": 2, "intermediate": 64, "embedding_width": 8, "max_positions": 512}
TRAINING = {"steps": 6, "batch_windows": 4, "window_lengths": [16, 24], "chunk_steps": 3, "log_every": 2,
            "stats_windows": 8}


@pytest.fixture(scope="module")
def distilled(tiny_exports, tmp_path_factory):
    out = tmp_path_factory.mktemp("student")
    teacher = tiny_exports["bert-tiny"]
    argv = ["train", "--teacher-dir", str(teacher),
            "--tatoeba", str(ROOT / "config/texts/tatoeba_sample.tsv"), "--udhr",
            str(ROOT / "config/texts/udhr_sample"), "--student", json.dumps(SHAPE),
            "--training", json.dumps(TRAINING), "--checkpoint", str(out / "checkpoint.pt"),
            "--out", str(out / "student.pt"), "--loss-log", str(out / "training.csv"),
            "--plot", str(out / "training.png"), "--provenance", str(out / "prov/distill_student.md")]
    first = student.main(argv)
    fragment_after_first = (out / "prov/distill_student.md").exists()
    second = student.main(argv)
    return {"dir": out, "teacher": teacher, "codes": (first, second), "early_fragment": fragment_after_first}


def test_train_runs_in_chunks_and_writes_outputs_once_done(distilled):
    out = distilled["dir"]
    assert distilled["codes"] == (student.CHUNK_EXIT, 0)
    assert not distilled["early_fragment"], "a chunk that is not the last must not write the fragment"
    rows = list(csv.DictReader((out / "training.csv").open()))
    assert [int(r["step"]) for r in rows] == [2, 4, 6]
    assert all(float(r["loss"]) > 0 for r in rows)
    assert (out / "training.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (out / "prov/distill_student.md").read_text()
    assert "Training log" in text and "training.csv" in text


def test_export_and_parity(distilled, tmp_path):
    out = distilled["dir"]
    export_dir = tmp_path / "models/student"
    assert student.main(["export", "--student", str(out / "student.pt"), "--teacher-dir",
                         str(distilled["teacher"]), "--out-dir", str(export_dir),
                         "--provenance", str(tmp_path / "prov/export_student.md")]) == 0
    assert manifest.verified_model(export_dir)["source"] == "student"
    assert (export_dir / manifest.TOKENIZER_FILE).read_bytes() == \
        (distilled["teacher"] / manifest.TOKENIZER_FILE).read_bytes()
    assert trainable.load(export_dir).settings.embedding_width == SHAPE["embedding_width"]

    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"id": f"t{i}", "source": "x", "lang": "eng", "text": t}) + "\n"
                             for i, t in enumerate(["A short text.", "Ein etwas längerer Satz, mit Komma."])))
    table = tmp_path / "parity.csv"
    assert student.main(["parity", "--student", str(out / "student.pt"), "--export-dir", str(export_dir),
                         "--texts", str(texts), "--out", str(table),
                         "--provenance", str(tmp_path / "prov/student_parity.md")]) == 0
    rows = list(csv.DictReader(table.open()))
    assert [r["comparison"] for r in rows] == ["trainable vs pytorch", "graph runtime vs pytorch"]
    for row in rows:
        assert int(row["tokens"]) > 10
        assert float(row["max_abs"]) < 1e-5
        assert row["batch_equal"] == "True"


def test_bad_settings_are_refused_with_a_message(distilled, tmp_path, capsys):
    code = student.main(["train", "--teacher-dir", str(distilled["teacher"]), "--tatoeba",
                         str(ROOT / "config/texts/tatoeba_sample.tsv"), "--student", json.dumps(SHAPE),
                         "--training", json.dumps({"stpes": 3}), "--checkpoint", str(tmp_path / "c.pt"),
                         "--out", str(tmp_path / "s.pt"), "--loss-log", str(tmp_path / "t.csv"),
                         "--plot", str(tmp_path / "t.png"), "--provenance", str(tmp_path / "p.md")])
    assert code == 2
    assert "stpes" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_torchrun_chunks_end_with_status_0_and_no_student_until_done(tiny_exports, tmp_path):
    """The rule's contract under torchrun (which fails a job on any non-zero exit): a chunk exits 0
    and leaves no student file; the run that finishes writes it and the fragment, on rank 0 only."""
    import os
    import subprocess
    import sys

    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "-m", "encoder_study.cli", "student", "train", "--teacher-dir", str(tiny_exports["bert-tiny"]),
            "--tatoeba", str(ROOT / "config/texts/tatoeba_sample.tsv"), "--student", json.dumps(SHAPE),
            "--training", json.dumps(TRAINING), "--checkpoint", str(tmp_path / "checkpoint.pt"),
            "--out", str(tmp_path / "student.pt"), "--loss-log", str(tmp_path / "training.csv"),
            "--plot", str(tmp_path / "training.png"), "--provenance", str(tmp_path / "distill_student.md")]
    env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1")
    first = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    assert not (tmp_path / "student.pt").exists() and not (tmp_path / "distill_student.md").exists()
    second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert (tmp_path / "student.pt").is_file()
    assert "| world size | 2 |" in (tmp_path / "distill_student.md").read_text()

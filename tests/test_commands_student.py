"""The student recipe's commands end to end on a tiny teacher: resuming after a crash, export, parity,
provenance, one process and two (torchrun)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest
import torch
from test_student_distill import Crash, crash_before

from conftest import ROOT, cli_runner
from encoder_study.encoders import trainable
from encoder_study.onnx import manifest

SHAPE = {"layers": 2, "width": 32, "heads": 2, "intermediate": 64, "embedding_width": 8, "max_positions": 512}
TRAINING = {"steps": 6, "batch_windows": 4, "window_lengths": [16, 24], "chunk_steps": 3, "log_every": 2,
            "stats_windows": 8}
# Under torchrun, in one launch: both ranks run the uninterrupted distillation (argv[1]), then the one to
# be resumed (argv[2]), which they stop before step 5, after the checkpoint of step 3, as a killed job would.
STOPPED = """
import json
import sys
from encoder_study import cli
from encoder_study.recipes.student import distill
if cli.main(json.loads(sys.argv[1])) != 0:
    sys.exit("the uninterrupted run failed")
real = distill._Run.train_step
def train_step(self):
    if self.step == 4:
        raise RuntimeError("test-only stop before step 5")
    real(self)
distill._Run.train_step = train_step
sys.exit(cli.main(json.loads(sys.argv[2])))
"""


student = cli_runner("student")


def stage_argv(out, udhr=True) -> list[str]:
    return ["stage", "--tatoeba", str(ROOT / "config/texts/tatoeba_sample.tsv"),
            *(["--udhr", str(ROOT / "config/texts/udhr_sample")] if udhr else []),
            "--out", str(out / "corpus/corpus.jsonl"), "--provenance", str(out / "prov/student_stage.md")]


def train_argv(teacher, out, udhr=True) -> list[str]:
    """`student distill` on the embedded sample, staged first (`student stage`) as the rules do."""
    assert student(*stage_argv(out, udhr)) == 0
    return ["distill", "--teacher-dir", str(teacher), "--corpus", str(out / "corpus/corpus.jsonl"),
            "--student", json.dumps(SHAPE), "--training", json.dumps(TRAINING),
            "--checkpoint", str(out / "checkpoints/distill.pt"), "--out", str(out / "student.pt"),
            "--loss-log", str(out / "training.csv"), "--plot", str(out / "training.png"), "--threads", "1",
            "--device", "cpu", "--precision", "fp32", "--provenance", str(out / "prov/student_distill.md")]


@pytest.fixture(scope="module")
def distilled(tiny_exports, tmp_path_factory):
    """A run stopped by a crash after its first chunk, then run again; and one that never stopped."""
    out, whole = tmp_path_factory.mktemp("student"), tmp_path_factory.mktemp("whole")
    teacher = tiny_exports["bert-tiny"]
    with pytest.MonkeyPatch.context() as patch:
        crash_before(patch, 4)
        with pytest.raises(Crash):
            student(*train_argv(teacher, out))
    after_crash = {"step": torch.load(out / "checkpoints/distill.pt", weights_only=True)["step"],
                   "outputs": sorted(p.name for p in out.iterdir() if p.is_file() or p.name == "prov")}
    code = student(*train_argv(teacher, out))
    assert student(*train_argv(teacher, whole)) == 0
    return {"dir": out, "whole": whole, "teacher": teacher, "code": code, "after_crash": after_crash}


def test_train_resumes_after_a_crash_and_writes_outputs_once_done(distilled):
    out = distilled["dir"]
    # The chunk's checkpoint, nothing else (the staged corpus and its fragment were there before).
    assert distilled["after_crash"] == {"step": 3, "outputs": ["prov"]}
    assert distilled["code"] == 0
    assert not (out / "checkpoints/distill.pt").exists(), "the finished run removes its checkpoint"
    assert (out / "student.pt").read_bytes() == (distilled["whole"] / "student.pt").read_bytes()
    assert (out / "training.csv").read_bytes() == (distilled["whole"] / "training.csv").read_bytes()
    rows = list(csv.DictReader((out / "training.csv").open()))
    assert [int(r["step"]) for r in rows] == [2, 4, 6]
    assert all(float(r["loss"]) > 0 for r in rows)
    assert (out / "training.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (out / "prov/student_distill.md").read_text()
    assert "Training log" in text and "training.csv" in text


def test_export_and_parity(distilled, tmp_path):
    out = distilled["dir"]
    export_dir = tmp_path / "models/student"
    assert student("export", "--student", str(out / "student.pt"), "--teacher-dir", str(distilled["teacher"]),
                   "--out-dir", str(export_dir), "--name", "student", "--opset", "17", "--tolerance", "1e-4",
                   "--ort-optimization", "all", "--threads", "1",
                   "--provenance", str(tmp_path / "prov/student_export.md")) == 0
    assert manifest.verified_model(export_dir)["source"] == "student"
    assert (export_dir / manifest.TOKENIZER_FILE).read_bytes() == \
        (distilled["teacher"] / manifest.TOKENIZER_FILE).read_bytes()
    assert trainable.load(export_dir).settings.embedding_width == SHAPE["embedding_width"]

    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"id": f"t{i}", "source": "x", "lang": "eng", "text": t}) + "\n"
                             for i, t in enumerate(["A short text.", "Ein etwas längerer Satz, mit Komma."])))
    table = tmp_path / "parity.csv"
    assert student("parity", "--student", str(out / "student.pt"), "--export-dir", str(export_dir),
                   "--texts", str(texts), "--out", str(table), "--threads", "1",
                   "--provenance", str(tmp_path / "prov/student_parity.md")) == 0
    rows = list(csv.DictReader(table.open()))
    assert [r["comparison"] for r in rows] == ["trainable vs transformers", "graph runtime vs transformers"]
    for row in rows:
        assert int(row["tokens"]) > 10
        assert 0 < float(row["max_abs"]) < 1e-5  # transformers' BertModel, written apart
        assert row["batch_equal"] == "True"
    assert "| trainable vs transformers |" in table.with_suffix(".md").read_text()


def test_bad_settings_are_refused_with_a_message(distilled, tmp_path, capsys):
    argv = train_argv(distilled["teacher"], tmp_path, udhr=False)
    argv[argv.index("--training") + 1] = json.dumps({"stpes": 3})
    assert student(*argv) == 2
    err = capsys.readouterr().err
    assert "encoder-study student distill: error:" in err and "stpes" in err
    assert sorted(p.name for p in (tmp_path / "prov").iterdir()) == ["student_stage.json", "student_stage.md"]
    assert not list(tmp_path.glob("*.pt")) and not (tmp_path / "training.csv").exists()


def test_torchrun_resumes_after_a_crash_and_writes_on_rank_0_only(tiny_exports, tmp_path):
    """Under torchrun (student.processes 2) as in one process: the rerun after a crash resumes from the
    checkpoint and writes, on rank 0 only, the student an uninterrupted run writes, byte for byte."""
    stopped = tmp_path / "stopped.py"
    stopped.write_text(STOPPED)
    env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1")
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    resumed, whole = tmp_path / "resumed", tmp_path / "whole"
    argv = {out: ["student", *train_argv(tiny_exports["bert-tiny"], out, udhr=False)]
            for out in (resumed, whole)}
    first = subprocess.run([*launcher, str(stopped), json.dumps(argv[whole]), json.dumps(argv[resumed])],
                           env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode != 0 and "test-only stop" in first.stderr, first.stderr[-3000:]
    assert (whole / "student.pt").is_file() and not (whole / "checkpoints/distill.pt").exists()
    assert torch.load(resumed / "checkpoints/distill.pt", weights_only=True)["step"] == 3
    assert not (resumed / "student.pt").exists() and not (resumed / "prov/student_distill.md").exists()
    run = subprocess.run([*launcher, "-m", "encoder_study.cli", *argv[resumed]], env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (resumed / "student.pt").read_bytes() == (whole / "student.pt").read_bytes()
    assert not (resumed / "checkpoints/distill.pt").exists()
    assert "| world size | 2 |" in (resumed / "prov/student_distill.md").read_text()

"""Faults injected into training and its stored artefacts (issue 23): every one ends in a refusal that
names the file or the step and the way out, with exit status 2 and no fragment, never in a wrong
result.

- one flipped byte in a tagging checkpoint, a distillation checkpoint, the distilled student and a
  pipeline file (inline, and the write-back's with its graph), where torch or safetensors alone would
  return the changed number;
- a NaN or infinite loss: a learning rate of 1e30, and a NaN put into a checkpoint's weight (a run that
  diverged before it was saved), for the fine-tune, the L-BFGS probe and distillation.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from test_commands_student import train_argv as distill_argv
from test_student_distill import TINY_RUN, Crash, _distill, crash_before
from test_tagging_train import Crash as TaggingCrash
from test_tagging_train import crash_after_saves
from test_writeback_pipeline import finetuned

from conftest import cli_runner, train_argv
from encoder_study.core import files
from encoder_study.core.files import CheckpointError
from encoder_study.data import synthetic
from encoder_study.encoders.trainable import harness
from encoder_study.encoders.trainable.words import TrainableEncoder
from encoder_study.provenance import artefacts
from encoder_study.recipes import writeback
from encoder_study.recipes.student import StudentError, distill
from encoder_study.recipes.tagging import pipeline
from encoder_study.recipes.tagging.tagger import Tagger

tagging = cli_runner("tagging")
student = cli_runner("student")
RUN = "tiny-finetuned"
FINETUNE = {"mode": "finetuned", "max-steps": 6, "eval-every": 2, "warmup": 2, "chunk-steps": 3}
PROBE = {"mode": "frozen", "optimizer": "lbfgs", "lr": 1.0, "clip": 0.0, "weight-decay": 1e-5,
         "epochs": 6, "chunk-steps": 3}


@pytest.fixture(scope="module")
def bank(tmp_path_factory) -> dict:
    return synthetic.write_synthetic(tmp_path_factory.mktemp("treebank"), seed=0,
                                     sizes={"train": 40, "dev": 12, "test": 12})


def flip(path: Path, tensor: torch.Tensor, mask: int = 0x40) -> None:
    """Flip bits of the last byte of `tensor`'s first element where its bytes lie in `path`: in a
    little-endian float32, the sign and the high exponent bits, what the issue's fault changed."""
    data = bytearray(path.read_bytes())
    raw = tensor.detach().contiguous().reshape(-1).numpy().tobytes()
    at = data.find(raw)
    assert at >= 0 and data.find(raw, at + 1) < 0, "the tensor's bytes are in the file once"
    data[at + tensor.element_size() - 1] ^= mask
    path.write_bytes(bytes(data))


def first_matrix(state: dict) -> tuple[str, torch.Tensor]:
    return next((k, v) for k, v in state.items() if v.dtype == torch.float32 and v.ndim == 2)


def outputs(out: Path) -> list[str]:
    return sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())


# -- the self-checking digest ------------------------------------------------------------------------

def test_the_content_digest_is_a_sha256_of_tagged_bytes_and_tells_types_and_shapes_apart():
    x = torch.tensor([1.5, -2.0])
    by_hand = hashlib.sha256(b"D1|S1|x" + b"Ttorch.float32(2,)|" + struct.pack("<2f", 1.5, -2.0)).hexdigest()
    assert artefacts.content_sha256({"x": x}) == by_hand
    values = [1, 1.0, "1", True, None, [1], (1, 2), [[1], 2], b"1", {"1": 1}, {1: 1},
              torch.ones(2, 2), torch.ones(4), torch.ones(4, dtype=torch.float64), np.ones(4)]
    assert len({artefacts.content_sha256(v) for v in values}) == len(values)
    assert artefacts.content_sha256([1, 2]) == artefacts.content_sha256((1, 2))  # what a pickle keeps apart
    sealed = artefacts.seal({"w": torch.arange(3.0), "step": 3})
    assert artefacts.seal(sealed) == sealed
    assert artefacts.opened(sealed, "f", "thing", "fix", CheckpointError) == {"w": sealed["w"], "step": 3}
    with pytest.raises(CheckpointError, match=r"^f: the thing is damaged: its content's SHA-256 is "
                                              r"[0-9a-f]{64}, and it recorded [0-9a-f]{64} when it was "
                                              r"written; fix$"):
        artefacts.opened({**sealed, "step": 4}, "f", "thing", "fix", CheckpointError)
    with pytest.raises(TypeError, match="cannot hash a set"):
        artefacts.content_sha256({"s": {1}})


# -- flipped bytes ---------------------------------------------------------------------------------------

def crashed_run(model_dir: Path, out: Path, bank: dict, monkeypatch, **chosen) -> tuple[list[str], Path]:
    """`tagging train` killed right after its first checkpoint (step 3): (its argv, the checkpoint)."""
    argv = train_argv(RUN, model_dir, out, out / "prov", bank, **chosen)
    with monkeypatch.context() as patch:
        crash_after_saves(patch, 1)
        with pytest.raises(TaggingCrash):
            tagging(*argv)
    checkpoint = out / "checkpoints" / f"{RUN}.pt"
    assert torch.load(checkpoint, weights_only=True)["step"] == 3
    return argv, checkpoint


def test_a_flipped_byte_in_a_tagging_checkpoint_is_refused_not_resumed(tiny_exports, bank, tmp_path,
                                                                        monkeypatch, capsys):
    """The issue's case: one flipped exponent byte in the fine-tune's checkpoint gave "train loss nan",
    a score from other weights and exit 0. torch reads the changed number; the digest refuses it."""
    argv, checkpoint = crashed_run(tiny_exports["bert-tiny"], tmp_path, bank, monkeypatch, **FINETUNE)
    name, weight = first_matrix(torch.load(checkpoint, weights_only=True)["model"])
    flip(checkpoint, weight)
    changed = torch.load(checkpoint, weights_only=True)["model"][name]  # torch reads it without a word
    assert not torch.equal(changed, weight) and changed.flatten()[1:].equal(weight.flatten()[1:])
    capsys.readouterr()
    assert tagging(*argv) == 2
    err = capsys.readouterr().err
    assert (f"{checkpoint}: the tagger training checkpoint is damaged: its content's SHA-256 is " in err
            and "when it was written; delete it to start over" in err), err
    assert outputs(tmp_path) == [f"checkpoints/{RUN}.pt"]  # no output, no fragment; the file left to see
    checkpoint.unlink()  # the way out
    assert tagging(*argv) == 0


@pytest.mark.parametrize("where", ["checkpoint", "student"])
def test_a_flipped_byte_in_a_distillation_checkpoint_or_the_student_is_refused(tiny_exports, tmp_path,
                                                                               monkeypatch, where):
    teacher, run = tiny_exports["bert-tiny"], dict(TINY_RUN, chunk_steps=2)
    if where == "checkpoint":
        with monkeypatch.context() as patch:
            crash_before(patch, 2)
            with pytest.raises(Crash):
                _distill(teacher, tmp_path, run)
        path = tmp_path / "checkpoint.pt"
        flip(path, first_matrix(torch.load(path, weights_only=True)["student"])[1])
        with pytest.raises(CheckpointError, match=rf"^{re.escape(str(path))}: the distillation checkpoint is "
                                                  r"damaged: .*; delete it to start over$"):
            _distill(teacher, tmp_path, run)
        assert not (tmp_path / "student.pt").exists()
        return
    _distill(teacher, tmp_path, run)
    path = tmp_path / "student.pt"
    distill.load_student(path)
    flip(path, first_matrix(torch.load(path, weights_only=True)["state_dict"])[1])
    shown = re.escape(str(path))
    with pytest.raises(StudentError, match=rf"^{shown}: the distilled student is damaged: .*; rebuild it: "
                                           rf"snakemake --cores all -f {shown}$"):
        distill.load_student(path)


@pytest.mark.parametrize("kind", ["inline", "graph"])
def test_a_flipped_byte_in_a_pipeline_file_is_refused_with_the_command_that_rebuilds_it(
        tiny_exports, bank, tmp_path, capsys, kind):
    """The issue's third case: `predict` scored with a flipped weight. The file carries its digest."""
    tagger = finetuned(tiny_exports["bert-tiny"])
    path = tmp_path / "run" / pipeline.FILE_NAME
    if kind == "inline":
        pipeline.save(tagger, path, training={"run": "x"})
    else:
        writeback.save_with_graph(tagger, path, training={"run": "x"})
    predicted = tmp_path / "out.conllu"
    argv = ["predict", "--pipeline", str(path), "--input", str(bank["test"]), "--out", str(predicted)]
    assert tagging(*argv) == 0
    predicted.unlink()
    settings, tensors = pipeline.read(path)
    assert artefacts.KEY not in settings  # checked and taken out

    if kind == "inline":
        flip(path, tensors["head.weight"], mask=0x01)  # exponent bit 1: the weight 4 times larger or smaller
    else:  # format /3 keeps every weight in its graph (checked by the SHA-256 it records): a settings byte
        data = bytearray(path.read_bytes())
        data[data.index(b"mean", data.index(b"pooling")) + 1] ^= 0x01  # "mean" -> "mdan"
        path.write_bytes(bytes(data))
    capsys.readouterr()
    assert tagging(*argv) == 2
    err = capsys.readouterr().err
    assert (f"{path}: the pipeline file is damaged: its content's SHA-256 is " in err
            and f"when it was written; rebuild it: snakemake --cores all -f {path}" in err), err
    assert not predicted.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_pipeline_files_digest_key_damaged_does_not_pass_for_an_older_file(tiny_exports, tmp_path):
    tagger = Tagger(TrainableEncoder(tiny_exports["bert-tiny"]), seed=1)
    path = pipeline.save(tagger, tmp_path / "p.safetensors")
    data = path.read_bytes()
    assert data.count(artefacts.KEY.encode()) == 1
    path.write_bytes(data.replace(artefacts.KEY.encode(), b"content_sha25f"))
    with pytest.raises(pipeline.PipelineError, match=r"no SHA-256 of its content, and settings "
                                                     r"\['content_sha25f'\] no writer wrote without one"):
        pipeline.read(path)


# -- non-finite values -----------------------------------------------------------------------------------

def poison(checkpoint: Path, key: str) -> None:
    """Put a NaN into the first matrix of the checkpoint's `key` state, sealed again: the state of a run
    that diverged (no flipped byte: its digest matches)."""
    state = torch.load(checkpoint, weights_only=True)
    first_matrix(state[key])[1].view(-1)[0] = math.nan
    files.write_torch(checkpoint, artefacts.seal(state))


@pytest.mark.parametrize("settings", [FINETUNE, PROBE], ids=["finetune", "lbfgs-probe"])
def test_a_nan_from_a_resumed_checkpoint_stops_tagging_naming_it(tiny_exports, bank, tmp_path, monkeypatch,
                                                                  capsys, settings):
    argv, checkpoint = crashed_run(tiny_exports["bert-tiny"], tmp_path, bank, monkeypatch, **settings)
    poison(checkpoint, "model")
    capsys.readouterr()
    assert tagging(*argv) == 2
    err = capsys.readouterr().err
    assert f"{RUN}: step 4 of 6: the training loss is nan" in err, err
    assert (f"not a finite number; training stopped, and no output was written. It resumed from {checkpoint} "
            f"at step 3: lower the learning rate, or delete {checkpoint} to start over") in err, err
    assert outputs(tmp_path) == [f"checkpoints/{RUN}.pt"]  # no output, no fragment


def test_an_exploding_learning_rate_stops_the_fine_tune_before_any_output(tiny_exports, bank, tmp_path,
                                                                           capsys):
    argv = train_argv(RUN, tiny_exports["bert-tiny"], tmp_path, tmp_path / "prov", bank,
                      **{**FINETUNE, "lr": 1e30, "chunk-steps": 0})
    assert tagging(*argv) == 2
    err = capsys.readouterr().err
    assert re.search(r"step \d of 6: the (training loss|gradient norm) is (nan|inf)", err), err
    assert "It started from scratch (no checkpoint): lower the learning rate or check the data" in err
    assert outputs(tmp_path) == []


def test_the_harness_names_where_a_run_came_from(tmp_path):
    class Run(harness.Loop):
        def total_steps(self):
            return 10

    saved = tmp_path / "saved.pt"
    saved.write_bytes(b"")
    fresh, started, resumed = Run(None, torch.device("cpu")), Run(saved, torch.device("cpu")), \
        Run(saved, torch.device("cpu"))
    resumed.resumed_from = resumed.step = 4
    fresh.check_finite({"loss": 1.0, "development UPOS": 93.5})  # finite: nothing happens
    for run, step, origin in (
            (fresh, 1, "It started from scratch (no checkpoint): lower the learning rate or check the data"),
            (started, 1, f"It started from scratch, and {saved} holds a step saved before this one: lower "
                         f"the learning rate, and delete {saved} to start over"),
            (resumed, 5, f"It resumed from {saved} at step 4: lower the learning rate, or delete {saved} to "
                         "start over")):
        with pytest.raises(harness.NonFiniteError) as err:
            run.check_finite({"loss": 0.5, "development UPOS": math.nan, "gradient norm": math.inf})
        assert str(err.value) == (f"train: step {step} of 10: the development UPOS is nan, the gradient "
                                  f"norm is inf, not a finite number; training stopped, and no output was "
                                  f"written. {origin}")


def test_a_nan_stops_distillation_naming_the_checkpoint_and_writes_no_student(tiny_exports, tmp_path,
                                                                             monkeypatch):
    teacher, run = tiny_exports["bert-tiny"], dict(TINY_RUN, chunk_steps=2)
    with monkeypatch.context() as patch:
        crash_before(patch, 2)
        with pytest.raises(Crash):
            _distill(teacher, tmp_path, run)
    checkpoint = tmp_path / "checkpoint.pt"
    poison(checkpoint, "student")
    shown = re.escape(str(checkpoint))
    with pytest.raises(harness.NonFiniteError, match=rf"^distill: step 3 of 6: the loss is nan, the "
                                                     rf"gradient norm is nan, .* It resumed from {shown} at "
                                                     r"step 2: "):
        _distill(teacher, tmp_path, run)
    assert not (tmp_path / "student.pt").exists()


def test_an_exploding_learning_rate_stops_the_distill_command_before_its_outputs(tiny_exports, tmp_path,
                                                                                 capsys):
    argv = distill_argv(tiny_exports["bert-tiny"], tmp_path)  # stages the corpus first
    staged = outputs(tmp_path)
    training = json.loads(argv[argv.index("--training") + 1])
    argv[argv.index("--training") + 1] = json.dumps({**training, "lr": 1e30, "chunk_steps": 0})
    assert student(*argv) == 2
    err = capsys.readouterr().err
    assert re.search(r"distill: step \d of 6: the loss is (nan|inf)", err), err
    assert "no output was written" in err
    assert outputs(tmp_path) == staged  # no student, log, plot, checkpoint or fragment

"""The frozen probe solved to convergence (full-batch L-BFGS, stopping on a plateau), and the tagging
device plumbing, checked on the CPU through the same code a GPU run takes.

The convergence tests plant the cached word vectors, so that the problem is known: its optimum is
computed a second way (scipy's L-BFGS-B in float64), or it is separable and must be solved exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.optimize
import torch
import yaml

from conftest import boot_argv
from encoder_study.core import files
from encoder_study.data import conllu, synthetic
from encoder_study.data.conllu import UPOS
from encoder_study.encoders.frozen import FrozenEncoder
from encoder_study.encoders.trainable import harness
from encoder_study.encoders.trainable.words import TrainableEncoder
from encoder_study.provenance import artefacts
from encoder_study.recipes.tagging import command
from encoder_study.recipes.tagging import train as training
from encoder_study.recipes.tagging.tagger import Tagger
from encoder_study.recipes.tagging.train import CheckpointError, TrainingError, TrainSettings, train

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"train": 60, "dev": 20, "test": 20}
BASE = {"optimizer": "lbfgs", "seed": 0, "lr": 1.0, "weight_decay": 1e-5, "epochs": 0, "max_steps": 0,
        "warmup": 0, "batch_words": 100, "eval_every": 0, "eval_batch_words": 2000, "clip": 0.0,
        "patience": 0, "threads": 1, "device": "cpu", "precision": "fp32"}


def settings_for(mode: str = "frozen", **chosen) -> TrainSettings:
    return TrainSettings(mode=mode, **{**BASE, **chosen})


@pytest.fixture(scope="module")
def sentences(tmp_path_factory) -> dict:
    paths = synthetic.write_synthetic(tmp_path_factory.mktemp("treebank"), seed=0, sizes=SIZES)
    return {split: conllu.read_conllu(path) for split, path in paths.items()}


class PlantedEncoder(FrozenEncoder):
    """A frozen encoder whose word vectors are planted, one array per document: cached features whose
    problem is known. The model files (for the run's fingerprint) are a tiny export's."""

    def __init__(self, model_dir, vectors: dict):
        super().__init__(model_dir, pooling="mean", max_length=512)
        self.planted = vectors
        self.width = next(iter(vectors.values())).shape[1]

    def __call__(self, docs):
        return [self.planted[doc].copy() for doc in docs]


def planted(sentences: dict, width: int, spread: float, noise: float, seed: int = 0) -> dict:
    """doc -> float32 [words, width]: a fixed centre per tag (normal, scaled by `spread`) plus noise."""
    rng = np.random.default_rng(seed)
    centres = spread * rng.standard_normal((len(UPOS), width))
    vectors = {}
    for split in sorted(sentences):
        for s in sentences[split]:
            tags = np.asarray([UPOS.index(t) for t in s.upos])
            noisy = centres[tags] + noise * rng.standard_normal((len(tags), width))
            vectors[s.doc()] = noisy.astype(np.float32)
    return vectors


def planted_tagger(model_dir, vectors) -> Tagger:
    return Tagger(PlantedEncoder(model_dir, vectors), seed=0)


def features(sentences, vectors) -> tuple[np.ndarray, np.ndarray]:
    x = np.concatenate([vectors[s.doc()] for s in sentences]).astype(np.float64)
    y = np.concatenate([[UPOS.index(t) for t in s.upos] for s in sentences])
    return x, y


def regularised_loss(theta: np.ndarray, x: np.ndarray, y: np.ndarray,
                     decay: float) -> tuple[float, np.ndarray]:
    """Mean cross-entropy of softmax(x W^T + b) + decay/2 (|W|^2 + |b|^2), and its gradient, in float64."""
    k, d = len(UPOS), x.shape[1]
    w, b = theta[:k * d].reshape(k, d), theta[k * d:]
    logits = x @ w.T + b
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    n = len(y)
    loss = -np.log(p[np.arange(n), y]).mean() + 0.5 * decay * (theta @ theta)
    p[np.arange(n), y] -= 1.0
    grad = np.concatenate([(p.T @ x / n).ravel(), p.mean(axis=0)]) + decay * theta
    return loss, grad


def final_head(checkpoint: Path) -> np.ndarray:
    """The head where training ended (the checkpoint's weights; the tagger holds the selected ones)."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    return np.concatenate([state["model"]["head.weight"].numpy().ravel(),
                           state["model"]["head.bias"].numpy()]).astype(np.float64)


# -- convergence ---------------------------------------------------------------------------------------


def test_lbfgs_reaches_the_optimum_scipy_finds_for_the_same_regularised_problem(tiny_exports, sentences,
                                                                              tmp_path):
    vectors = planted(sentences, width=6, spread=1.0, noise=1.0)  # overlapping tags: no separation
    decay = 1e-2
    tagger = planted_tagger(tiny_exports["bert-tiny"], vectors)
    checkpoint = tmp_path / "probe.pt"
    result = train(tagger, sentences["train"], sentences["dev"],
                   settings_for(weight_decay=decay, epochs=150), checkpoint=checkpoint)
    assert result.stopped == "maximum" and result.steps == 150

    x, y = features(sentences["train"], vectors)
    best = scipy.optimize.minimize(regularised_loss, np.zeros(len(UPOS) * 7), args=(x, y, decay), jac=True,
                                   method="L-BFGS-B",
                                   options={"gtol": 1e-12, "ftol": 1e-15, "maxiter": 10000})
    assert best.success, best.message
    ours = final_head(checkpoint)
    ours_loss, ours_grad = regularised_loss(ours, x, y, decay)
    assert ours_loss - best.fun < 1e-6, (ours_loss, best.fun)
    assert np.abs(ours_grad).max() < 1e-4
    assert np.abs(ours - best.x).max() < 2e-3  # strictly convex: one optimum, and the head is at it
    # The objective the history reports is the same function, ending at its minimum.
    assert result.history[-1]["train_loss"] == pytest.approx(best.fun, rel=1e-5)


def test_a_separable_problem_is_solved_and_training_stops_on_the_plateau(tiny_exports, sentences):
    vectors = planted(sentences, width=8, spread=3.0, noise=0.05)  # tags far apart: separable
    tagger = planted_tagger(tiny_exports["bert-tiny"], vectors)
    result = train(tagger, sentences["train"], sentences["dev"], settings_for(epochs=500, patience=4))

    assert result.stopped == "plateau"
    assert result.best_dev_upos == 100.0
    steps = [h["step"] for h in result.history]
    assert steps == list(range(1, result.steps + 1))  # eval_every 0: every iteration is scored
    first_best = next(h["step"] for h in result.history if h["dev_upos"] == 100.0)
    assert result.best_step == first_best  # ties keep the earlier step
    assert result.steps == first_best + 4  # four evaluations without a new best, then stop
    x, y = features(sentences["train"], vectors)
    with torch.no_grad():
        predicted = tagger.head(torch.from_numpy(x.astype(np.float32))).argmax(dim=-1).numpy()
    assert (predicted == y).all()


def test_selection_puts_back_the_best_step_which_a_shorter_run_ends_at(tiny_exports, sentences):
    """The selected weights are the best evaluation's: a run stopped at max_steps = that step, from the
    same start, ends with exactly those weights (and the same history up to it)."""
    model = tiny_exports["bert-tiny"]
    make = lambda: Tagger(FrozenEncoder(model, pooling="mean", max_length=512), seed=0)  # noqa: E731
    long = make()
    result = train(long, sentences["train"], sentences["dev"], settings_for(epochs=60, patience=6))
    assert result.stopped in ("plateau", "maximum")
    assert result.best_dev_upos == max(h["dev_upos"] for h in result.history)
    assert result.best_step < result.steps  # the test means something only if training went past it

    short = make()
    cut = train(short, sentences["train"], sentences["dev"], settings_for(max_steps=result.best_step))
    assert cut.stopped == "max_steps" and cut.steps == result.best_step
    assert cut.history == result.history[:result.best_step]
    assert all(torch.equal(a, b) for a, b in zip(long.trainable_state().values(),
                                                  short.trainable_state().values(), strict=True))


@pytest.mark.parametrize("every", [3, 5])
def test_an_lbfgs_run_that_crashes_and_resumes_ends_bit_for_bit_where_one_run_ends(
        tiny_exports, sentences, tmp_path, monkeypatch, every):
    make = lambda: Tagger(FrozenEncoder(tiny_exports["xlmr-tiny"], pooling="mean", max_length=512),  # noqa: E731
                          seed=0)
    settings = settings_for(epochs=40, patience=8)
    whole = make()
    one = train(whole, sentences["train"], sentences["dev"], settings)
    assert one.steps > 2 * every

    written, saved = files.write_torch, []

    def write_then_crash(path, state):
        written(path, state)
        saved.append(state["step"])
        if len(saved) == 2:
            raise RuntimeError("crash")

    checkpoint = tmp_path / "probe.pt"
    with monkeypatch.context() as patch:
        patch.setattr(files, "write_torch", write_then_crash)
        with pytest.raises(RuntimeError, match="crash"):
            train(make(), sentences["train"], sentences["dev"], settings, checkpoint=checkpoint,
                  chunk_steps=every)
    assert saved == [every, 2 * every]
    again = make()
    resumed = train(again, sentences["train"], sentences["dev"], settings, checkpoint=checkpoint,
                    chunk_steps=every)
    assert resumed.resumed_from == 2 * every
    assert (resumed.stopped, resumed.steps, resumed.best_step) == (one.stopped, one.steps, one.best_step)
    assert resumed.history == one.history
    assert all(torch.equal(a, b) for a, b in zip(whole.trainable_state().values(),
                                                  again.trainable_state().values(), strict=True))
    # The finished checkpoint resumes as the finished run, with the same reason to have stopped.
    finished = train(make(), sentences["train"], sentences["dev"], settings, checkpoint=checkpoint)
    assert finished.stopped == one.stopped and finished.steps == one.steps


def test_the_schema_defaults_are_settings_the_code_accepts():
    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    defaults = schema["properties"]["tagging"]["properties"]["defaults"]["properties"]
    fields = set(TrainSettings.__dataclass_fields__)
    built = {}
    for mode in ("frozen", "finetuned"):
        given = {k: v["default"] for k, v in defaults[mode]["properties"].items() if k in fields}
        built[mode] = TrainSettings(mode=mode, seed=0, threads=1, device="cpu", **given)
    frozen = built["frozen"]
    assert frozen.optimizer == "lbfgs" and frozen.patience > 0 and frozen.epochs > frozen.patience
    assert built["finetuned"].optimizer == "adamw" and built["finetuned"].precision == "fp32"


def test_settings_refuse_what_the_optimizer_or_mode_cannot_do():
    with pytest.raises(TrainingError, match="fine-tune takes optimizer adamw"):
        settings_for("finetuned", max_steps=1)
    with pytest.raises(TrainingError, match="takes no warmup"):
        settings_for(epochs=1, warmup=2)
    with pytest.raises(TrainingError, match="takes no clip"):
        settings_for(epochs=1, clip=1.0)
    with pytest.raises(TrainingError, match="bf16 is for the fine-tune"):
        settings_for(epochs=1, precision="bf16")
    with pytest.raises(TrainingError, match="resolve 'auto'"):
        settings_for(epochs=1, device="auto")
    with pytest.raises(TrainingError, match="patience must be 0 or more"):
        settings_for(epochs=1, patience=-1)


# -- device --------------------------------------------------------------------------------------------


def test_the_auto_device_resolves_to_this_machine_and_the_tagger_lives_there(tiny_exports, sentences):
    device = harness.resolve_device("auto").type
    assert device == ("cuda" if torch.cuda.is_available() else "cpu")
    tagger = Tagger(FrozenEncoder(tiny_exports["bert-tiny"], pooling="mean", max_length=512), seed=0)
    train(tagger, sentences["train"], sentences["dev"], settings_for(epochs=2, device=device))
    assert tagger.device.type == device
    assert tagger.word_vectors([sentences["dev"][0].doc()]).device.type == device


def test_a_checkpoint_from_another_device_is_refused_with_the_way_out(tiny_exports, sentences, tmp_path):
    """A run resumes bit for bit only on the device it started on: a GPU checkpoint on a CPU is refused
    (read onto the CPU first, so that the refusal, not a CUDA error, is what the user sees)."""
    checkpoint = tmp_path / "probe.pt"
    make = lambda: Tagger(FrozenEncoder(tiny_exports["bert-tiny"], pooling="mean", max_length=512), seed=0)  # noqa: E731
    train(make(), sentences["train"], sentences["dev"], settings_for(epochs=3), checkpoint=checkpoint)
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    state["settings"]["device"] = "cuda"  # as a GPU job writes it
    files.write_torch(checkpoint, artefacts.seal(state))  # with the SHA-256 of its new content
    with pytest.raises(CheckpointError, match=r"written by a run on cuda, and this run is on cpu.*"
                                              r"--device cuda.*delete it to start over on cpu"):
        train(make(), sentences["train"], sentences["dev"], settings_for(epochs=3), checkpoint=checkpoint)


def test_bf16_autocast_is_applied_to_the_finetune_and_repeats(tiny_exports, sentences):
    def finetune(precision: str) -> dict:
        tagger = Tagger(TrainableEncoder(tiny_exports["bert-tiny"], pooling="mean"), seed=0)
        chosen = {"optimizer": "adamw", "lr": 1e-3, "clip": 1.0, "max_steps": 2, "eval_every": 2,
                  "precision": precision}
        settings = TrainSettings(mode="finetuned", **{**BASE, **chosen})
        train(tagger, sentences["train"], sentences["dev"], settings)
        return tagger.trainable_state()

    fp32, bf16, again = finetune("fp32"), finetune("bf16"), finetune("bf16")
    assert all(torch.equal(bf16[k], again[k]) for k in bf16)
    assert any(not torch.equal(fp32[k], bf16[k]) for k in fp32)
    assert all(v.dtype == torch.float32 for v in bf16.values())  # autocast: the weights stay float32


def test_the_commands_take_a_device(capsys):
    for sub in ("train", "step-time"):
        with pytest.raises(SystemExit):
            command.parser().parse_args([sub, "--help"])
        assert "--device {auto,cpu,cuda}" in capsys.readouterr().out


def test_the_frozen_command_records_why_it_stopped_and_the_device(tiny_exports, tmp_path):
    paths = synthetic.write_synthetic(tmp_path / "treebank", seed=0, sizes=SIZES)
    out, prov = tmp_path / "probe", tmp_path / "prov" / "tagging_train-probe.md"
    argv = ["train", "--run", "probe", "--model-dir", str(tiny_exports["bert-tiny"]), "--mode", "frozen",
            "--pooling", "mean", "--task", "upos",
            *(x for split in ("train", "dev", "test") for x in (f"--{split}", str(paths[split]))),
            "--out-dir", str(out), "--checkpoint", str(tmp_path / "probe.pt"), "--chunk-steps", "0",
            "--optimizer", "lbfgs", "--seed", "0", "--lr", "1", "--weight-decay", "1e-5", "--epochs", "40",
            "--max-steps", "0", "--patience", "3", "--warmup", "0", "--batch-words", "500",
            "--eval-every", "0", "--eval-batch-words", "2000", "--clip", "0", "--threads", "1",
            "--device", "auto", "--precision", "fp32", "--max-length", "512", "--window-batch", "8",
            "--max-batch-pieces", "8192", *boot_argv(),
            "--provenance", str(prov)]
    args = command.parser().parse_args(argv)
    assert args.run(args) == 0
    record = json.loads((out / "run.json").read_text())
    assert record["stopped"] in training.STOPS and record["settings"]["device"] == "cpu"
    history = (out / "history.csv").read_text().splitlines()
    assert int(history[-1].split(",")[0]) == record["steps"]
    fragment = prov.read_text()
    assert f"stopped: {record['stopped']}" in fragment
    assert "| torch device | cpu |" in fragment and "| torch precision | fp32 |" in fragment

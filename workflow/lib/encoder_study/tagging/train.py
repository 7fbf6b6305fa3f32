"""Training a tagger, frozen or fine-tuned, resumable from checkpoints bit for bit where one run ends.

    settings = TrainSettings(mode="finetuned", seed=0, lr=5e-5, weight_decay=0.01, epochs=0,
                             max_steps=236, warmup=40, batch_words=500, eval_every=50,
                             eval_batch_words=2000, clip=1.0, threads=1)
    result = train(tagger, train_sentences, dev_sentences, settings, checkpoint="run/checkpoint.pt",
                   chunk_steps=100)   # saves every 100 steps; after a crash, the same call resumes

One loop serves both modes. A step takes the next batch of sentences, computes the cross-entropy of
the head's logits for all their words, clips the gradient norm and takes an AdamW step; every
`eval_every` steps (or at the end of every epoch when it is 0), and at the last step, the tagger
predicts the development split and the best development accuracy so far keeps a copy of its weights.
When training ends those weights are put back: the development split selects the step (the epoch,
for a frozen encoder), and the test split is left to the caller, to be scored once.

- Frozen (`Tagger` over a `FrozenEncoder`): only the head trains. The encoder runs once per document:
  the train and development documents are encoded up front, and every epoch reads the cache.
- Fine-tuned (`Tagger` over a `TrainableEncoder`): the encoder's layers and the head train together
  under one learning rate (after a linear warm-up), the token table frozen unless the encoder was
  built with `freeze_embeddings=False`.

The settings have no defaults here: the workflow's config schema holds them, per mode
(`tagging.defaults.frozen`, `tagging.defaults.finetuned`). A frozen encoder leaves a convex problem
(logistic regression on fixed vectors), which takes a larger rate and several epochs; fine-tuning
moves pretrained layers, which takes a small rate after a warm-up.

Batches: each epoch draws a permutation of the train sentences from one seeded numpy Generator and
groups sentences in that order until a batch holds `batch_words` words (`tagger.word_batches`).

Determinism: the head starts from a seeded generator, torch is seeded, the data order comes from the
Generator, deterministic algorithms are switched on while training (warn-only: CPU kernels have no
nondeterministic variants that matter here), and the thread count is part of the settings, since
reductions may add in another order on another count. The learning rate is a pure function of the
step (as in nanoGPT), so the step is the whole of the scheduler's state. A checkpoint holds the
trainable weights, AdamW's state, the torch, numpy and Python random states, the epoch's batches and
the position in them, the step, the best weights and the development history; a run resumed from it
computes exactly what the uninterrupted run computes from that step on. Writing a checkpoint changes
nothing of the state, so a run that saves every K steps and goes on computes what one that never
saves computes; a crash costs at most the steps since the last save.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .. import files
from ..data.conllu import UPOS, Sentence
from ..errors import UserError
from ..files import CheckpointError  # noqa: F401 -- what resuming raises; callers import it from here
from ..trainable.common import determinism
from .tagger import Tagger, word_batches

CHECKPOINT_FORMAT = "encoder_study.tagging.train/1"
MODES = ("frozen", "finetuned")
TAG_INDEX = {tag: i for i, tag in enumerate(UPOS)}
ENCODE_SLICE = 1024  # documents per frozen-encoder call while filling the cache (a progress unit)


class TrainingError(UserError, ValueError):
    """Settings or data training cannot run with (a config value, an empty split)."""


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """Everything besides the encoder and the data that decides the trained weights.

    Training stops after `max_steps` steps or `epochs` epochs, whichever comes first (0: no limit by
    that measure; one of them must be set). `eval_every` 0 evaluates at the end of every epoch.
    """

    mode: str
    seed: int
    lr: float
    weight_decay: float
    epochs: int
    max_steps: int
    warmup: int
    batch_words: int
    eval_every: int
    eval_batch_words: int
    clip: float
    threads: int

    def __post_init__(self):
        if self.mode not in MODES:
            raise TrainingError(f"mode must be one of {list(MODES)}, got {self.mode!r}")
        for name in ("epochs", "max_steps", "warmup", "eval_every"):
            if getattr(self, name) < 0:
                raise TrainingError(f"{name} must be 0 or more, got {getattr(self, name)}")
        for name in ("batch_words", "eval_batch_words", "threads"):
            if getattr(self, name) < 1:
                raise TrainingError(f"{name} must be positive, got {getattr(self, name)}")
        if not self.epochs and not self.max_steps:
            raise TrainingError("training needs an end: set epochs or max_steps (or both)")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise TrainingError(f"lr must be a positive number, got {self.lr}")

    def lr_at(self, step: int) -> float:
        """Learning rate of step `step` (0-based): linear warm-up over `warmup` steps, then constant."""
        if self.warmup and step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        return self.lr


@dataclasses.dataclass
class TrainResult:
    """What training did; the tagger holds the selected weights."""

    steps: int
    epochs: float              # epochs seen, fractional when the run ended inside one
    best_step: int
    best_dev_upos: float
    history: list[dict]        # step, epoch, train_loss (mean since the previous evaluation), dev_upos
    chunks: list[dict]         # first_step, last_step, seconds of each invocation that trained
    resumed_from: int | None   # the step this invocation started from, when it resumed


def data_digest(sentences: Sequence[Sentence]) -> str:
    """SHA-256 of what training reads from the sentences: ids, texts, word ranges and tags."""
    rows = [[s.sent_id, s.text, [list(r) for r in s.doc().words], list(s.upos)] for s in sentences]
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode("utf-8")).hexdigest()


def gold_ids(sentence: Sentence) -> np.ndarray:
    return np.asarray([TAG_INDEX[tag] for tag in sentence.upos], dtype=np.int64)


def train(tagger: Tagger, train_sentences: Sequence[Sentence], dev_sentences: Sequence[Sentence],
          settings: TrainSettings, checkpoint: str | os.PathLike | None = None, chunk_steps: int = 0,
          progress: bool = False, desc: str = "train") -> TrainResult:
    """Train `tagger` and leave the weights the development split selects in it.

    With `checkpoint`, an existing checkpoint there is resumed (it must come from the same settings,
    encoder and data), and the finished state is written there at the end, so a failure after training
    does not cost the training (delete the file once the outputs are safe). With `chunk_steps` K > 0,
    the state is also written there every K steps and training goes on: a crash then costs at most K
    steps, and the same call resumes. `progress` reports on stderr: a tqdm bar on a terminal, else one
    line per development evaluation (a log file reads those).
    """
    expected = "frozen" if tagger.kind == "transformer" else "finetuned"
    if settings.mode != expected:
        raise TrainingError(f"settings for mode {settings.mode!r}, but the tagger's encoder is "
                            f"{tagger.kind!r} (mode {expected!r})")
    if chunk_steps < 0:
        raise TrainingError(f"chunk_steps must be 0 or more, got {chunk_steps}")
    if chunk_steps and checkpoint is None:
        raise TrainingError("saving every chunk_steps steps needs a checkpoint path")
    with determinism(settings.threads):
        run = _Run(tagger, train_sentences, dev_sentences, settings,
                   None if checkpoint is None else Path(checkpoint))
        return run.go(chunk_steps, progress, desc)


class _Run:
    """The state of one training run: what a checkpoint saves, and the loop that advances it."""

    def __init__(self, tagger: Tagger, train_sentences, dev_sentences, settings: TrainSettings,
                 checkpoint: Path | None):
        if not train_sentences or not dev_sentences:
            raise TrainingError("training needs train and development sentences")
        self.tagger, self.settings, self.checkpoint = tagger, settings, checkpoint
        self.train_docs = [s.doc() for s in train_sentences]
        self.train_gold = [gold_ids(s) for s in train_sentences]
        self.train_lengths = [len(g) for g in self.train_gold]
        self.dev_docs = [s.doc() for s in dev_sentences]
        self.dev_gold = np.concatenate([gold_ids(s) for s in dev_sentences])
        self.fingerprint = {"kind": tagger.kind, "files": tagger.encoder_files(),
                            "pooling": tagger.encoder.pooling, "max_length": tagger.encoder.max_length,
                            "train": data_digest(train_sentences), "dev": data_digest(dev_sentences)}
        if tagger.trainable_encoder:
            self.fingerprint["embeddings_frozen"] = bool(tagger.encoder.embeddings_frozen)

        self.params = [p for p in tagger.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=settings.lr, weight_decay=settings.weight_decay)
        self.rng = np.random.default_rng(settings.seed)  # the data order, one permutation per epoch
        torch.manual_seed(settings.seed)  # nothing draws from it now; anything added later is seeded
        random.seed(settings.seed)

        self.step = 0            # steps taken
        self.epochs_done = 0     # epochs finished
        self.batches: list[list[int]] = []  # the current epoch's batches of sentence indices
        self.position = 0        # batches of the current epoch already taken
        self.best: dict | None = None  # step, dev_upos, state (a copy of the trainable weights)
        self.history: list[dict] = []
        self.loss_sum, self.loss_count = 0.0, 0
        self.chunks: list[dict] = []
        self.resumed_from = None
        if checkpoint is not None and checkpoint.exists():
            self.load(checkpoint)
            self.resumed_from = self.step

    # -- the loop --------------------------------------------------------------------------------------

    def finished(self) -> bool:
        s = self.settings
        return bool((s.max_steps and self.step >= s.max_steps) or (s.epochs and self.epochs_done >= s.epochs))

    def go(self, chunk_steps: int, progress: bool, desc: str) -> TrainResult:
        from tqdm import tqdm

        if not self.tagger.trainable_encoder:
            self.fill_cache(progress, desc)
        start, started = self.step, time.perf_counter()
        total = self.expected_steps()
        bar = tqdm(total=total, initial=self.step, desc=desc, unit="step", file=sys.stderr,
                   disable=not (progress and sys.stderr.isatty()), dynamic_ncols=True)
        try:
            while not self.finished():
                if self.position == len(self.batches):
                    self.new_epoch()
                loss = self.train_step(self.batches[self.position])
                self.step += 1
                self.position += 1
                if self.position == len(self.batches):
                    self.epochs_done += 1
                if self.evaluation_due():
                    self.evaluate()
                    if progress and bar.disable:
                        self.report(desc, total, start, started)
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}", dev=f"{self.history[-1]['dev_upos']:.2f}"
                                if self.history else "-", refresh=False)
                if chunk_steps and self.step % chunk_steps == 0 and not self.finished():
                    # A crash from here on resumes at this step; the record counts this invocation.
                    self.save(self.checkpoint, running=self.chunk_record(start, started))
        finally:
            bar.close()
        if self.step > start:
            self.chunks.append(self.chunk_record(start, started))
        if self.checkpoint is not None and self.step > start:
            self.save(self.checkpoint)  # the finished state: a crash while writing outputs costs no training
        self.tagger.load_trainable_state(self.best["state"])
        return TrainResult(steps=self.step, epochs=self.epoch_position(), best_step=self.best["step"],
                           best_dev_upos=self.best["dev_upos"], history=list(self.history),
                           chunks=list(self.chunks), resumed_from=self.resumed_from)

    def report(self, desc: str, total: int, start: int, started: float) -> None:
        """One plain line per development evaluation, for a log file: step, loss, dev score, times."""
        last = self.history[-1]
        elapsed = time.perf_counter() - started
        left = elapsed / (self.step - start) * max(total - self.step, 0)
        print(f"{desc}: step {self.step}/{total}, train loss {last['train_loss']:.4f}, dev UPOS "
              f"{last['dev_upos']:.2f}, {elapsed:.0f} s elapsed, about {left:.0f} s left", file=sys.stderr,
              flush=True)

    def fill_cache(self, progress: bool, desc: str) -> None:
        """Run the frozen encoder over every train and development document once, in fixed slices.

        Epochs then read the cache. Filling it the same way in every run (a resumed one too) keeps the
        window batches, and so the vectors, identical to the last bit.
        """
        from tqdm import tqdm

        docs = self.train_docs + self.dev_docs
        for start in tqdm(range(0, len(docs), ENCODE_SLICE), desc=f"{desc}: encode", unit="slice",
                          file=sys.stderr, disable=not (progress and sys.stderr.isatty()),
                          dynamic_ncols=True):
            self.tagger.encoder(docs[start:start + ENCODE_SLICE])

    def expected_steps(self) -> int | None:
        s = self.settings
        per_epoch = len(word_batches(self.train_lengths, range(len(self.train_lengths)), s.batch_words))
        by_epochs = s.epochs * per_epoch if s.epochs else None  # close: epochs differ by a batch at most
        return min(x for x in (s.max_steps or None, by_epochs) if x is not None)

    def new_epoch(self) -> None:
        order = self.rng.permutation(len(self.train_docs))
        self.batches = word_batches(self.train_lengths, order, self.settings.batch_words)
        self.position = 0

    def train_step(self, batch: list[int]) -> float:
        docs = [self.train_docs[i] for i in batch]
        gold = torch.from_numpy(np.concatenate([self.train_gold[i] for i in batch]))
        for group in self.optimizer.param_groups:
            group["lr"] = self.settings.lr_at(self.step)
        self.tagger.train()
        loss = F.cross_entropy(self.tagger(docs), gold)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.settings.clip:
            torch.nn.utils.clip_grad_norm_(self.params, self.settings.clip)
        self.optimizer.step()
        value = loss.item()
        self.loss_sum += value
        self.loss_count += 1
        return value

    def evaluation_due(self) -> bool:
        if self.finished():
            return True  # the last step is always scored, so the selection sees the final weights
        if self.settings.eval_every:
            return self.step % self.settings.eval_every == 0
        return self.position == len(self.batches)  # the end of an epoch

    def evaluate(self) -> None:
        predicted = np.concatenate(self.tagger.predict_ids(self.dev_docs, self.settings.eval_batch_words))
        correct = int((predicted == self.dev_gold).sum())
        dev_upos = 100.0 * correct / len(self.dev_gold)  # the formula evaluate.accuracy_interval uses
        self.history.append({"step": self.step, "epoch": self.epoch_position(),
                             "train_loss": self.loss_sum / max(self.loss_count, 1), "dev_upos": dev_upos})
        self.loss_sum, self.loss_count = 0.0, 0
        if self.best is None or dev_upos > self.best["dev_upos"]:  # a tie keeps the earlier, shorter run
            self.best = {"step": self.step, "dev_upos": dev_upos, "state": self.tagger.trainable_state()}

    def epoch_position(self) -> float:
        if not self.batches or self.position == len(self.batches):
            return float(self.epochs_done)
        return self.epochs_done + self.position / len(self.batches)

    def chunk_record(self, start: int, started: float) -> dict:
        return {"first_step": start + 1, "last_step": self.step,
                "seconds": round(time.perf_counter() - started, 3)}

    # -- checkpoints -----------------------------------------------------------------------------------

    def state(self, running: dict | None = None) -> dict:
        return {
            "format": CHECKPOINT_FORMAT,
            "settings": dataclasses.asdict(self.settings),
            "fingerprint": self.fingerprint,
            "step": self.step, "epochs_done": self.epochs_done,
            "batches": self.batches, "position": self.position,
            "model": self.tagger.trainable_state(),
            "optimizer": self.optimizer.state_dict(),
            "rng": {"torch": torch.get_rng_state(), "numpy": self.rng.bit_generator.state,
                    "python": random.getstate()},
            "best": self.best, "history": self.history,
            "loss": [self.loss_sum, self.loss_count],
            "chunks": self.chunks + ([running] if running else []),
        }

    def save(self, path: Path, running: dict | None = None) -> None:
        """Write the state; `running`: the record of the invocation still training, if it goes on."""
        files.write_torch(path, self.state(running))

    def load(self, path: Path) -> None:
        state = files.read_checkpoint(path, CHECKPOINT_FORMAT, "tagger training checkpoint")
        files.check_same_run(path, "settings", state["settings"], dataclasses.asdict(self.settings))
        files.check_same_run(path, "encoder or data", state["fingerprint"], self.fingerprint)
        self.tagger.load_trainable_state(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"]["torch"])
        self.rng.bit_generator.state = state["rng"]["numpy"]
        random.setstate(state["rng"]["python"])
        self.step, self.epochs_done = state["step"], state["epochs_done"]
        self.batches, self.position = state["batches"], state["position"]
        self.best, self.history = state["best"], state["history"]
        self.loss_sum, self.loss_count = state["loss"]
        self.chunks = state["chunks"]

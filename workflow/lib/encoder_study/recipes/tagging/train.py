"""Training a tagger, frozen or fine-tuned, resumable from checkpoints bit for bit where one run ends.

    settings = TrainSettings(mode="finetuned", optimizer="adamw", seed=0, lr=5e-5, weight_decay=0.01,
                             epochs=0, max_steps=236, warmup=40, batch_words=500, eval_every=50,
                             eval_batch_words=2000, clip=1.0, patience=0, threads=1, device="cpu",
                             precision="fp32")
    result = train(tagger, train_sentences, dev_sentences, settings, checkpoint="run/checkpoint.pt",
                   chunk_steps=100)   # saves every 100 steps; after a crash, the same call resumes

One loop serves both modes and both optimizers. Every `eval_every` steps (or at the end of every
epoch when it is 0), and at the last step, the tagger predicts the development split and the best
development accuracy so far keeps a copy of its weights (a tie keeps the earlier). When training ends
those weights are put back: the development split selects the step, and the test split is left to
the caller, to be scored once.

- `adamw` (the fine-tune; also possible for a frozen encoder): a step takes the next batch of
  sentences, computes the cross-entropy of the head's logits for all their words, clips the gradient
  norm and takes an AdamW step (decoupled weight decay; PyTorch's fused kernel, `trainable.common.adamw`)
  at a rate that warms up linearly, then stays.
- `lbfgs` (frozen encoders only): the probe is multinomial logistic regression on cached vectors, a
  convex problem, so it is solved as one: a step is one L-BFGS iteration (strong-Wolfe line search,
  `LBFGS_HISTORY` correction pairs) on the whole train split at once, minimising the mean
  cross-entropy plus `weight_decay / 2 * (|W|^2 + |b|^2)` (an L2 penalty on the head's weights and
  bias: it makes the optimum unique and finite even when the words are separable or a tag never
  occurs in train, whose bias would otherwise sink forever). A step is also an epoch (one
  pass over the data, not counting the line search's extra evaluations), `lr` scales the line
  search's first trial step (1 is L-BFGS's natural step), and there is no warm-up, clipping or batch.
  Deterministic: no sampling, one fixed order of the data.

Training stops at the first of: `max_steps` steps (`stopped` = "max_steps"), `epochs` epochs
("maximum"), or, with `patience` P > 0, P development evaluations in a row without a new best
("plateau": the development curve has stopped improving). The reason is `TrainResult.stopped`.

- Frozen (`Tagger` over a `FrozenEncoder`): only the head trains. The encoder runs once per document:
  the train and development documents are encoded up front, and every step reads the cache.
- Fine-tuned (`Tagger` over a `TrainableEncoder`): the encoder's layers and the head train together
  under one learning rate (after a linear warm-up), the token table frozen unless the encoder was
  built with `freeze_embeddings=False`. `precision` "bf16" runs forward passes under bfloat16
  autocast (weights, gradients and AdamW's state stay float32); "fp32" computes in float32 throughout.

The settings have no defaults here: the workflow's config schema holds them, per mode
(`tagging.defaults.frozen`, `tagging.defaults.finetuned`).

Batches (AdamW): each epoch draws a permutation of the train sentences from one seeded numpy
Generator and groups sentences in that order until a batch holds `batch_words` words
(`tagger.word_batches`).

The harness (`trainable.harness`) runs the loop: device, determinism, precision, chunked checkpoints,
resuming and progress; this module gives the objective and the data.

Device: `settings.device` is "cpu" or "cuda" (`harness.resolve_device(...).type` turns the command's
`auto` into one of them). The tagger's weights, the batches (or the cached train vectors), the
optimizer's state and the weights kept for selection live on it; checkpoints are read onto the CPU and
the state copied onto the device. A checkpoint records the device it was written on, and one written
on another device is refused (`files.CheckpointError`): a resumed run ends where an uninterrupted one
ends only on the same device, so a GPU checkpoint is resumed on a GPU, or deleted to start over on the
CPU.

Determinism: the head starts from a seeded generator, torch is seeded, the data order comes from the
Generator, training runs under `harness.deterministic`, and the thread count is part of the settings,
since reductions may add in another order on another count. The learning rate is a pure function of
the step (as in nanoGPT), so the step is the whole of the scheduler's state. A checkpoint holds the
trainable weights, the optimizer's state (AdamW's moments, or L-BFGS's correction pairs and last
direction), the torch (and CUDA), numpy and Python random states, the epoch's batches and the position
in them, the step, the best weights and the development history; a run resumed from it computes
exactly what the uninterrupted run computes from that step on. Writing a checkpoint changes nothing of
the state, so a run that saves every K steps and goes on computes what one that never saves computes; a
crash costs at most the steps since the last save.

Checks (`harness.Loop`): a checkpoint carries the SHA-256 of its own content and a damaged one is
refused; a training loss or gradient norm that is NaN or infinite stops the run before the step's
update, and so does a development evaluation whose score or largest trainable weight is not finite
(`harness.NonFiniteError`, naming the step and the checkpoint resumed from), before anything is saved.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import random
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ...core import files
from ...core.files import CheckpointError  # what resuming raises; callers import it from here too
from ...data.conllu import Sentence
from ...data.tasks import TASKS
from ...encoders.trainable import harness
from ...encoders.trainable.common import adamw
from ...encoders.trainable.harness import TrainingError
from .settings import MODES, OPTIMIZERS, Training
from .tagger import Tagger, word_batches

CHECKPOINT_FORMAT = "encoder_study.tagging.train/2"
STOPS = ("plateau", "maximum", "max_steps")  # TrainResult.stopped
LBFGS_HISTORY = 20       # correction pairs L-BFGS keeps (torch's default is 100; 20 is ample for 17 x width)
LBFGS_LINE_SEARCH = 25   # function evaluations one strong-Wolfe line search may take
ENCODE_SLICE = 1024  # documents per frozen-encoder call while filling the cache (a progress unit)


@dataclasses.dataclass(frozen=True)
class TrainSettings(Training):
    """Everything besides the encoder and the data that decides the trained weights (the fields are
    `settings.Training`'s, spelled there once), with the device resolved and the values checked.

    Training stops after `max_steps` steps or `epochs` epochs, whichever comes first (0: no limit by
    that measure; one of them must be set), or earlier after `patience` development evaluations without
    a new best (0: never). `eval_every` 0 evaluates at the end of every epoch (for L-BFGS: every step).
    `device` is "cpu" or "cuda" (`resolve_device` resolves "auto").
    """

    def __post_init__(self):
        for name, allowed in (("mode", MODES), ("optimizer", OPTIMIZERS), ("device", harness.DEVICES),
                              ("precision", harness.PRECISIONS)):
            if getattr(self, name) not in allowed:
                hint = " (resolve 'auto' with resolve_device first)" if name == "device" else ""
                raise TrainingError(f"{name} must be one of {list(allowed)}, got "
                                    f"{getattr(self, name)!r}{hint}")
        if self.optimizer == "lbfgs":
            if self.mode != "frozen":
                raise TrainingError("optimizer lbfgs solves the frozen probe on its cached vectors, all at "
                                    "once; a fine-tune takes optimizer adamw")
            for name in ("warmup", "clip"):
                if getattr(self, name):
                    raise TrainingError(f"optimizer lbfgs takes no {name} (a line search sets each step): "
                                        f"set {name} to 0, got {getattr(self, name)}")
        if self.precision == "bf16" and self.mode != "finetuned":
            raise TrainingError("precision bf16 is for the fine-tune; the frozen probe trains in fp32")
        for name in ("epochs", "max_steps", "warmup", "eval_every", "patience"):
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

    stopped: str               # why training stopped: one of STOPS
    steps: int
    epochs: float              # epochs seen, fractional when the run ended inside one
    best_step: int
    best_dev_upos: float
    history: list[dict]        # step, epoch, train_loss (mean since the previous evaluation), dev_upos
    chunks: list[dict]         # first_step, last_step, seconds of each invocation that trained
    resumed_from: int | None   # the step this invocation started from, when it resumed


def settled(settings: TrainSettings):
    """`harness.deterministic` for the settings' device and thread count (training and its predictions)."""
    return harness.deterministic(settings.device, settings.threads)


def autocast(settings: TrainSettings):
    """`harness.autocast` for the settings' device and precision (training and its predictions)."""
    return harness.autocast(settings.device, settings.precision)


def data_digest(sentences: Sequence[Sentence], task: str = "upos") -> str:
    """SHA-256 of what training reads from the sentences: ids, texts, word ranges and the task's tags."""
    rows = [[s.sent_id, s.text, [list(r) for r in s.doc().words], list(s.tags(task))] for s in sentences]
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode("utf-8")).hexdigest()


def gold_ids(sentence: Sentence, tagger: Tagger) -> np.ndarray:
    """The sentence's tags for the tagger's task as its tag ids; -1 for a tag it cannot predict (a
    development XPOS tag train never had), which then counts as an error."""
    index = tagger.tag_index
    return np.asarray([index.get(tag, -1) for tag in sentence.tags(tagger.task)], dtype=np.int64)


def train(tagger: Tagger, train_sentences: Sequence[Sentence], dev_sentences: Sequence[Sentence],
          settings: TrainSettings, checkpoint: str | os.PathLike | None = None, chunk_steps: int = 0,
          progress: bool = False, desc: str = "train") -> TrainResult:
    """Train `tagger` and leave the weights the development split selects in it.

    With `checkpoint`, an existing checkpoint there is resumed (it must come from the same settings,
    encoder and data), and the finished state is written there at the end, so a failure after training
    does not cost the training (delete the file once the outputs are safe). With `chunk_steps` K > 0,
    the state is also written there every K steps and training goes on: a crash then costs at most K
    steps, and the same call resumes. `progress` reports on stderr: a tqdm bar on a terminal, else one
    line per development evaluation (a log file reads those). The tagger is moved to
    `settings.device` and left there.
    """
    expected = "frozen" if tagger.kind == "transformer" else "finetuned"
    if settings.mode != expected:
        raise TrainingError(f"settings for mode {settings.mode!r}, but the tagger's encoder is "
                            f"{tagger.kind!r} (mode {expected!r})")
    if chunk_steps < 0:
        raise TrainingError(f"chunk_steps must be 0 or more, got {chunk_steps}")
    if chunk_steps and checkpoint is None:
        raise TrainingError("saving every chunk_steps steps needs a checkpoint path")
    with settled(settings):
        harness.check_precision(settings.precision, settings.device)
        tagger.to(settings.device)  # before the optimizer holds the parameters
        run = _Run(tagger, train_sentences, dev_sentences, settings,
                   None if checkpoint is None else Path(checkpoint))
        return run.go(chunk_steps, progress, desc)


class _Run(harness.Loop):
    """The state of one training run: what a checkpoint saves, and the step that advances it."""

    FORMAT = CHECKPOINT_FORMAT
    WHAT = "tagger training checkpoint"

    def __init__(self, tagger: Tagger, train_sentences, dev_sentences, settings: TrainSettings,
                 checkpoint: Path | None):
        if not train_sentences or not dev_sentences:
            raise TrainingError("training needs train and development sentences")
        super().__init__(checkpoint, torch.device(settings.device))
        self.tagger, self.settings = tagger, settings
        self.train_docs = [s.doc() for s in train_sentences]
        self.train_gold = [gold_ids(s, tagger) for s in train_sentences]
        if any((g < 0).any() for g in self.train_gold):
            raise TrainingError(f"a train tag is not among the tagger's {len(tagger.tags)} tags; a tagger "
                                "for this task takes its tags from the train split (data.tasks.tag_set)")
        self.train_lengths = [len(g) for g in self.train_gold]
        self.dev_docs = [s.doc() for s in dev_sentences]
        self.dev_gold = np.concatenate([gold_ids(s, tagger) for s in dev_sentences])
        self.fingerprint = {"kind": tagger.kind, "files": tagger.encoder_files(),
                            "pooling": tagger.encoder.pooling, "max_length": tagger.encoder.max_length,
                            "train": data_digest(train_sentences, tagger.task),
                            "dev": data_digest(dev_sentences, tagger.task)}
        if tagger.trainable_encoder:
            self.fingerprint["embeddings_frozen"] = bool(tagger.encoder.embeddings_frozen)

        self.params = [p for p in tagger.parameters() if p.requires_grad]
        self.lbfgs = settings.optimizer == "lbfgs"
        if self.lbfgs:
            # One iteration per call, so that a step is an iteration (evaluations, checkpoints and
            # limits count them); the line search may evaluate the objective up to LBFGS_LINE_SEARCH times.
            self.optimizer = torch.optim.LBFGS(self.params, lr=settings.lr, max_iter=1,
                                               max_eval=1 + LBFGS_LINE_SEARCH, history_size=LBFGS_HISTORY,
                                               line_search_fn="strong_wolfe")
        else:
            self.optimizer = adamw(self.params, settings.lr, settings.weight_decay)  # what step time times
        self.features: torch.Tensor | None = None  # L-BFGS: the train words' vectors, on the device
        self.targets: torch.Tensor | None = None
        self.rng = np.random.default_rng(settings.seed)  # the data order, one permutation per epoch
        torch.manual_seed(settings.seed)  # nothing draws from it now; anything added later is seeded
        random.seed(settings.seed)

        self.epochs_done = 0     # epochs finished
        self.batches: list[list[int]] = []  # the current epoch's batches of sentence indices
        self.position = 0        # batches of the current epoch already taken
        self.best: dict | None = None  # step, dev_upos, state (a copy of the trainable weights)
        self.history: list[dict] = []
        self.loss_sum, self.loss_count = 0.0, 0
        self.resume()

    # -- the loop --------------------------------------------------------------------------------------

    def limit_reached(self) -> str | None:
        """"max_steps" or "maximum" (epochs) when a limit set in advance is reached, else None."""
        s = self.settings
        if s.max_steps and self.step >= s.max_steps:
            return "max_steps"
        if s.epochs and self.epochs_done >= s.epochs:
            return "maximum"
        return None

    def evaluations_since_best(self) -> int:
        if self.best is None:
            return 0
        return sum(1 for h in self.history if h["step"] > self.best["step"])

    def stop_reason(self) -> str | None:
        """Why training stops now (one of STOPS), or None while it goes on."""
        limit = self.limit_reached()
        if limit is not None:
            return limit
        if self.settings.patience and self.evaluations_since_best() >= self.settings.patience:
            return "plateau"
        return None

    def finished(self) -> bool:
        return self.stop_reason() is not None

    def go(self, chunk_steps: int, progress: bool, desc: str) -> TrainResult:
        if not self.tagger.trainable_encoder:
            self.fill_cache(progress, desc)
        if self.lbfgs:
            self.features = self.tagger.word_vectors(self.train_docs)  # from the cache, on the device
            self.targets = torch.from_numpy(np.concatenate(self.train_gold)).to(self.device)
        self.train(chunk_steps, progress, desc)
        self.tagger.load_trainable_state(self.best["state"])
        return TrainResult(stopped=self.stop_reason(), steps=self.step, epochs=self.epoch_position(),
                           best_step=self.best["step"],
                           best_dev_upos=self.best["dev_upos"], history=list(self.history),
                           chunks=list(self.chunks), resumed_from=self.resumed_from)

    def train_step(self) -> None:
        """One step (an L-BFGS iteration, or an AdamW step on the next batch), then the development
        evaluation when one is due."""
        if self.lbfgs:
            self.lbfgs_step()
            self.step += 1
            self.epochs_done += 1  # one pass over the whole train split
        else:
            if self.position == len(self.batches):
                self.new_epoch()
            self.adamw_step(self.batches[self.position])
            self.step += 1
            self.position += 1
            if self.position == len(self.batches):
                self.epochs_done += 1
        if self.evaluation_due():
            self.evaluate()

    def report(self) -> str | None:
        """The development evaluation this step made, for the progress line; None if it made none."""
        if not self.history or self.history[-1]["step"] != self.step:
            return None
        last = self.history[-1]
        # (the history's key is dev_upos whatever the task: history.csv's column, as before tasks)
        label = TASKS[self.tagger.task].label
        return f"train loss {last['train_loss']:.4f}, dev {label} {last['dev_upos']:.2f}"

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

    def total_steps(self) -> int:
        s = self.settings
        if self.lbfgs:
            return min(x for x in (s.max_steps, s.epochs) if x)
        per_epoch = len(word_batches(self.train_lengths, range(len(self.train_lengths)), s.batch_words))
        by_epochs = s.epochs * per_epoch if s.epochs else None  # close: epochs differ by a batch at most
        return min(x for x in (s.max_steps or None, by_epochs) if x is not None)

    def new_epoch(self) -> None:
        order = self.rng.permutation(len(self.train_docs))
        self.batches = word_batches(self.train_lengths, order, self.settings.batch_words)
        self.position = 0

    def adamw_step(self, batch: list[int]) -> None:
        """One AdamW step on one batch."""
        docs = [self.train_docs[i] for i in batch]
        gold = torch.from_numpy(np.concatenate([self.train_gold[i] for i in batch])).to(self.device)
        for group in self.optimizer.param_groups:
            group["lr"] = self.settings.lr_at(self.step)
        self.tagger.train()
        with autocast(self.settings):
            loss = F.cross_entropy(self.tagger(docs), gold)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = harness.gradient_norm(self.params, self.settings.clip)
        value = loss.item()
        self.check_finite({"training loss": value, "gradient norm": norm})  # before the update
        self.optimizer.step()
        self.loss_sum += value
        self.loss_count += 1

    def objective(self) -> torch.Tensor:
        """L-BFGS's closure: mean cross-entropy on all train words + weight_decay/2 |head|^2 (weight and
        bias), with gradients."""
        self.optimizer.zero_grad(set_to_none=True)
        head = self.tagger.head
        loss = F.cross_entropy(head(self.features), self.targets)
        if self.settings.weight_decay:
            penalty = head.weight.square().sum() + head.bias.square().sum()
            loss = loss + 0.5 * self.settings.weight_decay * penalty
        loss.backward()
        return loss.detach()  # L-BFGS reads its value only

    def lbfgs_step(self) -> None:
        """One L-BFGS iteration; the loss counted is the objective where it started."""
        self.tagger.train()
        value = float(self.optimizer.step(self.objective))
        self.check_finite({"training loss": value})  # where this iteration started
        self.loss_sum += value
        self.loss_count += 1

    def evaluation_due(self) -> bool:
        if self.limit_reached():
            return True  # the last step is always scored, so the selection sees the final weights
        if self.settings.eval_every:
            return self.step % self.settings.eval_every == 0
        return self.position == len(self.batches)  # the end of an epoch

    def evaluate(self) -> None:
        with autocast(self.settings):
            predicted = np.concatenate(self.tagger.predict_ids(self.dev_docs, self.settings.eval_batch_words))
        correct = int((predicted == self.dev_gold).sum())
        dev_upos = 100.0 * correct / len(self.dev_gold)  # the formula evaluate.accuracy_interval uses
        # A weight that is not finite predicts some tag for every word: a score, but not one to select.
        largest = torch.stack([p.detach().abs().amax() for p in self.params]).amax().item()
        self.check_finite({f"development {TASKS[self.tagger.task].label}": dev_upos,
                           "largest trainable weight": largest}, step=self.step)
        self.history.append({"step": self.step, "epoch": self.epoch_position(),
                             "train_loss": self.loss_sum / max(self.loss_count, 1), "dev_upos": dev_upos})
        self.loss_sum, self.loss_count = 0.0, 0
        if self.best is None or dev_upos > self.best["dev_upos"]:  # a tie keeps the earlier, shorter run
            self.best = {"step": self.step, "dev_upos": dev_upos, "state": self.tagger.trainable_state()}

    def epoch_position(self) -> float:
        if not self.batches or self.position == len(self.batches):
            return float(self.epochs_done)
        return self.epochs_done + self.position / len(self.batches)

    # -- checkpoints -----------------------------------------------------------------------------------

    def state(self) -> dict:
        return {
            "settings": dataclasses.asdict(self.settings),
            "fingerprint": self.fingerprint,
            "epochs_done": self.epochs_done,
            "batches": self.batches, "position": self.position,
            "model": self.tagger.trainable_state(),
            "optimizer": self.optimizer.state_dict(),
            "rng": {**harness.rng_state(self.device), "numpy": self.rng.bit_generator.state},
            "best": self.best, "history": self.history,
            "loss": [self.loss_sum, self.loss_count],
        }

    def restore(self, state: dict) -> None:
        path = self.checkpoint
        then, now = state["settings"].get("device"), self.settings.device
        if then != now:
            raise CheckpointError(f"{path} was written by a run on {then}, and this run is on {now}: a "
                                  "resumed run ends where an uninterrupted one ends only on the device it "
                                  f"started on. Resume it with --device {then} (on a machine that has "
                                  f"one), or delete it to start over on {now}")
        files.check_same_run(path, "settings", state["settings"], dataclasses.asdict(self.settings))
        files.check_same_run(path, "encoder or data", state["fingerprint"], self.fingerprint)
        self.tagger.load_trainable_state(state["model"])  # copied onto the device
        self.optimizer.load_state_dict(state["optimizer"])  # its tensors cast onto the parameters' device
        harness.set_rng_state(state["rng"], self.device)
        self.rng.bit_generator.state = state["rng"]["numpy"]
        self.epochs_done = state["epochs_done"]
        self.batches, self.position = state["batches"], state["position"]
        self.best, self.history = state["best"], state["history"]
        self.loss_sum, self.loss_count = state["loss"]

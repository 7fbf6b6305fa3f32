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

Device: `settings.device` is "cpu" or "cuda" (`resolve_device` turns the command's `auto` into one of
them). The tagger's weights, the batches (or the cached train vectors), the optimizer's state and the
weights kept for selection live on it; checkpoints are read onto the CPU and the state copied onto
the device. A checkpoint records the device it was written on, and one written on another device is
refused (`files.CheckpointError`): a resumed run ends where an uninterrupted one ends only on the same
device, so a GPU checkpoint is resumed on a GPU, or deleted to start over on the CPU.

Determinism: the head starts from a seeded generator, torch is seeded, the data order comes from the
Generator, deterministic algorithms are switched on while training (warn-only on the CPU, whose
kernels have no nondeterministic variants that matter here; strict on CUDA, with
CUBLAS_WORKSPACE_CONFIG set before CUDA starts, so that an operation without a deterministic kernel
fails instead of drifting), and the thread count is part of the settings, since reductions may add in
another order on another count. The learning rate is a pure function of the step (as in nanoGPT), so
the step is the whole of the scheduler's state. A checkpoint holds the trainable weights, the
optimizer's state (AdamW's moments, or L-BFGS's correction pairs and last direction), the torch (and
CUDA), numpy and Python random states, the epoch's batches and the position in them, the step, the
best weights and the development history; a run resumed from it computes exactly what the
uninterrupted run computes from that step on. Writing a checkpoint changes nothing of the state, so a
run that saves every K steps and goes on computes what one that never saves computes; a crash costs at
most the steps since the last save.
"""

from __future__ import annotations

import contextlib
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
from ..files import CheckpointError  # what resuming raises; callers import it from here too
from ..trainable.common import adamw, clip_gradients, determinism
from .tagger import Tagger, word_batches

CHECKPOINT_FORMAT = "encoder_study.tagging.train/2"
MODES = ("frozen", "finetuned")
OPTIMIZERS = ("adamw", "lbfgs")
DEVICES = ("cpu", "cuda")
PRECISIONS = ("fp32", "bf16")
STOPS = ("plateau", "maximum", "max_steps")  # TrainResult.stopped
LBFGS_HISTORY = 20       # correction pairs L-BFGS keeps (torch's default is 100; 20 is ample for 17 x width)
LBFGS_LINE_SEARCH = 25   # function evaluations one strong-Wolfe line search may take
# cuBLAS picks reduction orders by workspace; a fixed one makes its results repeat (the PyTorch notes on
# reproducibility). ":16:8" is the other documented choice.
CUBLAS_WORKSPACE = ":4096:8"
CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")
TAG_INDEX = {tag: i for i, tag in enumerate(UPOS)}
ENCODE_SLICE = 1024  # documents per frozen-encoder call while filling the cache (a progress unit)


class TrainingError(UserError, ValueError):
    """Settings or data training cannot run with (a config value, an empty split)."""


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """Everything besides the encoder and the data that decides the trained weights.

    Training stops after `max_steps` steps or `epochs` epochs, whichever comes first (0: no limit by
    that measure; one of them must be set), or earlier after `patience` development evaluations without
    a new best (0: never). `eval_every` 0 evaluates at the end of every epoch (for L-BFGS: every step).
    `device` is "cpu" or "cuda" (`resolve_device` resolves "auto").
    """

    mode: str
    optimizer: str
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
    patience: int
    threads: int
    device: str
    precision: str

    def __post_init__(self):
        for name, allowed in (("mode", MODES), ("optimizer", OPTIMIZERS), ("device", DEVICES),
                              ("precision", PRECISIONS)):
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


def resolve_device(name: str) -> str:
    """"cpu" or "cuda" for `--device auto|cpu|cuda`: auto is CUDA when torch sees a GPU.

    Before CUDA starts, CUBLAS_WORKSPACE_CONFIG is set (unless the environment sets a deterministic
    value already): cuBLAS reads it once, when its first handle is made.
    """
    if name not in ("auto", *DEVICES):
        raise TrainingError(f"device must be auto, cpu or cuda, got {name!r}")
    if name == "cpu":
        return "cpu"
    workspace = os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    if not torch.cuda.is_available():
        if name == "cuda":
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA (a CPU build)"
            raise TrainingError(f"--device cuda, but torch {torch.__version__} (built with {build}) sees no "
                                "GPU: run on a GPU node, install the CUDA build of torch, or use --device "
                                "auto or cpu")
        return "cpu"
    if workspace not in CUBLAS_DETERMINISTIC:
        raise TrainingError(f"CUBLAS_WORKSPACE_CONFIG is {workspace!r}, which makes cuBLAS "
                            f"nondeterministic: unset it or set it to {CUBLAS_WORKSPACE}")
    return "cuda"


def describe_device(device: str) -> str:
    """The torch device a run computes on, for provenance: "cpu", or "cuda:<i>: <GPU name> (compute
    capability, CUDA version)". (The driver and the machine's GPUs are in every fragment's device facts.)"""
    if device != "cuda":
        return "cpu"
    index = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    return (f"cuda:{index}: {torch.cuda.get_device_name(index)} (compute capability {major}.{minor}, "
            f"CUDA {torch.version.cuda})")


@contextlib.contextmanager
def settled(settings: TrainSettings):
    """Deterministic algorithms and the thread count for the block (`determinism`), and on CUDA strict
    deterministic algorithms (an operation without a deterministic kernel raises) and no cuDNN
    autotuning; restored after."""
    with determinism(settings.threads):
        if settings.device != "cuda":
            yield
            return
        warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
        benchmark = torch.backends.cudnn.benchmark
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(True, warn_only=warn_only)
            torch.backends.cudnn.benchmark = benchmark


def autocast(settings: TrainSettings):
    """bfloat16 autocast for precision bf16 (forward passes: training and predictions); else nothing."""
    if settings.precision == "bf16":
        return torch.autocast(device_type=settings.device, dtype=torch.bfloat16)
    return contextlib.nullcontext()


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
        tagger.to(settings.device)  # before the optimizer holds the parameters
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

        self.device = torch.device(settings.device)
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

    def go(self, chunk_steps: int, progress: bool, desc: str) -> TrainResult:
        from tqdm import tqdm

        if not self.tagger.trainable_encoder:
            self.fill_cache(progress, desc)
        if self.lbfgs:
            self.features = self.tagger.word_vectors(self.train_docs)  # from the cache, on the device
            self.targets = torch.from_numpy(np.concatenate(self.train_gold)).to(self.device)
        start, started = self.step, time.perf_counter()
        total = self.expected_steps()
        bar = tqdm(total=total, initial=self.step, desc=desc, unit="step", file=sys.stderr,
                   disable=not (progress and sys.stderr.isatty()), dynamic_ncols=True)
        try:
            while self.stop_reason() is None:
                if self.lbfgs:
                    loss = self.lbfgs_step()
                    self.step += 1
                    self.epochs_done += 1  # one pass over the whole train split
                else:
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
                if chunk_steps and self.step % chunk_steps == 0 and self.stop_reason() is None:
                    # A crash from here on resumes at this step; the record counts this invocation.
                    self.save(self.checkpoint, running=self.chunk_record(start, started))
        finally:
            bar.close()
        if self.step > start:
            self.chunks.append(self.chunk_record(start, started))
        if self.checkpoint is not None and self.step > start:
            self.save(self.checkpoint)  # the finished state: a crash while writing outputs costs no training
        self.tagger.load_trainable_state(self.best["state"])
        return TrainResult(stopped=self.stop_reason(), steps=self.step, epochs=self.epoch_position(),
                           best_step=self.best["step"],
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
        if self.lbfgs:
            return min(x for x in (s.max_steps, s.epochs) if x)
        per_epoch = len(word_batches(self.train_lengths, range(len(self.train_lengths)), s.batch_words))
        by_epochs = s.epochs * per_epoch if s.epochs else None  # close: epochs differ by a batch at most
        return min(x for x in (s.max_steps or None, by_epochs) if x is not None)

    def new_epoch(self) -> None:
        order = self.rng.permutation(len(self.train_docs))
        self.batches = word_batches(self.train_lengths, order, self.settings.batch_words)
        self.position = 0

    def train_step(self, batch: list[int]) -> float:
        """One AdamW step on one batch; the batch's mean loss."""
        docs = [self.train_docs[i] for i in batch]
        gold = torch.from_numpy(np.concatenate([self.train_gold[i] for i in batch])).to(self.device)
        for group in self.optimizer.param_groups:
            group["lr"] = self.settings.lr_at(self.step)
        self.tagger.train()
        with autocast(self.settings):
            loss = F.cross_entropy(self.tagger(docs), gold)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.settings.clip:
            clip_gradients(self.params, self.settings.clip)
        self.optimizer.step()
        value = loss.item()
        self.loss_sum += value
        self.loss_count += 1
        return value

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

    def lbfgs_step(self) -> float:
        """One L-BFGS iteration; the objective where it started."""
        self.tagger.train()
        value = float(self.optimizer.step(self.objective))
        self.loss_sum += value
        self.loss_count += 1
        return value

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
                    "python": random.getstate(), **self.cuda_rng()},
            "best": self.best, "history": self.history,
            "loss": [self.loss_sum, self.loss_count],
            "chunks": self.chunks + ([running] if running else []),
        }

    def cuda_rng(self) -> dict:
        """The CUDA generator's state on a GPU (nothing draws from it today; anything added later resumes)."""
        return {"cuda": torch.cuda.get_rng_state(self.device)} if self.device.type == "cuda" else {}

    def save(self, path: Path, running: dict | None = None) -> None:
        """Write the state; `running`: the record of the invocation still training, if it goes on."""
        files.write_torch(path, self.state(running))

    def load(self, path: Path) -> None:
        state = files.read_checkpoint(path, CHECKPOINT_FORMAT, "tagger training checkpoint")
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
        torch.set_rng_state(state["rng"]["torch"])
        if "cuda" in state["rng"]:
            torch.cuda.set_rng_state(state["rng"]["cuda"], self.device)
        self.rng.bit_generator.state = state["rng"]["numpy"]
        random.setstate(state["rng"]["python"])
        self.step, self.epochs_done = state["step"], state["epochs_done"]
        self.batches, self.position = state["batches"], state["position"]
        self.best, self.history = state["best"], state["history"]
        self.loss_sum, self.loss_count = state["loss"]
        self.chunks = state["chunks"]

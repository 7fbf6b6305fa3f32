"""Distilling the student from a trainable teacher, in resumable chunks, on one process or many.

    rows = distill("results/models/minilm", documents, {"layers": 3, ...}, {"steps": 300, ...},
                   checkpoint_path="results/checkpoints/student/distill.pt",
                   out_path="results/student/student.pt", amounts=None, device="auto", precision="fp32",
                   progress=True)

A step draws global batch `step` of windows from the corpus (a pure function of the seed and the
step, see `data`), runs the teacher on it without gradients (`Encoder.hidden_states`: one code path
for every family), runs the student, and takes an AdamW step on the objective (`objective`) with the
gradient norm clipped; an exponential moving average of the student's weights follows, and the
student written at the end is that average.

Learning rate: linear warm-up over `warmup` steps, then linear or cosine decay to
`lr * min_lr_ratio` at the end. It is a pure function of the step (as in nanoGPT), so the step is the
whole of the scheduler's state and the data position at once.

Data parallelism (`torchrun`, or any launcher that sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT): every rank draws the same global batch and takes windows rank, rank + world, ...; each
rank's loss divides its per-token sums by the global batch's token count, so the ranks' losses add
up to the loss of the whole batch, and so do their gradients. The gradients are summed across ranks
by one explicit all_reduce (SUM) of a flat buffer, no DDP wrapper: DDP averages (divides by the world
size), which would need the loss scaled by the world size to undo, and buckets gradients in an order
of its own. Every rank then clips and steps on the identical sum, so the weights stay identical
without broadcasts. Against one process over the whole batch, only float addition order differs
(each rank's matrix products sum over its own tokens, then the ranks' sums are added), so the weights
agree to rounding (tests/test_student_distill.py measures it). Only rank 0 writes checkpoints and outputs.
Backend: NCCL on CUDA, gloo on CPU.

The harness (`trainable.harness`) runs the loop: device, determinism, precision, chunked checkpoints,
resuming and progress; this module gives the objective and the data.

Device (`harness.resolve_device`): "auto" is the rank's GPU when torch sees one, else the CPU; "cuda"
refuses to start without one. On CUDA the run is deterministic (`harness.deterministic`): a fixed cuBLAS
workspace set before CUDA starts, strict deterministic algorithms, cuDNN deterministic and not
benchmarking, no TF32 matrix products. The device type is part of the run's identity: a checkpoint
written on a GPU resumes on a GPU and is refused, naming the change, on a CPU (the numbers of the two
differ in their last bits, so a resumed run would not end where either ends).

Precision: "fp32", or "bf16" autocast for the teacher's and the student's forward passes and the
objective (weights, gradients, AdamW, the EMA and the feature statistics stay float32). Part of the
run's identity, off by default; the parity tables measure the float32 student whatever trained it.

Progress: with `progress`, rank 0 reports each log row on stderr (`harness.Progress`: step, loss and
terms, learning rate, elapsed time, an estimate of the time left from this call's steps per second).

Optimizer: `trainable.common.adamw` with weight decay on matrices only, in PyTorch's default
implementation rather than the fused kernel tagging uses (the fused one moves the weights in their last
bits, and the student keeps the weights it has always been distilled to); the gradient norm clipped by
`trainable.common.clip_gradients` (torch's clip, bit for bit).

Chunks: with `chunk_steps` K > 0 the run saves its checkpoint every K steps and goes on in the same
call from what it saved (`harness.Loop`, chunks "save"); it saves once more at the end, before the
student is written, so a failure while writing costs no training. A call that finds a checkpoint
resumes from it: after a crash or a walltime kill, running the same command again (Snakemake's
`retries`) loses at most K steps. A checkpoint holds the student, the maps and the feature statistics,
AdamW's state, the EMA, the RNG states, the step and the log rows, and refuses to resume a run with
other settings, teacher, corpus, world size or thread count (each changes the result in its last bits
or more). A run resumed from it computes bit for bit what the uninterrupted run computes. The caller
removes the checkpoint once it has what it needs (`encoder-study student distill` does, after its last
output).

Checks: the checkpoint and the student each carry the SHA-256 of their own content (`artefacts`), and
a damaged one is refused naming the file ("delete it to start over"; for the student, the command that
rebuilds it). A loss or gradient norm that is NaN or infinite stops the run before the
step's update (`harness.NonFiniteError`, naming the step and the checkpoint it resumed from), so no
student is written.

Training config keys (`TrainingConfig`, defaults sized for the embedded default: the MiniLM teacher
6 x 384, a 3 x 192 student, windows of 32 and 64 pieces, a few minutes on 2 CPU cores):

    steps           300      optimizer steps
    batch_windows   16       windows per global batch (split across ranks; at least the world size)
    window_lengths  [32, 64] window lengths in ids, specials included; one drawn per batch
    lr              1e-3     peak learning rate (AdamW, betas 0.9 / 0.999)
    warmup          30       linear warm-up steps
    schedule        linear   decay after the warm-up: linear or cosine
    min_lr_ratio    0.0      the learning rate at the end, as a fraction of lr
    weight_decay    0.01     on matrices (linear weights, the token table, positions), not on biases or norms
    clip            1.0      gradient-norm clip (0: none)
    ema_decay       0.99     the weights' moving average: decay min(ema_decay, (1+n)/(10+n)) at update n
    log_every       10       steps per log row (and the last step)
    chunk_steps     0        steps between checkpoints (0: only at the end); not part of the run's identity
    seed            0        student and maps initialisation, and every batch
    layer_map       null     teacher state per student layer (null: uniform, see objective.layer_map)
    hidden_weight   1.0      weight of the intermediate-layer MSE (mean over those layers)
    final_weight    1.0      weight of the last layer's MSE against the standardised final state
    cosine_weight   1.0      weight of the last layer's 1 - cosine
    stats_windows   64       windows of the fixed sample the final state's feature statistics come from
    language_power  0.5      language weights proportional to amount ** power (0.5: square root)
    pca_init        true     start the token table from the teacher's, reduced by principal components
    threads         0        torch threads (0: leave as set); part of the run's identity
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import random
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from ... import provenance
from ...core import files, plots, tables
from ...core.files import CheckpointError  # noqa: F401 -- what resuming raises; callers import it from here
from ...encoders import trainable
from ...encoders.tokens import PieceTokenizer
from ...encoders.trainable import harness
from ...encoders.trainable.common import adamw
from ...encoders.trainable.postnorm import PostNormEncoder, PostNormSettings
from ...provenance import artefacts
from . import StudentError, architecture
from .data import STATS_STREAM, Corpus, Document
from .objective import TERMS, FeatureStats, Objective, layer_map

CHECKPOINT_FORMAT = "encoder_study.distill.train/1"  # a stable format id (files written before the rename)
# Named after the architecture module as it was called when the format was made (now `architecture`);
# kept, because the name is inside every student.pt and `load_student` checks it.
STUDENT_FORMAT = "encoder_study.distill.student/1"  # a stable format id
LOG_COLUMNS = ("step", "loss", *TERMS, "lr", "tokens")
PCA_ROWS = 16384  # rows of the teacher table per float64 slice: mmBERT's whole table would take 1.6 GB
SCHEDULES = ("linear", "cosine")


@dataclass(frozen=True)
class TrainingConfig:
    """Everything besides the teacher, the corpus and the student's shape that decides the student.

    See the module's docstring for what each key means.
    """

    steps: int = 300
    batch_windows: int = 16
    window_lengths: tuple[int, ...] = (32, 64)
    lr: float = 1e-3
    warmup: int = 30
    schedule: str = "linear"
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.01
    clip: float = 1.0
    ema_decay: float = 0.99
    log_every: int = 10
    chunk_steps: int = 0
    seed: int = 0
    layer_map: tuple[int, ...] | None = None
    hidden_weight: float = 1.0
    final_weight: float = 1.0
    cosine_weight: float = 1.0
    stats_windows: int = 64
    language_power: float = 0.5
    pca_init: bool = True
    threads: int = 0

    @classmethod
    def from_dict(cls, values: Mapping | TrainingConfig | None) -> TrainingConfig:
        """The defaults with `values` over them; unknown keys raise StudentError naming them."""
        if isinstance(values, TrainingConfig):
            return values
        values = dict(values or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise StudentError(f"training config: unknown keys {unknown}; the keys are {sorted(known)}")
        for name in ("window_lengths", "layer_map"):
            if values.get(name) is not None:
                values[name] = tuple(int(v) for v in values[name])
        return cls(**values)

    def __post_init__(self):
        for name in ("steps", "batch_windows", "log_every", "stats_windows"):
            if getattr(self, name) < 1:
                raise StudentError(f"training config: {name} must be positive, got {getattr(self, name)}")
        for name in ("warmup", "chunk_steps", "threads", "weight_decay", "clip", "min_lr_ratio",
                     "hidden_weight", "final_weight", "cosine_weight"):
            if getattr(self, name) < 0:
                raise StudentError(f"training config: {name} must be 0 or more, got {getattr(self, name)}")
        if not self.window_lengths or min(self.window_lengths) < 3:
            raise StudentError(f"training config: window_lengths {list(self.window_lengths)} must be lengths "
                               "of at least 3 (specials and one piece)")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise StudentError(f"training config: lr must be a positive number, got {self.lr}")
        if self.schedule not in SCHEDULES:
            raise StudentError(f"training config: schedule must be one of {list(SCHEDULES)}, "
                               f"got {self.schedule!r}")
        if not 0 <= self.ema_decay < 1:
            raise StudentError(f"training config: ema_decay must be in [0, 1), got {self.ema_decay}")
        if not self.language_power >= 0:
            raise StudentError(f"training config: language_power must be 0 or more, "
                               f"got {self.language_power}")

    def identity(self) -> dict:
        """What a checkpoint must agree with: every key but chunk_steps (chunks do not change results)."""
        values = dataclasses.asdict(self)
        values.pop("chunk_steps")
        return json.loads(json.dumps(values))  # tuples as lists, as they come back from a checkpoint

    def loss_weights(self) -> dict[str, float]:
        return {"hidden": self.hidden_weight, "final": self.final_weight, "cosine": self.cosine_weight}

    def lr_at(self, step: int) -> float:
        """Learning rate of step `step` (0-based)."""
        if self.warmup and step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        progress = (step - self.warmup) / max(1, self.steps - self.warmup)
        floor = self.min_lr_ratio
        if self.schedule == "cosine":
            return self.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))
        return self.lr * (1 - (1 - floor) * progress)


# ---------------------------------------------------------------------------------------------------------
# Pieces: PCA, EMA, distributed set-up


def pca(table: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(reduced [rows, k], components [k, width], mean [width]) of a table, float32.

    table ~ reduced @ components + mean. Centred, covariance in float64 (summed over row slices),
    eigh, the k components of largest variance first; each component's sign is chosen so that its
    entry of largest magnitude (the first such, on a tie) is positive, so the result does not depend
    on the solver's arbitrary signs.
    """
    rows, width = table.shape
    if not 1 <= k <= min(rows, width):
        raise StudentError(f"cannot keep {k} principal components of a {rows} x {width} table")
    slices = range(0, rows, PCA_ROWS)
    total = torch.zeros(width, dtype=torch.float64)
    for start in slices:
        total += table[start:start + PCA_ROWS].to(torch.float64).sum(dim=0)
    mean = total / rows
    cov = torch.zeros(width, width, dtype=torch.float64)
    for start in slices:
        x = table[start:start + PCA_ROWS].to(torch.float64) - mean
        cov += x.T @ x
    cov /= rows
    _, vectors = torch.linalg.eigh(cov)               # ascending eigenvalues, vectors in columns
    components = vectors[:, -k:].flip(-1).T.contiguous()  # [k, width], largest variance first
    biggest = components.abs().argmax(dim=1)
    signs = torch.sign(components[torch.arange(k), biggest])
    components *= signs[:, None]
    reduced = torch.cat([(table[start:start + PCA_ROWS].to(torch.float64) - mean) @ components.T
                         for start in slices])
    return reduced.to(torch.float32), components.to(torch.float32), mean.to(torch.float32)


def pca_init(student: PostNormEncoder, teacher_table: torch.Tensor) -> None:
    """Start the student's token table from the teacher's, reduced to its width by `pca`.

    When the student's width equals the teacher table's, the projection starts as the inverse map
    (weight = componentsᵀ, bias = mean), so the student's lifted embeddings start as the teacher's
    table reconstructed from its top components; otherwise the two spaces share no basis and the
    projection keeps its initialisation.
    """
    table = student.tokens.weight
    if teacher_table.shape[0] != table.shape[0]:
        raise ValueError(f"the teacher's table has {teacher_table.shape[0]} rows, the student's "
                         f"{table.shape[0]}: they must share the vocabulary")
    reduced, components, mean = pca(teacher_table.detach().cpu(), table.shape[1])
    with torch.no_grad():
        table.copy_(reduced)
        if student.projection is not None and student.projection.out_features == teacher_table.shape[1]:
            student.projection.weight.copy_(components.T)
            student.projection.bias.copy_(mean)


class EMA:
    """Exponential moving average of a module's state: shadow = d * shadow + (1 - d) * value.

    At update n (0-based) d = min(decay, (1 + n) / (10 + n)) (TensorFlow's num_updates rule) unless
    `warmup` is off: with a plain 0.99 a short run's average would still hold much of the random start.
    Entries that are not floating point are copied.
    """

    def __init__(self, module: nn.Module, decay: float, warmup: bool = True):
        self.decay, self.warmup, self.updates = float(decay), bool(warmup), 0
        self.shadow = {k: v.detach().clone() for k, v in module.state_dict().items()}

    def rate(self) -> float:
        if self.warmup:
            return min(self.decay, (1 + self.updates) / (10 + self.updates))
        return self.decay

    @torch.no_grad()
    def update(self, module: nn.Module) -> None:
        d = self.rate()
        for name, value in module.state_dict().items():
            shadow = self.shadow[name]
            if shadow.is_floating_point():
                shadow.mul_(d).add_(value.detach(), alpha=1 - d)
            else:
                shadow.copy_(value)
        self.updates += 1

    def state_dict(self) -> dict:
        return {"decay": self.decay, "warmup": self.warmup, "updates": self.updates, "shadow": self.shadow}

    def load_state_dict(self, state: dict) -> None:
        self.decay, self.warmup, self.updates = state["decay"], state["warmup"], state["updates"]
        for name, value in state["shadow"].items():
            self.shadow[name].copy_(value)


def local_rank() -> int:
    """This process's GPU index on its node: torchrun's LOCAL_RANK with several processes, else 0."""
    return int(os.environ.get("LOCAL_RANK", "0")) if int(os.environ.get("WORLD_SIZE", "1")) > 1 else 0


def init_distributed(device: torch.device) -> tuple[int, int]:
    """(rank, world size); joins the process group when WORLD_SIZE > 1 (torchrun's env): NCCL when the
    run computes on CUDA, gloo otherwise."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return 0, 1
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def shard(rank: int, world: int) -> slice:
    """The windows of a global batch that `rank` takes."""
    return slice(rank, None, world)


def _barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def teacher_digest(teacher: nn.Module) -> str:
    """SHA-256 of the teacher's settings and weights (when no file hash names it)."""
    h = hashlib.sha256(json.dumps(teacher.settings_dict(), sort_keys=True).encode())
    for name, value in sorted(teacher.state_dict().items()):
        h.update(name.encode())
        h.update(value.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------------------
# Entry points


def distill(teacher_dir: str | os.PathLike, documents: Iterable[Document],
            student_config: Mapping | architecture.StudentConfig, training_config: Mapping | TrainingConfig,
            checkpoint_path: str | os.PathLike, out_path: str | os.PathLike, *,
            amounts: Mapping[str, float] | None, device: str | None, progress: bool,
            precision: str = "fp32") -> tuple[dict, ...]:
    """Distil a student from the exported teacher in `teacher_dir` (model.onnx, tokenizer.json).

    Joins the process group when launched by torchrun. `amounts`: text per language for the language
    weights (None: the characters of `documents`); `device` "auto" (or None), "cpu" or "cuda"
    (`harness.resolve_device`); `precision` "fp32" or "bf16"; `progress`: a line per log row on stderr.
    Returns the log rows; the student (EMA weights and settings, see `load_student`) is then at
    `out_path` and the finished state at `checkpoint_path`.
    """
    config = TrainingConfig.from_dict(training_config)
    if not isinstance(student_config, architecture.StudentConfig):
        student_config = architecture.StudentConfig.from_dict(dict(student_config))
    teacher_dir = Path(teacher_dir)
    teacher = trainable.load(teacher_dir)
    tokenizer = PieceTokenizer(teacher_dir / "tokenizer.json")
    say = _say if progress and int(os.environ.get("RANK", "0")) == 0 else (lambda text: None)
    say(f"{len(documents):,} documents in {len({d.lang for d in documents})} languages: tokenizing")
    corpus = Corpus.build(documents, tokenizer, amounts, config.language_power)
    say(f"corpus ready: {sum(len(s) for s in corpus.streams.values()):,} pieces in {len(corpus.streams)} "
        f"language streams")
    return train(teacher, corpus, student_config, config, checkpoint_path, out_path,
                 teacher_id=files.sha256_file(teacher_dir / "model.onnx"), device=device, progress=progress,
                 precision=precision)


def train(teacher: nn.Module, corpus: Corpus, student_config, config: TrainingConfig,
          checkpoint_path: str | os.PathLike, out_path: str | os.PathLike, *, teacher_id: str | None,
          device: str | None, progress: bool, precision: str = "fp32") -> tuple[dict, ...]:
    """The loop behind `distill`, on objects: a trainable teacher, a corpus, configs as dataclasses.

    `teacher_id` None: the teacher's `teacher_digest`.
    """
    device = harness.resolve_device(device, local_rank())  # before anything (NCCL's set-up too) starts CUDA
    rank, world = init_distributed(device)
    harness.check_precision(precision, device)
    provenance.used("torch device", harness.describe_device(device))
    provenance.used("torch precision", precision)
    if progress and rank == 0:
        _say(f"on {harness.describe_device(device)}: the teacher's feature statistics over "
             f"{config.stats_windows} windows (or the checkpoint), then {config.steps} steps")
    with harness.deterministic(device, config.threads or torch.get_num_threads()):
        run = _Run(teacher, corpus, student_config, config, Path(checkpoint_path), device, rank, world,
                   teacher_id or teacher_digest(teacher), precision)
        return run.go(Path(out_path), progress)


def _say(text: str) -> None:
    """A line on stderr before the first step: a log that says what the job is doing while it prepares."""
    print(f"distill: {text}", file=sys.stderr, flush=True)


def load_student(path: str | os.PathLike) -> tuple[PostNormEncoder, dict]:
    """(the student with its EMA weights, in eval mode; the whole saved record) from `out_path`.

    The record's content must match the SHA-256 it carries (`artefacts`); StudentError otherwise.
    """
    saved = artefacts.read_torch(path, "distilled student", artefacts.rebuild(path), StudentError)
    if saved.get("format") != STUDENT_FORMAT:
        raise StudentError(f"{path}: not a distilled student (format {STUDENT_FORMAT}); "
                           f"{artefacts.rebuild(path)}")
    encoder = PostNormEncoder(PostNormSettings(**saved["settings"]))
    encoder.load_state_dict(saved["state_dict"], strict=True)
    return encoder.eval(), saved


def write_log(rows: Sequence[Mapping], path: str | os.PathLike) -> None:
    """The log rows as CSV (LOG_COLUMNS), e.g. results/student/training.csv."""
    files.write_text(path, tables.csv_text(rows, LOG_COLUMNS))


def plot_loss(rows: Sequence[Mapping], path: str | os.PathLike) -> None:
    """The loss curve (total and each term) against the step, as a PNG with fixed metadata."""
    with plots.figure(path, 6.4, 4.0) as figure:  # the style and the deterministic PNG writer
        axis = figure.add_subplot()
        steps = [r["step"] for r in rows]
        axis.plot(steps, [r["loss"] for r in rows], label="loss", linewidth=2)
        for term in TERMS:
            axis.plot(steps, [r[term] for r in rows], label=term, linewidth=1)
        axis.set_xlabel("step")
        axis.set_ylabel("distillation loss")
        axis.set_yscale("log")
        axis.legend()
        axis.grid(alpha=0.3)


# ---------------------------------------------------------------------------------------------------------
# The run


def check_windows(config: TrainingConfig, student_config, teacher_settings) -> None:
    """Refuse windows longer than the student's or the teacher's positions."""
    limits = {"student": student_config.max_positions}
    if hasattr(teacher_settings, "max_positions"):
        limits["teacher"] = teacher_settings.max_positions - teacher_settings.position_offset
    for who, limit in limits.items():
        if max(config.window_lengths) > limit:
            raise StudentError(f"window length {max(config.window_lengths)} exceeds the {who}'s "
                               f"{limit} positions")


class _Run(harness.Loop):
    """One distillation: the teacher, the student and its maps, the objective; `harness.Loop` the rest."""

    FORMAT = CHECKPOINT_FORMAT
    WHAT = "distillation checkpoint"
    CHUNKS = "save"  # the student records each chunk's steps, the same whether resumed or not

    def __init__(self, teacher: nn.Module, corpus: Corpus, student_config, config: TrainingConfig,
                 checkpoint: Path, device: torch.device, rank: int, world: int, teacher_id: str,
                 precision: str = "fp32"):
        if config.batch_windows < world:
            raise StudentError(f"batch_windows {config.batch_windows} is smaller than the world size "
                               f"{world}: some ranks would have no windows")
        super().__init__(checkpoint, device)
        self.config, self.corpus = config, corpus
        self.rank, self.world, self.precision = rank, world, precision
        self.teacher = teacher.to(device).eval().requires_grad_(False)
        ts = teacher.settings
        self.pad_id = int(teacher.filler_id)
        check_windows(config, student_config, ts)
        self.mapping = layer_map(student_config.layers, ts.layers, config.layer_map)
        self.fingerprint = {
            "config": config.identity(), "student": dataclasses.asdict(student_config), "teacher": teacher_id,
            "corpus": corpus.digest(), "world_size": world, "threads": torch.get_num_threads(),
            "device": device.type, "precision": precision}

        self.student = architecture.build(student_config, vocab_size=teacher.tokens.weight.shape[0],
                                            seed=config.seed)
        if config.pca_init:
            pca_init(self.student, teacher.tokens.weight)
        self.student.to(device).train()
        teacher_width = ts.width
        with torch.random.fork_rng(devices=[]):  # the maps' default init, seeded, the global RNG untouched
            torch.manual_seed(config.seed + 1)
            self.objective = Objective(student_config.width, teacher_width, self.mapping,
                                       torch.zeros(teacher_width), torch.ones(teacher_width),
                                       config.loss_weights()).to(device)
        self.params = list(self.student.parameters()) + list(self.objective.parameters())
        # Weight decay on matrices only: decaying norms and biases towards 0 has no reason here.
        self.optimizer = adamw(self.params, config.lr, config.weight_decay, matrices_only=True, fused=None)
        self.ema = EMA(self.student, config.ema_decay)
        torch.manual_seed(config.seed)  # nothing draws from these now; anything added later is seeded
        random.seed(config.seed)

        self.rows: list[dict] = []
        # Since the last log row: the sums of the loss and the terms, the steps, the tokens.
        self.pending = [0.0] * (1 + len(TERMS)) + [0, 0]
        if not self.resume():
            self.feature_stats()

    # -- the loop --------------------------------------------------------------------------------------

    def go(self, out_path: Path, progress: bool) -> tuple[dict, ...]:
        """Train to the last step (`harness.Loop.train`), write the student, return the log rows."""
        self.train(self.config.chunk_steps, progress and self.rank == 0, "distill")
        if self.rank == 0:
            self.write_student(out_path)
        _barrier(self.world)
        return tuple(self.rows)

    def finished(self) -> bool:
        return self.step >= self.config.steps

    def total_steps(self) -> int:
        return self.config.steps

    def report(self) -> str | None:
        """The log row this step wrote, for the progress line; None if it wrote none."""
        if not self.rows or self.rows[-1]["step"] != self.step:
            return None
        row = self.rows[-1]
        terms = " ".join(f"{t} {row[t]:.4g}" for t in TERMS)
        return f"loss {row['loss']:.4g} ({terms}), lr {row['lr']:.3g}"

    def feature_stats(self) -> None:
        """Mean and std of the teacher's target state over the fixed sample (the statistics stream).

        Every rank computes the whole sample in the same batches, so every rank (and a one-process
        run) gets the same numbers without communication.
        """
        config, stats = self.config, FeatureStats()
        target = self.mapping[-1]
        for i, first in enumerate(range(0, config.stats_windows, config.batch_windows)):
            n = min(config.batch_windows, config.stats_windows - first)
            batch = self.corpus.batch(config.seed, i, n, config.window_lengths, self.pad_id, STATS_STREAM)
            ids, mask = batch.input_ids.to(self.device), batch.attention_mask.to(self.device)
            with torch.no_grad():
                stats.add(self.teacher.hidden_states(ids, mask)[target], mask)
        mean, std = stats.result()
        self.objective.mean.copy_(mean)
        self.objective.std.copy_(std)

    def train_step(self) -> None:
        config = self.config
        batch = self.corpus.batch(config.seed, self.step, config.batch_windows, config.window_lengths,
                                  self.pad_id)
        tokens = batch.tokens  # of the global batch: the denominator on every rank
        local = batch.rows(shard(self.rank, self.world))
        ids, mask = local.input_ids.to(self.device), local.attention_mask.to(self.device)
        lr = config.lr_at(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        with harness.autocast(self.device, self.precision):
            with torch.no_grad():
                teacher_states = self.teacher.hidden_states(ids, mask)
            student_states = self.student.hidden_states(ids, mask)[1:]
            loss, terms = self.objective(student_states, teacher_states, mask, tokens=float(tokens))
        loss = loss.float()  # backward from a float32 scalar (autocast may return bfloat16)
        terms = {t: terms[t].float() for t in TERMS}
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        values = torch.stack([loss.detach(), *(terms[t].detach() for t in TERMS)])
        if self.world > 1:
            self.sum_gradients()
            dist.all_reduce(values)  # each rank holds its share of the global mean: the sum is the whole
        norm = harness.gradient_norm(self.params, config.clip)
        logged = values.cpu().tolist()
        # The same sums on every rank, so every rank stops together, before the update and the average.
        self.check_finite({"loss": logged[0], "gradient norm": norm})
        self.optimizer.step()
        self.ema.update(self.student)
        self.step += 1
        self.log(logged, tokens, lr)

    def log(self, values: list[float], tokens: int, lr: float) -> None:
        """Add the step's loss, terms and tokens to the pending sums; a log row every log_every steps."""
        for i, v in enumerate(values):
            self.pending[i] += v
        self.pending[-2] += 1
        self.pending[-1] += tokens
        if self.step % self.config.log_every == 0 or self.step == self.config.steps:
            n = self.pending[-2]
            self.rows.append({"step": self.step, "loss": self.pending[0] / n,
                              **{t: self.pending[1 + i] / n for i, t in enumerate(TERMS)},
                              "lr": lr, "tokens": self.pending[-1]})
            self.pending = [0.0] * (1 + len(TERMS)) + [0, 0]

    def sum_gradients(self) -> None:
        """All ranks' gradients summed, in one flat buffer (one collective, a fixed layout)."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p in self.params:
            p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()

    # -- checkpoints and the result --------------------------------------------------------------------

    def state(self) -> dict:
        return {"fingerprint": self.fingerprint, "mapping": self.mapping,
                "student": self.student.state_dict(), "objective": self.objective.state_dict(),
                "optimizer": self.optimizer.state_dict(), "ema": self.ema.state_dict(),
                "rng": harness.rng_state(self.device), "rows": self.rows, "pending": self.pending}

    def save(self, running: dict | None = None) -> None:
        """Rank 0 writes the checkpoint; every rank waits for it."""
        if self.rank == 0:
            super().save(running)
        _barrier(self.world)

    def restore(self, state: dict) -> None:
        files.check_same_run(self.checkpoint, "settings, teacher, corpus or processes", state["fingerprint"],
                             self.fingerprint)
        self.student.load_state_dict(state["student"])
        self.objective.load_state_dict(state["objective"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.ema.load_state_dict(state["ema"])
        harness.set_rng_state(state["rng"], self.device)
        self.rows, self.pending = state["rows"], state["pending"]

    def write_student(self, path: Path) -> None:
        """The EMA weights and the settings to build the encoder again (`load_student`)."""
        record = {"format": STUDENT_FORMAT, "settings": self.student.settings_dict(),
                  "state_dict": {k: v.detach().cpu().clone() for k, v in self.ema.shadow.items()},
                  "layer_map": self.mapping, "fingerprint": self.fingerprint, "rows": self.rows,
                  # Step ranges only: the chunks' seconds would make equal students differ in bytes.
                  "chunks": [{k: v for k, v in c.items() if k != "seconds"} for c in self.chunks]}
        files.write_torch(path, artefacts.seal(record))

"""The training harness tagging (`tagging.train`) and distillation (`student.distill`) share.

    device = resolve_device("auto")          # before anything starts CUDA
    with deterministic(device, threads):
        run = Run(..., checkpoint, device)   # a `Loop` subclass: the objective and the data only
        run.train(chunk_steps=100, progress=True, desc="minilm-finetuned")

Device: `resolve_device` turns `--device auto|cpu|cuda` into a `torch.device` ("auto": the rank's GPU
when torch sees one, else the CPU; "cuda" refuses to start without one). Before CUDA starts it fixes
cuBLAS's workspace (CUBLAS_WORKSPACE_CONFIG, read once, when cuBLAS makes its first handle) and
refuses a value that makes cuBLAS nondeterministic.

Determinism (`deterministic`): a fixed thread count and deterministic algorithms for the block
(warn-only on the CPU, whose kernels have no nondeterministic variants that matter here; strict on
CUDA, so that an operation without a deterministic kernel fails instead of drifting), and on CUDA no
cuDNN autotuning and no TF32 products; all restored after. A resumed run ends where an uninterrupted
one ends only on the device it started on, so every loop records its device in its checkpoints.

Precision: "fp32", or "bf16" autocast for forward passes (`autocast`); weights, gradients and AdamW's
state stay float32.

A `Loop` steps until it is finished, saves its checkpoint every `chunk_steps` steps and goes on, saves
once more at the end (a failure while writing outputs then costs no training), resumes from the
checkpoint it finds (`resume`), and reports progress. Its checkpoint holds what the subclass's `state`
gives (its RNG states among them: `rng_state`), the step and the chunk records. Saving changes nothing
of the state, so a run that saves every K steps computes what one that never saves computes. Both
loops step with `trainable.common.adamw` and clip with `trainable.common.clip_gradients`.

Checks: a checkpoint carries the SHA-256 of its own content (`artefacts.seal`), and one that does not
match it, or has none, is refused, naming the file ("delete it to start over"), before anything of it
is used. A subclass passes its loss, gradient norm and development score to `check_finite`; a value
that is NaN or infinite stops the run with `NonFiniteError`, naming the step and the checkpoint it
resumed from, before the step's update and before anything is saved or written.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import sys
import time
from pathlib import Path

import torch

from ...core import files
from ...core.errors import UserError
from ...core.files import CheckpointError
from ...provenance import artefacts
from .common import clip_gradients, determinism, use_deterministic_algorithms

CHOICES = ("auto", "cpu", "cuda")  # what --device takes
DEVICES = ("cpu", "cuda")          # device types a run computes on
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}  # autocast dtype (None: autocast off)
# cuBLAS picks reduction orders by workspace; a fixed one makes its results repeat (the PyTorch notes on
# reproducibility). ":16:8" is the other documented choice.
CUBLAS_WORKSPACE = ":4096:8"
CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")


class TrainingError(UserError, ValueError):
    """Settings training cannot run with (a device, a precision, a config value, an empty split)."""


class NonFiniteError(TrainingError):
    """A loss, gradient norm or development score that is NaN or infinite: the run has diverged."""


def resolve_device(choice: str | None, local_rank: int = 0) -> torch.device:
    """The torch device for `--device auto|cpu|cuda` (None: auto) on the rank with `local_rank`.

    Unless the CPU is chosen, CUBLAS_WORKSPACE_CONFIG is set first (or a value that makes cuBLAS
    nondeterministic refused), so call this before anything starts CUDA.
    """
    choice = "auto" if choice is None else choice
    if choice not in CHOICES:
        raise TrainingError(f"device {choice!r}: expected one of auto, cpu or cuda")
    if choice == "cpu":
        return torch.device("cpu")
    workspace = os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    if not torch.cuda.is_available():
        if choice == "cuda":
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA (a CPU build)"
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
            raise TrainingError(f"--device cuda, but torch {torch.__version__} (built with {build}; "
                                f"CUDA_VISIBLE_DEVICES={visible}) sees no GPU: run on a GPU node with the "
                                "CUDA build of torch (envs/torch-cuda.txt), or use --device auto or cpu")
        return torch.device("cpu")
    if workspace not in CUBLAS_DETERMINISTIC:
        raise TrainingError(f"CUBLAS_WORKSPACE_CONFIG is {workspace!r}, which makes cuBLAS "
                            f"nondeterministic: unset it or set it to {CUBLAS_WORKSPACE}")
    return torch.device("cuda", local_rank)


def describe_device(device: torch.device | str) -> str:
    """The torch device a run computes on, for provenance: "cpu", or "cuda:<i>: <GPU name> (compute
    capability, CUDA version)". (The driver and the machine's GPUs are in every fragment's device facts.)"""
    device = torch.device(device)
    if device.type != "cuda":
        return "cpu"
    index = torch.cuda.current_device() if device.index is None else device.index
    major, minor = torch.cuda.get_device_capability(index)
    return (f"cuda:{index}: {torch.cuda.get_device_name(index)} (compute capability {major}.{minor}, "
            f"CUDA {torch.version.cuda})")


@contextlib.contextmanager
def deterministic(device: torch.device | str, threads: int):
    """`determinism(threads)` for the block, and on CUDA strict deterministic algorithms, cuDNN
    deterministic and not benchmarking, no TF32 matrix products; restored after."""
    with determinism(threads):
        if torch.device(device).type != "cuda":
            yield
            return
        cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
        warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
        before = (cudnn.deterministic, cudnn.benchmark, cudnn.allow_tf32, matmul.allow_tf32)
        use_deterministic_algorithms(True)
        cudnn.deterministic, cudnn.benchmark, cudnn.allow_tf32, matmul.allow_tf32 = True, False, False, False
        try:
            yield
        finally:
            use_deterministic_algorithms(True, warn_only=warn_only)
            cudnn.deterministic, cudnn.benchmark, cudnn.allow_tf32, matmul.allow_tf32 = before


def check_precision(precision: str, device: torch.device | str) -> None:
    """Refuse a precision that is not in PRECISIONS, or bf16 on a GPU without bfloat16."""
    if precision not in PRECISIONS:
        raise TrainingError(f"precision {precision!r}: expected one of {list(PRECISIONS)}")
    device = torch.device(device)
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise TrainingError(f"precision bf16: {torch.cuda.get_device_name(device)} has no bfloat16 "
                            "support; use precision fp32")


def autocast(device: torch.device | str, precision: str):
    """bfloat16 autocast for precision bf16 (forward passes: training and predictions); else nothing."""
    dtype = PRECISIONS[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def gradient_norm(params: list[torch.nn.Parameter], clip: float) -> float:
    """The gradients' total norm before clipping, having clipped it to `clip` (`clip_gradients`) when
    `clip` is positive: what `Loop.check_finite` checks before the optimizer steps."""
    if clip:
        return clip_gradients(params, clip).item()
    return torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None]).item()


def rng_state(device: torch.device) -> dict:
    """torch's and Python's random states, and on a GPU the CUDA generator's (nothing draws from them
    today; anything added later resumes)."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def chunk_record(first_step: int, last_step: int, started: float) -> dict:
    """Steps first_step..last_step (1-based, inclusive) and the seconds since `started` they took."""
    return {"first_step": first_step, "last_step": last_step,
            "seconds": round(time.perf_counter() - started, 3)}


def format_seconds(seconds: float) -> str:
    """h:mm:ss, for progress lines."""
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def progress_line(desc: str, step: int, total: int, values: str, elapsed: float, steps_done: int) -> str:
    """`desc: step S/T, values, elapsed h:mm:ss, left h:mm:ss`; the time left at this call's rate."""
    left = elapsed / max(steps_done, 1) * max(total - step, 0)
    return (f"{desc}: step {step}/{total}, {values}, elapsed {format_seconds(elapsed)}, "
            f"left {format_seconds(left)}")


def note(text: str) -> None:
    """One line on stderr for the job's log (above the progress bar on a terminal)."""
    from tqdm import tqdm

    tqdm.write(text, file=sys.stderr)
    sys.stderr.flush()


class Progress:
    """Progress on stderr: a tqdm bar on a terminal, else one plain line per report (a log reads those)."""

    def __init__(self, desc: str, total: int, step: int, enabled: bool):
        from tqdm import tqdm

        self.desc, self.total, self.enabled = desc, total, enabled
        self.first, self.began = step, time.perf_counter()
        self.bar = tqdm(total=total, initial=step, desc=desc, unit="step", file=sys.stderr,
                        disable=not (enabled and sys.stderr.isatty()), dynamic_ncols=True)

    def update(self, step: int, values: str | None) -> None:
        """One step taken; `values`: what this step reports (a log row, an evaluation), or None."""
        self.bar.update(1)
        if values is None:
            return
        if not self.bar.disable:
            self.bar.set_postfix_str(values, refresh=False)
        elif self.enabled:
            print(progress_line(self.desc, step, self.total, values, time.perf_counter() - self.began,
                                step - self.first), file=sys.stderr, flush=True)

    def close(self) -> None:
        self.bar.close()


class Loop:
    """One training run: the steps, chunked checkpoints, resuming and progress (see the module).

    A subclass gives the objective and the data: `train_step` (one optimizer step, with whatever the
    step logs or evaluates), `finished`, `total_steps`, `report` (the progress values of the step just
    taken, or None), `state` (a dict of tensors and plain data) and `restore` (check a saved state
    against this run and take it over). `FORMAT` names the checkpoint's format, `WHAT` what it is.

    `CHUNKS` says what a chunk record covers. "invocation": the steps one call trained; a save mid-run
    writes the open record as running and goes on. "save": the steps between two saves; a save closes
    the record, and the run goes on from the state it reads back, as a rerun after a crash would, so
    that what it later pickles holds the same objects whether, or after which chunk, it was resumed.
    """

    FORMAT = ""
    WHAT = ""
    CHUNKS = "invocation"

    def __init__(self, checkpoint: Path | None, device: torch.device):
        self.checkpoint, self.device = checkpoint, device
        self.desc = "train"  # what progress lines and errors call the run (`train` sets it)
        self.step = 0
        self.chunks: list[dict] = []
        self.resumed_from: int | None = None  # the step this call started from, when it resumed
        self.progress = False  # whether `train` reports progress (and each save) on stderr

    def resume(self) -> bool:
        """Take over the checkpoint's state if there is one; whether there was."""
        if self.checkpoint is None or not self.checkpoint.exists():
            return False
        self.load()
        self.resumed_from = self.step
        return True

    def train(self, chunk_steps: int, progress: bool, desc: str) -> None:
        """Step until finished, saving every `chunk_steps` steps (0: only at the end) and going on."""
        self.desc, self.progress = desc, progress
        if progress and self.resumed_from is not None and self.step == self.resumed_from:
            note(f"{desc}: resumed from the {self.WHAT} {self.checkpoint} at step {self.step}")
        first, started = self.step, time.perf_counter()  # the open chunk record
        shown = Progress(desc, self.total_steps(), self.step, progress)
        try:
            while not self.finished():
                self.train_step()
                shown.update(self.step, self.report())
                if chunk_steps and self.step % chunk_steps == 0 and not self.finished():
                    first, started = self.save_chunk(first, started)
        finally:
            shown.close()
        if self.step > first:
            self.chunks.append(chunk_record(first + 1, self.step, started))
            if self.checkpoint is not None:
                self.save()  # the finished state: a failure while writing outputs costs no training

    def save_chunk(self, first: int, started: float) -> tuple[int, float]:
        """The save every chunk_steps steps; the open record's first step and start time after it."""
        record = chunk_record(first + 1, self.step, started)
        if self.CHUNKS == "invocation":
            self.save(running=record)  # a crash from here on resumes at this step; the record counts it
            return first, started
        self.chunks.append(record)
        self.save()
        self.load()
        return self.step, time.perf_counter()

    def save(self, running: dict | None = None) -> None:
        """Write the checkpoint; `running`: the record of the call still training, if it goes on."""
        files.write_torch(self.checkpoint, artefacts.seal({
            "format": self.FORMAT, **self.state(), "step": self.step,
            "chunks": self.chunks + ([running] if running else [])}))
        if self.progress:  # the log says how far a retry after a crash will resume from
            note(f"{self.desc}: {self.WHAT} at step {self.step} saved to {self.checkpoint}"
                 + ("" if running or not self.finished() else " (finished)"))

    def load(self) -> None:
        """Take over the checkpoint's state, once its content matches its SHA-256 and its format."""
        state = artefacts.read_torch(self.checkpoint, self.WHAT, artefacts.CHECKPOINT_FIX, CheckpointError)
        if state.get("format") != self.FORMAT:
            raise CheckpointError(f"{self.checkpoint}: not a {self.WHAT} (format {state.get('format')!r}, "
                                  f"expected {self.FORMAT!r}); {artefacts.CHECKPOINT_FIX}")
        self.restore(state)
        self.step, self.chunks = state["step"], state["chunks"]

    def check_finite(self, values: dict[str, float], step: int | None = None) -> None:
        """NonFiniteError if a value (name: number, e.g. "loss") of `step` (1-based; None: the step being
        taken) is NaN or infinite. Call it before the step changes any weight where it can be."""
        bad = {name: value for name, value in values.items() if not math.isfinite(value)}
        if not bad:
            return
        what = ", ".join(f"the {name} is {value}" for name, value in bad.items())
        if self.resumed_from is not None:
            origin = (f"It resumed from {self.checkpoint} at step {self.resumed_from}: lower the learning "
                      f"rate, or delete {self.checkpoint} to start over")
        elif self.checkpoint is not None and self.checkpoint.exists():
            origin = (f"It started from scratch, and {self.checkpoint} holds a step saved before this one: "
                      f"lower the learning rate, and delete {self.checkpoint} to start over")
        else:
            origin = "It started from scratch (no checkpoint): lower the learning rate or check the data"
        step = self.step + 1 if step is None else step
        raise NonFiniteError(f"{self.desc}: step {step} of {self.total_steps()}: {what}, not a finite "
                             f"number; training stopped, and no output was written. {origin}")

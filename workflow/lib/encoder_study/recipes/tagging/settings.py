"""The tagging recipe's groups of settings, each spelled once (see core.settings): imported by the
rules to render their flags, by the commands to generate their options, by the library as objects.
A group's `OPTIONS` gives a field's command-line help and choices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

METHODS = ("percentile", "bca")
MODES = ("frozen", "finetuned")
OPTIMIZERS = ("adamw", "lbfgs")


@dataclass(frozen=True)
class Bootstrap:
    """The sentence bootstrap of every tagging interval (config `tagging.bootstrap`)."""

    resamples: int
    seed: int
    confidence: float
    method: str

    OPTIONS: ClassVar[dict] = {
        "resamples": "sentence resamples per interval",
        "seed": "the resampling generator's seed (numpy PCG64)",
        "confidence": "the interval's confidence level, e.g. 0.95",
        "method": ("percentile, or BCa", METHODS),
    }


@dataclass(frozen=True)
class Training:
    """What decides a tagging run's trained weights besides the encoder and the data (config
    `tagging.defaults.<mode>` and each run's entry; `tagging.seed`; `threads`; `tagging.device`).
    `train.TrainSettings` is this with the device resolved ("auto" -> cpu or cuda) and checked."""

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

    OPTIONS: ClassVar[dict] = {
        "mode": ("frozen: a probe on the frozen encoder; finetuned: the encoder trains too", MODES),
        "optimizer": ("adamw: minibatches (the fine-tune); lbfgs: the frozen probe solved on its cached "
                      "vectors, a step being one full-batch L-BFGS iteration", OPTIMIZERS),
        "seed": "the training seed (the head's initialisation, the batches)",
        "lr": "adamw: the rate; lbfgs: the first trial step",
        "weight_decay": "adamw: decoupled weight decay; lbfgs: the L2 penalty (weight_decay/2 |head|^2)",
        "epochs": "0: no limit by epochs (stop: maximum)",
        "max_steps": "0: no limit by steps (stop: max_steps)",
        "warmup": "adamw: linear warm-up steps",
        "batch_words": "adamw: words per batch",
        "eval_every": "steps between dev evaluations; 0: at the end of each epoch (lbfgs: every step)",
        "eval_batch_words": "words per batch when evaluating and predicting",
        "clip": "adamw: gradient norm clip; 0: none",
        "patience": "stop after this many dev evaluations without a new best (stop: plateau); 0: never",
        "threads": "torch's threads (capped to the machine's cores)",
        "device": ("where the tagger trains: auto is cuda when torch sees a GPU, else cpu",
                   ("auto", "cpu", "cuda")),
        "precision": ("finetuned: bf16 runs forward passes under bfloat16 autocast", ("fp32", "bf16")),
    }

"""The distillation objective: student layers matched to teacher hidden states (Jiao et al. 2020, 3.1).

Student layer i (1-based) goes through its own learned linear map to the teacher's width and is
matched by mean squared error to teacher hidden state `mapping[i-1]` (0 would be the embeddings):

- intermediate layers: the target is the teacher state layer-normalised per token (no affine); a
  teacher's residual stream has a few very large dimensions that would otherwise own the loss;
- the last layer: the target is the teacher's state standardised per feature, with a mean and standard
  deviation computed once over a fixed sample of the corpus (`FeatureStats`), so that the loss of a
  window does not depend on which other windows share its batch or its process; plus a cosine term
  1 - cos(mapped student, standardised target), in that same space.

Every term is a sum over real (non-padding) tokens divided by a token count the caller gives: the
batch's own count for one process, the global batch's count under data parallelism, so that the
ranks' losses (and gradients) add up to the loss of the whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import StudentError

NORM_EPS = 1e-5   # of the per-token layer norm of intermediate targets
STD_FLOOR = 1e-6  # a feature that never varies is divided by this, not by zero
TERMS = ("hidden", "final", "cosine")


def layer_map(student_layers: int, teacher_layers: int, given: Sequence[int] | None = None) -> list[int]:
    """The teacher hidden state (1..teacher_layers) each student layer is matched to.

    Uniform (Jiao et al. 2020, 4.6): student layer i < S goes to round-half-up(i * T / S), the last
    to T (the teacher's final state). `given` is checked instead: one entry per student layer, each in
    1..T, strictly increasing.
    """
    if student_layers < 1 or teacher_layers < 1:
        raise StudentError(f"layer counts must be positive, got student {student_layers}, "
                           f"teacher {teacher_layers}")
    if given is None:
        # Integer arithmetic: floor(i*T/S + 1/2) without float rounding at exact halves.
        mapping = [(2 * i * teacher_layers + student_layers) // (2 * student_layers)
                   for i in range(1, student_layers)]
        return mapping + [teacher_layers]
    mapping = [int(v) for v in given]
    if any(v != g for v, g in zip(mapping, given, strict=True)):
        raise StudentError(f"layer_map {list(given)}: entries must be integers")
    if len(mapping) != student_layers:
        raise StudentError(f"layer_map {mapping} has {len(mapping)} entries; the student has "
                           f"{student_layers} layers and needs one teacher state for each")
    if any(not 1 <= v <= teacher_layers for v in mapping):
        raise StudentError(f"layer_map {mapping}: teacher states run from 1 to {teacher_layers} (0, the "
                           "embeddings, is not a target)")
    if any(b <= a for a, b in zip(mapping[:-1], mapping[1:], strict=True)):
        raise StudentError(f"layer_map {mapping} must be strictly increasing")
    return mapping


@dataclass
class FeatureStats:
    """Per-feature mean and standard deviation of a teacher state over real tokens (float64 sums).

    Batches are merged with Chan et al.'s pairwise update, so a large sample needs no second pass.
    """

    count: float = 0.0
    mean: torch.Tensor | None = None
    m2: torch.Tensor | None = None

    def add(self, states: torch.Tensor, mask: torch.Tensor) -> None:
        x = states[mask.bool()].to(torch.float64)  # [real tokens, width]
        n = float(x.shape[0])
        if n == 0:
            return
        mean = x.mean(dim=0)
        m2 = ((x - mean) ** 2).sum(dim=0)
        if self.mean is None:
            self.count, self.mean, self.m2 = n, mean, m2
            return
        total = self.count + n
        delta = mean - self.mean
        self.mean = self.mean + delta * (n / total)
        self.m2 = self.m2 + m2 + delta ** 2 * (self.count * n / total)
        self.count = total

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, std) as float32; std is the population standard deviation, at least STD_FLOOR."""
        if self.mean is None:
            raise ValueError("no tokens were seen: the statistics sample is empty")
        std = (self.m2 / self.count).sqrt().clamp_min(STD_FLOOR)
        return self.mean.to(torch.float32), std.to(torch.float32)


class Objective(nn.Module):
    """The learned maps and the loss. `forward` takes the student's layer outputs (S of them) and the
    teacher's hidden states ([embeddings, layer 1..T]) and returns (total, {term: value})."""

    def __init__(self, student_width: int, teacher_width: int, mapping: Sequence[int], mean: torch.Tensor,
                 std: torch.Tensor, weights: dict[str, float] | None = None):
        super().__init__()
        self.mapping = list(mapping)
        self.maps = nn.ModuleList(nn.Linear(student_width, teacher_width) for _ in self.mapping)
        # Buffers: saved with the maps, moved with them to a device, never trained.
        self.register_buffer("mean", mean.detach().to(torch.float32).clone())
        self.register_buffer("std", std.detach().to(torch.float32).clone())
        weights = dict(weights or {})
        unknown = set(weights) - set(TERMS)
        if unknown:
            raise ValueError(f"unknown loss terms {sorted(unknown)}; the terms are {list(TERMS)}")
        self.weights = {term: float(weights.get(term, 1.0)) for term in TERMS}

    def forward(self, student: Sequence[torch.Tensor], teacher: Sequence[torch.Tensor], mask: torch.Tensor,
                tokens: float | torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """`tokens`: the count the per-token sums are divided by (default: the real tokens of `mask`)."""
        if len(student) != len(self.mapping):
            raise ValueError(f"{len(student)} student layers given, the mapping has {len(self.mapping)}")
        real = mask.to(student[0].dtype)  # [batch, sequence]
        tokens = real.sum() if tokens is None else tokens

        def per_token_mean(values: torch.Tensor) -> torch.Tensor:  # [batch, sequence] -> scalar
            return (values * real).sum() / tokens

        hidden = student[0].new_zeros(())
        for linear, state, target in zip(self.maps[:-1], student[:-1], self.mapping[:-1], strict=True):
            goal = F.layer_norm(teacher[target], teacher[target].shape[-1:], eps=NORM_EPS)
            hidden = hidden + per_token_mean(((linear(state) - goal) ** 2).mean(dim=-1))
        if len(self.mapping) > 1:
            hidden = hidden / (len(self.mapping) - 1)  # the mean over layers: its scale ignores depth
        mapped = self.maps[-1](student[-1])
        goal = (teacher[self.mapping[-1]] - self.mean) / self.std
        final = per_token_mean(((mapped - goal) ** 2).mean(dim=-1))
        cosine = per_token_mean(1 - F.cosine_similarity(mapped, goal, dim=-1))
        terms = {"hidden": hidden, "final": final, "cosine": cosine}
        total = sum(self.weights[name] * value for name, value in terms.items())
        return total, terms

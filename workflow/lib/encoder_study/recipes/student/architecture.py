"""The distilled student's architecture: a post-norm encoder with a factorised token table.

The student is a `trainable.postnorm.PostNormEncoder` (exact GELU, learned positions from 0, no token
types, no pooler) whose `vocab x embedding_width` table is lifted to `width` by a linear map (Lan et
al. 2020, section 3.1): with a 256,000-piece vocabulary the table stays 24.6 M of 35.5 M weights.

    config = StudentConfig.from_dict({"layers": 6, "width": 384, "heads": 12, "intermediate": 1536,
                                      "embedding_width": 96, "max_positions": 512})
    encoder = build(config, vocab_size=256_000, seed=0)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from ...encoders.trainable.postnorm import PostNormEncoder, PostNormSettings
from . import StudentError

INIT_STD = 0.02  # BERT's initializer_range


@dataclass(frozen=True)
class StudentConfig:
    layers: int
    width: int
    heads: int
    intermediate: int
    embedding_width: int
    max_positions: int
    eps: float = 1e-12

    @classmethod
    def from_dict(cls, values: dict) -> StudentConfig:
        """From a config mapping; unknown or missing keys raise StudentError naming them."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        missing = sorted(n for n, f in fields.items()
                         if n not in values and f.default is dataclasses.MISSING)
        if unknown or missing:
            raise StudentError(f"student config: unknown keys {unknown}, missing keys {missing}; "
                               f"expected {sorted(fields)}")
        config = cls(**{n: (float(v) if n == "eps" else int(v)) for n, v in values.items()})
        config.check()
        return config

    def check(self) -> None:
        for name in ("layers", "width", "heads", "intermediate", "embedding_width", "max_positions"):
            if getattr(self, name) < 1:
                raise StudentError(f"student config: {name} must be positive, got {getattr(self, name)}")
        if self.width % self.heads:
            raise StudentError(f"student config: width {self.width} does not split into {self.heads} heads")
        if not self.eps > 0:
            raise StudentError(f"student config: eps must be positive, got {self.eps}")

    def settings(self, vocab_size: int, freeze_embeddings: bool = False) -> PostNormSettings:
        return PostNormSettings(
            width=self.width, layers=self.layers, heads=self.heads, intermediate=self.intermediate,
            vocab_size=int(vocab_size), max_positions=self.max_positions, eps=self.eps, position_offset=0,
            position_pad_id=None, freeze_embeddings=freeze_embeddings, embedding_width=self.embedding_width)


def build(config: StudentConfig, vocab_size: int, seed: int) -> PostNormEncoder:
    """A freshly initialised student (train mode, every weight trainable, the token table included).

    BERT's initialisation: normal(0, 0.02) for linear weights, the token table and the positions,
    zero biases, unit norms. Drawn from a generator seeded with `seed` in parameter order, so a
    seed gives the same weights on every machine and the global RNG is left untouched.
    """
    config.check()
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    with torch.random.fork_rng(devices=[]):  # the constructors' default init draws from the global RNG
        encoder = PostNormEncoder(config.settings(vocab_size))
    generator = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        for module in encoder.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
                module.bias.zero_()
            elif isinstance(module, nn.Linear):
                module.weight.normal_(0.0, INIT_STD, generator=generator)
                module.bias.zero_()
            elif isinstance(module, nn.Embedding):
                module.weight.normal_(0.0, INIT_STD, generator=generator)
        encoder.positions.normal_(0.0, INIT_STD, generator=generator)
    return encoder.train()


def parameter_count(encoder: nn.Module) -> dict[str, int]:
    """{"total", "vocabulary" (the token table), "other"} numbers of weights."""
    total = sum(p.numel() for p in encoder.parameters())
    vocabulary = encoder.tokens.weight.numel()
    return {"total": total, "vocabulary": vocabulary, "other": total - vocabulary}

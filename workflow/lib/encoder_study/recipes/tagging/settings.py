"""The tagging recipe's groups of settings, each spelled once (see core.settings): imported by the
rules to render their flags, by the commands to generate their options, by the library as objects."""

from __future__ import annotations

from dataclasses import dataclass, field

METHODS = ("percentile", "bca")


@dataclass(frozen=True)
class Bootstrap:
    """The sentence bootstrap of every tagging interval (config `tagging.bootstrap`)."""

    resamples: int = field(metadata={"help": "sentence resamples per interval"})
    seed: int = field(metadata={"help": "the resampling generator's seed (numpy PCG64)"})
    confidence: float = field(metadata={"help": "the interval's confidence level, e.g. 0.95"})
    method: str = field(metadata={"help": "percentile, or BCa", "choices": METHODS})

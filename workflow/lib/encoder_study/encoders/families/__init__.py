"""Encoder families: what is particular to a family, declared once, in one module per family.

    family = families.of_config(config)         # by a Hugging Face config's model_type
    family = families.detect(weight_names)      # by an exported graph's weight names (prefix removed)
    families.usable_positions(config)           # ids one sequence may hold

A family module (`postnorm`, `student`, `modernbert`) declares a `FAMILY`: the model types it covers,
how its weights are named and recognised, its positions, its feed-forward (for the FLOP count), ONNX
Runtime's optimizer type, the ids a random model of it gets, the trainable module that rebuilds it and
how write-back lays its weights out. Nothing else in the package tests a `model_type` or a weight name
to tell families apart: it asks this registry. A new family is a new module here, its trainable module
under `encoders.trainable`, and one line in `FAMILIES`.

These modules import nothing heavy (no torch): the frozen graph path reads them too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ...core.errors import UserError


class FamilyError(UserError):
    """A model or graph of no family this package knows."""


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # Hugging Face config `model_type` values
    tokens: str  # the token table's weight name, after the wrapper prefix
    matches: Callable[[set[str]], bool]  # whether graph weight names (prefix removed) are this family's
    trainable: str  # the module under encoders.trainable that rebuilds it; a checkpoint's `family`
    gated: bool  # gated feed-forward: three products per layer where BERT has two (perf's FLOP count)
    ort_model_type: str | None  # onnxruntime.transformers optimizer's model type; None: it has none
    lost_positions: Callable[[Mapping], int] = lambda config: 0  # positions no sequence can use
    random_ids: Callable[[dict], dict] = lambda ids: {}  # a random model's config ids from its specials
    # Write-back (recipes.writeback): `folded_positions`: the module holds positions + token-type row 0
    # in one table, the graph two tables; `named_layout`: every weight is a named initializer [in, out].
    folded_positions: bool = False
    named_layout: bool = False


def _registry() -> dict[str, Family]:
    from . import modernbert, postnorm, student

    # Detection tries them in this order; the student's names are BERT's plus a projection.
    return {f.name: f for f in (student.FAMILY, postnorm.FAMILY, modernbert.FAMILY)}


FAMILIES = _registry()


def of_config(config: Mapping) -> Family:
    """The family of a Hugging Face style config (an export's model.config.json)."""
    kind = config.get("model_type")
    for family in FAMILIES.values():
        if kind in family.model_types:
            return family
    known = sorted(t for f in FAMILIES.values() for t in f.model_types)
    raise FamilyError(f"model_type {kind!r} is of no encoder family this package knows ({', '.join(known)}); "
                      "add a module to encoder_study.encoders.families")


def detect(names: Iterable[str]) -> Family:
    """The family of a graph from its weight names (the wrapper prefix removed)."""
    names = set(names)
    for family in FAMILIES.values():
        if family.matches(names):
            return family
    raise FamilyError(f"cannot tell the family from the weight names (e.g. {sorted(names)[:4]}); known "
                      f"families: {', '.join(FAMILIES)}")


def usable_positions(config: Mapping) -> int | None:
    """How many ids one sequence may hold (RoBERTa-style models lose padding_idx + 1 positions)."""
    n = config.get("max_position_embeddings")
    if n is None:
        return None
    return int(n) - of_config(config).lost_positions(config)

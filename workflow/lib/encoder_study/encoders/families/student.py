"""Family `student`: the distilled student (recipes.student), BERT's post-norm layers over a factorised
token table lifted by a linear map; its graph names every weight itself, linear weights [in, out].
Rebuilt by `encoders.trainable.postnorm`, which owns the layout's names."""

from __future__ import annotations

from . import Family
from .postnorm import TOKENS

MODEL_TYPE = "encoder_study_student"  # in the student export's config.json
PROJECTION = "embeddings.projection.weight"  # no Hugging Face model has it


def is_student(names, prefix: str = "") -> bool:
    """Whether weights named `names` (with the wrapper `prefix`, or without) are a distilled student's."""
    return prefix + PROJECTION in names


FAMILY = Family(
    name="student", model_types=(MODEL_TYPE,), tokens=TOKENS,
    matches=lambda names: TOKENS in names and is_student(names),
    trainable="postnorm", gated=False, ort_model_type=None, named_layout=True)

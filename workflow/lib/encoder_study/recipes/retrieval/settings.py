"""The retrieval recipe's groups of settings, each spelled once (see core.settings): the rules render
their flags from the config, the commands generate their options, the library takes the object.
Standard library only: the Snakefile imports it (the package's __init__ imports core.errors alone)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class Quantisation:
    """How the retrieval graph's int8 variant is made and when it is published (config
    `retrieval.quantisation`): every threshold holds on every case, against the float32 graph and
    against FlagEmbedding."""

    per_channel: bool
    embeddings: bool
    min_dense_cosine: float
    min_sparse_top10: float
    min_sparse_correlation: float
    min_colbert_cosine: float
    min_colbert_cosine_p5: float

    OPTIONS: ClassVar[dict] = {
        "per_channel": "one int8 scale per output column of each weight (else one per matrix)",
        "embeddings": "also store the token table as uint8 (Gather): 4x smaller, looked-up rows dequantised",
        "min_dense_cosine": "the least cosine of a text's dense vector with the reference's",
        "min_sparse_top10": "the least share of a text's top-10 sparse ids the reference's top 10 also has",
        "min_sparse_correlation": "the least Pearson correlation of a case's sparse weights (at the ids "
                                  "either keeps)",
        "min_colbert_cosine": "the least cosine of a token's ColBERT vector with the reference's",
        "min_colbert_cosine_p5": "the least 5th percentile of a case's ColBERT per-token cosines",
    }

"""Family `postnorm`: BERT, RoBERTa, XLM-R; rebuilt by `encoders.trainable.postnorm`."""

from __future__ import annotations

from . import Family

TOKENS = "embeddings.word_embeddings.weight"
POSITIONS = "embeddings.position_embeddings.weight"
TOKEN_TYPES = "embeddings.token_type_embeddings.weight"
QUERY = "encoder.layer.0.attention.self.query.weight"
# RoBERTa's descendants number positions from padding_idx + 1, so a sequence loses that many rows.
ROBERTA_LIKE = ("xlm-roberta", "roberta", "camembert")


def _lost_positions(config) -> int:
    return int(config.get("pad_token_id") or 0) + 1 if config.get("model_type") in ROBERTA_LIKE else 0


FAMILY = Family(
    name="postnorm", model_types=("bert", *ROBERTA_LIKE), tokens=TOKENS,
    matches=lambda names: TOKENS in names and QUERY in names,
    trainable="postnorm", gated=False, ort_model_type="bert", lost_positions=_lost_positions,
    random_ids=lambda ids: {"bos_token_id": ids["cls"], "eos_token_id": ids["sep"]},
    folded_positions=True)

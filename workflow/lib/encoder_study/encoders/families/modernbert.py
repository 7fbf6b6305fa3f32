"""Family `modernbert`: ModernBERT and mmBERT; rebuilt by `encoders.trainable.modernbert`."""

from __future__ import annotations

from . import Family

TOKENS = "embeddings.tok_embeddings.weight"
WQKV = "layers.0.attn.Wqkv.weight"

FAMILY = Family(
    name="modernbert", model_types=("modernbert",), tokens=TOKENS,
    matches=lambda names: TOKENS in names and WQKV in names,
    # GeGLU: the first half of Wi's output, through GELU, gates the second.
    trainable="modernbert", gated=True,
    # No model type of its own in ONNX Runtime; under "bert" the optimizer finds its norms and GELU.
    ort_model_type="bert",
    random_ids=lambda ids: {"bos_token_id": ids["cls"], "cls_token_id": ids["cls"],
                            "eos_token_id": ids["sep"], "sep_token_id": ids["sep"]})

"""ONNX Runtime's transformer optimizer on an exported encoder: the graph variants timed side by side.

    record = fusion.optimize("results/models/minilm/model.onnx", "/tmp/model.ort-attention.onnx",
                             config, "ort-attention", "bert")  # the family's ort_model_type
    graphs = fusion.variants("results/models/minilm/model.onnx", config, "/tmp", "bert")
    # {variant: (path, record)}

Variants (VARIANTS):

    exported        the exported graph as it is
    ort-fusions     `onnxruntime.transformers.optimizer.optimize_model` with its defaults for the model type:
                    Attention, SkipLayerNormalization (residual, bias and norm in one), BiasGelu,
                    EmbedLayerNormalization
    ort-attention   the same without the SkipLayerNormalization and EmbedLayerNormalization fusions: the
                    norms stay LayerNormalization, whose CPU kernel ran faster than those two fused ones
                    in ONNX Runtime 1.32 (measured: CHANGELOG.md)

ONNX Runtime applies its own session-level fusions (level `all`) to every variant when it loads it; the
optimizer's are those the session does not find by itself (attention above all). `optimize_model` runs
with opt_level 0, so the file holds the optimizer's fusions only, no hardware-specific rewrite.

The optimizer's model type is the encoder family's (`encoders.families`, `ort_model_type`): BERT and
XLM-R have BERT's graph pattern ("bert"). ModernBERT has no model type of its own in ONNX Runtime; under
"bert" the optimizer finds its norms and GELU but not its attention (rotary positions, alternating global
and local windows), so its variants differ from the exported graph in the norms and activations only. The
head count and width are the model's own (num_attention_heads, hidden_size), as the attention fusion
needs them.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

VARIANTS = {
    "exported": None,
    "ort-fusions": {},
    "ort-attention": {"enable_skip_layer_norm": False, "enable_embed_layer_norm": False},
}
# The variant an encoder's export publishes, and why: its export.json's `graph` (the model exports and
# the student's). `snakemake benchmarks` times every variant beside it on each run (part `graphs`).
PUBLISHED = {
    "variant": "exported",
    "alternatives": [v for v in VARIANTS if v != "exported"],
    "why": ("the fastest variant changed from run to run, by a few percent either way, on MiniLM at 8 x 128 "
            "(benchmarks part graphs; CHANGELOG.md), all within the same tolerance of transformers; the "
            "optimizer's Attention fusion packs each layer's query, key and value weights into one tensor, "
            "while a written graph (writeback) replaces the exported graph's tensors by name; ONNX Runtime "
            "applies its own session-level fusions to the published graph when it loads it"),
}


class FusionError(ValueError):
    pass


def optimizer_settings(config: dict, model_type: str | None) -> dict:
    """The optimizer's settings for a Hugging Face `config` of a family whose optimizer type is
    `model_type` (None: ONNX Runtime has none for it)."""
    if model_type is None:
        raise FusionError(f"no ONNX Runtime optimizer model type for model_type {config.get('model_type')!r}")
    return {"model_type": model_type, "num_heads": int(config["num_attention_heads"]),
            "hidden_size": int(config["hidden_size"])}


def optimize(source: str | os.PathLike, target: str | os.PathLike, config: dict, variant: str,
             model_type: str | None) -> dict:
    """Write `variant` of the graph `source` to `target`; return what was done (for a manifest or a
    table): the variant, the optimizer's settings and options, and the fused operators it made."""
    if variant not in VARIANTS:
        raise FusionError(f"unknown graph variant {variant!r}; expected one of {list(VARIANTS)}")
    import onnxruntime

    record = {"variant": variant, "onnxruntime": onnxruntime.__version__}
    if VARIANTS[variant] is None:
        raise FusionError(f"{variant!r} is the graph as exported: there is nothing to write")
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    settings = optimizer_settings(config, model_type)
    options = FusionOptions(settings["model_type"])
    for name, value in VARIANTS[variant].items():
        setattr(options, name, value)
    quiet = logging.getLogger("onnxruntime.transformers")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # it logs every fusion it tries
    try:
        model = optimize_model(str(source), optimization_options=options, opt_level=0, **settings)
    finally:
        quiet.setLevel(level)
    model.save_model_to_file(str(target))
    fused = {op: n for op, n in sorted(model.get_fused_operator_statistics().items()) if n}
    return {**record, **settings, "options": dict(VARIANTS[variant]), "fused": fused}


def variants(source: str | os.PathLike, config: dict, work_dir: str | os.PathLike,
             model_type: str | None) -> dict[str, tuple[Path, dict]]:
    """Every variant of the graph `source`: its file (`source` itself for the exported graph, the others
    written to `work_dir`) and its record."""
    out = {"exported": (Path(source), {"variant": "exported", "fused": {}})}
    for variant in VARIANTS:
        if VARIANTS[variant] is not None:
            target = Path(work_dir) / f"{Path(source).stem}.{variant}.onnx"
            out[variant] = target, optimize(source, target, config, variant, model_type)
    return out


def fused_text(record: dict) -> str:
    """The fused operators of a variant in one line: 'Attention 6, BiasGelu 6' (or 'none')."""
    return ", ".join(f"{op} {n}" for op, n in record["fused"].items()) or "none"

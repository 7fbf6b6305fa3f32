"""Trainable encoders rebuilt from an exported ONNX graph's weights.

The graph runtime cannot backpropagate, so fine-tuning runs on these PyTorch modules instead; they
read their weights from the same model.onnx the frozen path uses (see `graph`), and a checkpoint
holds only the settings and the layers, the token table being read from the graph again.

    encoder = trainable.load("results/models/xlmr-tiny")          # family detected from weight names
    hidden = encoder(input_ids, attention_mask)                  # [batch, sequence, width]
    trainable.save(encoder, "encoder.pt")
    again = trainable.restore("results/models/xlmr-tiny", "encoder.pt")
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ...core import files
from ...onnx.names import table_prefix
from .. import families
from . import modernbert, postnorm
from .common import Encoder, adamw, clip_gradients
from .graph import Graph, GraphError, read_weights
from .modernbert import ModernBertEncoder, ModernBertSettings
from .postnorm import PostNormEncoder, PostNormSettings

FAMILIES = {"postnorm": (postnorm, PostNormEncoder, PostNormSettings),
            "modernbert": (modernbert, ModernBertEncoder, ModernBertSettings)}
CHECKPOINT_FORMAT = "encoder_study.trainable/1"

__all__ = ["Encoder", "Graph", "GraphError", "ModernBertEncoder", "ModernBertSettings", "PostNormEncoder",
           "PostNormSettings", "adamw", "checkpoint", "clip_gradients", "detect_family", "load",
           "read_weights", "restore", "save"]


def _paths(model: str | os.PathLike, config: str | os.PathLike | None) -> tuple[Path, Path | None]:
    """(graph, config): a directory means its model.onnx; the config is `<stem>.config.json` beside it."""
    path = Path(model)
    onnx_path = path / "model.onnx" if path.is_dir() else path
    if config == "auto":
        beside = onnx_path.with_name(onnx_path.stem + ".config.json")
        return onnx_path, beside if beside.is_file() else None
    return onnx_path, None if config is None else Path(config)


def _read_config(path: Path | None) -> dict:
    if path is None:
        return {}
    return files.read_json(path, "the model's config", "give the config.json written with the graph",
                           kind=dict, error=GraphError)


def detect_family(names) -> str:
    """The trainable family (`postnorm` or `modernbert`) of a graph's weight names, from the family
    registry (a distilled student's names are `postnorm`'s), else refuse."""
    try:
        return families.detect(names).trainable
    except families.FamilyError as err:
        raise GraphError(f"{err}; or give family='postnorm' or family='modernbert'") from None


def _module_weights(graph: Graph) -> tuple[dict, str]:
    """The graph's weights with the wrapper prefix (`model.`, or `model.bert.` ...) removed."""
    weights = graph.weights()
    prefix = table_prefix(graph.path, weights)
    return {name[len(prefix):]: value for name, value in weights.items() if name.startswith(prefix)}, prefix


def load(model_dir_or_onnx: str | os.PathLike, family: str = "auto", heads: int | None = None,
         global_rope_theta: float | None = None, local_rope_theta: float | None = None, *,
         window: int | None = None, global_every: int | None = None, freeze_embeddings: bool = True,
         config: str | os.PathLike | None = "auto") -> Encoder:
    """Rebuild the encoder of an exported graph as trainable PyTorch modules (float32, train mode off).

    `config`: "auto" reads `<name>.config.json` beside the graph when it is there (num_attention_heads,
    local_attention, global_attn_every_n_layers, rope_parameters); a path reads that file; None reads
    nothing. Arguments given here win. Heads, rotary bases and the global period come next from the
    config, then from the graph (head size from its attention scale or rotary table, a single rotary
    base); epsilon, position offset and window are read from the graph's own constants.
    """
    onnx_path, config_path = _paths(model_dir_or_onnx, config)
    graph = Graph(onnx_path)
    weights, prefix = _module_weights(graph)
    family = detect_family(weights) if family == "auto" else family
    if family not in FAMILIES:
        raise ValueError(f"family {family!r}: use 'auto', {', '.join(map(repr, FAMILIES))}")
    module = FAMILIES[family][0]
    if module.TOKENS not in weights:
        raise GraphError(f"{onnx_path}: not a {family} encoder (the graph has no {module.TOKENS})")
    options = {"heads": heads, "freeze_embeddings": freeze_embeddings}
    rotary = {"global_rope_theta": global_rope_theta, "local_rope_theta": local_rope_theta,
              "window": window, "global_every": global_every}
    refused = [k for k, v in rotary.items() if v is not None and k not in module.OPTIONS]
    if refused:
        takers = [name for name, (m, *_) in FAMILIES.items() if set(refused) <= set(m.OPTIONS)]
        raise ValueError(f"{', '.join(refused)}: only for family {' or '.join(map(repr, takers))}, "
                         f"not {family!r}")
    options.update({k: v for k, v in rotary.items() if k in module.OPTIONS})
    encoder = module.from_graph(graph, weights, prefix, _read_config(config_path), **options)
    return encoder.eval()


def checkpoint(encoder: Encoder, onnx_sha256: str | None = None) -> dict:
    """Settings (JSON-ready) and the trainable weights; the frozen token table stays in the graph."""
    return {"format": CHECKPOINT_FORMAT, "settings": encoder.settings_dict(), "onnx_sha256": onnx_sha256,
            "state_dict": {k: v.detach().clone() for k, v in encoder.trainable_state_dict().items()}}


def save(encoder: Encoder, path: str | os.PathLike, onnx_path: str | os.PathLike | None = None) -> None:
    """Write `checkpoint(encoder)`; with `onnx_path`, record its SHA-256 so `restore` checks the graph."""
    digest = files.sha256_file(onnx_path) if onnx_path is not None else None
    files.write_torch(path, checkpoint(encoder, digest))


def restore(model_dir_or_onnx: str | os.PathLike, saved: dict | str | os.PathLike) -> Encoder:
    """Build the encoder from its settings, the token table from the graph, the layers from `saved`."""
    state = saved if isinstance(saved, dict) else torch.load(saved, map_location="cpu", weights_only=True)
    if state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"not a trainable-encoder checkpoint (format {state.get('format')!r})")
    settings = dict(state["settings"])
    family = settings.pop("family")
    module, encoder_class, settings_class = FAMILIES[family]
    encoder = encoder_class(settings_class(**settings))
    layers = state["state_dict"]
    if "tokens.weight" not in layers:
        onnx_path, _ = _paths(model_dir_or_onnx, None)
        if state.get("onnx_sha256") and files.sha256_file(onnx_path) != state["onnx_sha256"]:
            raise GraphError(f"{onnx_path}: not the graph the checkpoint was saved with (SHA-256 differs); "
                             "its token table would not match the saved layers")
        weights, _ = _module_weights(Graph(onnx_path))
        layers = dict(layers, **{"tokens.weight": torch.from_numpy(weights[module.TOKENS].copy())})
    encoder.load_state_dict(layers, strict=True)
    return encoder.eval()

"""ONNX export of a Hugging Face encoder, checked against PyTorch before anything is published.

The graph: inputs `input_ids` and `attention_mask` (int64, [batch, sequence], both axes dynamic),
output `last_hidden_state` (float32, [batch, sequence, width]); opset 17, eager attention so attention
is plain MatMul/Softmax. Traced, checked and published by `onnx.checked_export` (the TorchScript
exporter, dynamo=False); this module gives the model, its check batch and its manifest's own parts.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

import numpy as np

from ... import provenance
from ...core import files, machine, tables
from ...core.errors import UserError
from ...encoders.families import usable_positions
from ...encoders.reference import HiddenStates, load_pytorch, source_dir
from ...onnx import checked_export, fusion, manifest


class ExportError(UserError):
    pass


def check_batch(tokenizer_path: str | os.PathLike, config) -> tuple[np.ndarray, np.ndarray]:
    """The export check's padded batch for a model of Hugging Face `config`: its rows go beyond a local
    attention window, if the model has one."""
    window = int(getattr(config, "local_attention", 0) or 0)
    pad_id = config.pad_token_id if config.pad_token_id is not None else 0
    return checked_export.check_batch(tokenizer_path, usable_positions(config.to_dict()), pad_id, window,
                                      error=ExportError)


@dataclass(frozen=True)
class Settings:
    """The export's settings; the config's `export` section (and `threads`) holds their defaults."""

    opset: int
    tolerance: float  # on max_abs / max(1, largest |value|) over real (unpadded) tokens
    threads: int
    ort_optimization: str


def export(source_json: str | os.PathLike, out_dir: str | os.PathLike, settings: Settings) -> dict:
    """Export, check, and publish model.onnx, tokenizer.json, model.config.json and export.json."""
    threads = machine.torch_threads(settings.threads)
    model_dir, source = source_dir(source_json)
    model = load_pytorch(model_dir)
    wrapper = HiddenStates(model).eval()  # the exporter restores the wrapper's mode: it must be eval
    batch = check_batch(model_dir / "tokenizer.json", model.config)
    with files.staging_dir(out_dir) as stage:
        onnx_path = stage / manifest.ONNX_FILE
        checked_export.trace(wrapper, batch, onnx_path, settings.opset)
        check = checked_export.check(
            onnx_path, batch, checked_export.pytorch_output(wrapper, batch), threads=threads,
            optimization=settings.ort_optimization, tolerance=settings.tolerance,
            what=f"model '{source['model']}'", error=ExportError)
        shutil.copyfile(model_dir / "tokenizer.json", stage / manifest.TOKENIZER_FILE)
        shutil.copyfile(model_dir / "config.json", stage / manifest.CONFIG_FILE)
        record = {
            "model": source["model"],
            "source": source["source"],
            "source_tree_sha256": source["tree_sha256"],
            "libraries": provenance.library_versions(["torch", "transformers", "tokenizers", "onnx",
                                                      "onnxruntime"]),
            "exporter": checked_export.exporter_record(settings.opset, checked_export.HIDDEN_SHAPES,
                                                       attn_implementation="eager"),
            "architecture": _architecture(model),
            "check": check,
            "graph": fusion.PUBLISHED,
        }
        return checked_export.publish(stage, out_dir, record)


def _architecture(model) -> dict:
    """The manifest's `architecture` block: the model's shape, from its config and parameters."""
    config = model.config
    return {
        "model_type": config.model_type, "width": int(config.hidden_size),
        "layers": int(config.num_hidden_layers), "heads": int(config.num_attention_heads),
        "vocab_size": int(config.vocab_size), "parameters": int(sum(p.numel() for p in model.parameters())),
    }


def check_table(record: dict) -> str:
    """The export check of `record` (export.json) as a Markdown table, for the export's fragment."""
    check = record["check"]
    return tables.markdown_table(
        ["model", "lengths", "max_abs", "max_value", "relative", "tolerance"],
        [(record["model"], " ".join(map(str, check["lengths"])), f"{check['max_abs']:.3g}",
          f"{check['max_value']:.4g}", f"{check['relative']:.3g}", check["tolerance"])], "llrrrr")

"""ONNX export of a Hugging Face encoder, checked against PyTorch before anything is published.

The graph: inputs `input_ids` and `attention_mask` (int64, [batch, sequence], both axes dynamic),
output `last_hidden_state` (float32, [batch, sequence, width]); TorchScript exporter (dynamo=False),
opset 17, eager attention so attention is plain MatMul/Softmax.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from . import files, machine, manifest, provenance, tables
from .errors import UserError
from .reference import HiddenStates, load_pytorch, source_dir
from .runtime import CHECK_TEXT, DYNAMIC_AXES, INPUTS, OUTPUT, ort_session, pad_batch, usable_positions


class ExportError(UserError):
    pass


def check_batch(tokenizer_path: str | os.PathLike, config) -> tuple[np.ndarray, np.ndarray]:
    """A right-padded batch of three texts whose lengths go beyond a local attention window."""
    from tokenizers import Tokenizer

    window = int(getattr(config, "local_attention", 0) or 0)
    longest = min(usable_positions(config.to_dict()), max(48, 2 * window + 8))
    lengths = [longest, max(window + 3, (2 * longest) // 3), 5]
    tok = Tokenizer.from_file(str(tokenizer_path))
    tok.no_padding()
    rows = []
    for n in lengths:
        tok.enable_truncation(max_length=n)
        ids = tok.encode(CHECK_TEXT * 8).ids
        if len(ids) != n:
            raise ExportError(f"{tokenizer_path}: the check text gives {len(ids)} pieces, expected {n}")
        rows.append(ids)
    return pad_batch(rows, config.pad_token_id if config.pad_token_id is not None else 0)


@dataclass(frozen=True)
class Settings:
    """The export's settings; the config's `export` section (and `threads`) holds their defaults."""

    opset: int
    tolerance: float  # on max_abs / max(1, largest |value|) over real (unpadded) tokens
    threads: int
    ort_optimization: str


def export(source_json: str | os.PathLike, out_dir: str | os.PathLike, settings: Settings) -> dict:
    """Export, check, and publish model.onnx, tokenizer.json, model.config.json and export.json."""
    import onnx

    threads = machine.torch_threads(settings.threads)
    model_dir, source = source_dir(source_json)
    model = load_pytorch(model_dir)
    wrapper = HiddenStates(model).eval()  # the exporter restores the wrapper's mode: it must be eval
    input_ids, mask = check_batch(model_dir / "tokenizer.json", model.config)
    out_dir = Path(out_dir)
    names = [manifest.ONNX_FILE, manifest.TOKENIZER_FILE, manifest.CONFIG_FILE]
    with files.staging_dir(out_dir) as stage:
        with torch.no_grad():
            torch.onnx.export(
                wrapper, (torch.from_numpy(input_ids), torch.from_numpy(mask)), stage / manifest.ONNX_FILE,
                dynamo=False, opset_version=settings.opset, do_constant_folding=True,
                input_names=list(INPUTS), output_names=[OUTPUT], dynamic_axes=DYNAMIC_AXES,
            )
            reference = wrapper(torch.from_numpy(input_ids), torch.from_numpy(mask)).numpy()
        onnx.checker.check_model(str(stage / manifest.ONNX_FILE), full_check=True)
        session = ort_session(stage / manifest.ONNX_FILE, threads, settings.ort_optimization)
        got = session.run([OUTPUT], {"input_ids": input_ids, "attention_mask": mask})[0]
        real = mask.astype(bool)
        max_abs = float(np.abs(got - reference)[real].max())
        max_value = float(np.abs(reference[real]).max())
        relative = max_abs / max(1.0, max_value)
        if not np.isfinite(relative) or relative > settings.tolerance:
            raise ExportError(
                f"model '{source['model']}': ONNX Runtime differs from PyTorch by {max_abs:.3g} "
                f"(largest value {max_value:.3g}, relative {relative:.3g} > tolerance {settings.tolerance}); "
                "nothing was written")
        shutil.copyfile(model_dir / "tokenizer.json", stage / manifest.TOKENIZER_FILE)
        shutil.copyfile(model_dir / "config.json", stage / manifest.CONFIG_FILE)
        libs = provenance.library_versions(["torch", "transformers", "tokenizers", "onnx", "onnxruntime"])
        record = {
            "model": source["model"],
            "source": source["source"],
            "source_tree_sha256": source["tree_sha256"],
            "libraries": libs,
            "exporter": {
                "function": "torch.onnx.export", "dynamo": False, "opset": settings.opset,
                "do_constant_folding": True, "attn_implementation": "eager",
                "inputs": {n: {"dtype": "int64", "shape": ["batch", "sequence"]} for n in INPUTS},
                "outputs": {OUTPUT: {"dtype": "float32", "shape": ["batch", "sequence", "width"]}},
            },
            "architecture": {
                "model_type": model.config.model_type, "width": int(model.config.hidden_size),
                "layers": int(model.config.num_hidden_layers),
                "heads": int(model.config.num_attention_heads),
                "vocab_size": int(model.config.vocab_size),
                "parameters": int(sum(p.numel() for p in model.parameters())),
            },
            "check": {
                "lengths": [int(n) for n in mask.sum(axis=1)], "padded_to": int(mask.shape[1]),
                "onnx_checker": "passed (full_check)", "ort_optimization": settings.ort_optimization,
                "max_abs": max_abs, "max_value": max_value, "relative": relative,
                "tolerance": settings.tolerance, "criterion": "max_abs / max(1, max_value) <= tolerance",
            },
        }
        out_dir.mkdir(parents=True, exist_ok=True)
        record = manifest.write(stage, record, names)
        files.publish(stage, out_dir, [*names, manifest.MANIFEST])
    return record


def check_table(record: dict) -> str:
    """The export check of `record` (export.json) as a Markdown table, for the export's fragment."""
    check = record["check"]
    return tables.markdown_table(
        ["model", "lengths", "max_abs", "max_value", "relative", "tolerance"],
        [(record["model"], " ".join(map(str, check["lengths"])), f"{check['max_abs']:.3g}",
          f"{check['max_value']:.4g}", f"{check['relative']:.3g}", check["tolerance"])], "llrrrr")

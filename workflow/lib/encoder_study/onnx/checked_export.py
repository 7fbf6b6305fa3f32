"""The one checked ONNX export: trace a module, check the graph, record how, publish atomically.

The model export (`recipes.export.export`), the student's (`student.export`) and the retrieval graph
(`retrieval`) each give what differs: the module, its outputs, the PyTorch reference and the check's
cases. The rest is here:

- `trace`: `torch.onnx.export` with the TorchScript exporter (dynamo=False) and constant folding, inputs
  `input_ids` and `attention_mask` (int64 [batch, sequence]) and dynamic axes. The TorchScript exporter
  is deprecated upstream: `TRACER` is the one place to change for another, and `exporter_record`
  records from it what the manifest says about the exporter.
- `check_graph`: `onnx.checker` with full_check.
- `check_batch`, `pytorch_output`, `check`: the checker, then ONNX Runtime against PyTorch on a
  right-padded batch of three rows, max_abs / max(1, largest |value|) over real tokens <= tolerance;
  the result is the manifest's `check` block.
- `publish`: export.json with every file's size and SHA-256, then the staged files renamed into the
  output directory, the manifest last. A stage writes into `files.staging_dir(out_dir)`, so a failure
  before `publish` leaves nothing in `out_dir`.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from ..core import files
from ..core.errors import UserError
from . import manifest
from .runtime import CHECK_TEXT, DYNAMIC_AXES, INPUTS, OUTPUT, ort_session, pad_batch

# The exporter's settings that every export shares and every manifest records.
TRACER = {"dynamo": False, "do_constant_folding": True}
# An encoder's one output, `last_hidden_state`: its dynamic axes and its recorded shape.
HIDDEN_AXES = {OUTPUT: DYNAMIC_AXES[OUTPUT]}
HIDDEN_SHAPES = {OUTPUT: ["batch", "sequence", "width"]}
# The check batch: rows of LONGEST pieces (or more, past a local attention window), two-thirds of it,
# and SHORTEST.
LONGEST = 48
SHORTEST = 5
CRITERION = "max_abs / max(1, max_value) <= tolerance"


def trace(module: torch.nn.Module, batch: tuple[np.ndarray, ...], path: str | os.PathLike, opset: int,
          outputs: dict[str, dict[int, str]] = HIDDEN_AXES, *, external_data: bool = False) -> None:
    """Write `module`, traced on `batch` (input_ids, attention_mask), as the ONNX graph `path`.

    `outputs`: each output's name and dynamic axes, in the module's order. With `external_data` a graph
    over 2 GiB gets its weights as files beside `path`, one per tensor (the exporter writes them only
    when it is given the path as a str); without it the exporter refuses such a graph.
    """
    target = str(path) if external_data else Path(path)
    axes = {**{name: DYNAMIC_AXES[name] for name in INPUTS}, **outputs}
    with torch.no_grad():
        torch.onnx.export(module, tuple(torch.from_numpy(a) for a in batch), target, opset_version=opset,
                          input_names=list(INPUTS), output_names=list(outputs), dynamic_axes=axes, **TRACER)


def exporter_record(opset: int, shapes: dict[str, list], **details) -> dict:
    """The manifest's `exporter` block: how `trace` made the graph, its inputs, its float32 outputs
    (`shapes`: name -> shape) and the stage's own `details` (attention, module, ...)."""
    return {
        "function": "torch.onnx.export", **TRACER, "opset": opset,
        "inputs": {n: {"dtype": "int64", "shape": ["batch", "sequence"]} for n in INPUTS},
        "outputs": {n: {"dtype": "float32", "shape": s} for n, s in shapes.items()},
        **details,
    }


def check_graph(path: str | os.PathLike) -> None:
    """onnx.checker on the graph file `path`, with full_check (shape inference included)."""
    import onnx

    onnx.checker.check_model(str(path), full_check=True)


def check_batch(tokenizer_path: str | os.PathLike, positions: int, pad_id: int, window: int = 0, *,
                error: type[UserError]) -> tuple[np.ndarray, np.ndarray]:
    """The export check's batch: three right-padded rows of the check text, none over `positions`.

    The rows have LONGEST pieces, two-thirds of that and SHORTEST; with a local attention `window`, the
    longest goes past twice the window and the middle one past the window, so that both attention
    patterns are checked. A tokenizer that cannot give a row's length raises `error`.
    """
    from tokenizers import Tokenizer

    longest = min(positions, max(LONGEST, 2 * window + 8))
    middle = max(window + 3 if window else 1, (2 * longest) // 3)
    tok = Tokenizer.from_file(str(tokenizer_path))
    tok.no_padding()
    rows = []
    for n in (longest, middle, min(SHORTEST, longest)):
        tok.enable_truncation(max_length=n)
        ids = tok.encode(CHECK_TEXT * 8).ids
        if len(ids) != n:
            raise error(f"{tokenizer_path}: the check text gives {len(ids)} pieces, expected {n}")
        rows.append(ids)
    return pad_batch(rows, pad_id)


def pytorch_output(module: torch.nn.Module, batch: tuple[np.ndarray, ...]) -> np.ndarray:
    """`module(input_ids, attention_mask)` in eval mode without gradients; the module's mode is kept."""
    was = module.training
    try:
        module.eval()
        with torch.no_grad():
            return module(*(torch.from_numpy(a) for a in batch)).numpy()
    finally:
        module.train(was)


def check(path: str | os.PathLike, batch: tuple[np.ndarray, np.ndarray], reference: np.ndarray, *,
          threads: int, optimization: str, tolerance: float, what: str, error: type[UserError]) -> dict:
    """`check_graph` on the graph `path`, then the graph in ONNX Runtime on `batch` against PyTorch's
    `reference` over real tokens.

    Returns the manifest's `check` block; a relative difference over `tolerance` (or not finite) raises
    `error`, naming `what` was exported.
    """
    check_graph(path)
    input_ids, mask = batch
    session = ort_session(path, threads, optimization)
    got = session.run([OUTPUT], {"input_ids": input_ids, "attention_mask": mask})[0]
    real = mask.astype(bool)
    max_abs = float(np.abs(got - reference)[real].max())
    max_value = float(np.abs(reference[real]).max())
    relative = max_abs / max(1.0, max_value)
    if not np.isfinite(relative) or relative > tolerance:
        raise error(f"{what}: ONNX Runtime differs from PyTorch by {max_abs:.3g} (largest value "
                    f"{max_value:.3g}, relative {relative:.3g} > tolerance {tolerance}); nothing was written")
    return {
        "lengths": [int(n) for n in mask.sum(axis=1)], "padded_to": int(mask.shape[1]),
        "onnx_checker": "passed (full_check)", "ort_optimization": optimization,
        "max_abs": max_abs, "max_value": max_value, "relative": relative, "tolerance": tolerance,
        "criterion": CRITERION,
    }


def publish(stage: Path, out_dir: str | os.PathLike, record: dict) -> dict:
    """Write export.json for the staged model files into `stage`, then rename them into `out_dir`, the
    manifest last; return the manifest."""
    record = manifest.write(stage, record, list(manifest.MODEL_FILES))
    files.publish(stage, out_dir, list(manifest.EXPORT_FILES))
    return record

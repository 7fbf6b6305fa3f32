"""The one quantisation path: an int8 variant of a float32 graph made by ONNX Runtime's own tool.

    record = quantise(Path("pipeline.encoder0.onnx"), Path("int8.onnx"), per_channel=False,
                      ops=("MatMul",))

`onnxruntime.quantization.quantize_dynamic`, never a hand-written rewrite: each MatMul whose second
operand is an initializer (every linear layer; not attention's activations x activations, which
MatMulConstBOnly leaves in float32) gets int8 weights (QInt8, symmetric) and runs as
DynamicQuantizeLinear + MatMulInteger on uint8 activations whose scale is computed per call;
`Gather` in `ops` also stores an embedding table as uint8 (4x smaller, dequantised per looked-up row).
Everything else (layer norms, softmax, GELU, the heads' own arithmetic) stays float32.

`per_channel` (one scale per output column instead of one per matrix) is the setting the callers
choose and say why (docs/recipes.md: on MiniLM, as fast as one scale per matrix and 2-4x fewer changed
tags); what it buys is measured by the same jobs that gate publication.

The result is deterministic: the same graph and settings give the same bytes (scales are computed from
the weights alone), so a job that times a variant may remake it and check it against the SHA-256 the
gating job recorded (`remake`).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..core import files
from ..core.errors import UserError

METHOD = "onnxruntime.quantization.quantize_dynamic"
WEIGHT_TYPE = "QInt8"  # ONNX Runtime's default for dynamic quantisation: s8 weights, u8 activations
OPS = ("MatMul", "Gather")  # what a caller may ask to quantise


class QuantisationError(UserError):
    """A graph could not be quantised, or a remade variant is not the one that was measured."""


def settings_record(per_channel: bool, ops: tuple[str, ...]) -> dict:
    """How a variant was made: what its manifest and the fragments record."""
    from .. import provenance

    return {"method": METHOD, "weight_type": WEIGHT_TYPE, "activations": "QUInt8, dynamic (per call)",
            "per_channel": bool(per_channel), "reduce_range": False, "ops": list(ops),
            "extra_options": {"MatMulConstBOnly": True},
            "libraries": provenance.library_versions(["onnx", "onnxruntime"])}


def quantise(source: str | os.PathLike, target: str | os.PathLike, per_channel: bool,
             ops: tuple[str, ...] = ("MatMul",)) -> dict:
    """Write the int8 variant of the graph `source` (external data beside it is read) to `target`, one
    file (an int8 graph of BGE-M3's size is about a quarter of its 2.2 GB: no external data needed);
    return `settings_record` with the counts of quantised nodes and the file's size and SHA-256."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    unknown = sorted(set(ops) - set(OPS))
    if unknown or not ops:
        raise QuantisationError(f"quantise: ops {list(ops)}; choose among {list(OPS)}")
    source, target = Path(source), Path(target)
    try:
        quantize_dynamic(source, target, weight_type=QuantType.QInt8, per_channel=per_channel,
                         reduce_range=False, op_types_to_quantize=list(ops),
                         extra_options={"MatMulConstBOnly": True}, use_external_data_format=False)
    except Exception as err:  # the quantiser raises many kinds; the job's line names the graph
        raise QuantisationError(f"{source}: ONNX Runtime's quantize_dynamic failed: {err}") from err
    model = onnx.load(str(target), load_external_data=False)
    counts: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type in ("MatMulInteger", "DynamicQuantizeMatMul", "DequantizeLinear"):
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return {**settings_record(per_channel, ops), "nodes": dict(sorted(counts.items())),
            "bytes": target.stat().st_size, "sha256": files.sha256_file(target)}


def describe(record: dict) -> str:
    """How a variant was made, in words, for a fragment's note."""
    return (f"made by {record['method']} (weights {record['weight_type']}, per_channel "
            f"{record['per_channel']}, ops {', '.join(record['ops'])}; nodes {record['nodes']}; onnxruntime "
            f"{record['libraries'].get('onnxruntime')}), {record['bytes']:,} bytes, SHA-256 "
            f"{record['sha256']}")


def remake(source: str | os.PathLike, target: str | os.PathLike, per_channel: bool, ops: tuple[str, ...],
           sha256: str) -> dict:
    """`quantise`, refusing a result whose SHA-256 is not `sha256` (the variant a gating job measured)."""
    record = quantise(source, target, per_channel, ops)
    if record["sha256"] != sha256:
        raise QuantisationError(f"{source}: the int8 variant made again has SHA-256 {record['sha256']}, not "
                                f"{sha256} as measured; ONNX Runtime or the settings changed since: rerun "
                                "the job that measured it")
    return record


def graph_bytes(path: str | os.PathLike) -> int:
    """A graph's size on disk, with its external data file beside it if any."""
    path = Path(path)
    data = path.with_name(path.name + ".data")
    return path.stat().st_size + (data.stat().st_size if data.is_file() else 0)

"""How PyTorch's TorchScript exporter names a model's weights, and how to get the module names back.

What such a graph looks like (`torch.onnx.export(..., dynamo=False, do_constant_folding=True)`):

- Biases, norms and embedding tables keep their module names (`model.embeddings.LayerNorm.weight`).
- Constant folding turns every `nn.Linear` weight into `Transpose(weight)`, stored as an anonymous
  initializer `onnx::MatMul_N` of shape [in, out]. The `MatMul` node that consumes it keeps the module's
  scope in its name (`/model/encoder/layer.0/attention/self/query/MatMul`), which gives the name back.
- Equal tensors are stored once; every other name for them is the output of an `Identity` node.
- Buffers and other traced constants (rotary `inv_freq`, position ids) are `Constant` nodes.

Graphs made another way (the dynamo exporter, ONNX Runtime's optimiser, other converters) name
things differently, and weights read from them by these rules could be silently wrong, so they are
refused with a message instead.

Two readers apply these rules: `trainable.graph.Graph` (a graph loaded with onnx, to rebuild the
trainable modules) and `onnx.patch.StreamedGraph` (a graph read field by field, never whole, to
write weights back). Each describes its graph as a `Layout`, the little these rules look at, and
`weight_names` names the weights from it; the values are read by the caller's own means.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core.errors import UserError

ANONYMOUS = "onnx::"  # prefix of the TorchScript exporter's unnamed values
REEXPORT = ("Export the model again with encoder_study.recipes.export (torch.onnx.export(..., dynamo=False, "
            "do_constant_folding=True) on a module that wraps the Hugging Face model).")
# The token table of a Hugging Face encoder, after the wrapper's prefix (`model.`, `model.bert.` ...).
TOKEN_TABLE = re.compile(r"^(.*?)embeddings\.(word|tok)_embeddings\.weight$")
FLOAT = 1  # TensorProto.DataType.FLOAT
# TensorProto data types of buffers (position ids, masks), which are not parameters.
INTEGER = (7, 6, 9)  # INT64, INT32, BOOL


class GraphError(UserError, ValueError):
    """The graph cannot be read by these rules; the message says why and what to do."""


@dataclass
class Node:
    """A node as these rules see it (Identity and MatMul nodes are the ones they use)."""

    op_type: str
    name: str
    inputs: list[str]
    outputs: list[str]


@dataclass
class Layout:
    """What the naming rules need to know of a graph, whichever way it was read."""

    path: Path
    producer: str  # ModelProto.producer_name
    dtypes: dict[str, int]  # initializer name -> TensorProto data type, in the graph's order
    nodes: list[Node]  # at least every Identity and MatMul node, in the graph's order
    scoped: bool  # some node name carries a module scope (/model/...), as TorchScript writes
    dynamo: bool = False  # it looks like a dynamo export (only for the refusal's wording)
    identity: dict[str, str] = field(init=False)  # Identity output -> its input

    def __post_init__(self):
        self.identity = {n.outputs[0]: n.inputs[0] for n in self.nodes
                         if n.op_type == "Identity" and len(n.inputs) == 1 and len(n.outputs) == 1}

    def resolve(self, name: str) -> str:
        """Follow `Identity` nodes (the exporter's stand-ins for equal tensors) back to the stored name."""
        seen = set()
        while name not in self.dtypes and name in self.identity and name not in seen:
            seen.add(name)
            name = self.identity[name]
        return name


def module_scope(node_name: str) -> str | None:
    """`/model/encoder/layer.0/attention/self/query/MatMul` -> `model.encoder.layer.0.attention.self.query`.

    None for a node name without a scope (`MatMul_7`, dynamo's `node_linear`).
    """
    if not node_name.startswith("/"):
        return None
    parts = node_name.strip("/").split("/")
    return ".".join(parts[:-1]) or None


def check_origin(layout: Layout) -> None:
    """Refuse a graph these rules were not written for: not PyTorch's, or without module scopes."""
    path, producer = layout.path, layout.producer
    if producer != "pytorch":
        raise GraphError(f"{path}: written by {producer or 'an unnamed producer'!r}, not by PyTorch's "
                         "TorchScript exporter; weight names are recovered from that exporter's node scopes, "
                         f"which other tools do not keep. {REEXPORT}")
    if not layout.scoped:
        how = ("it looks like a dynamo export (torch.onnx.export(..., dynamo=True)), whose node names "
               "carry no module scopes" if layout.dynamo else
               "no node name carries a module scope such as /model/encoder/layer.0/...")
        raise GraphError(f"{path}: not a TorchScript export: {how}. {REEXPORT}")


def check_float32(path: Path, name: str, data_type: int) -> None:
    """The trainable modules and the patcher read float32 weights only."""
    if data_type != FLOAT:
        from onnx import TensorProto

        try:
            kind = TensorProto.DataType.Name(data_type).lower()
        except ValueError:  # a number no data type has (a damaged or hostile file)
            kind = f"data type {data_type}"
        raise GraphError(f"{path}: {name} is stored as {kind}; the trainable modules read float32 "
                         "graphs: export the model in float32")


@dataclass
class WeightNames:
    """Every float32 parameter's module name and the stored initializer that holds it."""

    named: dict[str, str]  # module name (an initializer, or an Identity of one) -> stored initializer
    linear: dict[str, list[str]]  # `scope.weight` -> the MatMul inputs that read it (anonymous, [in, out])
    linear_stored: dict[str, str]  # `scope.weight` -> the stored initializer those MatMuls read

    def __contains__(self, name: str) -> bool:
        return name in self.named or name in self.linear


def weight_names(layout: Layout, read: Callable[[str], np.ndarray]) -> WeightNames:
    """Name every float32 parameter of a TorchScript export by the rules above.

    `read(stored)` gives a stored float32 initializer's values as an array; it is called only when
    two stored tensors claim one module name (a layout the exporter does not write), to refuse them
    unless they are equal.
    """
    check_origin(layout)
    path = layout.path
    named = {name: name for name, dtype in layout.dtypes.items()
             if not name.startswith(ANONYMOUS) and dtype not in INTEGER}
    stored_named = set(named)
    for output in layout.identity:
        if not output.startswith(ANONYMOUS):
            stored = layout.resolve(output)
            if stored in stored_named:
                named[output] = stored
    for name, stored in named.items():
        check_float32(path, name, layout.dtypes[stored])

    linear: dict[str, list[str]] = {}
    roots: dict[str, list[str]] = {}  # `scope.weight` -> the stored tensors its MatMuls read, in order
    for node in layout.nodes:
        if node.op_type != "MatMul" or len(node.inputs) != 2:
            continue
        stored = layout.resolve(node.inputs[1])
        if stored not in layout.dtypes or not stored.startswith(ANONYMOUS):
            continue
        scope = module_scope(node.name)
        if scope is None:
            raise GraphError(
                f"{path}: the weight {stored!r} is consumed by node {node.name!r}, whose name carries no "
                "module scope, so the weight's module cannot be named (the TorchScript exporter names it "
                f"like /model/encoder/layer.0/attention/self/query/MatMul). {REEXPORT}")
        name = scope + ".weight"
        check_float32(path, name, layout.dtypes[stored])
        linear.setdefault(name, []).append(node.inputs[1])
        if stored not in roots.setdefault(name, []):
            roots[name].append(stored)
    for name, stored in roots.items():
        # Two MatMuls of one module reading different tensors, or a module name also stored under
        # its own name: allowed only when the values are equal.
        if len(stored) > 1 or name in named:
            values = [read(s).T for s in sorted(stored)]
            if name in named:
                values.append(read(named[name]))
            if any(not np.array_equal(v, values[0]) for v in values[1:]):
                raise GraphError(f"{path}: two different weights claim the module name {name!r}; the graph "
                                 "does not follow the exporter's one-MatMul-per-Linear pattern")
    return WeightNames(named, linear, {name: stored[-1] for name, stored in roots.items()})


def table_prefix(path: Path, names: Iterable[str]) -> str:
    """The wrapper's prefix (`model.`, `model.bert.` ...) before every Hugging Face name: what comes
    before the one token embedding table."""
    prefixes = {m.group(1) for name in names if (m := TOKEN_TABLE.match(name))}
    if len(prefixes) != 1:
        raise GraphError(f"{path}: expected one token embedding table (…embeddings.word_embeddings or "
                         f"…embeddings.tok_embeddings), found {len(prefixes)}")
    return prefixes.pop()


# The tagging head a written pipeline graph carries (`onnx.head`), named here with the export's own
# weights: its linear weight is stored [in, out] = [width, tags], as the exporter stores every MatMul
# weight (the transpose of nn.Linear's), and its bias [tags]. No exported encoder uses the prefix.
HEAD_WEIGHT = "tagger.head.weight"
HEAD_BIAS = "tagger.head.bias"

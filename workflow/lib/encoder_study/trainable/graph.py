"""Weights and a few constants read back from an ONNX graph written by PyTorch's TorchScript exporter.

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
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import UserError

ANONYMOUS = "onnx::"  # prefix of the TorchScript exporter's unnamed values
REEXPORT = ("Export the model again with encoder_study.export (torch.onnx.export(..., dynamo=False, "
            "do_constant_folding=True) on a module that wraps the Hugging Face model).")


class GraphError(UserError, ValueError):
    """The graph cannot be read by these rules; the message says why and what to do."""


def module_scope(node_name: str) -> str | None:
    """`/model/encoder/layer.0/attention/self/query/MatMul` -> `model.encoder.layer.0.attention.self.query`.

    None for a node name without a scope (`MatMul_7`, dynamo's `node_linear`).
    """
    if not node_name.startswith("/"):
        return None
    parts = node_name.strip("/").split("/")
    return ".".join(parts[:-1]) or None


class Graph:
    """An ONNX graph from the TorchScript exporter, indexed for reading weights and constants."""

    def __init__(self, path: str | os.PathLike):
        import onnx

        self.path = Path(path)
        try:
            # External data is never followed: the check below refuses it before any byte is read.
            self.model = onnx.load(str(self.path), load_external_data=False)
        except Exception as err:  # protobuf raises several types for a file that is not ONNX
            raise GraphError(f"{self.path}: not a readable ONNX file ({err})") from err
        graph = self.model.graph
        self.initializers = {t.name: t for t in graph.initializer}
        self.nodes = list(graph.node)
        self.producer = {out: node for node in self.nodes for out in node.output}
        self.consumers: dict[str, list] = {}
        for node in self.nodes:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self._check_origin()

    # -- refusals -----------------------------------------------------------------------------------
    def _check_origin(self) -> None:
        from onnx import TensorProto

        external = [t.name for t in self.model.graph.initializer if t.data_location == TensorProto.EXTERNAL]
        if external:
            raise GraphError(
                f"{self.path}: {len(external)} initializers (e.g. {external[0]!r}) live in external data "
                "files. Their bytes are outside the graph file, so the export's SHA-256 in export.json does "
                "not cover them and they could change unnoticed; this loader reads single-file graphs only. "
                "Merge them into one file with onnx.save(onnx.load(path), out_path, "
                f"save_as_external_data=False) (graphs under 2 GiB). {REEXPORT}")
        producer = self.model.producer_name
        if producer != "pytorch":
            raise GraphError(
                f"{self.path}: written by {producer or 'an unnamed producer'!r}, not by PyTorch's "
                "TorchScript exporter; weight names are recovered from that exporter's node scopes, "
                f"which other tools do not keep. {REEXPORT}")
        if not any(node.name.startswith("/") for node in self.nodes):
            dynamo = any(p.key.startswith("pkg.torch") for node in self.nodes for p in node.metadata_props)
            dynamo = dynamo or any(o.domain.startswith("pkg.onnxscript") for o in self.model.opset_import)
            how = ("it looks like a dynamo export (torch.onnx.export(..., dynamo=True)), whose node names "
                   "carry no module scopes" if dynamo else
                   "no node name carries a module scope such as /model/encoder/layer.0/...")
            raise GraphError(f"{self.path}: not a TorchScript export: {how}. {REEXPORT}")

    # -- values -------------------------------------------------------------------------------------
    def resolve(self, name: str) -> str:
        """Follow `Identity` nodes (the exporter's stand-ins for equal tensors) back to the stored name."""
        seen = set()
        while name not in self.initializers and name in self.producer:
            node = self.producer[name]
            if node.op_type != "Identity" or name in seen:
                break
            seen.add(name)
            name = node.input[0]
        return name

    def constant(self, name: str) -> np.ndarray | None:
        """The value of `name` when it is an initializer or a `Constant` node's output, else None."""
        from onnx import numpy_helper

        name = self.resolve(name)
        if name in self.initializers:
            return numpy_helper.to_array(self.initializers[name])
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    return numpy_helper.to_array(attr.t)
        return None

    def _float32(self, name: str, stored: str) -> np.ndarray:
        from onnx import TensorProto, numpy_helper

        tensor = self.initializers[stored]
        if tensor.data_type != TensorProto.FLOAT:
            kind = TensorProto.DataType.Name(tensor.data_type).lower()
            raise GraphError(f"{self.path}: {name} is stored as {kind}; the trainable modules read float32 "
                             "graphs: export the model in float32")
        return numpy_helper.to_array(tensor)

    def weights(self) -> dict[str, np.ndarray]:
        """Every float32 parameter under its module name, linear weights in torch's [out, in] layout.

        Names shared through `Identity` map to the same array; callers copy before training so that
        weights that merely started equal do not stay tied.
        """
        from onnx import TensorProto

        integer = {TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL}  # buffers, not parameters
        named: dict[str, str] = {}  # module name -> stored initializer
        for name, tensor in self.initializers.items():
            if not name.startswith(ANONYMOUS) and tensor.data_type not in integer:
                named[name] = name
        for node in self.nodes:
            if node.op_type == "Identity" and not node.output[0].startswith(ANONYMOUS):
                stored = self.resolve(node.output[0])
                if stored in named.values():
                    named[node.output[0]] = stored
        arrays: dict[str, np.ndarray] = {}  # one array per stored tensor
        out = {}
        for name, stored in named.items():
            if stored not in arrays:
                arrays[stored] = self._float32(name, stored)
            out[name] = arrays[stored]

        for node in self.nodes:
            if node.op_type != "MatMul" or len(node.input) != 2:
                continue
            stored = self.resolve(node.input[1])
            if stored not in self.initializers or not stored.startswith(ANONYMOUS):
                continue
            scope = module_scope(node.name)
            if scope is None:
                raise GraphError(
                    f"{self.path}: the weight {stored!r} is consumed by node {node.name!r}, whose name "
                    "carries no module scope, so the weight's module cannot be named (the TorchScript "
                    f"exporter names it like /model/encoder/layer.0/attention/self/query/MatMul). {REEXPORT}")
            name = scope + ".weight"
            # Stored [in, out] for MatMul; nn.Linear keeps [out, in].
            weight = np.ascontiguousarray(self._float32(name, stored).T)
            if name in out and not np.array_equal(out[name], weight):
                raise GraphError(f"{self.path}: two different weights claim the module name {name!r}; "
                                 "the graph does not follow the exporter's one-MatMul-per-Linear pattern")
            out[name] = weight
        return out

    def norm_epsilons(self) -> dict[str, float]:
        """Module scope -> epsilon of each layer norm.

        Opset 17 writes a `LayerNormalization` node: its `epsilon` attribute, or ONNX's default 1e-5
        when the exporter left the attribute out because it equals the default. Older opsets write the
        decomposition `(x - mean) / Sqrt(var + eps)`: the constant added just before the `Sqrt`.
        """
        out: dict[str, float] = {}
        for node in self.nodes:
            scope = module_scope(node.name)
            if scope is None:
                continue
            if node.op_type == "LayerNormalization":
                eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
                out[scope] = _shortest_float32(eps)
            elif node.op_type == "Sqrt":
                add = self.producer.get(node.input[0])
                if add is None or add.op_type != "Add":
                    continue
                for name in add.input:
                    value = self.constant(name)
                    if value is not None and value.size == 1 and value.dtype.kind == "f":
                        out[scope] = _shortest_float32(float(value.reshape(())))
        return out

    def float_constants(self, scope_part: str) -> list[tuple[str, np.ndarray]]:
        """(node name, value) of every float `Constant` node whose scope contains `scope_part`."""
        found = []
        for node in self.nodes:
            if node.op_type == "Constant" and scope_part in node.name:
                value = self.constant(node.output[0])
                if value is not None and value.dtype.kind == "f":
                    found.append((node.name, value))
        return found

    def upstream(self, name: str, limit: int = 64) -> list:
        """Nodes that compute `name`, nearest first (breadth-first, at most `limit`)."""
        out, queue, seen = [], [name], {name}
        while queue and len(out) < limit:
            node = self.producer.get(queue.pop(0))
            if node is None:
                continue
            out.append(node)
            for value in node.input:
                if value and value not in seen:
                    seen.add(value)
                    queue.append(value)
        return out


def _shortest_float32(value: float) -> float:
    """The decimal a float32 attribute was written from (9.99999996e-13 -> 1e-12), as PyTorch had it."""
    return float(str(np.float32(value)))


def read_weights(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Module name -> float32 array of every parameter in a TorchScript-exported graph."""
    return Graph(path).weights()

"""Weights and a few constants read back from an ONNX graph written by PyTorch's TorchScript exporter.

The graph is loaded whole with onnx; its weights are named by the exporter's rules, which
`encoder_study.onnx.names` owns (read there what such a graph looks like and what is refused).
Besides the weights, the trainable modules read a few constants the export traced (layer-norm
epsilons, position schemes, rotary tables) through this class.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ...onnx import names
from ...onnx.names import ANONYMOUS, REEXPORT, GraphError, module_scope

__all__ = ["ANONYMOUS", "REEXPORT", "Graph", "GraphError", "module_scope", "read_weights"]


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
        self._refuse_external()
        scoped = any(node.name.startswith("/") for node in self.nodes)
        self.layout = names.Layout(
            self.path, self.model.producer_name, {t.name: t.data_type for t in graph.initializer},
            [names.Node(n.op_type, n.name, list(n.input), list(n.output)) for n in self.nodes
             if n.op_type in ("Identity", "MatMul")],
            scoped, dynamo=not scoped and self._looks_dynamo())
        names.check_origin(self.layout)

    # -- refusals -----------------------------------------------------------------------------------
    def _refuse_external(self) -> None:
        from onnx import TensorProto

        external = [t.name for t in self.model.graph.initializer if t.data_location == TensorProto.EXTERNAL]
        if external:
            raise GraphError(
                f"{self.path}: {len(external)} initializers (e.g. {external[0]!r}) live in external data "
                "files. Their bytes are outside the graph file, so the export's SHA-256 in export.json does "
                "not cover them and they could change unnoticed; this loader reads single-file graphs only. "
                "Merge them into one file with onnx.save(onnx.load(path), out_path, "
                f"save_as_external_data=False) (graphs under 2 GiB). {REEXPORT}")

    def _looks_dynamo(self) -> bool:
        """Whether the graph carries the dynamo exporter's marks (for the refusal's wording only)."""
        if any(p.key.startswith("pkg.torch") for node in self.nodes for p in node.metadata_props):
            return True
        return any(o.domain.startswith("pkg.onnxscript") for o in self.model.opset_import)

    # -- values -------------------------------------------------------------------------------------
    def resolve(self, name: str) -> str:
        """Follow `Identity` nodes (the exporter's stand-ins for equal tensors) back to the stored name."""
        return self.layout.resolve(name)

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

    def weights(self) -> dict[str, np.ndarray]:
        """Every float32 parameter under its module name (`names.weight_names`), linear weights in
        torch's [out, in] layout.

        Names shared through `Identity` map to the same array; callers copy before training so that
        weights that merely started equal do not stay tied.
        """
        from onnx import numpy_helper

        arrays: dict[str, np.ndarray] = {}  # one array per stored tensor

        def read(stored: str) -> np.ndarray:
            if stored not in arrays:
                arrays[stored] = numpy_helper.to_array(self.initializers[stored])
            return arrays[stored]

        found = names.weight_names(self.layout, read)
        out = {name: read(stored) for name, stored in found.named.items()}
        for name, stored in found.linear_stored.items():  # stored [in, out] for MatMul; nn.Linear [out, in]
            out[name] = np.ascontiguousarray(read(stored).T)
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

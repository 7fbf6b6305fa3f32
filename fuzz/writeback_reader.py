"""Fuzz target: arbitrary bytes as an ONNX file given to the write-back patcher (`encoder_study.onnx.patch`).

    python fuzz/writeback_reader.py --make-seeds fuzz/corpus      # a small seed corpus
    python fuzz/writeback_reader.py fuzz/corpus -runs=2000 -seed=1 -max_len=4096

Every input is written to a file and patched; the first byte picks what is asked of the patcher:
nothing, every float32 tensor with its own values, every one changed, or only the Identity names
changed. The contract: `patch` returns a result or raises `WritebackError`. Anything else (another
exception, a hang, a crash) is a finding, and so is a broken promise on success: asked for unchanged
values, the output must be the input's bytes; the output's size must be the one reported; no
temporary file may be left behind. See fuzz/README.md.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["encoder_study.onnx.patch"]):
    from encoder_study.onnx import patch

import numpy as np

MODES = ("none", "same", "changed", "identity")
WORK = Path(tempfile.mkdtemp(prefix="writeback-fuzz-"))
SRC, DST = WORK / "src.onnx", WORK / "dst.onnx"


def _replacements(path: Path, mode: str) -> dict[str, np.ndarray]:
    """What to ask of the patcher, read with the patcher's own reader (it may refuse the file too)."""
    if mode == "none":
        return {}
    with patch.StreamedGraph(path) as graph:  # refuses external data, as `patch` does
        layout = graph.layout
        values = {name: graph.value(name) for name, dtype in layout.dtypes.items() if dtype == patch.FLOAT}
    if mode == "same":
        return values
    with np.errstate(all="ignore"):  # the values are whatever bytes the input holds: NaN, infinities
        if mode == "changed":
            return {name: value + np.float32(1) for name, value in values.items()}
        aliases = {out: stored for out, stored in layout.identity.items() if stored in values}
        return {out: values[stored] + np.float32(2) for out, stored in aliases.items()}


def one_input(data: bytes) -> None:
    if not data:
        return
    mode, body = MODES[data[0] % len(MODES)], data[1:]
    SRC.write_bytes(body)
    DST.unlink(missing_ok=True)
    try:
        replacements = _replacements(SRC, mode)
        report = patch.patch(SRC, DST, replacements)
    except patch.WritebackError:
        left = sorted(p.name for p in WORK.iterdir())
        assert left == ["src.onnx"], f"a refusal left files behind: {left}"
        return
    written = DST.read_bytes()
    assert len(written) == report.bytes_written, (len(written), report.bytes_written)
    if mode in ("none", "same"):
        assert written == body, f"mode {mode}: the output differs from the input"
        assert not report.rewritten and not report.materialized
    assert sorted(p.name for p in WORK.iterdir()) == ["dst.onnx", "src.onnx"]


def make_seeds(directory: str | os.PathLike) -> list[Path]:
    """A few small, valid graphs: raw_data and float_data weights, an int64 tensor, Identity names."""
    from onnx import TensorProto, helper, numpy_helper

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w")
    b = helper.make_tensor("b", TensorProto.FLOAT, [3], [0.5, -1.0, 2.0])  # stored as float_data
    shape = numpy_helper.from_array(np.array([1, 3], dtype=np.int64), "shape")
    nodes = [helper.make_node("Identity", ["w"], ["w_alias"]),
             helper.make_node("Identity", ["b"], ["layer.0.bias"]),
             helper.make_node("MatMul", ["x", "w_alias"], ["h"], name="/m/layer.0/MatMul"),
             helper.make_node("Add", ["h", "layer.0.bias"], ["y0"]),
             helper.make_node("Reshape", ["y0", "shape"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
                              initializer=[w, b, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="pytorch")
    data = model.SerializeToString()
    seeds = []
    for i, mode in enumerate(MODES):
        path = directory / f"seed-{mode}"
        path.write_bytes(bytes([i]) + data)
        seeds.append(path)
    return seeds


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--make-seeds":
        print("\n".join(str(p) for p in make_seeds(sys.argv[2])))
        sys.exit(0)
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()

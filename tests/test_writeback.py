"""Fine-tuned weights written back into the ONNX graph: byte identity, parity with the modules in ONNX
Runtime, Identity-named tensors, and every refusal leaving nothing behind."""

from __future__ import annotations

import shutil
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper

from conftest import TINY
from encoder_study.encoders import reference, trainable
from encoder_study.onnx import manifest, names, patch, runtime
from encoder_study.onnx.patch import WritebackError
from encoder_study.recipes import writeback

FAMILIES = [*TINY, "minilm"]  # the tiny families and a real pretrained BERT


def graph_path(exports, name):
    return exports[name] / manifest.ONNX_FILE


def perturbed(path, seed=1, tokens=True):
    """The encoder of `path` with every weight moved a little, as a fine-tune would."""
    encoder = trainable.load(path)
    encoder.embeddings_frozen = not tokens
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in encoder.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    return encoder


def inputs(seed=3):
    ids = torch.randint(5, 1000, (3, 24), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[1, 17:], mask[2, 6:] = 0, 0
    return ids, mask


def max_abs_against_ort(encoder, onnx_path):
    ids, mask = inputs()
    with torch.no_grad():
        ours = encoder(ids, mask).numpy()
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    theirs = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
    return float(np.abs(ours - theirs)[mask.numpy().astype(bool)].max())


def only(directory, *names):
    """Nothing in `directory` but `names` (no output, no temporary file)."""
    return sorted(p.name for p in directory.iterdir()) == sorted(names)


@pytest.mark.parametrize("name", FAMILIES)
def test_unchanged_weights_give_the_same_bytes(exports, tmp_path, name):
    src = graph_path(exports, name)
    encoder = trainable.load(src)
    encoder.embeddings_frozen = False  # the token table too
    replacements = writeback.module_weights_to_graph(encoder, src)
    report = patch.patch(src, tmp_path / "out.onnx", replacements)
    assert (tmp_path / "out.onnx").read_bytes() == src.read_bytes()
    assert not report.rewritten and not report.materialized
    # The graph's own arrays under their own names: also the same bytes.
    model = onnx.load(str(src))
    every = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if t.data_type == 1}
    patch.patch(src, tmp_path / "again.onnx", every)
    assert (tmp_path / "again.onnx").read_bytes() == src.read_bytes()


@pytest.mark.parametrize("name", FAMILIES)
def test_perturbed_weights_give_the_modules_states(exports, tmp_path, name):
    src = graph_path(exports, name)
    encoder = perturbed(src)
    replacements = writeback.module_weights_to_graph(encoder, src)
    out = tmp_path / "out.onnx"
    report = patch.patch(src, out, replacements)
    assert report.rewritten and not report.unchanged
    assert any(n.endswith(("word_embeddings.weight", "tok_embeddings.weight")) for n in report.rewritten)
    max_abs = max_abs_against_ort(encoder, out)
    print(f"{name}: ONNX Runtime on the written graph vs modules, max abs {max_abs:.3g}")
    assert max_abs < 1e-5
    onnx.checker.check_model(str(out), full_check=True)

    # Only the replaced tensors differ; everything else in the graph is as it was.
    before, after = onnx.load(str(src)), onnx.load(str(out))
    assert list(before.graph.node) == list(after.graph.node)
    old = {t.name: t for t in before.graph.initializer}
    new = {t.name: t for t in after.graph.initializer}
    assert list(old) == list(new)
    for key, tensor in new.items():
        if key in replacements:
            assert np.array_equal(numpy_helper.to_array(tensor), replacements[key])
        else:
            assert tensor == old[key]
    for part in ("input", "output", "value_info"):
        assert list(getattr(before.graph, part)) == list(getattr(after.graph, part))
    before.graph.ClearField("initializer")
    after.graph.ClearField("initializer")
    assert before == after
    if name != "modernbert-tiny":  # BERT family: positions folded, token types zeroed
        types = numpy_helper.to_array(new["model.embeddings.token_type_embeddings.weight"])
        assert not types.any()


@pytest.mark.parametrize("name", FAMILIES)
def test_weights_to_graph_never_loads_the_graph(exports, tmp_path, monkeypatch, name):
    """Names come from the patcher's streaming index: the graph is never parsed whole (the study's are
    over 1 GB), and the only values read are the BERT family's position and token-type tables."""
    src = graph_path(exports, name)
    encoder = perturbed(src)
    given_a_graph = writeback.module_weights_to_graph(encoder, trainable.Graph(src))

    def refuse(*args, **kwargs):
        raise AssertionError("module_weights_to_graph loaded the whole graph")

    for load in ("load", "load_model", "load_from_string", "load_model_from_string"):
        monkeypatch.setattr(onnx, load, refuse)
    read, old_value = [], patch.StreamedGraph.value

    def counted(graph, stored):
        read.append(stored)
        return old_value(graph, stored)

    monkeypatch.setattr(patch.StreamedGraph, "value", counted)
    replacements = writeback.module_weights_to_graph(encoder, src.parent)
    report = patch.patch(src, tmp_path / "out.onnx", replacements)
    monkeypatch.undo()

    tables = {"model.embeddings.position_embeddings.weight", "model.embeddings.token_type_embeddings.weight"}
    assert set(read) <= (set() if name == "modernbert-tiny" else tables)
    assert replacements.keys() == given_a_graph.keys()
    assert all(np.array_equal(replacements[k], given_a_graph[k]) for k in replacements)
    assert report.rewritten
    assert max_abs_against_ort(encoder, tmp_path / "out.onnx") < 1e-5


@pytest.mark.parametrize("name", FAMILIES)
def test_both_readers_name_the_weights_alike(exports, name):
    """The loaded graph (trainable.Graph) and the streamed one describe the graph alike, so the one set
    of naming rules (onnx.names) gives both the same names."""
    src = graph_path(exports, name)
    loaded = trainable.Graph(src)
    with patch.StreamedGraph(src) as streamed:
        assert streamed.layout == loaded.layout
        found = names.weight_names(streamed.layout, streamed.value)
    assert found == names.weight_names(loaded.layout, lambda stored: numpy_helper.to_array(
        loaded.initializers[stored]))
    assert set(loaded.weights()) == set(found.named) | set(found.linear)


def test_linear_weights_go_back_in_in_out_layout(tiny_exports):
    src = graph_path(tiny_exports, "bert-tiny")
    encoder = trainable.load(src)
    replacements = writeback.module_weights_to_graph(encoder, src)
    query = encoder.layers[0].query.weight.detach().numpy()
    graph = trainable.Graph(src)
    node = next(n for n in graph.nodes if n.name == "/model/encoder/layer.0/attention/self/query/MatMul")
    assert np.array_equal(replacements[node.input[1]], query.T)
    assert "model.embeddings.word_embeddings.weight" not in replacements  # frozen table: left as it is


def _export_fresh(models_dir, tmp_path):
    """A freshly initialised bert-tiny: its zero biases and unit norms are stored once and named
    through Identity nodes by the TorchScript exporter."""
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(0)
    source, _ = reference.source_dir(models_dir / "sources" / "bert-tiny" / "source.json")
    config = AutoConfig.from_pretrained(source)
    model = AutoModel.from_config(config, attn_implementation="eager").eval()
    ids, mask = inputs()
    path = tmp_path / "fresh" / "model.onnx"
    path.parent.mkdir()
    with torch.no_grad():
        torch.onnx.export(reference.HiddenStates(model).eval(), (ids, mask), path, dynamo=False,
                          opset_version=17, do_constant_folding=True, input_names=list(runtime.INPUTS),
                          output_names=[runtime.OUTPUT], dynamic_axes=runtime.DYNAMIC_AXES)
    (path.parent / manifest.CONFIG_FILE).write_text(config.to_json_string())
    return path


@pytest.fixture(scope="module")
def fresh(tiny_exports, models_dir, tmp_path_factory):
    return _export_fresh(models_dir, tmp_path_factory.mktemp("fresh"))


def test_identity_names_become_initializers(fresh, tmp_path):
    model = onnx.load(str(fresh))
    identities = [n for n in model.graph.node if n.op_type == "Identity"]
    assert identities and any(not n.output[0].startswith("onnx::") for n in identities)
    encoder = perturbed(fresh)
    replacements = writeback.module_weights_to_graph(encoder, fresh)
    out = tmp_path / "out.onnx"
    report = patch.patch(fresh, out, replacements)
    assert report.materialized
    assert max_abs_against_ort(encoder, out) < 1e-5
    onnx.checker.check_model(str(out), full_check=True)
    written = onnx.load(str(out))
    dropped = set(report.materialized)
    kept = [n for n in model.graph.node if not (n.op_type == "Identity" and n.output[0] in dropped)]
    assert list(written.graph.node) == kept
    names = {t.name for t in written.graph.initializer}
    assert set(report.materialized) <= names

    # Unchanged weights, Identity names included, still give the same bytes.
    same = writeback.module_weights_to_graph(trainable.load(fresh), fresh)
    assert any(name in {n.output[0] for n in identities} for name in same)
    patch.patch(fresh, tmp_path / "same.onnx", same)
    assert (tmp_path / "same.onnx").read_bytes() == fresh.read_bytes()


def test_one_identity_name_alone(fresh, tmp_path):
    """Replacing one name of a shared tensor gives it its own initializer; the others keep the old value."""
    model = onnx.load(str(fresh))
    node = next(n for n in model.graph.node if n.op_type == "Identity" and n.output[0].endswith(".bias"))
    stored = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == node.input[0]))
    value = np.full_like(stored, 0.25)
    out = tmp_path / "out.onnx"
    report = patch.patch(fresh, out, {node.output[0]: value})
    assert report.materialized == [node.output[0]]
    written = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(out)).graph.initializer}
    assert np.array_equal(written[node.output[0]], value)
    assert np.array_equal(written[node.input[0]], stored)


def test_refuses_a_shared_tensor_read_under_a_name_not_replaced(fresh, tmp_path):
    model = onnx.load(str(fresh))
    node = next(n for n in model.graph.node if n.op_type == "Identity" and n.output[0].endswith(".bias"))
    stored = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == node.input[0]))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(WritebackError, match=r"reads the same stored tensor.*give .* a value too"):
        patch.patch(fresh, out_dir / "out.onnx", {node.input[0]: stored + 1})
    assert only(out_dir)


# -- refusals -------------------------------------------------------------------------------------

def refused(src, replacements, tmp_path, match):
    out_dir = tmp_path / "out"
    out_dir.mkdir(exist_ok=True)
    with pytest.raises(WritebackError, match=match):
        patch.patch(src, out_dir / "out.onnx", replacements)
    assert only(out_dir), "a refusal left a file behind"


@pytest.fixture
def bert(tiny_exports, tmp_path):
    src = graph_path(tiny_exports, "bert-tiny")
    return src, {t.name: numpy_helper.to_array(t) for t in onnx.load(str(src)).graph.initializer}


BIAS = "model.encoder.layer.0.attention.self.query.bias"


@pytest.mark.parametrize("fraction", [0.0001, 0.01, 0.3, 0.5, 0.9, 0.9999])
def test_refuses_a_truncated_file(bert, tmp_path, fraction):
    src, arrays = bert
    data = src.read_bytes()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(data[:max(1, int(len(data) * fraction))])
    refused(cut, {BIAS: arrays[BIAS] + 1}, tmp_path, f"{cut}: not a well-formed ONNX file")


def test_refuses_a_length_past_its_parent(bert, tmp_path):
    src, arrays = bert
    data = src.read_bytes()
    table = arrays["model.embeddings.word_embeddings.weight"]
    header = b"\x4a" + patch._encode_varint(table.nbytes)  # raw_data (field 9) of the token table
    at = data.index(header)
    longer = b"\x4a" + patch._encode_varint(table.nbytes + 1000)
    assert len(longer) == len(header)  # still inside the file, past its tensor
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(data[:at] + longer + data[at + len(header):])
    refused(bad, {BIAS: arrays[BIAS] + 1}, tmp_path, "are left in its message")


def test_refuses_garbage_and_huge_names(bert, tmp_path):
    src, arrays = bert
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(bytes(range(256)) * 8)
    refused(garbage, {BIAS: arrays[BIAS]}, tmp_path, "not a well-formed ONNX file")
    model = onnx.load(str(src))
    model.graph.initializer[5].name = "x" * 5000
    huge = tmp_path / "huge.onnx"
    onnx.save(model, huge)
    refused(huge, {BIAS: arrays[BIAS]}, tmp_path, "more than 4096")


def test_refuses_external_data(bert, tmp_path):
    src, arrays = bert
    model = onnx.load(str(src))
    ext = tmp_path / "ext.onnx"
    onnx.save(model, ext, save_as_external_data=True, location="ext.onnx.data", size_threshold=0)
    refused(ext, {BIAS: arrays[BIAS] + 1}, tmp_path, r"external data.*save_as_external_data=False")


def test_refuses_non_float32(bert, tmp_path):
    src, arrays = bert
    model = onnx.load(str(src))
    index = next(i for i, t in enumerate(model.graph.initializer) if t.name == BIAS)
    model.graph.initializer[index].CopyFrom(numpy_helper.from_array(arrays[BIAS].astype(np.float16), BIAS))
    half = tmp_path / "half.onnx"
    onnx.save(model, half)
    refused(half, {BIAS: arrays[BIAS] + 1}, tmp_path, "not float32")
    refused(src, {BIAS: (arrays[BIAS] + 1).astype(np.float64)}, tmp_path, "give float32 arrays")


def test_refuses_wrong_shapes_and_unknown_names(bert, tmp_path):
    src, arrays = bert
    refused(src, {BIAS: np.zeros(17, np.float32)}, tmp_path, r"has shape \[17\], the graph's is \[16\]")
    refused(src, {"model.no.such.weight": arrays[BIAS]}, tmp_path, "neither an initializer nor an Identity")


def test_refuses_a_result_over_the_limit(bert, tmp_path, monkeypatch):
    src, arrays = bert
    monkeypatch.setattr(patch, "MAX_OUTPUT", src.stat().st_size - 1)
    refused(src, {BIAS: arrays[BIAS] + 1}, tmp_path, "over protobuf's 2 GiB limit")


def test_float_data_is_rewritten_as_raw_data(bert, tmp_path):
    src, arrays = bert
    model = onnx.load(str(src))
    tensor = next(t for t in model.graph.initializer if t.name == BIAS)
    tensor.ClearField("raw_data")
    tensor.float_data.extend(arrays[BIAS].tolist())
    stored = tmp_path / "floats.onnx"
    onnx.save(model, stored)
    patch.patch(stored, tmp_path / "same.onnx", {BIAS: arrays[BIAS]})
    assert (tmp_path / "same.onnx").read_bytes() == stored.read_bytes()
    report = patch.patch(stored, tmp_path / "out.onnx", {BIAS: arrays[BIAS] + 1})
    assert report.from_float_data == [BIAS]
    written = next(t for t in onnx.load(str(tmp_path / "out.onnx")).graph.initializer if t.name == BIAS)
    assert not written.float_data and np.array_equal(numpy_helper.to_array(written), arrays[BIAS] + 1)


def test_failed_patch_keeps_an_existing_output(bert, tmp_path):
    src, arrays = bert
    out = tmp_path / "out.onnx"
    shutil.copy(src, out)
    with pytest.raises(WritebackError):
        patch.patch(src, out, {BIAS: np.zeros(3, np.float32)})
    assert out.read_bytes() == src.read_bytes()
    assert only(tmp_path, "out.onnx")


# -- hostile files ----------------------------------------------------------------------------------------

def _swap(data: bytes, old: bytes, new: bytes) -> bytes:
    """`data` with the one occurrence of `old` replaced by `new` of the same length (offsets all kept)."""
    assert len(old) == len(new) and data.count(old) == 1
    return data.replace(old, new)


def test_refuses_nested_garbage(bert, tmp_path):
    """Every length is right, the garbage is inside: in a tensor's name field, in a node, in a data field."""
    src, arrays = bert
    data = src.read_bytes()
    name_field = b"\x42" + patch._encode_varint(len(BIAS)) + BIAS.encode()  # TensorProto.name (8)
    bad = tmp_path / "tensor.onnx"
    bad.write_bytes(_swap(data, name_field, b"\x47" + name_field[1:]))  # wire type 7 does not exist
    refused(bad, {BIAS: arrays[BIAS] + 1}, tmp_path, "wire type 7")

    node = next(n for n in onnx.load(str(src)).graph.node if n.op_type == "MatMul")
    named = b"\x1a" + patch._encode_varint(len(node.name)) + node.name.encode()  # NodeProto.name (3)
    op_field = named + b"\x22\x06MatMul"  # then op_type (4), here given wire type 6
    bad.write_bytes(_swap(data, op_field, named + b"\x26" + op_field[len(named) + 1:]))
    refused(bad, {BIAS: arrays[BIAS] + 1}, tmp_path, "wire type 6")

    raw = arrays[BIAS].tobytes()
    raw_field = b"\x4a" + patch._encode_varint(len(raw)) + raw
    # raw_data as a varint (0), then unknown varint fields (number 20) that keep every length.
    filler = len(raw_field) - 2
    unknown = b"\xa0\x01\x00" * (filler // 3 - 1) + {3: b"\xa0\x01\x00", 4: b"\xa0\x01\x80\x00",
                                                     5: b"\xa0\x01\x80\x80\x00"}[3 + filler % 3]
    bad.write_bytes(_swap(data, raw_field, b"\x48\x05" + unknown))
    refused(bad, {BIAS: arrays[BIAS] + 1}, tmp_path, "data field 9 .* wire type 0")


@pytest.mark.parametrize("data, match", [
    (b"\x80" * 11, "runs past its message or past 10 bytes"),
    (b"\x02\x00", "field number 0"),
    (b"\x3a\xff\xff\xff\xff\x0f", "needs 4294967301 bytes"),  # a graph of 4 GiB in a 6-byte file
    (b"\x3a\x00", "no opset_import"),
    (b"\x38\x01\x42\x00", "the graph at byte 0 has wire type 0"),
])
def test_refuses_broken_framing(tmp_path, data, match):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(data)
    refused(bad, {}, tmp_path, match)


def test_field_and_node_limits(bert, fresh, tmp_path, monkeypatch):
    src, arrays = bert
    monkeypatch.setattr(patch, "MAX_FIELDS", 10)
    refused(src, {BIAS: arrays[BIAS] + 1}, tmp_path, "more than 10 fields")
    monkeypatch.undo()
    # Nodes over MAX_NODE are copied, never parsed: their Identity names are then unknown, stored names work.
    identity = next(n for n in onnx.load(str(fresh)).graph.node if n.op_type == "Identity")
    monkeypatch.setattr(patch, "MAX_NODE", 4)
    stored = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(fresh)).graph.initializer}
    refused(fresh, {identity.output[0]: stored[identity.input[0]]}, tmp_path, "neither an initializer")
    patch.patch(fresh, tmp_path / "same.onnx", {identity.input[0]: stored[identity.input[0]]})
    assert (tmp_path / "same.onnx").read_bytes() == fresh.read_bytes()


def _identity_graph(path, nodes, value):
    from onnx import TensorProto, helper

    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                              initializer=[numpy_helper.from_array(value, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_identity_cycles_and_long_chains(tmp_path):
    from onnx import helper

    value = np.array([1.0, 2.0], np.float32)
    cycle = _identity_graph(tmp_path / "cycle.onnx", [helper.make_node("Identity", ["b"], ["a"]),
                                                      helper.make_node("Identity", ["a"], ["b"])], value)
    refused(cycle, {"a": value}, tmp_path, "'a' is neither an initializer nor an Identity of one")
    patch.patch(cycle, tmp_path / "w.onnx", {"w": value + 1})  # the cycle reads no weight

    n = 2 * sys.getrecursionlimit()  # longer than Python's recursion limit
    nodes = [helper.make_node("Identity", [f"a{i - 1}" if i else "w"], [f"a{i}"]) for i in range(n)]
    chain = _identity_graph(tmp_path / "chain.onnx", nodes, value)
    refused(chain, {"w": value + 1}, tmp_path, "'a0' reads the same stored tensor 'w'")
    report = patch.patch(chain, tmp_path / "end.onnx", {f"a{n - 1}": value + 1})
    assert report.materialized == [f"a{n - 1}"]
    patch.patch(chain, tmp_path / "same.onnx", {f"a{n - 1}": value, "a5": value})
    assert (tmp_path / "same.onnx").read_bytes() == chain.read_bytes()


# -- memory: no replaced tensor is ever copied whole ---------------------------------------------------

def test_weights_to_graph_gives_views_of_the_parameters(tiny_exports):
    """The replacements are read-only views of the encoder's own memory (linear weights transposed
    views), not copies: a copy of every replaced tensor, held at once, was half a MiniLM graph."""
    src = graph_path(tiny_exports, "bert-tiny")
    encoder = perturbed(src)
    replacements = writeback.module_weights_to_graph(encoder, src)
    memory = [p.detach().numpy() for p in encoder.parameters()]
    views = {k for k, v in replacements.items() if any(np.shares_memory(v, m) for m in memory)}
    assert views == set(replacements) - {"model.embeddings.token_type_embeddings.weight"}  # zeroed: new
    assert not any(replacements[k].flags.writeable for k in views)
    assert any(not replacements[k].flags.c_contiguous for k in views)  # the transposed linear weights


def _matmul_graph(path, value, doc=""):
    from onnx import TensorProto, helper

    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="/m/MatMul")
    rows, cols = value.shape
    weight = numpy_helper.from_array(value, "w")
    weight.doc_string = doc
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cols])],
                              initializer=[weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.parametrize("chunk", [patch.CHUNK, 4096, 52])  # 52: blocks that split no row evenly
def test_strided_views_are_written_as_their_copies(tmp_path, monkeypatch, chunk):
    """A view written (or compared) a block at a time gives the bytes of its contiguous copy."""
    monkeypatch.setattr(patch, "CHUNK", chunk)
    rng = np.random.default_rng(0)
    stored = rng.standard_normal((96, 40), dtype=np.float32)
    src = _matmul_graph(tmp_path / "w.onnx", stored)
    module = rng.standard_normal((40, 96), dtype=np.float32)  # [out, in], as a torch Linear keeps it
    for i, view in enumerate([module.T, module[:, ::-1].T, np.ascontiguousarray(module.T)]):
        patch.patch(src, tmp_path / f"view{i}.onnx", {"w": view})
        patch.patch(src, tmp_path / f"copy{i}.onnx", {"w": np.ascontiguousarray(view)})
        assert (tmp_path / f"view{i}.onnx").read_bytes() == (tmp_path / f"copy{i}.onnx").read_bytes()
        written = numpy_helper.to_array(onnx.load(str(tmp_path / f"view{i}.onnx")).graph.initializer[0])
        assert np.array_equal(written, view)
    # Compared a block at a time: the stored value given as a view is recognised as unchanged...
    report = patch.patch(src, tmp_path / "same.onnx", {"w": np.ascontiguousarray(stored.T).T})
    assert report.unchanged == ["w"] and (tmp_path / "same.onnx").read_bytes() == src.read_bytes()
    # ...and one bit changed in the last row is not.
    changed = np.ascontiguousarray(stored.T)
    changed.view(np.uint32)[-1, -1] ^= 1
    assert patch.patch(src, tmp_path / "bit.onnx", {"w": changed.T}).rewritten == ["w"]


def test_float_data_in_many_fields_is_compared_across_them(tmp_path, monkeypatch):
    """float_data stored one fixed32 field per value (unpacked): compared across field boundaries."""
    monkeypatch.setattr(patch, "CHUNK", 12)
    value = np.arange(10, dtype=np.float32).reshape(2, 5)
    # Protobuf writes float_data packed; the unpacked form (5 bytes a value, not 4) takes the room of a
    # doc_string (field 12) that follows raw_data, so that no enclosing length changes.
    src = _matmul_graph(tmp_path / "w.onnx", value, doc="d" * 20)
    data = src.read_bytes()
    packed = bytes([0x4A, 40]) + value.tobytes() + bytes([0x62, 20]) + b"d" * 20  # raw_data (9), doc (12)
    unpacked = b"".join(bytes([0x25]) + v.tobytes() for v in value.reshape(-1))  # float_data fixed32 each
    assert data.count(packed) == 1
    floats = tmp_path / "floats.onnx"
    floats.write_bytes(data.replace(packed, unpacked + bytes([0x62, 12]) + b"d" * 12))
    assert np.array_equal(numpy_helper.to_array(onnx.load(str(floats)).graph.initializer[0]), value)
    assert patch.patch(floats, tmp_path / "same.onnx", {"w": value.T.copy().T}).unchanged == ["w"]
    bumped = value.copy()
    bumped[1, 4] += 1
    assert patch.patch(floats, tmp_path / "out.onnx", {"w": bumped.T.copy().T}).rewritten == ["w"]


def test_writing_a_view_never_copies_it_whole(tmp_path):
    """Patching a 16 MiB weight given as a transposed view allocates a few 1 MiB chunks, never a copy of
    the tensor (numpy's and Python's allocations are both traced)."""
    import tracemalloc

    stored = np.zeros((2048, 2048), np.float32)
    src = _matmul_graph(tmp_path / "w.onnx", stored)
    module = np.random.default_rng(0).standard_normal((2048, 2048), dtype=np.float32)
    tracemalloc.start()
    try:
        patch.patch(src, tmp_path / "out.onnx", {"w": module.T})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < module.nbytes / 4, f"patching traced {peak / 2**20:.1f} MiB for a 16 MiB tensor"
    written = numpy_helper.to_array(onnx.load(str(tmp_path / "out.onnx")).graph.initializer[0])
    assert np.array_equal(written, module.T)


# -- the fuzz target ------------------------------------------------------------------------------------

def test_the_fuzz_target_runs_without_a_finding(tmp_path):
    import subprocess
    import sys

    from conftest import ROOT

    try:
        import atheris  # noqa: F401
    except ImportError:
        pytest.fail("the test set-up installs atheris (envs/test.txt); it is missing")
    target = ROOT / "fuzz" / "writeback_reader.py"
    corpus = tmp_path / "corpus"
    subprocess.run([sys.executable, str(target), "--make-seeds", str(corpus)], check=True,
                   capture_output=True)
    result = subprocess.run([sys.executable, str(target), str(corpus), "-runs=2000", "-seed=1",
                             "-max_len=4096", f"-artifact_prefix={tmp_path}/"],
                            capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "Done 2000 runs" in output
    assert not list(tmp_path.glob("crash-*")) and not list(tmp_path.glob("timeout-*"))

"""The trainable encoders rebuilt from exported graphs: parity with Hugging Face, padding, gradients,
checkpoints, and every refusal."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from encoder_study.encoders import reference, trainable
from encoder_study.encoders.trainable import GraphError, modernbert
from encoder_study.encoders.trainable.common import score_bias
from encoder_study.onnx import manifest, runtime
from encoder_study.recipes.export import export

TOLERANCE = {"bert-tiny": 2e-5, "xlmr-tiny": 2e-5, "modernbert-tiny": 2e-5, "minilm": 1e-4}


def hf_model(models_dir, name):
    model_dir, _ = reference.source_dir(models_dir / "sources" / name / "source.json")
    return reference.load_pytorch(model_dir)


def batch(directory, config):
    """Right-padded texts of 48, 32 and 5 pieces (a ModernBERT window is 8), as the export checks."""
    ids, mask = export.check_batch(directory / manifest.TOKENIZER_FILE, config)
    return torch.from_numpy(ids), torch.from_numpy(mask)


def random_ids(batch, seq, seed=0):
    return torch.randint(5, 1000, (batch, seq), generator=torch.Generator().manual_seed(seed))


def left_padded(ids, mask, pad_id):
    """The same rows with their padding moved to the front."""
    out_ids, out_mask = torch.full_like(ids, pad_id), torch.zeros_like(mask)
    for i, n in enumerate(mask.sum(dim=1).tolist()):
        out_ids[i, ids.shape[1] - n:], out_mask[i, ids.shape[1] - n:] = ids[i, :n], 1
    return out_ids, out_mask


@pytest.mark.parametrize("name", ["bert-tiny", "xlmr-tiny", "modernbert-tiny", "minilm"])
def test_hidden_states_match_hugging_face(exports, models_dir, name):
    encoder = trainable.load(exports[name])
    hf = hf_model(models_dir, name)
    ids, mask = batch(exports[name], hf.config)
    assert ids.shape[1] > 2 * int(getattr(hf.config, "local_attention", 0) or 0)
    for inputs, real in [(ids, mask), left_padded(ids, mask, hf.config.pad_token_id)]:
        with torch.no_grad():
            ours, theirs = encoder(inputs, real), hf(input_ids=inputs, attention_mask=real).last_hidden_state
        real = real.bool()
        max_abs = (ours - theirs).abs()[real].max().item()
        print(f"{name}: max abs {max_abs:.3g} over {int(real.sum())} tokens")
        assert max_abs < TOLERANCE[name]


def test_settings_read_from_the_graph(exports):
    bert, xlmr = trainable.load(exports["bert-tiny"]), trainable.load(exports["xlmr-tiny"])
    def scheme(s):
        return s.eps, s.position_offset, s.position_pad_id

    assert scheme(bert.settings) == (1e-12, 0, None)  # LayerNormalization's epsilon; arange positions
    assert scheme(xlmr.settings) == (1e-5, 2, 1)  # epsilon left at ONNX's default; counted from pad id 1
    mb = trainable.load(exports["modernbert-tiny"])
    s = mb.settings
    assert (s.family, s.heads, s.window, s.global_every, s.eps) == ("modernbert", 2, 8, 3, 1e-5)
    assert (s.global_rope_theta, s.local_rope_theta) == (160000.0, 10000.0)
    assert [layer.is_global for layer in mb.layers] == [True, False, False, True]
    assert isinstance(mb.layers[0].attn_norm, torch.nn.Identity)
    minilm = trainable.load(exports["minilm"])
    assert (minilm.settings.heads, minilm.settings.eps) == (12, 1e-12)  # from model.config.json
    # Without the config beside it, the head size comes from the graph's attention scale 1/sqrt(32).
    assert trainable.load(exports["minilm"] / manifest.ONNX_FILE, config=None).settings.heads == 12
    assert trainable.load(exports["bert-tiny"], family="postnorm", heads=4).settings.heads == 4


def test_rotary_bases_given_instead_of_config(exports):
    ids, mask = random_ids(2, 20), torch.ones(2, 20, dtype=torch.long)
    with torch.no_grad():
        ref = trainable.load(exports["modernbert-tiny"])(ids, mask)
        given = trainable.load(exports["modernbert-tiny"] / manifest.ONNX_FILE, config=None,
                               global_rope_theta=160000, local_rope_theta=10000)
        assert given.settings.heads == 2 and given.settings.window == 8  # from the graph alone
        assert torch.equal(given(ids, mask), ref)
        swapped = trainable.load(exports["modernbert-tiny"], global_rope_theta=10000, local_rope_theta=160000)
        assert not torch.allclose(swapped(ids, mask), ref)
        # Naming one base of two is enough: the other is the other one.
        one = trainable.load(exports["modernbert-tiny"], config=None, local_rope_theta=10000)
        assert one.settings.global_rope_theta == 160000.0


def test_rope_base_rules(exports):
    graph = trainable.Graph(exports["modernbert-tiny"] / manifest.ONNX_FILE)
    assert modernbert.graph_rotary_bases(graph) == ([10000.0, 160000.0], 16)
    choose = modernbert.choose_rope_bases
    assert choose(graph, [160000.0], (None, None), {}) == (160000.0, 160000.0)  # mmBERT: one base for both
    old_style = {"global_rope_theta": 160000, "local_rope_theta": 10000}  # configs before transformers 5
    assert choose(graph, [10000.0, 160000.0], (None, None), old_style) == (160000.0, 10000.0)
    with pytest.raises(GraphError, match="two rotary bases"):
        choose(graph, [10000.0, 160000.0], (None, None), {})


@pytest.mark.parametrize("name", ["bert-tiny", "xlmr-tiny", "modernbert-tiny", "minilm"])
def test_padded_batch_equals_single_sequences_bitwise(exports, name):
    encoder = trainable.load(exports[name])
    generator = torch.Generator().manual_seed(0)
    lengths = [66, 47, 40, 33, 21, 17, 16, 15, 9, 8, 5, 2, 1]  # attention pads to multiples of 16
    ids = torch.randint(5, 1000, (len(lengths), max(lengths)), generator=generator)
    mask = (torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]).long()
    ids = ids.masked_fill(mask == 0, encoder.filler_id)
    with torch.no_grad():
        together = encoder(ids, mask)
        for i, n in enumerate(lengths):
            alone = encoder(ids[i:i + 1, :n], mask[i:i + 1, :n])[0]
            assert torch.equal(alone, together[i, :n]), (name, n, (alone - together[i, :n]).abs().max())


def test_clip_gradients_is_torchs_clip_bit_for_bit():
    """Also when nothing is clipped (the multiplication by 1 skipped) and when the norm is not finite."""
    generator = torch.Generator().manual_seed(0)
    for scale in (1e-3, 1.0, float("nan"), float("inf")):
        grads = [torch.randn(shape, generator=generator) * scale for shape in ((24, 16), (16,), (3, 5))]
        ours, theirs = ([torch.nn.Parameter(torch.zeros_like(g)) for g in grads] for _ in range(2))
        for a, b, g in zip(ours, theirs, grads, strict=True):
            a.grad, b.grad = g.clone(), g.clone()
        norm = trainable.clip_gradients(ours, 1.0)
        expected = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
        assert torch.equal(norm, expected) or (norm.isnan() and expected.isnan())
        for a, b in zip(ours, theirs, strict=True):
            assert torch.equal(a.grad.nan_to_num(7.0), b.grad.nan_to_num(7.0)), scale


def test_adamw_is_fused_and_close_to_torchs_default():
    generator = torch.Generator().manual_seed(0)
    start = [torch.randn(shape, generator=generator) for shape in ((24, 16), (16,))]
    ours, theirs = ([torch.nn.Parameter(w.clone()) for w in start] for _ in range(2))
    fused = trainable.adamw(ours, 5e-5, 0.01)
    default = torch.optim.AdamW(theirs, lr=5e-5, weight_decay=0.01)
    assert fused.defaults["fused"]
    for _ in range(5):
        for a, b in zip(ours, theirs, strict=True):
            a.grad = torch.randn(a.shape, generator=generator)
            b.grad = a.grad.clone()
        fused.step()
        default.step()
    for a, b, w in zip(ours, theirs, start, strict=True):
        assert not torch.equal(a, w)  # it stepped
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-8)  # the same update, in another order


@pytest.fixture
def one_thread():
    """Finite differences run thousands of tiny forwards; two threads on two shared cores are several
    times slower than one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_gradients_match_finite_differences_modernbert(exports, one_thread):
    """float64: through rotary embeddings, the gated feed-forward and the local window mask."""
    encoder = trainable.load(exports["modernbert-tiny"]).double()
    generator = torch.Generator().manual_seed(1)
    layer = encoder.layers[1]
    assert not layer.is_global
    # One local layer, every input coordinate: 10 tokens (2 of them padding) under a half-window of 4.
    seq = 10
    cos, sin = modernbert.rotary_tables(encoder.local_inv_freq, seq, torch.float64)
    index = torch.arange(seq)
    mask = torch.ones(1, seq, dtype=torch.long)
    mask[0, 8:] = 0
    allowed = mask.bool()[:, None, None, :] & ((index[:, None] - index[None, :]).abs() <= 4)
    bias = score_bias(allowed, torch.float64)
    x = torch.randn(1, seq, 32, dtype=torch.float64, generator=generator, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: layer(x, cos, sin, bias), (x,), eps=1e-6, atol=1e-5)

    # The whole encoder, in random directions (gradcheck's fast mode): inputs and a local layer's weights.
    seq = 14
    mask = torch.ones(2, seq, dtype=torch.long)
    mask[1, 10:] = 0
    x = torch.randn(2, seq, 32, dtype=torch.float64, generator=generator, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: encoder.encode(x, mask), (x,), eps=1e-6, atol=1e-5,
                                    fast_mode=True)
    names = ["layers.1.qkv.weight", "layers.1.mlp_in.weight", "layers.1.mlp_out.weight"]
    params = {n: p.detach().clone().requires_grad_(True) for n, p in encoder.named_parameters() if n in names}
    ids = torch.randint(5, 1000, (2, seq), generator=generator)

    def through_weights(*weights):
        return torch.func.functional_call(encoder, dict(zip(names, weights, strict=True)), (ids, mask))

    assert torch.autograd.gradcheck(through_weights, tuple(params[n] for n in names), eps=1e-6, atol=1e-5,
                                    fast_mode=True)


def test_rotary_pairs_coordinate_i_with_i_plus_half():
    cos, sin = modernbert.rotary_tables(modernbert.inverse_frequencies(10000.0, 8), 5, torch.float64)
    x = torch.randn(5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    y = modernbert.rotate(x, cos, sin)
    angle = torch.arange(5.0)[:, None].double() * modernbert.inverse_frequencies(10000.0, 8).double()
    c, s = angle.cos(), angle.sin()
    assert torch.allclose(y[:, :4], x[:, :4] * c - x[:, 4:] * s, atol=1e-6)
    assert torch.allclose(y[:, 4:], x[:, 4:] * c + x[:, :4] * s, atol=1e-6)


def test_gradients_match_finite_differences_postnorm(exports, one_thread):
    encoder = trainable.load(exports["xlmr-tiny"]).double()
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[0, 5:] = 0
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(2, 7, 16, dtype=torch.float64, generator=generator, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: encoder.encode(x, mask), (x,), eps=1e-6, atol=1e-5)


def test_token_table_frozen_by_default(exports):
    encoder = trainable.load(exports["xlmr-tiny"])
    assert not encoder.tokens.weight.requires_grad and encoder.embeddings_frozen
    assert "tokens.weight" not in encoder.trainable_state_dict()
    assert all(p.requires_grad for n, p in encoder.named_parameters() if n != "tokens.weight")
    ids, mask = random_ids(2, 9), torch.ones(2, 9, dtype=torch.long)
    encoder(ids, mask).sum().backward()
    assert encoder.tokens.weight.grad is None and encoder.positions.grad is not None
    unfrozen = trainable.load(exports["xlmr-tiny"], freeze_embeddings=False)
    assert unfrozen.tokens.weight.requires_grad and "tokens.weight" in unfrozen.trainable_state_dict()
    unfrozen.embeddings_frozen = True
    assert not unfrozen.tokens.weight.requires_grad and unfrozen.settings.freeze_embeddings


@pytest.mark.parametrize("name", ["xlmr-tiny", "modernbert-tiny"])
def test_checkpoint_rebuilds_the_encoder(exports, tmp_path, name):
    encoder = trainable.load(exports[name]).train()
    optimizer = torch.optim.AdamW(encoder.trainable_parameters(), lr=1e-2)
    ids, mask = random_ids(2, 20), torch.ones(2, 20, dtype=torch.long)
    encoder(ids, mask).pow(2).mean().backward()
    optimizer.step()
    path = tmp_path / "encoder.pt"
    onnx_path = exports[name] / manifest.ONNX_FILE
    trainable.save(encoder, path, onnx_path)
    saved = torch.load(path, weights_only=True)
    assert "tokens.weight" not in saved["state_dict"]
    assert saved["settings"] == encoder.settings_dict()
    again = trainable.restore(exports[name], path)
    assert again.settings_dict() == encoder.settings_dict()
    with torch.no_grad():
        assert torch.equal(again(ids, mask), encoder.eval()(ids, mask))
    other = "bert-tiny" if name == "xlmr-tiny" else "xlmr-tiny"
    with pytest.raises(GraphError, match="not the graph the checkpoint was saved with"):
        trainable.restore(exports[other], path)


def _export_fresh(models_dir, tmp_path, name, opset):
    """A freshly initialised model (norms all ones, biases all zeros, one weight copied onto another):
    the exporter stores equal tensors once and names the others through Identity nodes."""
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(0)
    source, _ = reference.source_dir(models_dir / "sources" / name / "source.json")
    config = AutoConfig.from_pretrained(source)
    model = AutoModel.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        if name == "bert-tiny":
            model.encoder.layer[1].attention.self.key.weight.copy_(model.encoder.layer[0].attention.self.key.weight)
        else:
            model.layers[2].mlp.Wo.weight.copy_(model.layers[1].mlp.Wo.weight)
    ids = torch.randint(5, 1000, (3, 24), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, 17:], mask[2, 6:] = 0, 0
    path = tmp_path / "model.onnx"
    with torch.no_grad():
        torch.onnx.export(reference.HiddenStates(model).eval(), (ids, mask), path, dynamo=False,
                          opset_version=opset, do_constant_folding=True, input_names=list(runtime.INPUTS),
                          output_names=[runtime.OUTPUT], dynamic_axes=runtime.DYNAMIC_AXES)
        states = model(input_ids=ids, attention_mask=mask).last_hidden_state
    (tmp_path / manifest.CONFIG_FILE).write_text(config.to_json_string())
    return path, ids, mask, states


@pytest.mark.parametrize("name,opset", [("bert-tiny", 16), ("modernbert-tiny", 17)])
def test_identity_named_tensors_and_decomposed_norms(exports, models_dir, tmp_path, name, opset):
    path, ids, mask, reference = _export_fresh(models_dir, tmp_path, name, opset)
    graph = onnx.load(str(path)).graph
    assert any(n.op_type == "Identity" and n.input[0].startswith("onnx::MatMul") for n in graph.node)
    assert any(n.op_type == "Identity" and not n.output[0].startswith("onnx::") for n in graph.node)
    if opset < 17:
        assert not any(n.op_type == "LayerNormalization" for n in graph.node)
    encoder = trainable.load(path)
    assert encoder.settings.eps == (1e-12 if name == "bert-tiny" else 1e-5)
    with torch.no_grad():
        assert (encoder(ids, mask) - reference).abs()[mask.bool()].max() < 2e-5
    # Tensors the graph stores once are separate parameters here: training one leaves the other.
    params = dict(encoder.named_parameters())
    a, b = (("layers.0.key.weight", "layers.1.key.weight") if name == "bert-tiny"
            else ("layers.1.mlp_out.weight", "layers.2.mlp_out.weight"))
    assert torch.equal(params[a], params[b]) and params[a].data_ptr() != params[b].data_ptr()


# -- refusals -------------------------------------------------------------------------------------

def _copy_graph(exports, name="bert-tiny"):
    return onnx.load(str(exports[name] / manifest.ONNX_FILE))


def test_refuses_an_anonymous_weight_without_a_scoped_consumer(exports, tmp_path):
    model = _copy_graph(exports)
    node = next(n for n in model.graph.node if n.name.endswith("/attention/self/query/MatMul"))
    node.name = "MatMul_7"
    onnx.save(model, tmp_path / "model.onnx")
    with pytest.raises(GraphError, match="consumed by node 'MatMul_7', whose name carries no module scope"):
        trainable.load(tmp_path / "model.onnx")


def test_refuses_to_guess_between_two_rotary_bases(exports, tmp_path):
    shutil.copy(exports["modernbert-tiny"] / manifest.ONNX_FILE, tmp_path / "model.onnx")  # no config beside
    with pytest.raises(GraphError, match=r"two rotary bases, 10000 and 160000.*global_rope_theta="):
        trainable.load(tmp_path)
    with pytest.raises(GraphError, match="not the graph's"):
        trainable.load(tmp_path, global_rope_theta=160000, local_rope_theta=160000)


def test_refuses_a_graph_from_another_producer(exports, tmp_path):
    model = _copy_graph(exports)
    model.producer_name = "onnxruntime.transformers"
    onnx.save(model, tmp_path / "model.onnx")
    with pytest.raises(GraphError, match="not by PyTorch's TorchScript exporter.*dynamo=False"):
        trainable.load(tmp_path / "model.onnx")


def test_refuses_a_dynamo_export(tmp_path):
    """What torch.onnx.export(dynamo=True) writes: named weights, nodes named node_*, no scopes."""
    table = helper.make_tensor("embeddings.word_embeddings.weight", TensorProto.FLOAT, [4, 2],
                               np.arange(8, dtype=np.float32))
    node = helper.make_node("Gather", [table.name, "input_ids"], ["h"], name="node_embedding")
    entry = node.metadata_props.add()
    entry.key, entry.value = "pkg.torch.onnx.name_scopes", "['', 'embeddings']"
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"])]
    outputs = [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["b", "s", 2])]
    graph = helper.make_graph([node], "main_graph", inputs, outputs, [table])
    model = helper.make_model(graph, producer_name="pytorch", opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(model, tmp_path / "model.onnx")
    with pytest.raises(GraphError, match="dynamo export.*dynamo=False"):
        trainable.load(tmp_path / "model.onnx")


def test_refuses_external_data(exports, tmp_path):
    model = _copy_graph(exports)
    onnx.save(model, tmp_path / "model.onnx", save_as_external_data=True, location="model.onnx.data",
              size_threshold=0)
    with pytest.raises(GraphError, match="external data.*save_as_external_data=False"):
        trainable.load(tmp_path / "model.onnx")


def test_refuses_unknown_families_and_variants(exports, tmp_path):
    with pytest.raises(GraphError, match="cannot tell the family"):
        trainable.detect_family(["embeddings.word_embeddings.weight", "pooler.dense.weight"])
    with pytest.raises(ValueError, match="family 'gpt'"):
        trainable.load(exports["bert-tiny"], family="gpt")
    with pytest.raises(GraphError, match="not a modernbert encoder"):
        trainable.load(exports["bert-tiny"], family="modernbert")
    with pytest.raises(ValueError, match="global_rope_theta: only for family 'modernbert'"):
        trainable.load(exports["bert-tiny"], global_rope_theta=10000)
    # A weight nothing reads (here BERT's relative-position table) is another variant: refused, not ignored.
    model = _copy_graph(exports)
    model.graph.initializer.append(onnx.numpy_helper.from_array(
        np.zeros((255, 16), np.float32), "model.encoder.layer.0.attention.self.distance_embedding.weight"))
    onnx.save(model, tmp_path / "model.onnx")
    with pytest.raises(GraphError, match="weights this family does not use.*distance_embedding"):
        trainable.load(tmp_path / "model.onnx")

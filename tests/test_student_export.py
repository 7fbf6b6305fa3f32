"""The distilled student: architecture, ONNX export (names, [in, out] layout, graph shape, determinism),
reading it back as a trainable encoder, the frozen encoder on it, write-back, and parity against
transformers' BertModel holding the student's weights (student.reference)."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper

from encoder_study.encoders import trainable
from encoder_study.encoders.frozen import FrozenEncoder
from encoder_study.encoders.tokens import Doc
from encoder_study.encoders.trainable import GraphError
from encoder_study.encoders.trainable.words import TrainableEncoder
from encoder_study.onnx import manifest, patch
from encoder_study.recipes import writeback
from encoder_study.recipes.student import StudentError
from encoder_study.recipes.student import export as student_export
from encoder_study.recipes.student import parity as student_parity
from encoder_study.recipes.student import reference as student_reference
from encoder_study.recipes.student.architecture import StudentConfig, build, parameter_count

SMALL = StudentConfig(layers=2, width=32, heads=4, intermediate=64, embedding_width=8, max_positions=64)
STUDY = {"layers": 6, "width": 384, "heads": 12, "intermediate": 1536, "embedding_width": 96,
         "max_positions": 512}
# What `encoder-study student export` passes from the config (config/config.yaml's export section).
EXPORT = {"name": "student", "tolerance": 1e-4, "threads": 1, "opset": 17, "ort_optimization": "all"}
NO_RECORD: dict = {}
TEXTS = ["The bank of the river floods.", "Příliš žluťoučký kůň úpěl ďábelské ódy.", "a",
         "Съешь же ещё этих мягких французских булок, да выпей чаю. " * 3]


def trained(encoder, seed=5, scale=0.1):
    """Every trainable weight moved, as training would: no two tensors stay equal (fresh biases are)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in encoder.trainable_parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator))
    return encoder


@pytest.fixture(scope="module")
def teacher(tiny_exports):
    return tiny_exports["bert-tiny"]


@pytest.fixture(scope="module")
def vocab(teacher):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(teacher / manifest.TOKENIZER_FILE)).get_vocab_size(with_added_tokens=True)


@pytest.fixture(scope="module")
def student(vocab):
    return trained(build(SMALL, vocab, seed=0))


@pytest.fixture(scope="module")
def exported(student, teacher, tmp_path_factory):
    out = tmp_path_factory.mktemp("student") / "student"
    student_export.export_student(student, teacher, out, distillation={"checkpoint_sha256": "ab" * 32},
                                  **EXPORT)
    return out


def batch(seed=3, vocab=1000):
    ids = torch.randint(5, vocab, (3, 24), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[1, 17:], mask[2, 6:] = 0, 0
    return ids, mask


def run(encoder, ids, mask):
    with torch.no_grad():
        return encoder.eval()(ids, mask).numpy()


def run_ort(onnx_path, ids, mask):
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    return session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]


def real_max_abs(a, b, mask):
    return float(np.abs(a - b)[mask.numpy().astype(bool)].max())


# -- architecture ----------------------------------------------------------------------------------

def test_study_student_shapes_and_counts():
    encoder = build(StudentConfig.from_dict(STUDY), vocab_size=256_000, seed=0)
    s = encoder.settings
    assert (s.layers, s.width, s.heads, s.intermediate, s.embedding_width, s.max_positions) == \
        (6, 384, 12, 1536, 96, 512)
    assert (s.position_offset, s.position_pad_id, s.freeze_embeddings, s.eps) == (0, None, False, 1e-12)
    shapes = {n: tuple(p.shape) for n, p in encoder.named_parameters()}
    assert shapes["tokens.weight"] == (256_000, 96)
    assert shapes["projection.weight"] == (384, 96) and shapes["positions"] == (512, 384)
    assert shapes["layers.5.query.weight"] == (384, 384) and shapes["layers.5.ff_in.weight"] == (1536, 384)
    assert shapes["layers.5.ff_out.weight"] == (384, 1536) and "layers.6.query.weight" not in shapes
    counts = parameter_count(encoder)
    # 256,000 x 96; projection 96 x 384 + 384; positions 512 x 384; norm 768; 6 x 1,774,464 per layer.
    assert counts == {"total": 35_457_408, "vocabulary": 24_576_000, "other": 10_881_408}
    assert round(counts["total"] / 1e6, 1) == 35.5 and round(counts["vocabulary"] / 1e6, 1) == 24.6


def test_build_is_deterministic_and_bert_initialised(vocab):
    before = torch.random.get_rng_state()
    a, b, c = build(SMALL, vocab, 0), build(SMALL, vocab, 0), build(SMALL, vocab, 1)
    assert torch.equal(before, torch.random.get_rng_state())  # the global RNG is left alone
    for (name, x), y, z in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values(),
                               strict=True):
        assert torch.equal(x, y), name
        if name.endswith("bias"):
            assert not x.any(), name
        elif "norm" in name:
            assert torch.equal(x, torch.ones_like(x)), name
        else:
            assert not torch.equal(x, z) and abs(float(x.std()) - 0.02) < 0.005, name
    assert a.training and all(p.requires_grad for p in a.parameters())
    with pytest.raises(StudentError, match="unknown keys"):
        StudentConfig.from_dict({**STUDY, "hidden": 3})
    with pytest.raises(StudentError, match="heads"):
        StudentConfig.from_dict({**STUDY, "heads": 7})


# -- export ----------------------------------------------------------------------------------------

def stored(model, name):
    """The array an initializer name reads, following the exporter's Identity nodes."""
    inits = {t.name: t for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    while name not in inits:
        assert producer[name].op_type == "Identity", name
        name = producer[name].input[0]
    return numpy_helper.to_array(inits[name])


def test_export_names_layout_and_graph(student, exported, teacher):
    model = onnx.load(str(exported / manifest.ONNX_FILE))
    inits = {t.name for t in model.graph.initializer}
    assert not [n for n in inits if n.startswith("onnx::")]  # every weight named
    assert "model.encoder.layer.1.attention.query.weight" in inits
    params = dict(student.named_parameters())
    names = student_export.graph_names(SMALL.layers)
    assert set(names) == set(params)
    for ours, theirs in names.items():
        value = params[ours].detach().numpy()
        linear = ours.endswith(".weight") and value.ndim == 2 and ours not in ("tokens.weight",)
        expected = value.T if linear else value  # linear weights [in, out]
        assert np.array_equal(stored(model, theirs), expected), theirs
    assert stored(model, "model.embeddings.projection.weight").shape == (8, 32)
    assert stored(model, "model.encoder.layer.0.intermediate.weight").shape == (32, 64)
    assert stored(model, "model.encoder.layer.0.output.weight").shape == (64, 32)

    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [17]
    assert [i.name for i in model.graph.input] == ["input_ids", "attention_mask"]
    for i in model.graph.input:
        assert i.type.tensor_type.elem_type == onnx.TensorProto.INT64
        assert [d.dim_param for d in i.type.tensor_type.shape.dim] == ["batch", "sequence"]
    assert [o.name for o in model.graph.output] == ["last_hidden_state"]
    ops = {n.op_type for n in model.graph.node}
    assert {"MatMul", "Softmax", "Erf", "LayerNormalization"} <= ops
    assert not ops & {"Attention", "MultiHeadAttention", "Gelu", "FastGelu"}
    assert {n.domain for n in model.graph.node} <= {""}

    config = json.loads((exported / manifest.CONFIG_FILE).read_text())
    assert (config["num_attention_heads"], config["hidden_size"], config["num_hidden_layers"],
            config["intermediate_size"], config["embedding_size"], config["max_position_embeddings"],
            config["vocab_size"], config["model_type"]) == (4, 32, 2, 64, 8, 64, student.settings.vocab_size,
                                                            "encoder_study_student")
    assert config["pad_token_id"] == 0 and config["layer_norm_eps"] == 1e-12
    tokenizer = manifest.TOKENIZER_FILE
    assert (exported / tokenizer).read_bytes() == (teacher / tokenizer).read_bytes()
    record = manifest.verified_model(exported)
    assert record["source"] == "student" and record["distillation"] == {"checkpoint_sha256": "ab" * 32}
    assert sorted(e["path"] for e in record["files"]) == sorted(manifest.MODEL_FILES)
    assert record["check"]["relative"] <= 1e-4 and record["architecture"]["embedding_width"] == 8
    assert record["graph"]["variant"] == "exported"


def test_export_is_deterministic_and_refuses_without_publishing(student, exported, teacher, tmp_path):
    again = tmp_path / "again"
    student_export.export_student(student, teacher, again, distillation={"checkpoint_sha256": "ab" * 32},
                                  **EXPORT)
    for name in manifest.EXPORT_FILES:
        assert (again / name).read_bytes() == (exported / name).read_bytes(), name
    refused = tmp_path / "refused"
    with pytest.raises(StudentError, match="tolerance"):
        student_export.export_student(student, teacher, refused, distillation=NO_RECORD,
                                      **{**EXPORT, "tolerance": -1.0})
    with pytest.raises(StudentError, match="factorised"):
        student_export.export_student(trainable.load(teacher), teacher, refused, distillation=NO_RECORD,
                                      **EXPORT)
    small = build(SMALL, 100, 0)
    with pytest.raises(StudentError, match="whole vocabulary"):
        student_export.export_student(small, teacher, refused, distillation=NO_RECORD, **EXPORT)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again"]  # no output, no staging left


# -- read back -------------------------------------------------------------------------------------

def test_trainable_reads_the_student(student, exported):
    encoder = trainable.load(exported)
    s = encoder.settings
    assert (s.family, s.embedding_width, s.heads, s.position_offset, s.position_pad_id, s.eps) == \
        ("postnorm", 8, 4, 0, None, 1e-12)
    assert s.vocab_size == student.settings.vocab_size and s.freeze_embeddings
    theirs = dict(encoder.named_parameters())
    for name, p in student.named_parameters():
        assert torch.equal(p, theirs[name]), name
    ids, mask = batch(vocab=s.vocab_size)
    reference = run(student, ids, mask)
    assert real_max_abs(run(encoder, ids, mask), reference, mask) < 1e-5
    assert real_max_abs(run_ort(exported / manifest.ONNX_FILE, ids, mask), reference, mask) < 1e-5
    states = encoder.hidden_states(ids, mask)
    assert len(states) == 3 and np.array_equal(states[-1].detach().numpy(), run(encoder, ids, mask))


def test_student_heads_come_from_the_config_or_the_caller(exported, tmp_path):
    bare = tmp_path / "bare.onnx"
    shutil.copyfile(exported / manifest.ONNX_FILE, bare)  # no bare.config.json beside it
    with pytest.raises(GraphError, match="head count"):
        trainable.load(bare)
    assert trainable.load(bare, heads=4).settings.heads == 4
    assert trainable.load(bare, heads=8).settings.heads == 8  # the caller's word is taken
    (tmp_path / "bare.config.json").write_text(json.dumps({"hidden_size": 32}))
    with pytest.raises(GraphError, match="head count"):
        trainable.load(bare)
    (tmp_path / "bare.config.json").write_text(json.dumps({"num_attention_heads": 4}))
    assert trainable.load(bare).settings.heads == 4


def test_student_layout_refuses_a_weight_stored_out_in(exported, tmp_path):
    model = onnx.load(str(exported / manifest.ONNX_FILE))
    name = "model.encoder.layer.0.intermediate.weight"
    for i, t in enumerate(model.graph.initializer):
        if t.name == name:
            out_in = numpy_helper.to_array(t).T.copy()
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(out_in, name))
    onnx.save(model, str(tmp_path / "model.onnx"))
    with pytest.raises(GraphError, match=r"\[in, out\]"):
        trainable.load(tmp_path / "model.onnx", heads=4)


def test_frozen_and_trainable_word_encoders_agree(student, exported, tmp_path):
    docs = [Doc.from_words(t.split()) for t in TEXTS]
    frozen = FrozenEncoder(exported)
    words = TrainableEncoder(exported)
    with torch.no_grad():
        ours = [v.numpy() for v in words(docs)]
    for a, b, doc in zip(frozen(docs), ours, docs, strict=True):
        assert a.shape == (len(doc.words), 32)
        assert float(np.abs(a - b).max()) < 1e-5
    trained(words.encoder, seed=9, scale=0.01)
    words.save(tmp_path / "words.pt")
    again = TrainableEncoder.restore(exported, tmp_path / "words.pt")
    assert again.encoder.settings_dict() == words.encoder.settings_dict()
    assert again.encoder.settings_dict()["embedding_width"] == 8
    for (name, p), q in zip(words.encoder.state_dict().items(), again.encoder.state_dict().values(),
                            strict=True):
        assert torch.equal(p, q), name


def test_old_checkpoints_without_embedding_width_restore(teacher):
    encoder = trainable.load(teacher)
    saved = trainable.checkpoint(encoder)
    del saved["settings"]["embedding_width"]
    again = trainable.restore(teacher, saved)
    assert again.settings.embedding_width is None and again.projection is None


# -- write-back and parity -------------------------------------------------------------------------

@pytest.mark.parametrize("fresh", [False, True], ids=["trained", "fresh"])
def test_writeback_unchanged_gives_the_same_bytes(exported, teacher, tmp_path, vocab, fresh):
    source = exported
    if fresh:  # equal fresh biases and norms are stored once, the others read through Identity nodes
        source = tmp_path / "fresh"
        student_export.export_student(build(SMALL, vocab, 0), teacher, source, distillation=NO_RECORD,
                                      **EXPORT)
    encoder = trainable.load(source, freeze_embeddings=False)
    replacements = writeback.module_weights_to_graph(encoder, source)
    assert "model.embeddings.word_embeddings.weight" in replacements
    assert replacements["model.embeddings.projection.weight"].shape == (8, 32)
    out = tmp_path / "out.onnx"
    report = patch.patch(source / manifest.ONNX_FILE, out, replacements)
    assert not report.rewritten and not report.materialized
    assert out.read_bytes() == (source / manifest.ONNX_FILE).read_bytes()
    frozen = writeback.module_weights_to_graph(trainable.load(source), source)
    assert "model.embeddings.word_embeddings.weight" not in frozen


@pytest.mark.parametrize("tokens", [False, True], ids=["layers", "with-table"])
def test_writeback_perturbed_graph_equals_the_modules(exported, tmp_path, tokens):
    encoder = trained(trainable.load(exported, freeze_embeddings=not tokens), seed=11, scale=0.05)
    out_dir = tmp_path / "patched"
    out_dir.mkdir()
    report = patch.patch(exported / manifest.ONNX_FILE, out_dir / manifest.ONNX_FILE,
                         writeback.module_weights_to_graph(encoder, exported))
    assert "model.embeddings.projection.weight" in report.rewritten
    assert ("model.embeddings.word_embeddings.weight" in report.rewritten) == tokens
    ids, mask = batch(vocab=encoder.settings.vocab_size)
    reference = run(encoder, ids, mask)
    assert real_max_abs(run_ort(out_dir / manifest.ONNX_FILE, ids, mask), reference, mask) < 1e-5
    shutil.copyfile(exported / manifest.CONFIG_FILE, out_dir / manifest.CONFIG_FILE)
    again = dict(trainable.load(out_dir).named_parameters())
    for name, p in encoder.named_parameters():
        if name != "tokens.weight" or tokens:
            assert torch.equal(p, again[name]), name


# -- parity against transformers' BertModel (student.reference) ---------------------------------------

# Without effect by mathematics: a key bias adds the same amount to every score of a query.
NO_EFFECT = re.compile(r"layers\.\d+\.key\.bias")


def bert(state, settings, names=None):
    return student_reference.load(state, settings, names)


def states(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).numpy()


def test_student_parity(student, exported):
    rows = student_parity.parity(bert(student.state_dict(), student.settings_dict()), exported, TEXTS,
                                 threads=1, batch=3)
    assert [r["comparison"] for r in rows] == ["trainable vs transformers", "graph runtime vs transformers"]
    for r in rows:
        assert list(r) == student_parity.PARITY_COLUMNS
        # Two implementations written apart: close, and not the same bits.
        assert r["tokens"] > 40 and 0 < r["max_abs"] < 1e-5 and r["min_cos"] > 0.99999 and r["batch_equal"]
    assert "graph runtime vs transformers" in student_parity.parity_markdown(rows)


def test_transformers_reference_computes_the_student(student):
    ids, mask = batch(vocab=student.settings.vocab_size)
    reference = bert(student.state_dict(), student.settings_dict())
    assert not reference.training and reference.bert.config._attn_implementation == "eager"
    assert real_max_abs(states(reference, ids, mask), run(student, ids, mask), mask) < 1e-5


@pytest.fixture(scope="module")
def graph_states(student, exported):
    ids, mask = batch(vocab=student.settings.vocab_size)
    return ids, mask, run_ort(exported / manifest.ONNX_FILE, ids, mask)


def test_every_student_tensor_moved_in_turn_is_caught(student, graph_states):
    """The reference given the student's weights with one tensor moved, for each tensor in turn, differs
    from the exported graph: no tensor is left out or read from elsewhere without it showing."""
    ids, mask, graph = graph_states
    state, settings = student.state_dict(), student.settings_dict()
    generator = torch.Generator().manual_seed(17)
    for name, value in state.items():
        moved = dict(state, **{name: value + 0.05 * torch.randn(value.shape, generator=generator)})
        diff = real_max_abs(states(bert(moved, settings), ids, mask), graph, mask)
        assert diff < 1e-5 if NO_EFFECT.fullmatch(name) else diff > 1e-3, (name, diff)


def test_every_swapped_pair_of_tensors_is_caught(student, graph_states):
    """Each tensor read from the place of the next tensor of its shape (and that one from its place)."""
    ids, mask, graph = graph_states
    state, settings = student.state_dict(), student.settings_dict()
    by_shape = {}
    for name, value in state.items():
        by_shape.setdefault(tuple(value.shape), []).append(name)
    swaps = [(group[i], group[(i + 1) % len(group)]) for group in by_shape.values() if len(group) > 1
             for i in range(len(group))]
    assert len(swaps) > 30
    for a, b in swaps:
        if NO_EFFECT.fullmatch(a) and NO_EFFECT.fullmatch(b):
            continue
        diff = real_max_abs(states(bert(dict(state, **{a: state[b], b: state[a]}), settings), ids, mask),
                            graph, mask)
        assert diff > 1e-3, (a, b, diff)


def test_a_swapped_name_in_the_map_shows_in_the_parity_table(student, exported):
    names = student_reference.bert_names(2)
    names["layers.1.query.weight"], names["layers.1.key.weight"] = \
        names["layers.1.key.weight"], names["layers.1.query.weight"]
    reference = bert(student.state_dict(), student.settings_dict(), names)
    rows = student_parity.parity(reference, exported, TEXTS[:2], threads=1, batch=2)
    assert [r["max_abs"] > 1e-3 for r in rows] == [True, True]


def test_the_reference_refuses_what_it_cannot_place(student):
    state, settings = student.state_dict(), student.settings_dict()
    with pytest.raises(StudentError, match=r"\['extra'\] have no place"):
        bert(dict(state, extra=torch.zeros(1)), settings)
    with pytest.raises(StudentError, match="no tensor layers.1.ff_in.bias"):
        bert({k: v for k, v in state.items() if k != "layers.1.ff_in.bias"}, settings)
    with pytest.raises(StudentError, match=r"layers.0.ff_in.weight has shape \(32, 64\)"):
        bert(dict(state, **{"layers.0.ff_in.weight": state["layers.0.ff_in.weight"].T}), settings)
    with pytest.raises(StudentError, match="tokens.weight has shape"):
        bert(dict(state, **{"tokens.weight": state["tokens.weight"][:-1]}), settings)
    names = student_reference.bert_names(2)
    del names["layers.0.ff_norm.bias"]
    with pytest.raises(StudentError, match="layers.0.ff_norm.bias"):  # now unplaced
        bert(state, settings, names)
    names = dict(student_reference.bert_names(2), **{"layers.0.ff_norm.bias": "embeddings.LayerNorm.bias"})
    with pytest.raises(StudentError, match=r"\['encoder.layer.0.output.LayerNorm.bias'\] get no"):
        bert(state, settings, names)
    with pytest.raises(StudentError, match="positions"):
        bert(state, dict(settings, position_offset=2))
    with pytest.raises(StudentError, match="factorised"):
        bert(state, dict(settings, embedding_width=None))

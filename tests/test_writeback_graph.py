"""The written pipeline graph (format /3): the export byte for byte outside the replaced tensors and the
appended head; the head's weights written as the encoder's and used by the graph; the graph's word
pooling against the trainable encoder's (trainable.words, the reference semantics), mean and first,
across windows and for words without pieces; the distilled student's layout; and the patcher's
refusals of an appendix."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

from encoder_study.encoders.tokens import Doc
from encoder_study.encoders.trainable.words import TrainableEncoder
from encoder_study.onnx import manifest, names, patch
from encoder_study.onnx.patch import WritebackError
from encoder_study.recipes import writeback
from encoder_study.recipes.tagging import graph as tagging_graph
from encoder_study.recipes.tagging import pipeline
from encoder_study.recipes.tagging.graph import GraphTagger
from encoder_study.recipes.tagging.tagger import Tagger
from encoder_study.recipes.writeback import speed

TEXTS = ["The bank of the river floods .", "Příliš žluťoučký kůň úpěl ďábelské ódy .",
         "Съешь же ещё этих мягких французских булок , да выпей чаю .", "a", "日本語のテキスト 한국어 문장 ."]


@pytest.fixture(scope="module")
def student_dir(tiny_exports, tmp_path_factory):
    """A distilled student's export (its own layout: every weight named, linear weights [in, out])."""
    from tokenizers import Tokenizer

    from encoder_study.recipes.student import export as student_export
    from encoder_study.recipes.student.architecture import StudentConfig, build

    teacher = tiny_exports["bert-tiny"]
    vocab = Tokenizer.from_file(str(teacher / manifest.TOKENIZER_FILE)).get_vocab_size(with_added_tokens=True)
    config = StudentConfig(layers=2, width=32, heads=4, intermediate=64, embedding_width=8, max_positions=64)
    student = build(config, vocab, seed=0)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():  # as distillation leaves it: no two tensors equal (the exporter would share them)
        for p in student.trainable_parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=generator))
    out = tmp_path_factory.mktemp("student") / "student"
    student_export.export_student(student, teacher, out, name="student", distillation={}, tolerance=1e-4,
                                  threads=1, opset=17, ort_optimization="all")
    return out


@pytest.fixture(scope="module")
def models(exports, student_dir) -> dict:
    return {**exports, "student": student_dir}


def docs() -> list[Doc]:
    """Short and long documents (several windows at max_length 16), a word of many pieces, words that no
    piece may overlap (an empty range, two spaces), a document without words and one without text."""
    return [*(Doc.from_words(t.split()) for t in TEXTS),
            Doc.from_words((TEXTS[1] + " " + TEXTS[2]).split() * 3),
            Doc.from_words(["antidisestablishmentarianismus", "x"]),
            Doc("a  b xyz", ((0, 1), (1, 3), (3, 4), (5, 5), (5, 8))),
            Doc("no words here", ()), Doc("", ((0, 0),))]


def finetuned(model_dir, pooling="mean", max_length=64, seed=1) -> Tagger:
    """A tagger whose layers, token table and head moved as a fine-tune moves them."""
    tagger = Tagger(TrainableEncoder(model_dir, pooling=pooling, max_length=max_length,
                                     freeze_embeddings=False), seed=seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in tagger.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    return tagger.eval()


def head_tensors(tagger: Tagger) -> list:
    """The head as the graph should store it: weight [in, out], bias; float32 raw data."""
    weight = np.ascontiguousarray(tagger.head.weight.detach().numpy().T)
    return [numpy_helper.from_array(weight, names.HEAD_WEIGHT),
            numpy_helper.from_array(tagger.head.bias.detach().numpy(), names.HEAD_BIAS)]


def module_logits(tagger: Tagger, documents) -> np.ndarray:
    with torch.no_grad():
        return tagger(documents).numpy()


def graph_logits(tagger: GraphTagger, documents) -> np.ndarray:
    return np.concatenate(tagger.logits(documents))


# -- the graph is the export, plus the head ------------------------------------------------------------

@pytest.mark.parametrize("name, pooling", [("bert-tiny", "mean"), ("xlmr-tiny", "first"),
                                           ("modernbert-tiny", "mean"), ("minilm", "first"),
                                           ("student", "mean")])
def test_the_written_graph_is_the_export_outside_the_replaced_tensors_and_the_head(models, tmp_path, name,
                                                                                   pooling):
    source = models[name] / manifest.ONNX_FILE
    tagger = finetuned(models[name], pooling)
    saved = writeback.save_with_graph(tagger, tmp_path / pipeline.FILE_NAME)
    export, written = onnx.load(str(source)), onnx.load(str(saved.graph))
    onnx.checker.check_model(written, full_check=True)
    replaced = writeback.module_weights_to_graph(tagger.encoder.encoder, source)
    rewritten = set(saved.report.rewritten)
    assert rewritten and rewritten <= set(replaced) and not saved.report.materialized
    appended = writeback.head_appendix(tagger.encoder.width, len(tagger.tags), pooling)

    # Nodes, inputs and outputs: the export's, in order, then the appended ones.
    for part, added in (("node", appended.nodes), ("input", appended.inputs), ("output", appended.outputs)):
        theirs, ours = list(getattr(export.graph, part)), list(getattr(written.graph, part))
        assert ours == theirs + list(added), part
    # Initializers: the export's, equal unless rewritten, then the head's.
    old, new = list(export.graph.initializer), list(written.graph.initializer)
    assert [t.name for t in new] == [t.name for t in old] + [names.HEAD_WEIGHT, names.HEAD_BIAS]
    for before, after in zip(old, new, strict=False):
        if before.name in rewritten:
            assert np.array_equal(numpy_helper.to_array(after), replaced[before.name])
            assert not np.array_equal(numpy_helper.to_array(after), numpy_helper.to_array(before))
        else:
            assert after == before, before.name

    # And the bytes: the export with those values and the appended fields, as protobuf writes it.
    expected = onnx.load(str(source))
    for tensor in expected.graph.initializer:
        if tensor.name in rewritten:
            tensor.ClearField("float_data")
            tensor.raw_data = replaced[tensor.name].astype("<f4").tobytes()
    expected.graph.node.extend(appended.nodes)
    expected.graph.initializer.extend(head_tensors(tagger))
    expected.graph.input.extend(appended.inputs)
    expected.graph.output.extend(appended.outputs)
    assert expected.SerializeToString() == saved.graph.read_bytes()


def test_unchanged_weights_give_the_export_and_the_head_alone(tiny_exports, tmp_path):
    model_dir = tiny_exports["bert-tiny"]
    tagger = Tagger(TrainableEncoder(model_dir, freeze_embeddings=False))
    saved = writeback.save_with_graph(tagger, tmp_path / "tagger.safetensors")
    assert saved.graph.name == "tagger.encoder0.onnx"  # <stem>.encoder0.onnx
    assert not saved.report.rewritten and saved.report.appended == [names.HEAD_WEIGHT, names.HEAD_BIAS]
    export = onnx.load(str(model_dir / manifest.ONNX_FILE))
    appended = writeback.head_appendix(tagger.encoder.width, 17, "mean")
    export.graph.node.extend(appended.nodes)
    export.graph.initializer.extend(head_tensors(tagger))
    export.graph.input.extend(appended.inputs)
    export.graph.output.extend(appended.outputs)
    assert saved.graph.read_bytes() == export.SerializeToString()


# -- the head ------------------------------------------------------------------------------------------

def test_the_head_is_written_as_given_and_is_what_the_graph_uses(tiny_exports, tmp_path):
    tagger = finetuned(tiny_exports["bert-tiny"])
    documents = docs()
    saved = writeback.save_with_graph(tagger, tmp_path / "a" / pipeline.FILE_NAME)
    stored = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(saved.graph)).graph.initializer}
    weight, bias = tagger.head.weight.detach().numpy(), tagger.head.bias.detach().numpy()
    assert np.array_equal(stored[names.HEAD_WEIGHT], weight.T)
    assert np.array_equal(stored[names.HEAD_BIAS], bias)
    base = graph_logits(pipeline.load(saved.path), documents)
    assert np.abs(base - module_logits(tagger, documents)).max() < 1e-5

    # One head weight moved (tag 3's weight on feature 0): only tag 3's logits move, by the words'
    # feature 0 (the modules' word vectors); a weight written transposed would move others.
    with torch.no_grad():
        vectors = tagger.encoder.forward_flat(documents)[0].numpy()
        tagger.head.weight[3, 0] += 1.0
    moved = writeback.save_with_graph(tagger, tmp_path / "b" / pipeline.FILE_NAME).path
    moved = graph_logits(pipeline.load(moved), documents)
    others = [i for i in range(17) if i != 3]
    assert np.abs(moved[:, others] - base[:, others]).max() < 1e-6
    assert np.abs(moved[:, 3] - base[:, 3] - vectors[:, 0]).max() < 1e-5
    assert np.abs(vectors[:, 0]).max() > 0.1  # the check above sees a change

    # A bias far above the others: every word gets that tag through the graph.
    with torch.no_grad():
        tagger.head.bias[5] += 1e4
    loaded = pipeline.load(writeback.save_with_graph(tagger, tmp_path / "c" / "p.safetensors").path)
    fifth = tagger.tags[5]
    assert loaded.predict(documents) == [[fifth] * len(d.words) for d in documents]


# -- the pooling ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, pooling, batch_size", [
    ("bert-tiny", "mean", 1), ("bert-tiny", "first", 3), ("xlmr-tiny", "mean", 64),
    ("modernbert-tiny", "first", 3), ("student", "mean", 3)])
def test_the_graph_pools_words_as_the_modules_do(models, tmp_path, name, pooling, batch_size):
    """An identity head makes the logits the word vectors: against trainable.words' word vectors on the
    same weights, documents of several windows (max_length 16) and words without pieces included."""
    model_dir = models[name]
    encoder = TrainableEncoder(model_dir, pooling=pooling, max_length=16)
    width = encoder.width
    out = tmp_path / "identity.onnx"
    identity = {names.HEAD_WEIGHT: np.eye(width, dtype=np.float32),
                names.HEAD_BIAS: np.zeros(width, np.float32)}
    patch.patch(model_dir / manifest.ONNX_FILE, out, identity,
                appended=writeback.head_appendix(width, width, pooling))
    documents = docs()
    assert any(len(p.windows) > 2 for p in encoder.tokenizer.prepare_many(documents, 16))
    with torch.no_grad():
        reference = encoder.forward_flat(documents)[0].numpy()
    graph = GraphTagger(model_dir, out, pooling=pooling, max_length=16, batch_size=batch_size)
    ours = graph.logits(documents, batch_words=7)  # groups of documents, as Tagger.predict forms them
    assert [len(v) for v in ours] == [len(d.words) for d in documents]
    ours = np.concatenate(ours)
    assert np.abs(ours - reference).max() < 1e-5
    pieceless = sum(len(d.words) for d in documents[:7]) + 3  # the empty word (5, 5)
    assert not ours[pieceless].any() and not reference[pieceless].any()
    assert np.abs(reference).max() > 0.1


def test_a_pieces_budget_pools_as_the_modules_do(models, tmp_path):
    """Runs of at most N padded pieces (the speed table's batches) give the modules' word vectors too."""
    model_dir = models["bert-tiny"]
    encoder = TrainableEncoder(model_dir, pooling="mean", max_length=16)
    out = tmp_path / "identity.onnx"
    patch.patch(model_dir / manifest.ONNX_FILE, out,
                {names.HEAD_WEIGHT: np.eye(encoder.width, dtype=np.float32),
                 names.HEAD_BIAS: np.zeros(encoder.width, np.float32)},
                appended=writeback.head_appendix(encoder.width, encoder.width, "mean"))
    documents = docs()
    with torch.no_grad():
        reference = encoder.forward_flat(documents)[0].numpy()
    graph = GraphTagger(model_dir, out, pooling="mean", max_length=16)
    graph.encoder.batch_pieces = 40
    joined = graph.encoder.tokenizer.prepare_joined(documents, 16)
    longest, windows = tagging_graph.window_counts(joined)
    assert len(tagging_graph.piece_batches(longest, windows, 40)) > 2  # several runs, one over the budget
    ours = np.concatenate(graph.logits(documents))
    assert np.abs(ours - reference).max() < 1e-5
    # The speed table's passes: documents of several windows, so one call per planned batch ...
    planned = speed.speed_batches(graph, documents, 40)
    assert planned["calls"] == planned["batches"] and len(planned["batches"]) > 2
    assert sum(planned["lengths"]) <= sum(planned["padded"])
    # ... and one call for one-window documents: the modules then plan the same batches themselves.
    short = [d for d, n in zip(documents, windows, strict=True) if n == 1]
    planned = speed.speed_batches(graph, short, 40)
    assert planned["calls"] == [short] and len(planned["batches"]) > 1


def _plain_feeds(tokenizer, documents, group, pad_id, max_length):
    """A run's inputs built document by document from prepare_many's DocPieces, with plain loops: the
    reference for PieceFeeds.feeds, which builds them from the flat arrays of prepare_joined."""
    prepared = tokenizer.prepare_many(documents, max_length)
    windows = [w for d in group for w in prepared[d].inputs] or [tokenizer.wrap(np.zeros(0, np.int64))]
    length = max(len(w) for w in windows)
    ids = np.full((len(windows), length), pad_id, np.int64)
    mask = np.zeros((len(windows), length), np.int64)
    for b, w in enumerate(windows):
        ids[b, :len(w)], mask[b, :len(w)] = w, 1
    table, first = [], 0
    for d in group:
        doc = prepared[d]
        for i in range(doc.words.n_words):
            table.append([int((first + doc.owner[p]) * length + doc.row[p]) for p in doc.words.pieces_of(i)])
        first += len(doc.inputs)
    width = max([1] + [len(r) for r in table])
    return ids, mask, np.array([r + [-1] * (width - len(r)) for r in table], np.int64).reshape(-1, width)


@pytest.mark.parametrize("budget", [None, 40])
def test_the_feeds_from_flat_arrays_equal_the_per_document_ones(models, budget):
    """Every run's input_ids, attention_mask and word_pieces, as _plain_feeds builds them (several
    windows per document, an empty word, documents without words or text), in either grouping."""
    feeds = tagging_graph.PieceFeeds(models["bert-tiny"], "mean", 16, 3, batch_pieces=budget)
    documents = docs()
    runs = feeds.batches(feeds.tokenizer.prepare_joined(documents, 16))
    assert sorted(d for group, _ in runs for d in group) == list(range(len(documents))) and len(runs) > 2
    for group, inputs in runs:
        ids, mask, table = _plain_feeds(feeds.tokenizer, documents, group, feeds.pad_id, 16)
        assert np.array_equal(inputs["input_ids"], ids) and np.array_equal(inputs["attention_mask"], mask)
        assert np.array_equal(inputs[tagging_graph.WORD_PIECES], table), group


def _windows(*lengths_of_docs):
    """piece_batches' view of documents whose windows have these lengths: (longest, windows)."""
    return [max(doc) for doc in lengths_of_docs], [len(doc) for doc in lengths_of_docs]


def test_piece_batches_group_as_the_trainable_encoder_plans():
    """One-window documents: the grouping trainable.words.plan_batches makes of their lengths; a
    document's windows stay together, and one over the budget runs alone."""
    from encoder_study.encoders.trainable.words import plan_batches

    rng = np.random.default_rng(0)
    for budget in (16, 40, 100, 10_000):
        lengths = [int(n) for n in rng.integers(1, 17, size=30)]
        assert tagging_graph.piece_batches(*_windows(*([n] for n in lengths)), budget) == \
            plan_batches(lengths, budget)
    assert tagging_graph.piece_batches(*_windows([3], [2], [4]), 1) == [[2], [0], [1]]
    # [5, 5] (10 padded), [6] (6), [3], [4, 4, 4] (12): longest first, windows x longest <= 12
    assert tagging_graph.piece_batches(*_windows([5, 5], [6], [3], [4, 4, 4]), 12) == [[1], [0], [3], [2]]
    assert tagging_graph.piece_batches(*_windows([5, 5], [6], [3], [4, 4, 4]), 18) == [[1, 0], [3, 2]]
    with pytest.raises(ValueError, match="max_pieces"):
        tagging_graph.piece_batches([], [], 0)


def test_the_piece_table_lists_each_words_pieces_in_order():
    from encoder_study.encoders.tokens import WordPieces

    words = WordPieces(4, np.array([0, 0, 0, 2, 3, 3]), np.array([0, 1, 2, 2, 3, 4]))
    rows = np.array([10, 11, 12, 20, 21])
    assert tagging_graph.piece_table(words, rows).tolist() == [[10, 11, 12], [-1, -1, -1], [12, -1, -1],
                                                               [20, 21, -1]]
    assert tagging_graph.piece_table(WordPieces(2, np.zeros(0, np.int64), np.zeros(0, np.int64)),
                                     rows).tolist() == [[-1], [-1]]


# -- the student -----------------------------------------------------------------------------------------

def test_a_students_pipeline_round_trip(student_dir, tmp_path):
    tagger = finetuned(student_dir, "first")
    documents = docs()
    saved = writeback.save_with_graph(tagger, tmp_path / pipeline.FILE_NAME)
    assert "model.embeddings.projection.weight" in saved.report.rewritten
    loaded = pipeline.load(saved.path)
    assert isinstance(loaded, GraphTagger)
    assert np.abs(graph_logits(loaded, documents) - module_logits(tagger, documents)).max() < 1e-5
    assert loaded.predict(documents) == tagger.predict(documents)


# -- the patcher's appendix ---------------------------------------------------------------------------------

def test_the_patcher_refuses_what_it_cannot_append(tiny_exports, tmp_path):
    source = tiny_exports["bert-tiny"] / manifest.ONNX_FILE
    appended = writeback.head_appendix(32, 17, "mean")
    head = {names.HEAD_WEIGHT: np.zeros((32, 17), np.float32), names.HEAD_BIAS: np.zeros(17, np.float32)}
    out = tmp_path / "out" / "g.onnx"
    out.parent.mkdir()
    clash = helper.make_tensor_value_info("input_ids", onnx.TensorProto.INT64, ["b"])
    for replacements, appendix, match in (
            ({names.HEAD_WEIGHT: head[names.HEAD_WEIGHT]}, appended, "no value given for the appended"),
            ({**head, names.HEAD_BIAS: np.zeros(16, np.float32)}, appended, r"declared \[17\]"),
            (head, patch.Appendix(inputs=(clash,)), "already has a value named 'input_ids'"),
            (head, patch.Appendix(outputs=(helper.make_tensor_value_info("last_hidden_state", 1, None),)),
             "already has a value named 'last_hidden_state'"),
            (head, patch.Appendix(initializers=appended.initializers, min_opset=99), "opset 99")):
        with pytest.raises(WritebackError, match=match):
            patch.patch(source, out, replacements, appended=appendix)
        assert list(out.parent.iterdir()) == []

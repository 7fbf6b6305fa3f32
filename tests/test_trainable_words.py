"""The trainable encoder at the word level: the frozen encoder's word vectors, batching, gradients, the
frozen token table, checkpoints and the batch bound.

The reference for the vectors is `FrozenEncoder` (ONNX Runtime on the same export), which
test_frozen.py checks against the tokenizer's own encoding run as one sequence.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import TINY
from encoder_study.encoders import trainable
from encoder_study.encoders.frozen import EncoderError, FrozenEncoder
from encoder_study.encoders.tokens import Doc
from encoder_study.encoders.trainable.words import CHECKPOINT_FORMAT, TrainableEncoder, plan_batches
from encoder_study.onnx import manifest

TOLERANCE = {"bert-tiny": 2e-5, "xlmr-tiny": 2e-5, "modernbert-tiny": 2e-5, "minilm": 1e-4}
SENTENCES = [
    "The bank's record runs fast , but time flies like an arrow .",
    "Příliš žluťoučký kůň úpěl ďábelské ódy .",
    "Съешь же ещё этих мягких французских булок .",
    "日本語 の テキスト 😀 and Ξεσκεπάζω την ψυχοφθόρα .",
    "x",
]
DOCS = [
    *(Doc.from_words(s.split()) for s in SENTENCES),
    Doc("time runs", ((0, 4), (5, 7), (7, 9))),  # "runs" cut inside a piece: one piece, two words
    Doc("the bank", ((0, 3), (3, 3), (4, 8))),  # the middle word is empty: no piece, a zero vector
    Doc("", ()),  # no pieces, no words
    Doc.from_words(" ".join(SENTENCES[:2] * 2).split()),  # longer: several windows at max_length 16
]
WINDOWED = 16  # max_length that forces windows on most documents


def numpy_vectors(vectors: list[torch.Tensor]) -> list[np.ndarray]:
    return [v.detach().numpy() for v in vectors]


def max_abs(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    return max(float(np.abs(g - w).max(initial=0)) for g, w in zip(got, want, strict=True))


class BatchRecorder:
    """Keeps the (input_ids, attention_mask) of every batch the inner encoder is given."""

    def __init__(self, encoder: TrainableEncoder):
        self.batches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.handle = encoder.encoder.register_forward_pre_hook(self.record)

    def record(self, module, args):
        self.batches.append((args[0].clone(), args[1].clone()))


# -- word vectors -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [*TINY, "minilm"])
def test_word_vectors_match_the_frozen_encoder(exports, name):
    measured = {}
    for max_length in (512, WINDOWED):
        for pooling in ("mean", "first"):
            ours = TrainableEncoder(exports[name], pooling=pooling, max_length=max_length)
            frozen = FrozenEncoder(exports[name], pooling=pooling, max_length=max_length)
            windows = [len(ours.tokenizer.prepare(doc, ours.max_length).windows) for doc in DOCS]
            if max_length == WINDOWED:
                assert max(windows) >= 3
            else:
                assert max(windows) == 1  # the documents fit: no windowing
            with torch.no_grad():
                got = numpy_vectors(ours(DOCS))
            want = frozen(DOCS)
            shapes = [(len(d.words), ours.width) for d in DOCS]
            assert [g.shape for g in got] == [w.shape for w in want] == shapes
            assert not got[6][1].any() and got[6][[0, 2]].any(axis=1).all()  # the empty word
            measured[max_length, pooling] = max_abs(got, want)
    print(f"{name}: max abs vs FrozenEncoder {measured}")
    assert max(measured.values()) < TOLERANCE[name]


@pytest.mark.parametrize("name", [*TINY, "minilm"])
def test_a_batch_of_documents_equals_each_document_alone_bitwise(exports, name):
    # A small bound: several batches, each padded to its own longest window.
    encoder = TrainableEncoder(exports[name], max_length=WINDOWED, max_batch_pieces=4 * WINDOWED)
    with torch.no_grad():
        together = encoder(DOCS)
        for doc, vectors in zip(DOCS, together, strict=True):
            alone = encoder([doc])[0]
            assert torch.equal(alone, vectors), (doc.text, (alone - vectors).abs().max())


def test_forward_flat_is_forward_concatenated(exports):
    encoder = TrainableEncoder(exports["xlmr-tiny"], max_length=WINDOWED)
    with torch.no_grad():
        flat, offsets = encoder.forward_flat(DOCS)
        split = encoder(DOCS)
    assert offsets.tolist() == np.cumsum([0] + [len(d.words) for d in DOCS]).tolist()
    assert torch.equal(torch.cat(split), flat)
    assert encoder([]) == [] and encoder.forward_flat([])[0].shape == (0, encoder.width)


# -- gradients and the token table --------------------------------------------------------------------


@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("pooling", ["mean", "first"])
def test_a_word_loss_reaches_its_pieces_the_layers_and_its_windows_tokens(exports, name, pooling):
    encoder = TrainableEncoder(exports[name], pooling=pooling, max_length=WINDOWED, freeze_embeddings=False)
    doc = DOCS[-1]
    pieces = encoder.tokenizer.prepare(doc, encoder.max_length)

    def owners(w):
        return sorted(set(pieces.owner[pieces.words.pieces_of(w)].tolist()))

    # A word of several pieces read from two windows, neither the first nor the last, so that the loss
    # crosses windows inside the document and other windows exist on both sides.
    word = next(w for w in range(len(doc.words)) if len(owners(w)) == 2
                and 0 < owners(w)[0] and owners(w)[1] < len(pieces.windows) - 1)
    mine = pieces.words.pieces_of(word)
    used = mine if pooling == "mean" else mine[:1]
    windows = sorted(set(pieces.owner[used].tolist()))
    assert len(windows) == (2 if pooling == "mean" else 1)

    captured = []

    def keep(module, args, out):
        out.retain_grad()
        captured.append(out)

    handle = encoder.encoder.register_forward_hook(keep)
    direction = torch.randn(encoder.width, generator=torch.Generator().manual_seed(0))
    (encoder([doc])[0][word] * direction).sum().backward()
    handle.remove()

    # The hidden states: non-zero gradient exactly on the rows the word pools, each its pooling weight.
    (hidden,) = captured  # one batch: the windows of one document fit under 8192 pieces
    order = sorted(range(len(pieces.windows)), key=lambda k: -len(pieces.inputs[k]))  # the batch's rows
    expected = torch.zeros_like(hidden)
    for p in used:
        expected[order.index(pieces.owner[p]), pieces.row[p]] = direction / len(used)
    assert torch.allclose(hidden.grad, expected, rtol=0, atol=1e-6)
    assert torch.count_nonzero(hidden.grad.abs().sum(-1)) == len(used)

    # Every parameter of the modules gets a gradient.
    missing = [n for n, p in encoder.encoder.named_parameters() if p.grad is None or not p.grad.any()]
    assert missing == []
    # The token table: exactly the rows of the ids in the windows the pooled pieces are read from
    # (specials included), not only the word's own pieces: attention carries the loss to every token
    # those windows hold, and to no token of the other windows.
    rows = set(torch.nonzero(encoder.encoder.tokens.weight.grad.abs().sum(dim=1)).flatten().tolist())
    assert rows == set(np.concatenate([pieces.inputs[k] for k in windows]).tolist())
    assert rows > set(pieces.ids[used].tolist())
    assert rows < set(pieces.ids.tolist()) | set(encoder.tokenizer.prefix + encoder.tokenizer.suffix)


def test_token_table_frozen_by_default_and_unfrozen_by_the_option(exports):
    frozen = TrainableEncoder(exports["modernbert-tiny"])
    table = frozen.encoder.tokens.weight
    assert frozen.embeddings_frozen and not table.requires_grad
    assert all(p is not table for p in frozen.trainable_parameters())
    torch.cat(frozen(DOCS[:3])).pow(2).sum().backward()
    assert table.grad is None and all(p.grad is not None for p in frozen.trainable_parameters())
    assert "tokens.weight" not in frozen.checkpoint()["encoder"]["state_dict"]

    unfrozen = TrainableEncoder(exports["modernbert-tiny"], freeze_embeddings=False)
    assert not unfrozen.embeddings_frozen and unfrozen.encoder.tokens.weight.requires_grad
    assert any(p is unfrozen.encoder.tokens.weight for p in unfrozen.trainable_parameters())
    assert "tokens.weight" in unfrozen.checkpoint()["encoder"]["state_dict"]
    assert unfrozen.settings()["encoder"]["freeze_embeddings"] is False


# -- checkpoints --------------------------------------------------------------------------------------


def train_a_step(encoder: TrainableEncoder) -> None:
    encoder.train()
    optimizer = torch.optim.AdamW(encoder.trainable_parameters(), lr=1e-2)
    torch.cat(encoder(DOCS)).pow(2).mean().backward()
    optimizer.step()
    encoder.eval()


@pytest.mark.parametrize("name,freeze", [("xlmr-tiny", True), ("modernbert-tiny", False)])
def test_save_then_restore_gives_identical_outputs(exports, tmp_path, name, freeze):
    encoder = TrainableEncoder(exports[name], pooling="first", max_length=24, max_batch_pieces=100,
                               freeze_embeddings=freeze)
    before = {n: p.detach().clone() for n, p in encoder.named_parameters()}
    train_a_step(encoder)
    changed = {n for n, p in encoder.named_parameters() if not torch.equal(p, before[n])}
    assert ("encoder.tokens.weight" in changed) == (not freeze) and len(changed) > 1
    path = tmp_path / "encoder.pt"
    encoder.save(path)
    saved = torch.load(path, weights_only=True)
    assert saved["format"] == CHECKPOINT_FORMAT
    assert saved["words"]["files"] == {f: encoder.settings()["files"][f] for f in saved["words"]["files"]}

    again = TrainableEncoder.restore(exports[name], path)
    assert again.settings() == encoder.settings()
    assert (again.pooling, again.max_length, again.max_batch_pieces) == ("first", 24, 100)
    with torch.no_grad():
        for a, b in zip(again(DOCS), encoder(DOCS), strict=True):
            assert torch.equal(a, b)
    # The state a tagger embeds in its own file restores as well as the file does.
    with torch.no_grad():
        from_state = TrainableEncoder.restore(exports[name], encoder.checkpoint())
        assert torch.equal(torch.cat(from_state(DOCS)), torch.cat(encoder(DOCS)))

    other = "bert-tiny" if name == "xlmr-tiny" else "xlmr-tiny"
    with pytest.raises(EncoderError, match="not the file the checkpoint was saved with"):
        TrainableEncoder.restore(exports[other], path)
    with pytest.raises(ValueError, match="not a TrainableEncoder checkpoint"):
        TrainableEncoder.restore(exports[name], trainable.checkpoint(encoder.encoder))


# -- batches ------------------------------------------------------------------------------------------


def test_plan_batches_is_longest_first_and_greedy_under_the_bound():
    assert plan_batches([], 10) == []
    assert plan_batches([3, 5, 5, 2, 4], 10) == [[1, 2], [4, 0], [3]]  # ties keep order; 3 * 4 > 10
    assert plan_batches([4, 4, 4], 12) == [[0, 1, 2]]
    with pytest.raises(ValueError, match="exceeds max_batch_pieces 5"):
        plan_batches([3, 6], 5)


@pytest.mark.parametrize("bound", [16, 40, 100, 8192])
def test_batches_respect_max_batch_pieces(exports, bound):
    encoder = TrainableEncoder(exports["bert-tiny"], max_length=WINDOWED, max_batch_pieces=bound)
    recorder = BatchRecorder(encoder)
    with torch.no_grad():
        got = encoder(DOCS)
    shapes = [tuple(ids.shape) for ids, _ in recorder.batches]
    print(f"max_batch_pieces {bound}: batch shapes {shapes}")
    windows = [w for doc in DOCS for w in encoder.tokenizer.prepare(doc, encoder.max_length).inputs]
    assert sum(rows for rows, _ in shapes) == len(windows) == encoder.windows_run
    assert all(rows * length <= bound for rows, length in shapes)
    assert [length for _, length in shapes] == sorted((length for _, length in shapes), reverse=True)
    # Greedy: a batch stops only when the next window would break the bound.
    for rows, length in shapes[:-1]:
        assert (rows + 1) * length > bound
    # Rows are the windows right padded: real ids then masked filler, longest first.
    real = sorted((len(w) for w in windows), reverse=True)
    assert [int(n) for _, mask in recorder.batches for n in mask.sum(dim=1)] == real
    for ids, mask in recorder.batches:
        assert torch.all(ids[mask == 0] == encoder.encoder.filler_id)
        assert torch.equal(mask, (mask.cumsum(dim=1) == torch.arange(1, mask.shape[1] + 1)).long())
    reference = FrozenEncoder(exports["bert-tiny"], max_length=WINDOWED)(DOCS)
    assert max_abs(numpy_vectors(got), reference) < 2e-5


# -- settings and refusals ----------------------------------------------------------------------------


def test_settings_record_what_decides_the_vectors(exports):
    threads = torch.get_num_threads()
    try:  # `threads` sets PyTorch's count for the whole process
        encoder = TrainableEncoder(exports["xlmr-tiny"], pooling="first", max_length=1000,
                                   max_batch_pieces=4096, threads=1)
        settings = json.loads(json.dumps(encoder.settings()))  # JSON-ready
    finally:
        torch.set_num_threads(threads)
    recorded = manifest.read(exports["xlmr-tiny"])["files"]
    assert settings["files"] == {e["path"]: e["sha256"] for e in recorded}
    lengths = (settings["max_length"], settings["max_length_requested"], settings["window_pieces"])
    assert lengths == (128, 1000, 126)  # xlmr-tiny: 130 positions less padding_idx + 1
    assert (settings["pooling"], settings["max_batch_pieces"], settings["pad_id"]) == ("first", 4096, 1)
    assert settings["encoder"] == encoder.encoder.settings_dict()
    assert settings["encoder"]["family"] == "postnorm" and settings["encoder"]["freeze_embeddings"] is True
    assert settings["threads"] == 1 and settings["kind"] == "transformer-trainable"


def test_bad_arguments_are_refused(exports, tmp_path):
    directory = exports["bert-tiny"]
    with pytest.raises(ValueError, match="pooling must be one of"):
        TrainableEncoder(directory, pooling="max")
    with pytest.raises(ValueError, match="max_batch_pieces 64 cannot hold one window of 128 pieces"):
        TrainableEncoder(directory, max_batch_pieces=64)
    with pytest.raises(ValueError, match="max_length must be a positive integer"):
        TrainableEncoder(directory, max_length=0)
    with pytest.raises(ValueError, match="max_length 3 is too small"):
        TrainableEncoder(directory, max_length=3)
    with pytest.raises(EncoderError, match="not a directory"):
        TrainableEncoder(tmp_path / "missing")
    with pytest.raises(TypeError, match="takes encoders.tokens.Doc, got str"):
        TrainableEncoder(directory)(["a text"])
    with pytest.raises(ValueError, match="only for family 'modernbert'"):
        TrainableEncoder(directory, global_rope_theta=10000.0)

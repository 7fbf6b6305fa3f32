"""The frozen ONNX Runtime encoder and the piece/window/word machinery it shares (tokens.py).

References are computed independently of the code under test: the tokenizer's own encoding with
special tokens, onnxruntime run directly on single unpadded sequences, overlaps by brute force.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import onnxruntime as ort
import pytest
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors

from conftest import TINY
from encoder_study.core import files
from encoder_study.encoders.frozen import EncoderError, FrozenEncoder
from encoder_study.encoders.tokens import (
    Doc,
    DocPieces,
    PieceTokenizer,
    TokenizerError,
    WordPieces,
    cut_windows,
    nearest_windows,
    word_pieces,
)
from encoder_study.onnx import manifest, runtime

SENTENCES = [
    "The bank's record runs fast , but time flies like an arrow .",
    "Příliš žluťoučký kůň úpěl ďábelské ódy .",
    "Съешь же ещё этих мягких французских булок .",
    "日本語 の テキスト 😀 and Ξεσκεπάζω την ψυχοφθόρα .",
    "x",
]
DOCS = [Doc.from_words(s.split()) for s in SENTENCES]
# Gold words that cut one piece in two ("runs" -> "ru" + "ns"), so that a piece has two words.
SPLIT_DOC = Doc("time runs", ((0, 4), (5, 7), (7, 9)))
TOL = 1e-5


# ---------------------------------------------------------------------------------------------------------
# Independent references


_SESSIONS: dict[str, ort.InferenceSession] = {}


def run_direct(model_dir, ids) -> np.ndarray:
    """Hidden states [len, width] of one unpadded sequence, straight from onnxruntime."""
    path = str(model_dir / manifest.ONNX_FILE)
    if path not in _SESSIONS:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        _SESSIONS[path] = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    ids = np.asarray(ids, dtype=np.int64)[None]
    return _SESSIONS[path].run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0][0]


def overlapping(offsets, start, end) -> list[int]:
    """Pieces sharing at least one character with [start, end), by brute force over character sets."""
    chars = set(range(start, end))
    return [i for i, (s, e) in enumerate(offsets) if chars & set(range(s, e))]


def pool_reference(piece_vectors, offsets, doc: Doc, pooling: str) -> np.ndarray:
    out = np.zeros((len(doc.words), piece_vectors.shape[1]), np.float32)
    for w, (start, end) in enumerate(doc.words):
        hits = overlapping(offsets, start, end)
        if hits:
            out[w] = piece_vectors[hits].mean(axis=0) if pooling == "mean" else piece_vectors[hits[0]]
    return out


def unwindowed_reference(model_dir, doc: Doc, pooling: str) -> np.ndarray:
    """Word vectors from the tokenizer's own encoding with specials, run as one sequence."""
    tok = Tokenizer.from_file(str(model_dir / manifest.TOKENIZER_FILE))
    tok.no_truncation()
    tok.no_padding()
    enc = tok.encode(doc.text)
    real = [i for i, special in enumerate(enc.special_tokens_mask) if not special]
    hidden = run_direct(model_dir, enc.ids)[real]
    return pool_reference(hidden, [enc.offsets[i] for i in real], doc, pooling)


class Recorder:
    """Stands in for the encoder's session and keeps every batch it is given."""

    def __init__(self, session):
        self.session = session
        self.batches: list[tuple[np.ndarray, np.ndarray]] = []

    def run(self, names, feeds):
        self.batches.append((feeds["input_ids"].copy(), feeds["attention_mask"].copy()))
        return self.session.run(names, feeds)


def long_text(n_sentences: int) -> str:
    return " ".join((SENTENCES * n_sentences)[:n_sentences])


# ---------------------------------------------------------------------------------------------------------
# Doc


def test_doc_is_hashable_and_checks_ranges():
    doc = Doc.from_words(["a", "bank", "."])
    assert doc.text == "a bank ." and doc.words == ((0, 1), (2, 6), (7, 8)) and doc.word(1) == "bank"
    same = Doc("a bank .", [[0, 1], [2, 6], [7, 8]])  # lists in, tuples stored
    assert same == doc and hash(same) == hash(doc) and len({doc, same}) == 1
    assert Doc("ab", ((1, 1), (2, 2))).words == ((1, 1), (2, 2))  # empty ranges, even at the end, are fine
    for bad in [(0, 3), (-1, 1), (2, 1)]:
        with pytest.raises(ValueError, match=rf"word 1 has range \[{bad[0]}, {bad[1]}\), not within the text "
                                             r"of 2 characters 'ab'"):
            Doc("ab", ((0, 1), bad))
    with pytest.raises(TypeError, match="Doc.text must be a str"):
        Doc(b"ab", ())


# ---------------------------------------------------------------------------------------------------------
# Windows and word mapping (pure)


def brute_nearest(n, windows) -> list[int]:
    chosen = []
    for p in range(n):
        best = None
        for k, (start, end) in enumerate(windows):
            if start <= p < end:
                distance = abs(p - (start + end - 1) / 2)
                if best is None or distance < best[0]:  # strict: the earlier window keeps a tie
                    best = (distance, k)
        chosen.append(best[1])
    return chosen


@pytest.mark.parametrize("size", [2, 3, 4, 7, 8, 14])
def test_windows_overlap_by_half_and_pieces_take_the_nearest_centre(size):
    for n in range(0, 5 * size + 3):
        windows = cut_windows(n, size)
        if n == 0:
            assert windows == ()
            continue
        if n <= size:
            assert windows == ((0, n),)
        else:
            assert windows[0][0] == 0 and windows[-1][1] == n
            assert all(end - start == size for start, end in windows)
            overlaps = [a[1] - b[0] for a, b in zip(windows, windows[1:], strict=False)]
            assert all(o == size - size // 2 for o in overlaps[:-1])  # half (rounded up)
            assert size - size // 2 <= overlaps[-1] < size  # the last window is pulled back to the end
        owner = nearest_windows(n, windows)
        assert owner.tolist() == brute_nearest(n, windows)
        for p, k in enumerate(owner):
            start, end = windows[k]
            assert start <= p < end
            # Read far from the window's edges, unless the piece is near the document's own edge.
            assert min(p - start, end - 1 - p) >= min(p, n - 1 - p, (size - 1) // 4)


def test_nearest_window_ties_go_to_the_earlier_window():
    # Piece 2 is 0.5 from both centres (1.5 and 2.5).
    assert nearest_windows(5, [(0, 4), (1, 5)]).tolist() == [0, 0, 0, 1, 1]
    with pytest.raises(ValueError, match="do not cover"):
        nearest_windows(5, [(0, 3)])
    with pytest.raises(ValueError, match="at least 2 pieces"):
        cut_windows(10, 1)


def test_word_pieces_half_open_overlap():
    offsets = np.array([(0, 3), (3, 3), (3, 6), (5, 9), (10, 12)])
    words = [(0, 6), (4, 6), (6, 9), (9, 10), (7, 7), (10, 11)]
    mapping = word_pieces(offsets, words)
    assert [mapping.pieces_of(i).tolist() for i in range(len(words))] == [[0, 2, 3], [2, 3], [3], [], [], [4]]
    assert mapping.counts().tolist() == [3, 2, 1, 0, 0, 1]
    word, piece, weight = mapping.gather("first")
    assert (word.tolist(), piece.tolist(), weight.tolist()) == ([0, 1, 2, 5], [0, 2, 3, 4], [1, 1, 1, 1])
    hidden = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    for pooling in ("mean", "first"):
        got = mapping.pool(hidden, pooling)
        expected = pool_reference(hidden, offsets.tolist(), Doc("x" * 12, words), pooling)
        np.testing.assert_allclose(got, expected, atol=1e-6)
        assert not got[3].any() and not got[4].any()
    with pytest.raises(ValueError, match=r"pooling must be one of \['mean', 'first'\], got 'max'"):
        mapping.gather("max")


def pool_loop(hidden, word, piece, n_words, pooling) -> np.ndarray:
    """Pooling as a plain loop over (word, piece) pairs in float32: each term piece * float32(1 / count),
    added left to right; `first` takes a word's first pair."""
    out = np.zeros((n_words, hidden.shape[1]), np.float32)
    for w in range(n_words):
        mine = [p for ww, p in zip(word.tolist(), piece.tolist(), strict=True) if ww == w]
        if not mine:
            continue
        if pooling == "first":
            out[w] = hidden[mine[0]]
            continue
        scale = np.float32(1.0 / len(mine))
        total = hidden[mine[0]] * scale
        for p in mine[1:]:
            total = total + hidden[p] * scale
        out[w] = total
    return out


def test_pooling_gives_a_plain_loop_s_bytes():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n_pieces, n_words = int(rng.integers(0, 12)), int(rng.integers(0, 10))
        pairs = sorted({(int(rng.integers(n_words)), int(rng.integers(n_pieces)))
                        for _ in range(int(rng.integers(0, 25))) if n_words and n_pieces})
        word = np.array([w for w, _ in pairs], np.int64)
        piece = np.array([p for _, p in pairs], np.int64)
        hidden = (rng.standard_normal((n_pieces, 5)) * 10.0 ** rng.uniform(-3, 3)).astype(np.float32)
        for pooling in ("mean", "first"):
            got = WordPieces(n_words, word, piece).pool(hidden, pooling)
            expected = pool_loop(hidden, word, piece, n_words, pooling)
            assert got.dtype == np.float32 and got.shape == expected.shape
            assert got.tobytes() == expected.tobytes()


def plain_prepare(tok: PieceTokenizer, doc: Doc, max_length: int) -> DocPieces:
    """One document as encoder_study.encoders.tokens' docstring describes it, step by step on its own: the
    reference for prepare_joined (and prepare_many, cut from it)."""
    ids, offsets = tok.encode(doc.text)
    windows = cut_windows(len(ids), tok.window_size(max_length))
    owner = nearest_windows(len(ids), windows) if len(windows) > 1 else np.zeros(len(ids), np.int64)
    starts = np.asarray([start for start, _ in windows], dtype=np.int64)
    row = np.arange(len(ids), dtype=np.int64) - starts[owner] + len(tok.prefix)
    return DocPieces(ids, offsets, windows, tuple(tok.wrap(ids[a:b]) for a, b in windows), owner, row,
                     word_pieces(offsets, doc.words))


@pytest.mark.parametrize("name", TINY)
def test_joined_pieces_are_each_document_s_pieces_laid_out(tiny_exports, name):
    tok = PieceTokenizer(tiny_exports[name] / manifest.TOKENIZER_FILE)
    docs = [DOCS[0], Doc.from_words(long_text(3).split()), Doc("", ()), SPLIT_DOC, Doc.from_words(["\u200b"]),
            DOCS[3], Doc.from_words(long_text(4).split()), DOCS[4]]
    alone = [plain_prepare(tok, doc, 16) for doc in docs]
    # Each document cut back out of the joined arrays is the plain one.
    for got, want in zip(tok.prepare_many(docs, 16), alone, strict=True):
        assert got.ids.tolist() == want.ids.tolist() and got.offsets.tolist() == want.offsets.tolist()
        assert got.windows == want.windows
        assert [w.tolist() for w in got.inputs] == [w.tolist() for w in want.inputs]
        assert got.owner.tolist() == want.owner.tolist() and got.row.tolist() == want.row.tolist()
        assert got.words.n_words == want.words.n_words
        assert got.words.word.tolist() == want.words.word.tolist()
        assert got.words.piece.tolist() == want.words.piece.tolist()
    joined = tok.prepare_joined(docs, 16)
    assert sum(len(p.windows) > 2 for p in alone) >= 2  # documents of several windows
    assert joined.piece_start.tolist() == np.cumsum([0] + [len(p) for p in alone]).tolist()
    assert joined.ids.tolist() == [i for p in alone for i in p.ids.tolist()]
    assert [w.tolist() for w in joined.inputs] == [w.tolist() for p in alone for w in p.inputs]
    first_window = np.cumsum([0] + [len(p.windows) for p in alone])
    owners = [first_window[d] + k for d, p in enumerate(alone) for k in p.owner.tolist()]
    assert joined.window.tolist() == owners
    assert joined.row.tolist() == [r for p in alone for r in p.row.tolist()]
    assert joined.word_start.tolist() == np.cumsum([0] + [len(doc.words) for doc in docs]).tolist()
    assert joined.words.n_words == joined.word_start[-1]
    pairs = [(joined.word_start[d] + w, joined.piece_start[d] + q) for d, p in enumerate(alone)
             for w, q in zip(p.words.word.tolist(), p.words.piece.tolist(), strict=True)]
    assert list(zip(joined.words.word.tolist(), joined.words.piece.tolist(), strict=True)) == pairs
    empty = tok.prepare_joined([], 16)
    assert not len(empty.ids) and not empty.inputs and empty.word_start.tolist() == [0]


# ---------------------------------------------------------------------------------------------------------
# Tokenizer: offsets and specials


def test_wordpiece_offsets_and_specials(tiny_exports):
    path = tiny_exports["bert-tiny"] / manifest.TOKENIZER_FILE
    tok = PieceTokenizer(path)
    vocab = tok.tokenizer
    assert tok.prefix == (vocab.token_to_id("[CLS]"),) and tok.suffix == (vocab.token_to_id("[SEP]"),)
    # An emoji outside the BMP first: offsets after it are wrong if they count UTF-16 units or bytes.
    text = "😀 Héllo wörld, the bank's 日本語 Ξεσκεπάζω!"
    ids, offsets = tok.encode(text)
    assert ids.dtype == np.int64 and offsets.shape == (len(ids), 2)
    assert not set(ids.tolist()) & set(tok.prefix + tok.suffix)  # encoded without special tokens
    pieces = [vocab.id_to_token(i) for i in ids.tolist()]
    assert pieces[0] == "[UNK]" and tuple(offsets[0]) == (0, 1)
    for piece, (start, end) in zip(pieces[1:], offsets[1:].tolist(), strict=True):
        assert piece.removeprefix("##") == text[start:end]
    assert len(pieces) > len(text.split())  # words really are split into pieces


def test_unigram_offsets_and_specials(tiny_exports):
    tok = PieceTokenizer(tiny_exports["xlmr-tiny"] / manifest.TOKENIZER_FILE)
    vocab = tok.tokenizer
    assert tok.prefix == (vocab.token_to_id("<s>"),) and tok.suffix == (vocab.token_to_id("</s>"),)
    text = "😀 Héllo wörld, the bank's 日本語 Ξεσκεπάζω!"
    ids, offsets = tok.encode(text)
    assert not set(ids.tolist()) & set(tok.prefix + tok.suffix)
    pieces = [vocab.id_to_token(i) for i in ids.tolist()]
    for piece, (start, end) in zip(pieces, offsets.tolist(), strict=True):
        if piece == "<unk>":
            assert text[start:end] == "😀"
        elif piece == "▁":  # a lone "▁" prepended to the text takes the first character's range
            assert (start, end) == (0, 1)
        else:  # "▁" stands for the space before a word (none before the first one)
            assert piece.replace("▁", " ").lstrip() == text[start:end].lstrip()
    start = text.index(" the")
    found = [(p, tuple(o)) for p, o in zip(pieces, offsets.tolist(), strict=True)]
    assert ("▁the", (start, start + 4)) in found


def test_minilm_tokenizer_neither_pads_nor_truncates(minilm_export):
    tok = PieceTokenizer(minilm_export / manifest.TOKENIZER_FILE)
    assert tok.prefix == (101,) and tok.suffix == (102,)  # [CLS], [SEP] of bert-base-uncased
    assert tok.tokenizer.padding is None and tok.tokenizer.truncation is None
    ids, _ = tok.encode(long_text(30))
    assert len(ids) > 128 and 0 not in ids.tolist()  # the saved tokenizer truncates and pads to 128


def _save(tok: Tokenizer, path) -> str:
    tok.save(str(path))
    return str(path)


def _word_level(tmp_path, name, post_processor=None, normalizer=None) -> str:
    vocab = {"[UNK]": 0, "[CLS]": 1, "[LANG]": 2, "[SEP]": 3, "probe": 4, "two": 5, "words": 6}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if normalizer is not None:
        tok.normalizer = normalizer
    if post_processor is not None:
        tok.post_processor = post_processor
    return _save(tok, tmp_path / name)


def test_specials_are_found_by_probe_not_by_name(tmp_path):
    two_prefixes = processors.TemplateProcessing(
        single="[CLS] [LANG] $A [SEP]", special_tokens=[("[CLS]", 1), ("[LANG]", 2), ("[SEP]", 3)])
    tok = PieceTokenizer(_word_level(tmp_path, "lang.json", two_prefixes))
    assert (tok.prefix, tok.suffix, tok.n_specials) == ((1, 2), (3,), 3)
    plain = PieceTokenizer(_word_level(tmp_path, "plain.json"))
    assert (plain.prefix, plain.suffix) == ((), ())
    assert plain.wrap(np.array([4, 5])).tolist() == [4, 5]


def test_tokenizer_errors_name_the_file(tmp_path):
    with pytest.raises(TokenizerError, match="missing.json: cannot load the tokenizer"):
        PieceTokenizer(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="bad.json: cannot load the tokenizer"):
        PieceTokenizer(tmp_path / "bad.json")
    erase_all = normalizers.Replace(Regex(r"[\s\S]"), "")
    with pytest.raises(TokenizerError, match=r"empty.json: cannot find the special tokens: the probe"):
        PieceTokenizer(_word_level(tmp_path, "empty.json", normalizer=erase_all))


# ---------------------------------------------------------------------------------------------------------
# FrozenEncoder: vectors


@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("pooling", ["mean", "first"])
def test_word_vectors_match_onnxruntime_on_the_whole_sequence(tiny_exports, name, pooling):
    model_dir = tiny_exports[name]
    encoder = FrozenEncoder(model_dir, pooling=pooling)
    docs = DOCS + [SPLIT_DOC]
    got = encoder(docs)
    for doc, vectors in zip(docs, got, strict=True):
        assert vectors.dtype == np.float32 and vectors.shape == (len(doc.words), encoder.width)
        np.testing.assert_allclose(vectors, unwindowed_reference(model_dir, doc, pooling), atol=TOL, rtol=0)
    # The documents exercise what pooling is about: words of several pieces, a piece of two words.
    tokenizer = encoder.tokenizer
    counts = np.concatenate([tokenizer.prepare(d, 128).words.counts() for d in docs])
    assert counts.max() >= 3
    split = tokenizer.prepare(SPLIT_DOC, 128).words
    assert set(split.pieces_of(1).tolist()) & set(split.pieces_of(2).tolist())
    if pooling == "mean":  # the two halves of "runs" share their only piece
        np.testing.assert_array_equal(got[-1][1], got[-1][2])


@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("max_length", [16, 512])
def test_windowed_vectors_are_the_chosen_windows_vectors(tiny_exports, name, max_length):
    model_dir = tiny_exports[name]
    text = long_text(12 if max_length == 512 else 3)
    doc = Doc.from_words(text.split())
    encoder = FrozenEncoder(model_dir, pooling="mean", max_length=max_length, batch_size=2)
    assert encoder.max_length == min(max_length, 128)  # both tiny models have 128 usable positions
    got = encoder([doc])[0]

    # Reference: cut by hand, run each window alone, read each piece from its nearest-centre window.
    tok = encoder.tokenizer
    ids, offsets = tok.encode(doc.text)
    size = encoder.max_length - tok.n_specials
    assert len(ids) > 2 * size  # at least three windows
    windows = cut_windows(len(ids), size)
    outputs = [run_direct(model_dir, [*tok.prefix, *ids[a:b].tolist(), *tok.suffix]) for a, b in windows]
    assert encoder.windows_run == len(windows)
    pieces = np.zeros((len(ids), encoder.width), np.float32)
    for p, k in enumerate(brute_nearest(len(ids), windows)):
        pieces[p] = outputs[k][len(tok.prefix) + p - windows[k][0]]
    np.testing.assert_allclose(got, pool_reference(pieces, offsets.tolist(), doc, "mean"), atol=TOL, rtol=0)


@pytest.mark.parametrize("name", TINY)
def test_a_document_that_fits_is_one_window(tiny_exports, name):
    model_dir = tiny_exports[name]
    tok = PieceTokenizer(model_dir / manifest.TOKENIZER_FILE)
    words = long_text(3).split()
    for n_words in range(1, len(words)):  # the longest prefix of words that still fits in 16
        doc = Doc.from_words(words[:n_words])
        if len(tok.encode(doc.text)[0]) + tok.n_specials > 16:
            break
        fits = doc
    small, large = FrozenEncoder(model_dir, max_length=16), FrozenEncoder(model_dir, max_length=128)
    np.testing.assert_array_equal(small([fits])[0], large([fits])[0])
    assert small.windows_run == 1
    small([doc])  # one more word: no longer fits
    assert small.windows_run > 2


def test_windowing_on_a_real_model(minilm_export):
    """MiniLM attends globally, so windows change every vector somewhat; they must not change it much."""
    tok = PieceTokenizer(minilm_export / manifest.TOKENIZER_FILE)
    text = long_text(8)
    ids, offsets = tok.encode(text)
    doc = Doc(text, tuple(map(tuple, offsets.tolist())))  # one word per piece: word vectors are piece vectors
    full = FrozenEncoder(minilm_export, pooling="first")([doc])[0]
    windowed = FrozenEncoder(minilm_export, pooling="first", max_length=64)([doc])[0]
    windows = cut_windows(len(ids), 62)
    assert len(windows) >= 4
    outputs = [run_direct(minilm_export, tok.wrap(ids[a:b])) for a, b in windows]
    owner = brute_nearest(len(ids), windows)
    expected = np.stack([outputs[k][1 + p - windows[k][0]] for p, k in enumerate(owner)])
    np.testing.assert_allclose(windowed, expected, atol=TOL, rtol=0)
    cosine = (full * windowed).sum(-1) / np.linalg.norm(full, axis=-1) / np.linalg.norm(windowed, axis=-1)
    assert cosine.mean() > 0.8  # 0.87 when written


@pytest.mark.parametrize("name", TINY)
def test_batches_are_sorted_padded_and_do_not_change_results(tiny_exports, name):
    model_dir = tiny_exports[name]
    docs = DOCS + [Doc.from_words(long_text(3).split()), SPLIT_DOC]
    alone = []
    for doc in docs:
        single = FrozenEncoder(model_dir, max_length=32, batch_size=1)
        alone.append(single([doc])[0])
    encoder = FrozenEncoder(model_dir, max_length=32, batch_size=3)
    recorder = encoder.session = Recorder(encoder.session)
    together = encoder(docs)
    for a, b in zip(alone, together, strict=True):
        np.testing.assert_allclose(b, a, atol=TOL, rtol=0)

    pad_id = json.loads((model_dir / manifest.CONFIG_FILE).read_text())["pad_token_id"]
    lengths = [int(row.sum()) for _, masks in recorder.batches for row in masks]
    assert lengths == sorted(lengths, reverse=True)  # longest first, across documents
    assert len(lengths) == encoder.windows_run > len(docs)  # the long document has several windows
    assert len(recorder.batches) == -(-len(lengths) // 3)  # windows of all documents share batches
    for ids, mask in recorder.batches:
        assert len(ids) <= 3 and mask[:, 0].all()
        assert mask.shape[1] == mask.sum(axis=1).max()  # padded to the batch's longest, no more
        assert (ids[mask == 0] == pad_id).all()
        assert (np.diff(mask, axis=1) <= 0).all()  # right padding: ones, then zeros


def serial_reference(encoder: FrozenEncoder, session, docs: list[Doc]) -> list[np.ndarray]:
    """What a plain serial loop computes: every window of every document, longest first (ties in call
    order), `batch_size` at a time, each batch padded and run by `session`, every piece read through its
    owner mask, then each document pooled alone. The frozen encoder groups runs, copies single windows
    whole and pools all documents at once: the same bytes."""
    prepared = encoder.tokenizer.prepare_many(docs, encoder.max_length)
    jobs = sorted(((d, k) for d, p in enumerate(prepared) for k in range(len(p.windows))),
                  key=lambda job: -len(prepared[job[0]].inputs[job[1]]))
    hidden = [np.zeros((len(p), encoder.width), np.float32) for p in prepared]
    for start in range(0, len(jobs), encoder.batch_size):
        batch = jobs[start:start + encoder.batch_size]
        ids, mask = runtime.pad_batch([prepared[d].inputs[k] for d, k in batch], encoder.pad_id)
        out = session.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": mask})[0]
        for i, (d, k) in enumerate(batch):
            mine = prepared[d].owner == k
            hidden[d][mine] = out[i, prepared[d].row[mine]]
    return [p.words.pool(h, encoder.pooling) for p, h in zip(prepared, hidden, strict=True)]


@pytest.mark.parametrize("name", TINY)
def test_the_encoder_gives_a_plain_loop_s_bytes(tiny_exports, name):
    docs = [*DOCS, Doc.from_words(long_text(4).split()), SPLIT_DOC, Doc.from_words(["\u200b"]), *DOCS[:2]]
    for pooling in ("mean", "first"):
        encoder = FrozenEncoder(tiny_exports[name], pooling=pooling, max_length=24, batch_size=3)
        session = encoder.session
        expected = serial_reference(encoder, session, list(dict.fromkeys(docs)))
        by_doc = dict(zip(dict.fromkeys(docs), expected, strict=True))
        got = encoder(docs[:4]) + encoder(docs)  # a second call runs only what the first did not
        for doc, vectors in zip(docs[:4] + docs, got, strict=True):
            assert vectors.dtype == np.float32 and vectors.tobytes() == by_doc[doc].tobytes()
        if not len(encoder.tokenizer.encode("\u200b")[0]):  # no pieces (WordPiece drops it): zeros
            assert not got[docs.index(Doc.from_words(["\u200b"])) + 4].any()


def test_a_failed_run_is_raised_and_the_encoder_stays_usable(tiny_exports):
    encoder = FrozenEncoder(tiny_exports["bert-tiny"], max_length=16, batch_size=1)
    session = encoder.session

    class Fails:
        calls = 0

        def run(self, names, feeds):
            Fails.calls += 1
            if Fails.calls == 2:
                raise RuntimeError("the second batch fails")
            return session.run(names, feeds)

    encoder.session = Fails()
    with pytest.raises(RuntimeError, match="the second batch fails"):
        encoder(DOCS)
    assert Fails.calls == 2  # nothing ran after the failure
    encoder.session = session
    for got, alone in zip(encoder(DOCS), [FrozenEncoder(tiny_exports["bert-tiny"], max_length=16)([d])[0]
                                          for d in DOCS], strict=True):
        np.testing.assert_allclose(got, alone, atol=TOL, rtol=0)


def test_pad_batch_pads_rows_on_the_right_with_the_pad_id():
    ids, mask = runtime.pad_batch([np.array([5, 6, 7], np.int32), [8]], 1)
    assert ids.dtype == mask.dtype == np.int64
    assert ids.tolist() == [[5, 6, 7], [8, 1, 1]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    ids, mask = runtime.pad_batch([[8]], 0, width=3)  # a width beyond the longest row
    assert ids.tolist() == [[8, 0, 0]] and mask.tolist() == [[1, 0, 0]]


def test_caching_runs_each_document_once(tiny_exports):
    encoder = FrozenEncoder(tiny_exports["bert-tiny"], max_length=16)
    first = encoder(DOCS + DOCS[:2])  # repeated documents in one call run once
    ran = encoder.windows_run
    assert ran == sum(len(encoder.tokenizer.prepare(d, 16).windows) for d in DOCS)
    first[0][:] = 0  # results are copies: the cache is not touched
    again = encoder([Doc(d.text, d.words) for d in DOCS])  # equal documents, new objects
    assert encoder.windows_run == ran
    for a, b in zip(again, encoder(DOCS), strict=True):
        np.testing.assert_array_equal(a, b)
    assert again[0].any()
    new = Doc.from_words(["time", "flies"])
    encoder([new, *DOCS])
    assert encoder.windows_run == ran + 1
    encoder.clear_cache()
    encoder(DOCS)
    assert encoder.windows_run == 2 * ran + 1


@pytest.mark.parametrize("name", TINY)
def test_words_without_pieces_get_zeros(tiny_exports, name):
    encoder = FrozenEncoder(tiny_exports[name])
    # Zero-width ranges overlap no piece, wherever they point.
    doc = Doc("the bank", ((0, 3), (3, 3), (4, 4), (4, 8), (8, 8)))
    vectors = encoder([doc])[0]
    assert vectors[[0, 3]].any(axis=1).all() and not vectors[[1, 2, 4]].any()
    empty = encoder([Doc("", ((0, 0),)), Doc("", ())])  # no pieces: nothing to run
    assert [v.shape for v in empty] == [(1, encoder.width), (0, encoder.width)]
    assert not any(v.any() for v in empty) and encoder.windows_run == 1


def test_a_character_the_normalizer_drops_gets_zeros(tiny_exports, minilm_export):
    # BERT's normalizer drops the zero-width space; MiniLM's (uncased) also strips accents.
    bert = FrozenEncoder(tiny_exports["bert-tiny"])([Doc.from_words(["bank", "\u200b", "runs"])])[0]
    assert bert[[0, 2]].any(axis=1).all() and not bert[1].any()
    minilm = FrozenEncoder(minilm_export)([Doc.from_words(["bank", "\u0301", "runs"])])[0]
    assert minilm[[0, 2]].any(axis=1).all() and not minilm[1].any()


# ---------------------------------------------------------------------------------------------------------
# Settings and errors


def test_settings_are_read_from_the_session(tiny_exports):
    more = os.cpu_count() + 1
    encoder = FrozenEncoder(tiny_exports["xlmr-tiny"], threads=more, optimization="disable", max_length=64)
    settings = json.loads(json.dumps(encoder.settings()))  # plain JSON for provenance
    assert settings["threads"] == os.cpu_count() and settings["threads_requested"] == more
    assert settings["onnxruntime"]["intra_op_num_threads"] == os.cpu_count()
    assert settings["onnxruntime"]["graph_optimization_level"] == "ORT_DISABLE_ALL"
    assert settings["max_length"] == 64 and settings["window_pieces"] == 62
    assert settings["specials"] == {"prefix": [0], "suffix": [2]} and settings["pad_id"] == 1
    assert set(settings["files"]) == {manifest.ONNX_FILE, manifest.TOKENIZER_FILE, manifest.CONFIG_FILE}
    assert FrozenEncoder(tiny_exports["xlmr-tiny"]).settings()["max_length"] == 128  # 130 positions from 2
    optimized = FrozenEncoder(tiny_exports["xlmr-tiny"], optimization="all")
    for a, b in zip(encoder(DOCS), optimized(DOCS), strict=True):
        np.testing.assert_allclose(a, b, atol=TOL, rtol=0)


def _broken_copy(source, target, edit=None, names=None):
    """A copy of an export whose file `edit` changes, re-recorded in export.json so the hashes pass."""
    shutil.copytree(source, target)
    record = manifest.read(target)
    if edit is not None:
        edit(target)
    names = names if names is not None else [e["path"] for e in record["files"]]
    manifest.write(target, {k: v for k, v in record.items() if k != "files"}, names)
    return target


def test_bad_model_dirs_are_refused_naming_the_file(tiny_exports, tmp_path):
    source = tiny_exports["bert-tiny"]
    with pytest.raises(EncoderError, match="nowhere: not a directory"):
        FrozenEncoder(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(manifest.ManifestError, match="empty/export.json is missing"):
        FrozenEncoder(tmp_path / "empty")

    changed = tmp_path / "changed"
    shutil.copytree(source, changed)
    (changed / manifest.TOKENIZER_FILE).write_text("{}")
    with pytest.raises(files.IntegrityError, match="changed/tokenizer.json does not match"):
        FrozenEncoder(changed)

    unlisted = _broken_copy(source, tmp_path / "unlisted", names=[manifest.ONNX_FILE, manifest.CONFIG_FILE])
    with pytest.raises(EncoderError, match="unlisted/export.json does not list tokenizer.json"):
        FrozenEncoder(unlisted)

    def garbage_onnx(d):
        (d / manifest.ONNX_FILE).write_bytes(b"not a graph")

    with pytest.raises(EncoderError, match="onnx/model.onnx: ONNX Runtime cannot load the model"):
        FrozenEncoder(_broken_copy(source, tmp_path / "onnx", garbage_onnx))

    def bad_config(d):
        (d / manifest.CONFIG_FILE).write_text("{")

    with pytest.raises(EncoderError, match="config/model.config.json: cannot read the model.s config"):
        FrozenEncoder(_broken_copy(source, tmp_path / "config", bad_config))

    def no_width(d):
        config = json.loads((d / manifest.CONFIG_FILE).read_text())
        del config["hidden_size"]
        (d / manifest.CONFIG_FILE).write_text(json.dumps(config))

    with pytest.raises(EncoderError, match="width/model.config.json: no hidden_size"):
        FrozenEncoder(_broken_copy(source, tmp_path / "width", no_width))

    def bad_tokenizer(d):
        (d / manifest.TOKENIZER_FILE).write_text("[]")

    with pytest.raises(TokenizerError, match="tok/tokenizer.json: cannot load the tokenizer"):
        FrozenEncoder(_broken_copy(source, tmp_path / "tok", bad_tokenizer))


def test_bad_arguments_are_refused(tiny_exports):
    model_dir = tiny_exports["bert-tiny"]
    with pytest.raises(ValueError, match=r"max_length 3 is too small: .*bert-tiny/tokenizer.json wraps every "
                                         r"window in 2 special tokens, so max_length must be at least 4"):
        FrozenEncoder(model_dir, max_length=3)
    FrozenEncoder(model_dir, max_length=4)  # the smallest that works
    with pytest.raises(ValueError, match=r"pooling must be one of \['mean', 'first'\], got 'max'"):
        FrozenEncoder(model_dir, pooling="max")
    with pytest.raises(ValueError, match=r"optimization must be one of .*got 'fast'"):
        FrozenEncoder(model_dir, optimization="fast")
    for name in ("max_length", "batch_size", "threads"):
        with pytest.raises(ValueError, match=f"{name} must be a positive integer, got 0"):
            FrozenEncoder(model_dir, **{name: 0})
    encoder = FrozenEncoder(model_dir)
    with pytest.raises(TypeError, match="FrozenEncoder takes encoders.tokens.Doc, got str"):
        encoder(["a sentence"])

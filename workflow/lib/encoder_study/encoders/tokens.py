"""Documents, pieces with character offsets, windows, and the map from words to pieces.

Framework-free (numpy only): the frozen ONNX Runtime encoder and the trainable PyTorch encoder both
cut a document the same way here and differ only in how they run the windows and pool.

The steps for one document:

1. Its whole text is encoded once, without special tokens; every piece carries the [start, end)
   character range (Python str indices) it came from.
2. The special tokens the tokenizer wraps a text in are found by a probe (encode a text with and
   without them), then put around every window.
3. A document with more pieces than fit in one window (max_length minus the specials) is cut into
   full windows that overlap by half; each piece reads its vector from the window whose centre is
   nearest, so that it is read as far from a window edge as the windows allow.
4. A piece belongs to every word whose character range it overlaps; a word's vector is the mean of
   its pieces' vectors (`mean`) or its first piece's (`first`), zeros when no piece overlaps it.

`PieceTokenizer.prepare_joined` does this for many documents at once, in flat arrays over all of them
(`JoinedPieces`: one batch encode, one word mapping, every window wrapped at once): on short documents,
per-document numpy calls cost more than the work. The frozen encoder runs those arrays as they are;
`prepare_many` (and `prepare`, for one document) cuts them back into each document's `DocPieces`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import chain
from pathlib import Path

import numpy as np

from ..core.errors import UserError
from ..data.doc import Doc

POOLINGS = ("mean", "first")
# Two different probes: the specials must not depend on the text, or windows could not share them.
PROBES = ("probe", "two words")


class TokenizerError(UserError, ValueError):
    """tokenizer.json cannot be loaded or does not wrap texts the way windows need."""


# ---------------------------------------------------------------------------------------------------------
# Windows


def cut_windows(n_pieces: int, size: int) -> tuple[tuple[int, int], ...]:
    """Piece ranges [start, end) of the windows of a document with `n_pieces` pieces.

    A document that fits is one window. A longer one gets windows of exactly `size` pieces starting
    every `size // 2` pieces; the last is moved back to end at the last piece, so it overlaps its
    neighbour by half or more and no window is short of context.
    """
    if size < 2:
        raise ValueError(f"a window needs room for at least 2 pieces, got {size}")
    if n_pieces <= size:
        return ((0, n_pieces),) if n_pieces > 0 else ()
    stride = size // 2
    starts = list(range(0, n_pieces - size, stride)) + [n_pieces - size]
    return tuple((start, start + size) for start in starts)


def nearest_windows(n_pieces: int, windows: Sequence[tuple[int, int]]) -> np.ndarray:
    """For each piece, the index of the window containing it whose centre is nearest.

    Ties go to the earlier window. Distances are doubled so that they stay integers (a window's
    centre can fall between two pieces) and a tie is an exact tie.
    """
    best = np.full(n_pieces, np.iinfo(np.int64).max, dtype=np.int64)
    owner = np.full(n_pieces, -1, dtype=np.int64)
    for k, (start, end) in enumerate(windows):
        twice_distance = np.abs(2 * np.arange(start, end) - (start + end - 1))
        closer = twice_distance < best[start:end]  # strict: an earlier window keeps a tie
        best[start:end][closer] = twice_distance[closer]
        owner[start:end][closer] = k
    if (owner < 0).any():
        raise ValueError(f"windows {list(windows)} do not cover all {n_pieces} pieces")
    return owner


# ---------------------------------------------------------------------------------------------------------
# Words to pieces


@dataclass(frozen=True, eq=False)
class WordPieces:
    """Which pieces belong to which word, as (word, piece) pairs sorted by word, then piece.

    Plain index arrays, so that numpy (`pool`) and a differentiable torch gather (`index_add_` of
    `weight * hidden[piece]` into row `word`) compute the same thing from the same data.
    """

    n_words: int
    word: np.ndarray   # int64 [pairs]
    piece: np.ndarray  # int64 [pairs]

    def pieces_of(self, i: int) -> np.ndarray:
        """The piece indices of word `i`, ascending."""
        return self.piece[self.word == i]

    def counts(self) -> np.ndarray:
        """int64 [n_words]: how many pieces each word has (0: the word gets a zero vector)."""
        return np.bincount(self.word, minlength=self.n_words).astype(np.int64)

    def gather(self, pooling: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(word, piece, weight): word vector i = sum of weight * piece vector over the rows with word i."""
        check_pooling(pooling)
        if pooling == "mean":
            weight = (1.0 / np.maximum(self.counts(), 1))[self.word].astype(np.float32)
            return self.word, self.piece, weight
        # Pairs are sorted by word then piece, so a word's first pair holds its first piece.
        first = np.ones(len(self.word), dtype=bool)
        first[1:] = self.word[1:] != self.word[:-1]
        return self.word[first], self.piece[first], np.ones(int(first.sum()), dtype=np.float32)

    def pool(self, hidden: np.ndarray, pooling: str) -> np.ndarray:
        """float32 [n_words, width] word vectors from float32 [n_pieces, width] piece vectors."""
        check_pooling(pooling)
        hidden = np.asarray(hidden, dtype=np.float32)
        # Pairs are sorted by word then piece, so each word's pairs are one run, its first piece first.
        runs = np.flatnonzero(np.diff(self.word, prepend=-1))
        if len(runs) == self.n_words:  # every word has a piece (the usual case): gathered straight
            out = hidden[self.piece[runs]]
        else:
            out = np.zeros((self.n_words, hidden.shape[1]), dtype=np.float32)
            out[self.word[runs]] = hidden[self.piece[runs]]
        if pooling == "first" or not len(runs):
            return out
        # The mean as sum(piece * (1 / count)), summed left to right: the r-th term of every longer word
        # is added at once for r = 1, 2, ..., the order of a plain loop over the pairs (np.add.reduceat,
        # being pairwise, can differ in the last bit). A lone piece keeps its vector (x * 1 is x).
        lengths = np.diff(runs, append=len(self.word))
        longer = np.flatnonzero(lengths > 1)
        if not len(longer):
            return out
        rows = self.word[runs[longer]]
        weight = (1.0 / lengths[longer]).astype(np.float32)[:, None]
        out[rows] *= weight
        for r in range(1, int(lengths.max())):
            more = lengths[longer] > r
            longer, rows, weight = longer[more], rows[more], weight[more]
            out[rows] += hidden[self.piece[runs[longer] + r]] * weight
        return out


def join_word_pieces(parts: Sequence[WordPieces], piece_start: Sequence[int]) -> WordPieces:
    """The words and pieces of several documents laid one after another, document d's pieces
    starting at piece_start[d]: pooling the joined pieces pools every document at once."""
    word_start = np.cumsum([0] + [part.n_words for part in parts])
    none = [np.zeros(0, np.int64)]  # so that no parts join to no pairs
    word = np.concatenate(none + [part.word + word_start[d] for d, part in enumerate(parts)])
    piece = np.concatenate(none + [part.piece + piece_start[d] for d, part in enumerate(parts)])
    return WordPieces(int(word_start[-1]), word, piece)


def check_pooling(pooling: str) -> None:
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {list(POOLINGS)}, got {pooling!r}")


def word_pieces(offsets: np.ndarray, words: Sequence[tuple[int, int]]) -> WordPieces:
    """Map words to the pieces whose character ranges overlap theirs.

    Ranges are half-open; they overlap when their intersection is non-empty, so an empty word or an
    empty piece (a special token's (0, 0)) overlaps nothing.

    Pieces come in text order, so the starts and the ends of the non-empty pieces normally both
    ascend (overlapping pieces included). Then the pieces starting before a word's end are a prefix
    of them and those ending after its start a suffix, and the word's pieces are the run in between,
    found by binary search. Pieces out of order fall back to testing every piece against every word.
    """
    offsets = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    spans = np.asarray(words, dtype=np.int64).reshape(-1, 2)
    if not _in_text_order(offsets):
        return _word_pieces_any_order(offsets, spans)
    return _word_pieces_in_order(offsets, spans)


def word_pieces_joined(offsets: np.ndarray, piece_start: np.ndarray,
                       words: Sequence[Sequence[tuple[int, int]]]) -> WordPieces:
    """`word_pieces` of several documents laid one after another, as `join_word_pieces` lays them:
    `offsets` [n_pieces, 2] holds document d's pieces from piece_start[d], words are numbered on.

    The (non-negative) character ranges of document d are moved by d * extent, past every range of the
    documents before it, so that no piece of one overlaps a word of another, and mapped at once.
    """
    n_pieces = np.diff(piece_start)
    n_words = [len(w) for w in words]
    spans = np.fromiter(chain.from_iterable(chain.from_iterable(words)), np.int64, 2 * sum(n_words))
    extent = 1 + max(int(offsets.max(initial=0)), int(spans.max(initial=0)))
    shift = np.arange(len(n_words), dtype=np.int64) * extent
    moved = offsets + np.repeat(shift, n_pieces)[:, None]
    if not _in_text_order(moved):  # map each document on its own, in order or not
        cuts = piece_start.tolist()
        parts = [word_pieces(offsets[a:b], w) for a, b, w in zip(cuts[:-1], cuts[1:], words, strict=True)]
        return join_word_pieces(parts, cuts[:-1])
    return _word_pieces_in_order(moved, spans.reshape(-1, 2) + np.repeat(shift, n_words)[:, None])


def _in_text_order(offsets: np.ndarray) -> bool:
    """Whether the starts and the ends of the non-empty pieces both never decrease."""
    real = offsets[offsets[:, 0] < offsets[:, 1]]
    return not ((np.diff(real[:, 0]) < 0).any() or (np.diff(real[:, 1]) < 0).any())


def _word_pieces_in_order(offsets: np.ndarray, spans: np.ndarray) -> WordPieces:
    real = np.flatnonzero(offsets[:, 0] < offsets[:, 1])
    starts, ends = offsets[real, 0], offsets[real, 1]
    first = np.searchsorted(ends, spans[:, 0], side="right")  # the first piece ending after the start
    stop = np.searchsorted(starts, spans[:, 1], side="left")  # past the last piece starting before the end
    counts = np.where(spans[:, 0] < spans[:, 1], np.maximum(stop - first, 0), 0)
    word = np.repeat(np.arange(len(spans), dtype=np.int64), counts)
    # Pair j of word w is its (j - pairs before w)-th piece, counted from `first[w]`.
    shift = np.repeat(first - (np.cumsum(counts) - counts), counts)
    return WordPieces(len(spans), word, real[np.arange(len(word)) + shift].astype(np.int64))


def _word_pieces_any_order(offsets: np.ndarray, spans: np.ndarray) -> WordPieces:
    """`word_pieces` for pieces in any order: every piece tested against every word."""
    starts, ends = offsets[:, 0], offsets[:, 1]
    word_index, piece_index = [], []
    for i, (start, end) in enumerate(spans.tolist()):
        if start >= end:
            continue
        hits = np.flatnonzero((starts < end) & (ends > start) & (starts < ends))
        word_index.append(np.full(len(hits), i, dtype=np.int64))
        piece_index.append(hits.astype(np.int64))
    if not word_index:
        return WordPieces(len(spans), np.zeros(0, np.int64), np.zeros(0, np.int64))
    return WordPieces(len(spans), np.concatenate(word_index), np.concatenate(piece_index))


# ---------------------------------------------------------------------------------------------------------
# The tokenizer


@dataclass(frozen=True, eq=False)
class DocPieces:
    """One document ready to run: its pieces, windows (with specials), and where each piece is read.

    After running window k to hidden states out_k [len(inputs[k]), width], piece p's vector is
    out_{owner[p]}[row[p]]; `words` then pools piece vectors into word vectors.
    """

    ids: np.ndarray                            # int64 [n_pieces], no specials
    offsets: np.ndarray                        # int64 [n_pieces, 2], character ranges into the text
    windows: tuple[tuple[int, int], ...]       # piece ranges [start, end)
    inputs: tuple[np.ndarray, ...]             # int64 ids of each window, specials included
    owner: np.ndarray                          # int64 [n_pieces]: the window a piece is read from
    row: np.ndarray                            # int64 [n_pieces]: its row in that window's output
    words: WordPieces

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True, eq=False)
class JoinedPieces:
    """Many documents ready to run, in flat arrays: `prepare_many`'s DocPieces laid one after another,
    for callers that run all windows together (per-document numpy calls on short documents cost more
    than the work). Windows are numbered across documents, each document's in order.

    After running window j to hidden states out_j [len(inputs[j]), width], piece p (numbered across
    documents) has the vector out_{window[p]}[row[p]]; `words` pools pieces into words numbered across
    documents, document d's words from word_start[d].
    """

    ids: np.ndarray                 # int64 [n_pieces], no specials
    piece_start: np.ndarray         # int64 [docs + 1]: where each document's pieces start in ids
    inputs: tuple[np.ndarray, ...]  # int64 ids of each window, specials included
    window: np.ndarray              # int64 [n_pieces]: the window a piece is read from
    row: np.ndarray                 # int64 [n_pieces]: its row in that window's output
    words: WordPieces
    word_start: np.ndarray          # int64 [docs + 1]
    offsets: np.ndarray             # int64 [n_pieces, 2]: character ranges into each document's text
    spans: np.ndarray               # int64 [windows, 2]: each window's piece range [start, end) in ids
    first_window: np.ndarray        # int64 [docs + 1]: where each document's windows start

    @cached_property
    def pair_start(self) -> np.ndarray:
        """int64 [docs + 1]: where each document's (word, piece) pairs start in `words` (pairs are sorted
        by word, so a document's, as its words, are one run)."""
        return np.searchsorted(self.words.word, self.word_start).astype(np.int64)

    def documents(self) -> list[DocPieces]:
        """Each document's DocPieces: its slices of the arrays, its pieces, windows and words numbered
        from its own first."""
        pieces, windows, words = (a.tolist() for a in (self.piece_start, self.first_window, self.word_start))
        pairs = self.pair_start.tolist()
        out = []
        for d in range(len(pieces) - 1):
            a, b, j, k, p, q = pieces[d], pieces[d + 1], windows[d], windows[d + 1], pairs[d], pairs[d + 1]
            out.append(DocPieces(
                ids=self.ids[a:b], offsets=self.offsets[a:b],
                windows=tuple(map(tuple, (self.spans[j:k] - a).tolist())), inputs=self.inputs[j:k],
                owner=self.window[a:b] - j, row=self.row[a:b],
                words=WordPieces(words[d + 1] - words[d], self.words.word[p:q] - words[d],
                                 self.words.piece[p:q] - a)))
        return out


class PieceTokenizer:
    """A `tokenizers` tokenizer.json that encodes whole texts to pieces with character offsets.

    `prefix` and `suffix` are the ids of the special tokens the tokenizer wraps a text in (for BERT
    [CLS] and [SEP], for XLM-R <s> and </s>), found by probing rather than by name.
    """

    def __init__(self, path: str | os.PathLike):
        from tokenizers import Tokenizer

        self.path = Path(path)
        try:
            tokenizer = Tokenizer.from_file(str(self.path))
        except Exception as err:  # tokenizers raises a bare Exception for missing and malformed files
            raise TokenizerError(f"{self.path}: cannot load the tokenizer: {err}") from err
        # A saved tokenizer may pad and truncate (MiniLM's does, to 128): windows need every piece.
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self.tokenizer = tokenizer
        self.prefix, self.suffix = self._probe_specials()
        self._prefix = np.asarray(self.prefix, dtype=np.int64)
        self._suffix = np.asarray(self.suffix, dtype=np.int64)

    @property
    def n_specials(self) -> int:
        return len(self.prefix) + len(self.suffix)

    def _probe_specials(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        found = set()
        for text in PROBES:
            plain = self.tokenizer.encode(text, add_special_tokens=False).ids
            full = self.tokenizer.encode(text, add_special_tokens=True).ids
            at = _find(full, plain)
            if not plain or at < 0:
                raise TokenizerError(
                    f"{self.path}: cannot find the special tokens: the probe {text!r} gives pieces {plain} "
                    f"alone and {full} with special tokens, which do not contain them in one run")
            found.add((tuple(full[:at]), tuple(full[at + len(plain):])))
        if len(found) != 1:
            raise TokenizerError(f"{self.path}: the special tokens depend on the text ({sorted(found)})")
        return found.pop()

    def encode(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """(ids int64 [n], offsets int64 [n, 2]) of the whole text, without special tokens."""
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        ids = np.asarray(encoding.ids, dtype=np.int64)
        offsets = np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2)
        return ids, offsets

    def encode_many(self, texts: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """`encode` of each text, the texts encoded together (in parallel, the GIL released)."""
        ids, offsets, piece_start = self.encode_joined(texts)
        cuts = piece_start.tolist()
        return [(ids[a:b], offsets[a:b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]

    def encode_joined(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`encode_many` laid one after another: (ids int64 [n], offsets int64 [n, 2], piece_start
        int64 [texts + 1]), text t's pieces from piece_start[t]."""
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        # Converted all at once: many small conversions cost more than the encoding.
        n_pieces = [len(e) for e in encodings]
        total = sum(n_pieces)
        ids = np.fromiter(chain.from_iterable(e.ids for e in encodings), np.int64, total)
        offsets = np.fromiter(chain.from_iterable(chain.from_iterable(e.offsets for e in encodings)),
                              np.int64, 2 * total).reshape(-1, 2)
        return ids, offsets, np.cumsum([0] + n_pieces)

    def wrap(self, ids: np.ndarray) -> np.ndarray:
        """The ids with the special tokens around them: what the model sees for one window."""
        return np.concatenate([self._prefix, ids, self._suffix])

    def window_size(self, max_length: int) -> int:
        """Pieces per window when a window, specials included, has at most `max_length` ids."""
        size = max_length - self.n_specials
        if size < 2:
            raise ValueError(
                f"max_length {max_length} is too small: {self.path} wraps every window in "
                f"{self.n_specials} special tokens, so max_length must be at least {self.n_specials + 2}")
        return size

    def prepare(self, doc: Doc, max_length: int) -> DocPieces:
        """Encode, cut into windows and map the words of one document."""
        return self.prepare_many([doc], max_length)[0]

    def prepare_many(self, docs: Sequence[Doc], max_length: int) -> list[DocPieces]:
        """`prepare` of each document: `prepare_joined`, cut back into documents."""
        return self.prepare_joined(docs, max_length).documents()

    def prepare_joined(self, docs: Sequence[Doc], max_length: int) -> JoinedPieces:
        """Every document encoded, cut into windows and its words mapped, in flat arrays (JoinedPieces)."""
        size = self.window_size(max_length)
        ids, offsets, piece_start = self.encode_joined([doc.text for doc in docs])
        words = word_pieces_joined(offsets, piece_start, [doc.words for doc in docs])
        n_pieces = np.diff(piece_start)
        n_windows = (n_pieces > 0).astype(np.int64)  # a document that fits is one window, an empty one none
        long = {int(d): cut_windows(int(n_pieces[d]), size) for d in np.flatnonzero(n_pieces > size)}
        for d, windows in long.items():
            n_windows[d] = len(windows)
        first = np.cumsum(n_windows) - n_windows  # each document's first window
        window_start = np.repeat(piece_start[:-1], n_windows)
        window_size = np.repeat(n_pieces, n_windows)
        window = np.repeat(first, n_pieces)
        row = np.arange(len(ids), dtype=np.int64) - np.repeat(piece_start[:-1], n_pieces) + len(self.prefix)
        for d, windows in long.items():  # a document of several windows: each piece to its nearest
            starts = np.asarray([start for start, _ in windows], dtype=np.int64)
            at = slice(first[d], first[d] + len(windows))
            window_start[at] = piece_start[d] + starts
            window_size[at] = [end - start for start, end in windows]
            owner = nearest_windows(int(n_pieces[d]), windows)
            mine = slice(piece_start[d], piece_start[d + 1])
            window[mine] = first[d] + owner
            row[mine] = np.arange(n_pieces[d]) - starts[owner] + len(self.prefix)
        word_start = np.cumsum([0] + [len(doc.words) for doc in docs])
        spans = np.stack([window_start, window_start + window_size], axis=1)
        return JoinedPieces(ids, piece_start, self._wrap_windows(ids, window_start, window_size),
                            window, row, words, word_start, offsets, spans, np.append(first, len(spans)))

    def _wrap_windows(self, ids: np.ndarray, window_start: np.ndarray,
                      window_size: np.ndarray) -> tuple[np.ndarray, ...]:
        """`wrap` of every window ids[window_start[j]:window_start[j] + window_size[j]], written into one
        array at once: views of it."""
        lead = len(self.prefix)
        length = window_size + self.n_specials
        at = np.cumsum(length) - length  # where each wrapped window starts
        out = np.empty(int(length.sum()), dtype=np.int64)
        for i, token in enumerate(self.prefix):
            out[at + i] = token
        for i, token in enumerate(self.suffix):
            out[at + lead + window_size + i] = token
        # Piece t of window j: from window_start[j] + t to at[j] + lead + t, all windows at once.
        before = np.cumsum(window_size) - window_size
        k = np.arange(int(window_size.sum()), dtype=np.int64)
        source = k + np.repeat(window_start - before, window_size)
        out[k + np.repeat(at + lead - before, window_size)] = ids[source]
        ends = (at + length).tolist()
        return tuple(out[a:b] for a, b in zip(at.tolist(), ends, strict=True))


def _find(haystack: Sequence[int], needle: Sequence[int]) -> int:
    """Index of the first run of `needle` in `haystack`, -1 when there is none."""
    n = len(needle)
    for i in range(len(haystack) - n + 1):
        if list(haystack[i:i + n]) == list(needle):
            return i
    return -1


@dataclass(frozen=True)
class TextPieces:
    """Whole texts as the comparisons feed them to a model: the tokenizer's special tokens around each
    text, cut to the model's `max_pieces` positions; no windows and no words. Batches pad with `pad_id`.

    The parity, student and write-back recipes compare hidden states of exactly these rows, so they
    read texts the same way whether or not a PyTorch reference is at hand.
    """

    tokenizer_path: Path
    max_pieces: int
    pad_id: int

    def encode(self, texts: list[str]) -> tuple[list[list[int]], int]:
        """Piece ids with the tokenizer's special tokens, cut to the model's positions; how many were cut."""
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(self.tokenizer_path))
        tok.no_padding()
        tok.no_truncation()
        full = [e.ids for e in tok.encode_batch(texts)]
        tok.enable_truncation(max_length=self.max_pieces)
        cut = [e.ids for e in tok.encode_batch(texts)]
        return cut, sum(len(a) != len(b) for a, b in zip(full, cut, strict=True))

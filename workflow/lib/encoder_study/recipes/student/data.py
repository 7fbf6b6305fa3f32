"""The distillation corpus: documents per language, tokenised once, sampled as windows of teacher ids.

    documents = embedded_documents("config/texts/tatoeba_sample.tsv", "config/texts/udhr_sample")
    corpus = Corpus.build(documents, PieceTokenizer("results/models/minilm/tokenizer.json"), None, 0.5)
    batch = corpus.batch(seed=0, step=17, windows=16, lengths=(32, 64), pad_id=0)

Each language's documents are encoded without special tokens and laid end to end, each followed by
the tokenizer's closing special token(s) (BERT's [SEP], XLM-R's </s>), into one stream of piece ids:
windows longer than a document then stay full, as in RoBERTa's packed inputs. A window of length L
(specials included, what the model sees) is the prefix specials, L - specials consecutive pieces of
one language's stream from a uniformly drawn start, and the suffix specials; a stream shorter than
that gives all of itself, padded.

Languages are drawn with weights proportional to amount ** power (power 0.5: the square root, so
small languages are seen more often than their share; Conneau et al. 2019 use 0.3). The amount is
the number of characters of the language's documents unless given (a streamed sample is capped per
language, so the full study gives the sizes of the whole corpora instead).

Batch `step` is a pure function of (seed, step): drawn from a numpy Generator seeded with
[seed, stream, step], so the data position of a run is its step, every rank of a data-parallel run
draws the same global batch, and a resumed run sees exactly the batches an uninterrupted one sees.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ...encoders.tokens import PieceTokenizer
from ...onnx.runtime import pad_batch
from . import StudentError
from .sources import Document

TRAIN_STREAM, STATS_STREAM = 0, 1  # separate draws for training batches and the statistics sample


@dataclass(frozen=True)
class Batch:
    input_ids: torch.Tensor       # int64 [windows, length]
    attention_mask: torch.Tensor  # int64 [windows, length]: 1 for real ids, 0 for padding
    langs: tuple[str, ...]

    def rows(self, index) -> Batch:
        """The windows `index` selects (a slice or index list), padded to the same length as the batch."""
        picked = range(len(self.langs))[index] if isinstance(index, slice) else index
        picked = list(picked)
        langs = tuple(self.langs[i] for i in picked)
        return Batch(self.input_ids[picked], self.attention_mask[picked], langs)

    @property
    def tokens(self) -> int:
        return int(self.attention_mask.sum())


def language_weights(amounts: Mapping[str, float], power: float) -> dict[str, float]:
    """lang -> probability proportional to amount ** power, over the languages with a positive amount,
    sorted by language code."""
    kept = {lang: float(amounts[lang]) for lang in sorted(amounts) if amounts[lang] > 0}
    if not kept:
        raise StudentError("no language has any text")
    raw = {lang: amount ** power for lang, amount in kept.items()}
    total = math.fsum(raw.values())
    return {lang: value / total for lang, value in raw.items()}


class Corpus:
    """One stream of teacher piece ids per language, and the windows drawn from them."""

    def __init__(self, streams: Mapping[str, np.ndarray], amounts: Mapping[str, float], prefix: Sequence[int],
                 suffix: Sequence[int], power: float):
        self.streams = {lang: np.asarray(streams[lang], dtype=np.int64) for lang in sorted(streams)
                        if len(streams[lang])}
        missing = sorted(set(self.streams) - set(amounts))
        if missing:
            raise StudentError(f"no amount of text given for languages {missing}")
        self.weights = language_weights({lang: amounts[lang] for lang in self.streams}, power)
        self.langs = list(self.weights)
        self.prefix = np.asarray(prefix, dtype=np.int64)
        self.suffix = np.asarray(suffix, dtype=np.int64)
        self._p = np.asarray([self.weights[lang] for lang in self.langs], dtype=np.float64)

    @classmethod
    def build(cls, documents: Iterable[Document], tokenizer: PieceTokenizer,
              amounts: Mapping[str, float] | None, power: float) -> Corpus:
        """Encode every document (in the given order) and join each language's into one stream."""
        documents = list(documents)
        if not documents:
            raise StudentError("the distillation corpus has no documents")
        encoded = tokenizer.encode_many([doc.text for doc in documents])
        separator = np.asarray(tokenizer.suffix, dtype=np.int64)
        parts: dict[str, list[np.ndarray]] = {}
        chars: dict[str, int] = {}
        for doc, (ids, _) in zip(documents, encoded, strict=True):
            if len(ids):
                parts.setdefault(doc.lang, []).extend((ids, separator))
                chars[doc.lang] = chars.get(doc.lang, 0) + len(doc.text)
        streams = {lang: np.concatenate(p) for lang, p in parts.items()}
        return cls(streams, chars if amounts is None else amounts, tokenizer.prefix, tokenizer.suffix, power)

    def digest(self) -> str:
        """SHA-256 of the streams and the weights: what decides every window."""
        h = hashlib.sha256()
        for lang in self.langs:
            h.update(f"{lang}:{self.weights[lang]!r}:{len(self.streams[lang])}\n".encode())
            h.update(self.streams[lang].tobytes())
        h.update(self.prefix.tobytes() + b"|" + self.suffix.tobytes())
        return h.hexdigest()

    def window(self, rng: np.random.Generator, lang: str, length: int) -> np.ndarray:
        """One window of at most `length` ids (specials included) from `lang`'s stream."""
        specials = len(self.prefix) + len(self.suffix)
        size = length - specials
        if size < 1:
            raise StudentError(f"window length {length} leaves no room beside {specials} special tokens")
        stream = self.streams[lang]
        start = int(rng.integers(0, len(stream) - size + 1)) if len(stream) > size else 0
        return np.concatenate([self.prefix, stream[start:start + size], self.suffix])

    def batch(self, seed: int, step: int, windows: int, lengths: Sequence[int], pad_id: int = 0,
              stream: int = TRAIN_STREAM) -> Batch:
        """Batch `step`: one length for the whole batch (drawn from `lengths`), then for each window a
        language (by weight) and a start; padded to the longest window with `pad_id`."""
        rng = np.random.default_rng([int(seed), int(stream), int(step)])
        length = int(lengths[int(rng.integers(len(lengths)))])
        picked = rng.choice(len(self.langs), size=windows, p=self._p)
        ids, mask = pad_batch([self.window(rng, self.langs[i], length) for i in picked], pad_id)
        return Batch(torch.from_numpy(ids), torch.from_numpy(mask), tuple(self.langs[i] for i in picked))


# ---------------------------------------------------------------------------------------------------------
# Sources



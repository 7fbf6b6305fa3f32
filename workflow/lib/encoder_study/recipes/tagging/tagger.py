"""The tagger: one linear layer over an encoder's word vectors, for a task's tags (UPOS, or XPOS).

    encoder = FrozenEncoder("results/models/minilm", pooling="mean")       # or TrainableEncoder(...)
    tagger = Tagger(encoder, seed=0)
    logits = tagger([s.doc() for s in sentences])                          # [total words, 17]
    tags = tagger.predict([s.doc() for s in sentences])                     # one list of UPOS per sentence

Over a `FrozenEncoder` the word vectors come from ONNX Runtime (cached per document) and only the
head trains; over a `TrainableEncoder` the encoder's layers train with the head. Logit i is tag
`tags[i]`: for the `upos` task the 17 UD tags in `data.conllu.UPOS` order, for `xpos` the train split's
tags sorted (`data.tasks.tag_set`); a saved pipeline records its tags (and a task other than upos).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from ...data.conllu import UPOS
from ...data.tasks import DEFAULT as DEFAULT_TASK
from ...data.tasks import check_tags
from ...encoders.frozen import FrozenEncoder
from ...encoders.tokens import Doc
from ...encoders.trainable.words import TrainableEncoder
from ...onnx import manifest

KINDS = ("transformer", "transformer-trainable")
EVAL_BATCH_WORDS = 2000


def word_batches(lengths: Sequence[int], order: Sequence[int], batch_words: int) -> list[list[int]]:
    """Sentence indices in `order`, grouped: a batch closes as soon as it holds `batch_words` words.

    So every batch but an epoch's last has at least `batch_words` words (one long sentence more at
    most), and no sentence is cut.
    """
    if batch_words < 1:
        raise ValueError(f"batch_words must be positive, got {batch_words}")
    batches, current, words = [], [], 0
    for i in order:
        current.append(int(i))
        words += int(lengths[i])
        if words >= batch_words:
            batches.append(current)
            current, words = [], 0
    if current:
        batches.append(current)
    return batches


class Tagger(nn.Module):
    """A linear head (width -> tags) over a frozen or trainable encoder.

    The head starts from a seeded normal(0, 0.02) weight and zero bias, drawn from its own generator so
    that nothing else in the process changes it. A `FrozenEncoder` is kept as a plain attribute (it is
    not a module and has nothing to train); a `TrainableEncoder` is a submodule, so `parameters()` and
    `train()`/`eval()` reach it.
    """

    def __init__(self, encoder: FrozenEncoder | TrainableEncoder, seed: int = 0, tags: Sequence[str] = UPOS,
                 task: str = DEFAULT_TASK):
        super().__init__()
        if not isinstance(encoder, FrozenEncoder | TrainableEncoder):
            raise TypeError(f"a Tagger needs a FrozenEncoder or a TrainableEncoder, not "
                            f"{type(encoder).__name__}")
        check_tags(task, tags)
        self.encoder = encoder
        self.task = task
        self.tags = tuple(tags)
        self.tag_index = {tag: i for i, tag in enumerate(self.tags)}
        self.head = nn.Linear(encoder.width, len(self.tags))
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            self.head.weight.normal_(0.0, 0.02, generator=generator)
            self.head.bias.zero_()

    @property
    def kind(self) -> str:
        """`transformer` (frozen graph, no encoder weights saved) or `transformer-trainable`."""
        return "transformer-trainable" if isinstance(self.encoder, TrainableEncoder) else "transformer"

    @property
    def device(self) -> torch.device:
        """Where the weights are (`to(device)` moves the head and a trainable encoder)."""
        return self.head.weight.device

    @property
    def trainable_encoder(self) -> bool:
        return isinstance(self.encoder, TrainableEncoder)

    def encoder_files(self) -> dict[str, str]:
        """SHA-256 of the model files the word vectors depend on (checked against export.json on load)."""
        listed = {e["path"]: e["sha256"] for e in self.encoder.manifest.get("files", [])}
        return {name: listed[name] for name in manifest.MODEL_FILES}

    def encoder_settings(self) -> dict:
        """The encoder's own settings for provenance (JSON-ready)."""
        return self.encoder.settings()

    # -- running ---------------------------------------------------------------------------------------

    def word_vectors(self, docs: Sequence[Doc]) -> torch.Tensor:
        """float32 [total words, width] on the tagger's device: the documents' word vectors one after
        another."""
        if self.trainable_encoder:
            return self.encoder.forward_flat(docs)[0]
        vectors = self.encoder(docs)  # cached per document: each one runs the graph once (on the CPU)
        if not vectors:
            return torch.zeros(0, self.encoder.width, device=self.device)
        return torch.from_numpy(np.concatenate(vectors).reshape(-1, self.encoder.width)).to(self.device)

    def forward(self, docs: Sequence[Doc]) -> torch.Tensor:
        """Logits [total words, 17]."""
        return self.head(self.word_vectors(docs))

    @torch.no_grad()
    def predict_ids(self, docs: Sequence[Doc], batch_words: int = EVAL_BATCH_WORDS) -> list[np.ndarray]:
        """The most likely tag index per word, one int64 array per document.

        Documents run in their order, `batch_words` words at a time, so the batches (and with them
        every number) are the same whenever the same documents are predicted.
        """
        was_training = self.training
        self.eval()
        try:
            lengths = [len(doc.words) for doc in docs]
            out: list[np.ndarray] = []
            for batch in word_batches(lengths, range(len(docs)), batch_words):
                best = self([docs[i] for i in batch]).argmax(dim=-1).cpu().numpy()
                out += np.split(best, np.cumsum([lengths[i] for i in batch])[:-1])
            return out
        finally:
            self.train(was_training)

    def predict(self, docs: Sequence[Doc], batch_words: int = EVAL_BATCH_WORDS) -> list[list[str]]:
        """UPOS tags, one list per document."""
        return [[self.tags[i] for i in ids] for ids in self.predict_ids(docs, batch_words)]

    # -- weights ---------------------------------------------------------------------------------------

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """Copies of the weights training changes (the head; the encoder's layers when it trains).

        The frozen token table is left out: it never changes and is most of a multilingual model.
        """
        return {name: p.detach().clone() for name, p in self.named_parameters() if p.requires_grad}

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        params = {name: p for name, p in self.named_parameters() if p.requires_grad}
        if set(params) != set(state):
            missing, extra = sorted(set(params) - set(state)), sorted(set(state) - set(params))
            raise ValueError(f"weights do not fit the tagger: missing {missing[:3]}, unexpected {extra[:3]}")
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(state[name])

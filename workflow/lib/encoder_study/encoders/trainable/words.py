"""Word vectors from the trainable encoder: the frozen encoder's pieces, windows and pooling, differentiable.

    encoder = TrainableEncoder("results/models/xlmr-tiny", pooling="mean")
    vectors = encoder([Doc.from_words(["The", "bank", "floods", "."])])  # [tensor float32 [4, width]]
    loss = criterion(head(torch.cat(vectors)), gold)                     # gradients reach the layers
    encoder.save("encoder.pt")
    again = TrainableEncoder.restore("results/models/xlmr-tiny", "encoder.pt")

A document is cut exactly as `FrozenEncoder` cuts it (`PieceTokenizer.prepare`, the same max_length
capping), so for the same weights both encoders give the same word vectors. What differs is how
the pieces become words: here a word's vector is `index_add` of `weight * piece vector` over the
(word, piece, weight) triples of `WordPieces.gather`, so the gradient of a word reaches each of its
pieces (all of them for `mean`, the first for `first`).

Windows of all documents of a call run together, longest first, in batches of at most
`max_batch_pieces` padded pieces (rows x padded length of the batch tensor), right padded with
masked keys. Nothing is cached: the weights change between calls.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ...core import files, machine
from ...onnx import manifest
from ...onnx.runtime import pad_batch
from .. import trainable
from ..families import usable_positions
from ..frozen import EncoderError, open_export
from ..tokens import Doc, DocPieces, PieceTokenizer, check_pooling

CHECKPOINT_FORMAT = "encoder_study.trainable.words/1"


def plan_batches(lengths: Sequence[int], max_batch_pieces: int) -> list[list[int]]:
    """Group sequence indices into batches: longest first (ties keep their order), each batch holding
    as many sequences as fit in rows x (its longest length) <= max_batch_pieces."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if lengths[i] > max_batch_pieces:
            raise ValueError(f"a sequence of {lengths[i]} pieces exceeds max_batch_pieces {max_batch_pieces}")
        # Sorted longest first, so a batch's padded length is the length of its first sequence.
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= max_batch_pieces:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


class TrainableEncoder(nn.Module):
    """Word vectors from an exported model directory, computed by `trainable.load`'s PyTorch modules.

    `forward(docs)` returns one float32 tensor [n_words, width] per document (views of one tensor,
    so `torch.cat` of them is what a tagger over all words of a batch needs); `forward_flat(docs)`
    gives that tensor and the word offsets directly.

    `max_length` counts the special tokens and is capped at the model's positions, as in
    `FrozenEncoder`; `max_batch_pieces` must hold at least one window of that length. The token table
    is frozen unless `freeze_embeddings=False`. `threads`, when given, sets PyTorch's intra-op thread
    count for the whole process (capped at the machine's cores). `load_options` go to `trainable.load`
    (family, heads, rotary bases, window, global_every).
    """

    def __init__(self, model_dir: str | os.PathLike, pooling: str = "mean", max_length: int = 512,
                 max_batch_pieces: int = 8192, freeze_embeddings: bool = True, threads: int | None = None,
                 **load_options):
        super().__init__()
        self._configure(model_dir, pooling, max_length, max_batch_pieces, threads)
        self.encoder = trainable.load(self.model_dir / manifest.ONNX_FILE,
                                      freeze_embeddings=freeze_embeddings, **load_options)
        self._check_encoder()
        self.eval()  # as trainable.load leaves its modules; train() before training

    def _configure(self, model_dir, pooling, max_length, max_batch_pieces, threads) -> None:
        """Everything but the modules: the verified export, the tokenizer and the word-level settings."""
        check_pooling(pooling)
        for name, value in (("max_length", max_length), ("max_batch_pieces", max_batch_pieces),
                            ("threads", 1 if threads is None else threads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.model_dir = Path(model_dir)
        self.manifest, self.config = open_export(self.model_dir)
        self.file_hashes = {e["path"]: e["sha256"] for e in self.manifest.get("files", [])}

        self.pooling = pooling
        self.max_batch_pieces = max_batch_pieces
        self.max_length_requested = max_length
        positions = usable_positions(self.config)
        self.max_length = min(max_length, positions) if positions else max_length
        if self.max_length > max_batch_pieces:
            raise ValueError(f"max_batch_pieces {max_batch_pieces} cannot hold one window of "
                             f"{self.max_length} pieces (max_length); raise it or lower max_length")
        self.tokenizer = PieceTokenizer(self.model_dir / manifest.TOKENIZER_FILE)
        self.tokenizer.window_size(self.max_length)  # fail now, not on the first long document
        self.threads_requested = threads
        if threads is not None:
            machine.torch_threads(threads)
        self.windows_run = 0

    def _check_encoder(self) -> None:
        self.width = int(self.encoder.settings.width)
        if self.width != int(self.config["hidden_size"]):
            raise EncoderError(f"{self.model_dir}: the graph's width {self.width} is not the config's "
                               f"hidden_size {self.config['hidden_size']}")

    # -- running ---------------------------------------------------------------------------------------

    def forward(self, docs: Sequence[Doc]) -> list[torch.Tensor]:
        """One float32 tensor [n_words, width] per document, in order; differentiable."""
        vectors, offsets = self.forward_flat(docs)
        return list(torch.split(vectors, np.diff(offsets).tolist()))

    def forward_flat(self, docs: Sequence[Doc]) -> tuple[torch.Tensor, np.ndarray]:
        """(vectors [total words, width], offsets int64 [len(docs) + 1]): document d's words are rows
        offsets[d]:offsets[d + 1]."""
        for doc in docs:
            if not isinstance(doc, Doc):
                raise TypeError(f"TrainableEncoder takes encoders.tokens.Doc, got {type(doc).__name__}")
        prepared = self.tokenizer.prepare_many(docs, self.max_length)
        piece_offsets = np.cumsum([0] + [len(p) for p in prepared])
        word_offsets = np.cumsum([0] + [p.words.n_words for p in prepared])
        device = self.encoder.tokens.weight.device

        rows, where = self._piece_rows(prepared, piece_offsets, device)
        word, piece, weight = self._triples(prepared, piece_offsets, word_offsets)
        out = torch.zeros(int(word_offsets[-1]), self.width, dtype=rows.dtype, device=device)
        if len(word):
            # rows[where[p]] is piece p's vector; a word is the weighted sum of its pieces' vectors.
            picked = rows[torch.from_numpy(where[piece]).to(device)]
            out = out.index_add(0, torch.from_numpy(word).to(device),
                                picked * torch.from_numpy(weight).to(device)[:, None])
        return out, word_offsets

    def _piece_rows(self, prepared: list[DocPieces], piece_offsets: np.ndarray,
                    device) -> tuple[torch.Tensor, np.ndarray]:
        """(rows [total pieces, width], where int64 [total pieces]): piece p of the call (documents one
        after another) has the vector rows[where[p]], read from the window that owns it."""
        jobs = [(d, k) for d, p in enumerate(prepared) for k in range(len(p.windows))]
        lengths = [len(prepared[d].inputs[k]) for d, k in jobs]
        chunks, destinations = [], []
        for batch in plan_batches(lengths, self.max_batch_pieces):
            hidden = self._run([prepared[jobs[j][0]].inputs[jobs[j][1]] for j in batch], device)
            length = hidden.shape[1]
            source, target = [], []
            for i, j in enumerate(batch):
                d, k = jobs[j]
                mine = np.flatnonzero(prepared[d].owner == k)
                source.append(i * length + prepared[d].row[mine])
                target.append(piece_offsets[d] + mine)
            chunks.append(hidden.reshape(-1, self.width)[torch.from_numpy(np.concatenate(source)).to(device)])
            destinations.append(np.concatenate(target))
        total = int(piece_offsets[-1])
        if not chunks:
            return torch.zeros(0, self.width, device=device), np.zeros(0, np.int64)
        # Each piece is read from exactly one window, so the destinations are a permutation of all pieces.
        where = np.empty(total, dtype=np.int64)
        where[np.concatenate(destinations)] = np.arange(total, dtype=np.int64)
        return torch.cat(chunks), where

    def _triples(self, prepared: list[DocPieces], piece_offsets: np.ndarray,
                 word_offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(word, piece, weight) of all documents, indexed into the call's words and pieces."""
        parts = [p.words.gather(self.pooling) for p in prepared]
        if not parts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32)
        word = np.concatenate([w + word_offsets[d] for d, (w, _, _) in enumerate(parts)])
        piece = np.concatenate([p + piece_offsets[d] for d, (_, p, _) in enumerate(parts)])
        weight = np.concatenate([w for _, _, w in parts]).astype(np.float32)
        return word, piece, weight

    def _run(self, sequences: list[np.ndarray], device) -> torch.Tensor:
        """Right-pad the sequences to the longest (masked keys) and run them as one batch."""
        # The filler id keeps RoBERTa-style positions on the padding row; its keys are masked anyway.
        input_ids, mask = pad_batch(sequences, self.encoder.filler_id)
        self.windows_run += len(sequences)
        return self.encoder(torch.from_numpy(input_ids).to(device), torch.from_numpy(mask).to(device))

    # -- provenance and checkpoints --------------------------------------------------------------------

    @property
    def embeddings_frozen(self) -> bool:
        return self.encoder.embeddings_frozen

    def trainable_parameters(self) -> list[nn.Parameter]:
        return self.encoder.trainable_parameters()

    def settings(self) -> dict:
        """Everything that decides the vectors (JSON-ready), for provenance."""
        import tokenizers

        return {
            "kind": "transformer-trainable",
            "model": self.manifest.get("model"),
            "model_dir": str(self.model_dir),
            "files": dict(self.file_hashes),
            "pooling": self.pooling,
            "max_length": self.max_length,
            "max_length_requested": self.max_length_requested,
            "window_pieces": self.tokenizer.window_size(self.max_length),
            "max_batch_pieces": self.max_batch_pieces,
            "specials": {"prefix": list(self.tokenizer.prefix), "suffix": list(self.tokenizer.suffix)},
            "pad_id": int(self.encoder.filler_id),
            "encoder": self.encoder.settings_dict(),
            "threads": torch.get_num_threads(),
            "threads_requested": self.threads_requested,
            "torch": torch.__version__,
            "tokenizers": tokenizers.__version__,
        }

    def checkpoint(self) -> dict:
        """The word-level settings, the model files' hashes and `trainable.checkpoint` of the modules
        (the layers; the token table too when it trains). A tagger stores this inside its own state."""
        words = {"pooling": self.pooling, "max_length": self.max_length_requested,
                 "max_batch_pieces": self.max_batch_pieces, "model": self.manifest.get("model"),
                 "files": {name: self.file_hashes[name] for name in manifest.MODEL_FILES}}
        return {"format": CHECKPOINT_FORMAT, "words": words,
                "encoder": trainable.checkpoint(self.encoder, self.file_hashes[manifest.ONNX_FILE])}

    def save(self, path: str | os.PathLike) -> None:
        files.write_torch(path, self.checkpoint())

    @classmethod
    def restore(cls, model_dir: str | os.PathLike, saved: dict | str | os.PathLike,
                threads: int | None = None) -> TrainableEncoder:
        """The encoder `checkpoint()` or `save()` wrote, over the same exported model (checked by hash)."""
        state = saved if isinstance(saved, dict) else torch.load(saved, map_location="cpu", weights_only=True)
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"not a TrainableEncoder checkpoint (format {state.get('format')!r})")
        words = state["words"]
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self._configure(model_dir, words["pooling"], words["max_length"], words["max_batch_pieces"], threads)
        for name, digest in words["files"].items():
            if self.file_hashes.get(name) != digest:
                raise EncoderError(f"{self.model_dir / name}: not the file the checkpoint was saved with "
                                   f"(SHA-256 {self.file_hashes.get(name)}, saved {digest})")
        self.encoder = trainable.restore(self.model_dir / manifest.ONNX_FILE, state["encoder"])
        self._check_encoder()
        return self.eval()

"""The frozen encoder: an exported ONNX graph run by ONNX Runtime, word vectors out, cached per document.

    encoder = FrozenEncoder("results/models/minilm", pooling="mean")
    vectors = encoder([Doc.from_words(["The", "bank", "floods", "."])])  # [array float32 [4, 384]]

Windows of all documents of a call run together, longest first, `batch_size` at a time and right
padded, so a batch's padding stays small. A document's word vectors are computed once and kept, so a
head trained for many epochs over the same documents runs the transformer once per document.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..core import machine
from ..core.errors import UserError
from ..onnx import manifest, runtime
from ..onnx.runtime import INPUTS, OPTIMIZATIONS, OUTPUT
from .families import usable_positions
from .tokens import Doc, PieceTokenizer, check_pooling

RUNS_AT_ONCE = 16  # batches run back to back before their outputs are read (see _run)


class EncoderError(UserError):
    """The model directory cannot be used: the message names the file."""


def open_export(model_dir: Path) -> tuple[dict, dict]:
    """An export directory both encoders read: its manifest, with every file checked, and its config."""
    if not model_dir.is_dir():
        raise EncoderError(f"{model_dir}: not a directory; expected an exported model "
                           f"({', '.join(manifest.EXPORT_FILES)})")
    record = manifest.verified_model(model_dir)  # names any changed or missing file
    listed = {entry["path"] for entry in record.get("files", [])}
    for name in manifest.MODEL_FILES:
        if name not in listed:
            raise EncoderError(f"{model_dir / manifest.MANIFEST} does not list {name}; re-export the model")
    config = manifest.read_config(model_dir, error=EncoderError)
    if "hidden_size" not in config:
        raise EncoderError(f"{model_dir / manifest.CONFIG_FILE}: no hidden_size; expected a Hugging Face "
                           "config.json")
    return record, config


class FrozenEncoder:
    """Word vectors from an exported model directory (model.onnx, tokenizer.json, model.config.json).

    `max_length` counts the special tokens and is capped at the model's positions. `threads` is
    capped at the machine's cores. `windows_run` counts the windows actually sent to the model.
    `graph`, when given, is the ONNX file to run instead of the directory's model.onnx: a copy of it
    with other weights (`writeback`), read with the directory's tokenizer and config. The caller
    vouches for that file (a saved pipeline checks its SHA-256); the directory is verified as usual.
    `provider` is ONNX Runtime's execution provider, "cpu" or "cuda" (`runtime.providers_for`; refused
    where this ONNX Runtime has no CUDA provider).
    """

    def __init__(self, model_dir: str | os.PathLike, pooling: str = "mean", max_length: int = 512,
                 batch_size: int = 8, threads: int = 1, optimization: str = "all",
                 graph: str | os.PathLike | None = None, provider: str = "cpu"):
        check_pooling(pooling)
        if optimization not in OPTIMIZATIONS:
            raise ValueError(f"optimization must be one of {list(OPTIMIZATIONS)}, got {optimization!r}")
        for name, value in (("max_length", max_length), ("batch_size", batch_size), ("threads", threads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.model_dir = Path(model_dir)
        self.manifest, self.config = open_export(self.model_dir)

        self.pooling = pooling
        self.batch_size = batch_size
        self.optimization = optimization
        self.provider = provider
        self.threads_requested = threads
        self.threads = machine.usable_threads(threads)
        self.max_length_requested = max_length
        positions = usable_positions(self.config)
        self.max_length = min(max_length, positions) if positions else max_length
        self.tokenizer = PieceTokenizer(self.model_dir / manifest.TOKENIZER_FILE)
        self.tokenizer.window_size(self.max_length)  # fail now, not on the first long document
        # Padding is masked, so any id would do; the model's own pad id keeps the inputs conventional.
        pad = self.config.get("pad_token_id")
        self.pad_id = int(pad) if pad is not None else 0
        self.width = int(self.config["hidden_size"])

        onnx_path = self.graph = self.model_dir / manifest.ONNX_FILE if graph is None else Path(graph)
        try:
            self.session = runtime.ort_session(onnx_path, self.threads, optimization, provider)
        except UserError:  # says itself what is missing (e.g. no CUDA provider)
            raise
        except Exception as err:  # ONNX Runtime's errors do not always say which file
            raise EncoderError(f"{onnx_path}: ONNX Runtime cannot load the model: {err}") from err
        inputs = [i.name for i in self.session.get_inputs()]
        outputs = [o.name for o in self.session.get_outputs()]
        if sorted(inputs) != sorted(INPUTS) or OUTPUT not in outputs:
            raise EncoderError(f"{onnx_path}: inputs {inputs} and outputs {outputs}; expected inputs "
                               f"{list(INPUTS)} and output {OUTPUT!r} (see recipes.export.export)")

        self.windows_run = 0
        self._cache: dict[Doc, np.ndarray] = {}

    def settings(self) -> dict:
        """Everything that decides the vectors, read back from the live session where possible."""
        import onnxruntime as ort
        import tokenizers

        options = self.session.get_session_options()
        return {
            "model": self.manifest.get("model"),
            "model_dir": str(self.model_dir),
            "graph": str(self.graph),
            "files": {e["path"]: e["sha256"] for e in self.manifest.get("files", [])},
            "pooling": self.pooling,
            "max_length": self.max_length,
            "max_length_requested": self.max_length_requested,
            "window_pieces": self.tokenizer.window_size(self.max_length),
            "specials": {"prefix": list(self.tokenizer.prefix), "suffix": list(self.tokenizer.suffix)},
            "pad_id": self.pad_id,
            "batch_size": self.batch_size,
            "threads": self.threads,
            "threads_requested": self.threads_requested,
            "optimization": self.optimization,
            "provider": self.provider,
            "onnxruntime": {
                "version": ort.__version__,
                "providers": self.session.get_providers(),
                "intra_op_num_threads": options.intra_op_num_threads,
                "inter_op_num_threads": options.inter_op_num_threads,
                "graph_optimization_level": options.graph_optimization_level.name,
                "execution_mode": options.execution_mode.name,
            },
            "tokenizers": tokenizers.__version__,
        }

    def clear_cache(self) -> None:
        self._cache.clear()

    def __call__(self, docs: Sequence[Doc]) -> list[np.ndarray]:
        """One float32 array [n_words, width] per document, in order."""
        for doc in docs:
            if not isinstance(doc, Doc):
                raise TypeError(f"FrozenEncoder takes encoders.tokens.Doc, got {type(doc).__name__}")
        # A document hashes its whole text and words: each is looked up once, a new one kept once.
        found = [self._cache.get(doc) for doc in docs]
        missing = [i for i, vectors in enumerate(found) if vectors is None]
        if missing:
            todo: dict[Doc, int] = {}  # equal documents run once
            slot = [todo.setdefault(docs[i], len(todo)) for i in missing]
            fresh = self._run(list(todo))
            self._cache.update(zip(todo, fresh, strict=True))
            for i, s in zip(missing, slot, strict=True):
                found[i] = fresh[s]
        return [vectors.copy() for vectors in found]  # copies: callers cannot alter the cache

    def _run(self, docs: list[Doc]) -> list[np.ndarray]:
        """The word vectors of each document, its windows run with every other document's."""
        joined = self.tokenizer.prepare_joined(docs, self.max_length)
        sizes = np.fromiter(map(len, joined.inputs), np.int64, len(joined.inputs))
        order = np.argsort(-sizes, kind="stable")  # longest first; ties keep call order
        batches = [order[b:b + self.batch_size] for b in range(0, len(order), self.batch_size)]
        # Each piece's batch and row there, and the pieces grouped by batch.
        place = np.empty(len(order), dtype=np.int64)
        place[order] = np.arange(len(order))
        piece_place = place[joined.window]
        by_batch = np.argsort(piece_place // self.batch_size, kind="stable")
        cuts = np.searchsorted(piece_place[by_batch] // self.batch_size, np.arange(len(batches) + 1))
        hidden = np.empty((len(joined.ids), self.width), np.float32)
        # Runs go back to back, RUNS_AT_ONCE batches before any output is read: our work between runs
        # let ONNX Runtime's threads spin down and pay to wake up (the overhead over a bare session
        # fell by about a third; measured: CHANGELOG.md); the cap bounds memory. Our work cannot hide
        # beside the runs instead: they keep every core busy (measured: CHANGELOG.md).
        for g in range(0, len(batches), RUNS_AT_ONCE):
            outs = [self._forward([joined.inputs[j] for j in batch]) for batch in batches[g:g + RUNS_AT_ONCE]]
            for b, out in enumerate(outs, start=g):
                mine = by_batch[cuts[b]:cuts[b + 1]]
                hidden[mine] = out[piece_place[mine] % self.batch_size, joined.row[mine]]
        vectors = joined.words.pool(hidden, self.pooling)  # all documents at once
        cut = joined.word_start.tolist()
        return [vectors[a:b] for a, b in zip(cut[:-1], cut[1:], strict=True)]

    def _forward(self, sequences: list[np.ndarray]) -> np.ndarray:
        """Right-pad the sequences to the longest and run them as one batch."""
        input_ids, mask = runtime.pad_batch(sequences, self.pad_id)
        out = self.session.run([OUTPUT], {"input_ids": input_ids, "attention_mask": mask})[0]
        self.windows_run += len(sequences)
        return np.asarray(out, dtype=np.float32)

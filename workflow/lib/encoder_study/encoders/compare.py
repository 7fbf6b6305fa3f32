"""Hidden states compared token by token: an export and its PyTorch reference, the texts, the per-token
differences, and the trainable modules against PyTorch and the graph runtime.

The parity, student and write-back recipes all report these numbers, so how they are computed has
one owner here, below the stages that make tables of them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..core import machine
from ..core.errors import UserError
from ..onnx import manifest
from ..onnx.runtime import OUTPUT, ort_session, pad_batch
from . import reference
from .families import usable_positions
from .tokens import TextPieces

COMPARISONS = ("trainable vs pytorch", "trainable vs graph runtime", "graph runtime vs pytorch")


class ParityError(UserError):
    pass


def read_texts(path: str | os.PathLike) -> list[dict]:
    """The selected texts (results/texts/parity_texts.jsonl): id, source, lang, text."""
    records = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            try:
                record = json.loads(line)
                records.append({k: record[k] for k in ("id", "source", "lang", "text")})
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise ParityError(f"{path}:{number}: not a text record with id, source, lang, text ({err}); "
                                  "rebuild it with `snakemake parity`") from err
    if not records:
        raise ParityError(f"{path}: holds no texts; the selection is empty")
    return records


@dataclass(frozen=True)
class Pair:
    """An exported graph and the PyTorch model it was exported from, with the texts' piece ids for both.

    `pieces` is how texts become rows (tokens.TextPieces); `torch_model` is the reference the graph
    and the trainable modules are compared against (reference.load_pytorch, or the distilled student).
    """

    name: str
    onnx_path: Path
    torch_model: torch.nn.Module
    pieces: TextPieces

    @classmethod
    def load(cls, model_dir: str | os.PathLike, source_json: str | os.PathLike) -> Pair:
        """The export in `model_dir` and its source's PyTorch model, both checked against their hashes."""
        model_dir = Path(model_dir)
        record = manifest.verified_model(model_dir)
        source_dir, source = reference.source_dir(source_json)
        if source["tree_sha256"] != record["source_tree_sha256"]:
            raise ParityError(f"{source_json} describes another source than {model_dir / manifest.MANIFEST} "
                              "was exported from; re-export the model")
        model = reference.load_pytorch(source_dir)
        pad = model.config.pad_token_id
        pieces = TextPieces(model_dir / manifest.TOKENIZER_FILE, usable_positions(model.config.to_dict()),
                            0 if pad is None else int(pad))
        return cls(record["model"], model_dir / manifest.ONNX_FILE, model, pieces)


def torch_states(model: torch.nn.Module, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    # A Hugging Face model returns an output object; our encoders (the distilled student) the states.
    return (out if isinstance(out, torch.Tensor) else out.last_hidden_state).numpy()


def token_differences(reference: np.ndarray, other: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per token: the largest absolute difference and the cosine similarity (float64)."""
    a, b = reference.astype(np.float64), other.astype(np.float64)
    max_abs = np.abs(a - b).max(axis=-1)
    norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    cos = np.where(norms > 0, (a * b).sum(axis=-1) / np.where(norms > 0, norms, 1.0), 1.0)
    return max_abs, cos


class Accumulator:
    """Running max abs, mean abs, min cosine and largest value of one comparison over many texts."""

    def __init__(self):
        self.tokens, self.elements, self.abs_sum = 0, 0, 0.0
        self.max_abs, self.min_cos, self.max_value = 0.0, 1.0, 0.0

    def add(self, reference: np.ndarray, other: np.ndarray) -> None:
        diff, cos = token_differences(reference, other)
        self.tokens += diff.size
        self.elements += reference.size
        self.abs_sum += float(np.abs(reference.astype(np.float64) - other).sum())
        self.max_abs = max(self.max_abs, float(diff.max()))
        self.min_cos = min(self.min_cos, float(cos.min()))
        self.max_value = max(self.max_value, float(np.abs(reference).max()))

    def row(self) -> dict:
        return {"tokens": self.tokens, "max_abs": self.max_abs, "mean_abs": self.abs_sum / self.elements,
                "min_cos": self.min_cos, "max_value": self.max_value}


@dataclass(frozen=True)
class Alone:
    """The texts as rows of piece ids (`truncated`: how many were cut to the model's positions), each run
    alone through the PyTorch reference and the exported graph: the states every comparison reads."""

    rows: list[list[int]]
    truncated: int
    reference: list[np.ndarray]
    graph: list[np.ndarray]


def run_alone(pair: Pair, texts: list[str], session) -> Alone:
    """Each text alone through `pair`'s reference and `session` (an ONNX Runtime session of its graph)."""
    rows, truncated = pair.pieces.encode(texts)
    reference, graph = [], []
    for row in rows:
        ids, mask = pad_batch([row], pair.pieces.pad_id)
        reference.append(torch_states(pair.torch_model, ids, mask)[0])
        graph.append(session.run([OUTPUT], {"input_ids": ids, "attention_mask": mask})[0][0])
    return Alone(rows, truncated, reference, graph)


def trainable_parity(pair: Pair, texts: list[str], threads: int, batch: int = 8,
                     comparisons: tuple[str, ...] = COMPARISONS, alone: Alone | None = None) -> list[dict]:
    """The trainable modules against PyTorch and the graph runtime, one text per run, every token;
    and whether padded batches of `batch` give exactly (bitwise) the rows of the texts run alone
    (`batch_equal`; `batch_max_abs`, not a table column: by how much they differ at most).
    `comparisons`: which of COMPARISONS to report, in that order. `alone`: `run_alone` of the same
    texts at the same threads, when the caller has it (computed here otherwise)."""
    from . import trainable

    threads = machine.torch_threads(threads)
    encoder = trainable.load(pair.onnx_path)
    family = encoder.settings_dict()["family"]
    if alone is None:
        alone = run_alone(pair, texts, ort_session(pair.onnx_path, threads))
    rows = alone.rows
    pairs = {name: Accumulator() for name in COMPARISONS}
    singles = []
    for row, ref, graph in zip(rows, alone.reference, alone.graph, strict=True):
        ids, mask = pad_batch([row], pair.pieces.pad_id)
        with torch.no_grad():
            mine = encoder(torch.from_numpy(ids), torch.from_numpy(mask))[0].numpy()
        pairs["trainable vs pytorch"].add(ref, mine)
        pairs["trainable vs graph runtime"].add(graph, mine)
        pairs["graph runtime vs pytorch"].add(ref, graph)
        singles.append(mine)
    equal, batch_max_abs = True, 0.0
    for start in range(0, len(rows), batch):
        chunk = rows[start:start + batch]
        ids, mask = pad_batch(chunk, pair.pieces.pad_id)
        with torch.no_grad():
            out = encoder(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        equal &= all(np.array_equal(out[i, : len(r)], singles[start + i]) for i, r in enumerate(chunk))
        batch_max_abs = max([batch_max_abs] + [float(np.abs(out[i, : len(r)] - singles[start + i]).max())
                                               for i, r in enumerate(chunk)])
    return [{"model": pair.name, "family": family, "comparison": name, **pairs[name].row(),
             "batch_equal": equal, "batch_max_abs": batch_max_abs} for name in comparisons]

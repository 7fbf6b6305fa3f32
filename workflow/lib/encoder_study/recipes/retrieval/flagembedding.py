"""FlagEmbedding's own BGE-M3 inference code as the reference of all three outputs.

The class is `M3Embedder` of PyPI `FlagEmbedding` (exported there as `BGEM3FlagModel`); its `encode`
tokenises the texts with transformers' AutoTokenizer, runs the encoder, and returns dense vectors,
lexical weights (a dict of id -> weight per text) and ColBERT vectors (one per piece after the first).
It reads one model directory: the encoder's files with the heads `colbert_linear.pt` and
`sparse_linear.pt` beside them, as BGE-M3's snapshot holds them. Where the recipe's heads lie elsewhere
(the random heads), FlagEmbedding is given a temporary directory of links to both; where the model has
no tokenizer_config.json (the tiny models, and BGE-M3 as paper.yaml fetches it), one is written there
that has transformers read the model's tokenizer.json as it is.

It is installed with `--no-deps` (envs/no-deps.txt): its inference path imports torch, transformers,
numpy, tqdm and datasets, all pinned already; what its metadata declares beyond those
(sentence-transformers, peft, accelerate, ir-datasets, sentencepiece) serves its training and
evaluation code.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ...core import files
from . import RetrievalError
from .cases import Case
from .heads import HEAD_FILES

NAME = "flagembedding"  # the parity table's `reference`
DISTRIBUTION = "FlagEmbedding"
MODULE = "FlagEmbedding.inference.embedder.encoder_only.m3"
CLASS = "M3Embedder"
# The two package __init__s that are not run: they import every model FlagEmbedding has, among them a
# MiniCPM reranker written for transformers 4 (it imports transformers.modeling_attn_mask_utils, gone
# in 5). Every module M3Embedder imports runs as FlagEmbedding ships it.
SKIPPED_INITS = ("FlagEmbedding", "FlagEmbedding.inference")
# Float32 on the CPU, as the graph and the project's reference run; the rest are the class's defaults,
# written out: CLS pooling, L2-normalised dense and ColBERT vectors.
SETTINGS = {"use_fp16": False, "devices": "cpu", "pooling_method": "cls", "normalize_embeddings": True}
TOKENIZER_CONFIG = "tokenizer_config.json"
# transformers 5 rebuilds a tokenizer of a named class (XLMRobertaTokenizer) from tokenizer.json's
# vocabulary with the class's own pipeline, which keeps a SentencePiece normaliser (BGE-M3's) but drops
# any other (the tiny model's NFKC, which splits Thai's sara am). This class reads the file as it is.
AS_IS = "TokenizersBackend"
# Where transformers looks for each special token, by the role FlagEmbedding's sparse output ignores.
SPECIAL_TOKENS = {"cls": ("cls_token", "bos_token"), "eos": ("eos_token", "sep_token"), "pad": ("pad_token",),
                  "unk": ("unk_token",)}


def embedder_class():
    """FlagEmbedding's M3Embedder, imported without running the package __init__s SKIPPED_INITS."""
    if MODULE not in sys.modules:
        for name in SKIPPED_INITS:
            if name in sys.modules:
                continue
            spec = importlib.util.find_spec(name)
            if spec is None:
                raise RetrievalError(f"{DISTRIBUTION} is not installed; the retrieval check compares with "
                                     "its BGE-M3 code: pip install --no-deps -r envs/no-deps.txt")
            package = importlib.util.module_from_spec(spec)  # a package with its path, __init__ not run
            sys.modules[name] = package
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(sys.modules[parent], child, package)
    return getattr(importlib.import_module(MODULE), CLASS)


def tokenizer_config(model_dir: Path, ignored: dict[str, int]) -> dict:
    """A tokenizer_config.json that has transformers read the model's tokenizer.json as it is, naming
    its special tokens (the ids in `ignored`, role -> id)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    config = {"tokenizer_class": AS_IS}
    for role, names in SPECIAL_TOKENS.items():
        config.update(dict.fromkeys(names, tokenizer.id_to_token(ignored[role])))
    return config


@contextlib.contextmanager
def model_directory(model_dir: Path, heads: dict[str, Path], ignored: dict[str, int]) -> Iterator[Path]:
    """A directory in FlagEmbedding's layout: `model_dir` itself when it holds the heads and a
    tokenizer_config.json (a whole snapshot, as FlagEmbedding's users load it); else a temporary
    directory of links to the model's files and to the heads, with `tokenizer_config` where the model
    has none."""
    if (model_dir / TOKENIZER_CONFIG).is_file() and all(
            path.parent.resolve() == model_dir.resolve() for path in heads.values()):
        yield model_dir
        return
    with tempfile.TemporaryDirectory(prefix="flagembedding-") as tmp:
        for path in sorted(model_dir.iterdir()):
            if path.is_file() and path.name not in HEAD_FILES:
                (Path(tmp) / path.name).symlink_to(path.resolve())
        for path in heads.values():
            (Path(tmp) / path.name).symlink_to(path.resolve())
        if not (model_dir / TOKENIZER_CONFIG).is_file():
            files.write_json(Path(tmp) / TOKENIZER_CONFIG, tokenizer_config(model_dir, ignored))
        yield Path(tmp)


def load(directory: Path, max_length: int):
    """FlagEmbedding's embedder on `directory`, which must hold both heads: without them FlagEmbedding
    draws new ones at random and only logs it."""
    missing = [name for name in HEAD_FILES if not (directory / name).is_file()]
    if missing:
        raise RetrievalError(f"{directory}: no {' or '.join(missing)}; FlagEmbedding would draw the heads "
                             "at random instead of reading them")
    return embedder_class()(str(directory), passage_max_length=max_length, **SETTINGS)


def _same_pieces(embedder, case: Case, max_length: int) -> None:
    """FlagEmbedding tokenises the texts itself; its pieces must be the case's, or the rows compare
    different inputs."""
    theirs = embedder.tokenizer(case.texts, truncation=True, max_length=max_length)["input_ids"]
    ours = [ids[mask == 1].tolist() for ids, mask in zip(case.input_ids, case.attention_mask, strict=True)]
    if theirs != ours:
        row = next(i for i, (a, b) in enumerate(zip(theirs, ours, strict=True)) if a != b)
        raise RetrievalError(f"case {case.name}, text {row}: FlagEmbedding's tokenizer (transformers) gives "
                             f"{len(theirs[row])} pieces {theirs[row][:12]}..., the model's tokenizer.json "
                             f"{len(ours[row])} pieces {ours[row][:12]}...")


def outputs(embedder, case: Case, max_length: int, vocab_size: int) -> dict[str, np.ndarray]:
    """FlagEmbedding's outputs for the case's texts: `dense` [rows, width]; `sparse` [rows, vocab], its
    lexical weights placed at their ids (zero elsewhere); `colbert` every text's vectors, one per piece
    after the first, the texts one after another ([sum of (pieces - 1), dim])."""
    _same_pieces(embedder, case, max_length)
    # One batch: FlagEmbedding shows progress bars only when the texts fill a batch.
    got = embedder.encode(case.texts, batch_size=len(case.texts) + 1, max_length=max_length,
                          return_dense=True, return_sparse=True, return_colbert_vecs=True)
    sparse = np.zeros((len(case.texts), vocab_size))
    for row, weights in enumerate(got["lexical_weights"]):
        for token, weight in weights.items():
            sparse[row, int(token)] = weight
    lengths = case.attention_mask.sum(axis=1)
    if [len(v) for v in got["colbert_vecs"]] != [int(n) - 1 for n in lengths]:
        raise RetrievalError(f"case {case.name}: FlagEmbedding gives {[len(v) for v in got['colbert_vecs']]} "
                             f"ColBERT vectors per text for {lengths.tolist()} pieces")
    return {"dense": got["dense_vecs"], "sparse": sparse, "colbert": np.concatenate(got["colbert_vecs"])}


def graph_view(got: dict[str, np.ndarray], attention_mask: np.ndarray) -> dict[str, np.ndarray]:
    """The graph's outputs as FlagEmbedding reports them: each text's ColBERT vectors without the first
    position and the padding, the texts one after another (dense and sparse are the same)."""
    lengths = attention_mask.sum(axis=1)
    return {**got, "colbert": np.concatenate([got["colbert"][row, 1:n] for row, n in enumerate(lengths)])}


def reference(model_dir: Path, heads: dict[str, Path], ignored: dict[str, int], cases: list[Case],
              max_length: int, vocab_size: int) -> list[dict[str, np.ndarray]]:
    """FlagEmbedding's outputs for every case; its model goes when this returns."""
    with model_directory(model_dir, heads, ignored) as directory:
        embedder = load(directory, max_length)
        return [outputs(embedder, case, max_length, vocab_size) for case in cases]


def record() -> dict:
    """How the reference was computed, for retrieval.json."""
    from importlib import metadata

    return {"package": f"{DISTRIBUTION}=={metadata.version(DISTRIBUTION)}", "class": f"{MODULE}.{CLASS}",
            "settings": SETTINGS, "skipped_inits": list(SKIPPED_INITS),
            "tokenizer": f"transformers' AutoTokenizer; a model without {TOKENIZER_CONFIG} is given one with "
                         f"tokenizer_class {AS_IS} (tokenizer.json read as it is) and its special tokens",
            "compared": "the graph's colbert rows from the second position (FlagEmbedding's hidden[:, 1:]); "
                        "the texts tokenised by FlagEmbedding, each case as one batch"}

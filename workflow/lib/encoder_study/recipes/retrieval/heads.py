"""The two linear heads, in FlagEmbedding's files, and the ids the sparse head ignores."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...core import files
from . import RetrievalError

# FlagEmbedding's names: its model directory holds them beside the encoder's files.
COLBERT_FILE = "colbert_linear.pt"
SPARSE_FILE = "sparse_linear.pt"
HEAD_FILES = (COLBERT_FILE, SPARSE_FILE)


@dataclass
class Heads:
    """The two linear heads; weights in float32 whatever dtype their files hold (BGE-M3's are fp16)."""

    colbert: torch.nn.Linear
    sparse: torch.nn.Linear
    files: dict[str, Path] = field(default_factory=dict)


# The random sparse head's bias, added to its drawn one. A random deep encoder gives nearly the same
# final state for every token (measured on the full-size twin: w.h between -0.94 and -0.81 over three
# texts), so with torch's default bias every token's relu(w.h + b) was 0 and the sparse rows compared
# zeros with zeros. w.h of a LayerNorm'ed state has a standard deviation of about 1/sqrt(3): +2 keeps the
# weights positive for all but about 1 in 2,000 draws, so the check compares real numbers.
SPARSE_BIAS = 2.0


def random_heads(width: int, seed: int) -> dict[str, dict[str, torch.Tensor]]:
    """State dicts for both heads, drawn like torch.nn.Linear's default (uniform in ±1/sqrt(width)); the
    sparse head's bias moved up by SPARSE_BIAS, so that its weights are positive."""
    generator = torch.Generator().manual_seed(seed)
    bound = 1.0 / width**0.5

    def draw(*shape: int) -> torch.Tensor:
        return (torch.rand(shape, generator=generator) * 2 - 1) * bound

    return {
        COLBERT_FILE: {"weight": draw(width, width), "bias": draw(width)},
        SPARSE_FILE: {"weight": draw(1, width), "bias": draw(1) + SPARSE_BIAS},
    }


def save_heads(state: dict[str, dict[str, torch.Tensor]], out_dir: str | os.PathLike) -> list[Path]:
    """Write each head as FlagEmbedding does (`torch.save(linear.state_dict(), name)`), atomically."""
    out_dir = Path(out_dir)
    written = []
    for name, tensors in sorted(state.items()):
        files.write_torch(out_dir / name, {k: v.contiguous() for k, v in tensors.items()})
        written.append(out_dir / name)
    return written


def _linear(path: Path, width: int, out: int | None) -> torch.nn.Linear:
    """A head from its state dict; `out` None accepts any output size (the ColBERT dimension)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError as err:
        raise RetrievalError(f"head {path} is missing") from err
    except Exception as err:  # a pickle that is not a plain state dict, or not a torch file at all
        raise RetrievalError(f"head {path}: cannot read it as a state dict ({err})") from err
    if not isinstance(state, dict) or not {"weight", "bias"} <= set(state):
        keys = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise RetrievalError(f"head {path}: expected a state dict with 'weight' and 'bias', found {keys}")
    weight = state["weight"].float()
    bias = state["bias"].float().reshape(-1)
    if weight.ndim == 1:  # a one-output head saved as a vector
        weight = weight.reshape(1, -1)
    if weight.ndim != 2 or weight.shape[1] != width or bias.shape[0] != weight.shape[0] or (
            out is not None and weight.shape[0] != out):
        want = f"[{out if out is not None else 'dim'}, {width}]"
        raise RetrievalError(f"head {path}: weight {list(state['weight'].shape)} and bias "
                             f"{list(state['bias'].shape)} do not fit the encoder: expected weight {want}")
    linear = torch.nn.Linear(width, weight.shape[0])
    with torch.no_grad():
        linear.weight.copy_(weight)
        linear.bias.copy_(bias)
    return linear.eval()


def load_heads(heads_dir: str | os.PathLike, width: int) -> Heads:
    heads_dir = Path(heads_dir)
    colbert, sparse = heads_dir / COLBERT_FILE, heads_dir / SPARSE_FILE
    return Heads(colbert=_linear(colbert, width, None), sparse=_linear(sparse, width, 1),
                 files={"colbert": colbert, "sparse": sparse})


def ignored_ids(model_dir: str | os.PathLike, config) -> dict[str, int]:
    """The ids FlagEmbedding's sparse head ignores: cls, eos, pad and unk, as role -> id."""
    tokenizer = files.read_json(Path(model_dir) / "tokenizer.json", "the model's tokenizer (tokenizers' "
                                "JSON)", "acquire the model again", kind=dict, error=RetrievalError)
    model = tokenizer.get("model", {})
    unk = model.get("unk_id")  # Unigram keeps an id, WordPiece and BPE a piece
    if unk is None and model.get("unk_token") is not None:
        unk = model.get("vocab", {}).get(model["unk_token"])

    def first(*names: str):
        return next((v for n in names if (v := getattr(config, n, None)) is not None), None)

    # XLM-R's config names <s> bos_token_id and </s> eos_token_id; BERT-style configs use cls/sep.
    roles = {"cls": first("cls_token_id", "bos_token_id"), "eos": first("eos_token_id", "sep_token_id"),
             "pad": first("pad_token_id"), "unk": unk}
    missing = [role for role, value in roles.items() if value is None]
    if missing:
        raise RetrievalError(f"{model_dir}: cannot find the id of {', '.join(missing)} in config.json or "
                             "tokenizer.json; the sparse head must know which ids to ignore")
    return {role: int(value) for role, value in roles.items()}

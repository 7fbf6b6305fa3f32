"""The project's own reference (its PyTorch head code, on the cases' pieces) and the parity rows of the
graph against both references, with the notes that go under the table."""

from __future__ import annotations

import numpy as np
import torch

from ...core import tables
from . import OUTPUTS, RetrievalError
from .cases import Case
from .graph import REFERENCE_ATTENTION, attention
from .heads import Heads

PROJECT = "project"  # the parity table's `reference` for the project's own head code
PARITY_COLUMNS = ["case", "output", "reference", "rows", "tokens", "max_abs", "max_value", "allclose",
                  "tolerance"]
# results/retrieval/parity.md. ".0f" prints a count and "g" the tolerance as str() does (for a
# tolerance of up to 6 significant digits), aligned right.
PARITY_MARKDOWN = (("case", "case", ""), ("output", "output", ""), ("reference", "reference", ""),
                   ("rows", "rows", ".0f"), ("tokens", "tokens", ".0f"), ("max_abs", "max_abs", ".3g"),
                   ("max_value", "max_value", ".4g"), ("allclose", "allclose", "yes"),
                   ("tolerance", "tolerance", "g"))
# The validation cases, as `retrieval export` lists them in its fragment.
CASE_MARKDOWN = (("name", "case", ""), ("purpose", "what it checks", ""), ("rows", "rows", ".0f"),
                 ("tokens", "tokens", ".0f"))
# Where the graph and FlagEmbedding differ by definition, and what each row compares: under the table.
NOTES = (
    "`reference` flagembedding: FlagEmbedding's BGEM3FlagModel (M3Embedder.encode) on the case's texts; "
    "project: the project's own head code on the same pieces. `rows` texts, `tokens` their pieces.",
    "`colbert` keeps the first position, where FlagEmbedding computes `colbert_linear(hidden[:, 1:])`: "
    "with one vector per position, a consumer that trims each row of a padded batch to the attention "
    "mask's sum gets exactly the text's vectors, instead of one more than the output holds. The first "
    "vector (of `<s>`) is a summary of the whole text, harmless in late interaction; drop row 0 to get "
    "FlagEmbedding's vectors. So the flagembedding rows compare each text's positions from the second "
    "on (padding left out), the project rows every position, the first included.",
    "`sparse`: FlagEmbedding's lexical weights (per text, a weight for each id it keeps: weights above 0, "
    "the ids of cls, eos, pad and unk left out) are compared at their ids of the graph's vocabulary-wide "
    "vector, zero at every other id.",
    "FlagEmbedding tokenises the texts itself (its pieces are checked equal to the graph's) and pads each "
    "case to its longest text, so in `padding_tail` the graph's padding tail is compared with the text "
    "alone. Both references run transformers' default attention (PyTorch's scaled_dot_product_attention), "
    "the graph transformers' eager attention one head at a time.",
)


def reference(encoder: torch.nn.Module, heads: Heads, ignored: list[int], input_ids: np.ndarray,
              mask: np.ndarray) -> dict[str, np.ndarray]:
    """The three heads in plain PyTorch and Python, the project's own reading of FlagEmbedding's code.

    Shares only the encoder's weights with the graph: the encoder runs with PyTorch's
    scaled_dot_product_attention (the graph computes eager attention head by head), and the sparse
    weights are max-reduced by a loop over tokens. The encoder runs in float32, as the graph does; the
    heads run in float64 on its output, so that their own rounding is not in the differences the check
    measures (at 8,192 pieces of width 1024 that is 64 MiB: the float64 is not where the memory goes).
    """
    with torch.no_grad(), attention(encoder, REFERENCE_ATTENTION):
        hidden = encoder(input_ids=torch.from_numpy(input_ids),
                         attention_mask=torch.from_numpy(mask)).last_hidden_state.double()
        m = torch.from_numpy(mask).double()
        first = hidden[:, 0]
        dense = first / first.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        weights = torch.relu(hidden @ heads.sparse.weight.double().T + heads.sparse.bias.double())[..., 0]
        vectors = hidden @ heads.colbert.weight.double().T + heads.colbert.bias.double()
        colbert = vectors / vectors.norm(dim=-1, keepdim=True).clamp_min(1e-12) * m.unsqueeze(-1)
    vocab = encoder.config.vocab_size
    sparse = np.zeros((input_ids.shape[0], vocab))
    for row in range(input_ids.shape[0]):
        for token, weight, real in zip(input_ids[row], weights[row].tolist(), mask[row], strict=True):
            if real:
                sparse[row, token] = max(sparse[row, token], weight)
    sparse[:, sorted(set(ignored))] = 0.0
    return {"dense": dense.numpy(), "sparse": sparse, "colbert": colbert.numpy()}


def compare(case: Case, reference_name: str, got: dict[str, np.ndarray], want: dict[str, np.ndarray],
            tolerance: float) -> list[dict]:
    """One row per output: the largest absolute difference between the graph's outputs `got` (in the
    reference's terms) and the reference's `want`, and allclose(rtol=0, atol=tolerance)."""
    rows = []
    for name in OUTPUTS:
        a, b = np.asarray(got[name], dtype=np.float64), np.asarray(want[name], dtype=np.float64)
        if a.shape != b.shape:
            raise RetrievalError(f"case {case.name}: output {name} has shape {list(a.shape)}, the "
                                 f"{reference_name} reference {list(b.shape)}")
        rows.append({
            "case": case.name, "output": name, "reference": reference_name,
            "rows": int(case.input_ids.shape[0]), "tokens": int(case.attention_mask.sum()),
            "max_abs": float(np.abs(a - b).max()),
            "max_value": float(np.abs(b).max()),
            "allclose": bool(np.allclose(a, b, rtol=0.0, atol=tolerance)), "tolerance": tolerance,
        })
    return rows


def parity_markdown(rows: list[dict]) -> str:
    return tables.markdown(rows, PARITY_MARKDOWN)


def notes_markdown() -> str:
    """The notes under the table, a Markdown list."""
    return "".join(f"- {note}\n" for note in NOTES)

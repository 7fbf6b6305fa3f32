"""The module that is exported: an encoder and its two heads, `forward(input_ids, attention_mask) ->
(dense, sparse, colbert)`, with the sparse weights max-reduced onto the vocabulary inside the graph, and
the attention implementations the graph and the project's reference run.

Memory. BGE-M3 reads 8,192 pieces, and the check runs a text that long. Eager attention holds a
[batch, heads, sequence, sequence] score tensor, 4 GiB at 16 x 8192 x 8192 in float32, and ONNX Runtime
two of them at once (the scores and the softmax). So the graph computes attention one head at a time
(the same arithmetic as transformers' eager attention, head by head): a consumer's peak at 8,192 pieces
is one head's scores, 256 MiB, not 16 heads', and short inputs run as fast. The references run
PyTorch's scaled_dot_product_attention (a fused kernel that never holds all the scores), a different
implementation from the graph's.
"""

from __future__ import annotations

import contextlib

import torch

from ...encoders.reference import HiddenStates
from . import RetrievalError
from .heads import Heads

# ScatterElements gained reduction="max" in opset 18; older opsets only define none/add/mul. ONNX
# Runtime accepts "max" at 16 and 17 too, but a runtime that follows the standard may refuse it.
MIN_OPSET = 18
# The outputs' dynamic axes, in OUTPUTS' order (the inputs' are every export's).
OUTPUT_AXES = {"dense": {0: "batch"}, "sparse": {0: "batch"}, "colbert": {0: "batch", 1: "sequence"}}
# The optional compact sparse output (retrieval.sparse_top_k > 0): each text's k largest (id, weight)
# pairs of the vocabulary-wide row, computed inside the same graph (TopK), after the three outputs.
COMPACT_OUTPUTS = ("sparse_top_ids", "sparse_top_weights")
COMPACT_AXES = {name: {0: "batch"} for name in COMPACT_OUTPUTS}


class _ScatterMax(torch.autograd.Function):
    """torch.scatter_reduce(..., reduce="amax"), out of place, exported as one ScatterElements node.

    The stock symbolic wraps the node in two `If`s for rank-0 tensors, which leaves the output's rank
    unknown (ONNX Runtime then warns on every run); our tensors are always [batch, vocab].
    Inference only: there is no backward.
    """

    @staticmethod
    def forward(ctx, base: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        return torch.scatter_reduce(base, 1, index, src, reduce="amax")

    @staticmethod
    def symbolic(g, base, index, src):
        return g.op("ScatterElements", base, index, src, axis_i=1, reduction_s="max")


PER_HEAD_ATTENTION = "encoder_study_per_head"  # registered with transformers' attention interfaces
REFERENCE_ATTENTION = "sdpa"


def per_head_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, scaling: float | None = None,
                       dropout: float = 0.0, **kwargs):
    """transformers' eager attention ([batch, heads, sequence, head_dim] in, [batch, sequence, heads,
    head_dim] out), one head at a time: the exported graph then holds one head's scores at a time.

    Inference only (no dropout); the attention weights are not returned.
    """
    if key.shape[1] != query.shape[1]:
        raise RetrievalError(f"attention with {query.shape[1]} query heads and {key.shape[1]} key heads: "
                             "the per-head export supports only as many key heads as query heads")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    outputs = []
    for head in range(query.shape[1]):  # the head count is fixed: the traced graph has one chain per head
        one = slice(head, head + 1)
        scores = torch.matmul(query[:, one], key[:, one].transpose(2, 3)) * scaling
        if attention_mask is not None:
            scores = scores + attention_mask  # [batch, 1, query, key]: the same for every head
        outputs.append(torch.matmul(torch.softmax(scores, dim=-1), value[:, one]))
    return torch.cat(outputs, dim=1).transpose(1, 2).contiguous(), None


@contextlib.contextmanager
def attention(encoder: torch.nn.Module, implementation: str):
    """Run `encoder` with another of transformers' attention implementations inside the block:
    PER_HEAD_ATTENTION (with eager attention's additive mask) or one of transformers' own ("sdpa")."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import eager_mask

    if implementation == PER_HEAD_ATTENTION:
        AttentionInterface.register(PER_HEAD_ATTENTION, per_head_attention)
        AttentionMaskInterface.register(PER_HEAD_ATTENTION, eager_mask)
    before = encoder.config._attn_implementation
    encoder.config._attn_implementation = implementation
    try:
        yield encoder
    finally:
        encoder.config._attn_implementation = before


class RetrievalModel(torch.nn.Module):
    """`forward(input_ids, attention_mask) -> (dense, sparse, colbert)`: the module that is exported; with
    `top_k` > 0 also (sparse_top_ids, sparse_top_weights), the k largest weights of each row and their ids
    (ties in TopK's order; a text with fewer than k ids above 0 fills the rest with weight 0)."""

    def __init__(self, encoder: torch.nn.Module, heads: Heads, vocab_size: int, ignored: list[int],
                 top_k: int = 0):
        super().__init__()
        self.top_k = int(top_k)
        self.encoder = HiddenStates(encoder)
        self.colbert = heads.colbert
        self.sparse = heads.sparse
        self.vocab_size = int(vocab_size)
        keep = torch.ones(self.vocab_size)
        keep[sorted(set(ignored))] = 0.0
        self.register_buffer("keep", keep, persistent=False)  # 0 at ignored ids, 1 elsewhere

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        hidden = self.encoder(input_ids, attention_mask)
        mask = attention_mask.to(hidden.dtype)
        dense = torch.nn.functional.normalize(hidden[:, 0], dim=-1)
        weights = torch.relu(self.sparse(hidden)).squeeze(-1) * mask
        base = torch.zeros(input_ids.shape[0], self.vocab_size, dtype=weights.dtype)
        sparse = _ScatterMax.apply(base, input_ids, weights) * self.keep
        colbert = torch.nn.functional.normalize(self.colbert(hidden), dim=-1) * mask.unsqueeze(-1)
        if self.top_k:
            weights, ids = torch.topk(sparse, self.top_k, dim=-1)
            return dense, sparse, colbert, ids, weights
        return dense, sparse, colbert


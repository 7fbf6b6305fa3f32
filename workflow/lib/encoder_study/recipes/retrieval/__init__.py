"""Retrieval heads baked into one graph: the dense, sparse and multi-vector outputs of a BGE-M3-style encoder.

A standard export stops at `last_hidden_state`; BGE-M3's three retrieval signals are Python around it
(FlagEmbedding's BGE-M3 model). Here they go inside the ONNX graph, so one forward pass in any runtime
gives all three. Inputs `input_ids`, `attention_mask` (int64, [batch, sequence]); outputs:

- `dense` [batch, width]: the first token's hidden state, L2-normalised (CLS pooling).
- `sparse` [batch, vocab]: relu(sparse_linear(hidden)) per token, times the attention mask, max-reduced
  onto each token's vocabulary id inside the graph (ScatterElements with reduction "max"); the ids
  FlagEmbedding ignores (cls, eos, pad, unk) are zeroed, so they contribute nothing.
- `colbert` [batch, sequence, dim]: colbert_linear(hidden), L2-normalised, times the mask. Unlike
  FlagEmbedding (`hidden[:, 1:]`) the first position is kept, so the output is as long as the mask.

The heads are FlagEmbedding's files `colbert_linear.pt` and `sparse_linear.pt` (state dicts with
`weight` [out, width] and `bias` [out]); the embedded default makes random ones from a seed.
The graph (after the recipe's offline ONNX Runtime optimisation) is checked on fixed cases against two
references before the output directory, written under a temporary name, is renamed into place:
FlagEmbedding's own BGE-M3 inference code (`BGEM3FlagModel`, on the cases' texts) and the project's
plain PyTorch head code (on the same pieces, the first ColBERT position included). `retrieval.json`
lists every file with its SHA-256; `verify` checks them without running anything.

The modules, in the order the export uses them: `heads` (the two linear heads and the ids the sparse
head ignores), `cases` (the validation texts), `flagembedding` (the reference from FlagEmbedding's
code), `check` (the project's reference and the parity rows), `graph` (the module that is exported and
its attention), `export` (export, optimise, check, publish; the memory of each phase) and `verify`.
"""

from __future__ import annotations

from ...core.errors import UserError

OUTPUTS = ("dense", "sparse", "colbert")  # the graph's outputs, in its order


class RetrievalError(UserError):
    pass

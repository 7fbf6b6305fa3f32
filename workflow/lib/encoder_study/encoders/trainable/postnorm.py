"""Family `postnorm` (encoders.families.postnorm): BERT, RoBERTa, XLM-R (Devlin et al. 2018; Liu et al.
2019; Conneau et al. 2019), rebuilt as trainable modules.

Token + learned position embeddings, layer norm, then post-norm layers:
    x = norm(x + Wo(attention(x)))
    x = norm(x + W2(gelu(W1 x)))
with biases everywhere and exact (erf) GELU. The reference is transformers' modeling_bert.py.

The distilled student (encoder_study.recipes.student) is this family with a factorised token table; its graph
names every weight itself, linear weights stored [in, out] (encoders.families.student declares the family;
this module owns the layout's parameter names: `student_names`, `student_linear`, `_from_student_graph`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..families.postnorm import POSITIONS, TOKEN_TYPES, TOKENS
from ..families.student import PROJECTION, is_student
from .common import Encoder, attention, choose_heads, copy_weights, graph_head_dim, padding_keys, score_bias
from .graph import ANONYMOUS, Graph, GraphError

# The distilled student's layout (recipes.student.export): a factorised table lifted by the projection,
# every linear weight a named initializer stored [in, out], positions from 0, no token types.

OPTIONS = ()  # `trainable.load`'s family options: none beyond the common ones


@dataclass
class PostNormSettings:
    width: int
    layers: int
    heads: int
    intermediate: int
    vocab_size: int
    max_positions: int
    eps: float
    position_offset: int  # position row of the first token: BERT 0, XLM-R/RoBERTa padding_idx + 1 = 2
    position_pad_id: int | None  # RoBERTa-style: positions count non-pad tokens; None: 0, 1, 2, ... + offset
    freeze_embeddings: bool = True
    family: str = "postnorm"
    # Factorised token table (Lan et al. 2020, 3.1): vocab x embedding_width, lifted to `width` by a
    # linear map (the distilled student). None: a vocab x width table, as BERT and XLM-R have.
    embedding_width: int | None = None


class PostNormLayer(nn.Module):
    def __init__(self, s: PostNormSettings):
        super().__init__()
        self.heads = s.heads
        self.scale = (s.width // s.heads) ** -0.5
        self.query = nn.Linear(s.width, s.width)
        self.key = nn.Linear(s.width, s.width)
        self.value = nn.Linear(s.width, s.width)
        self.attn_out = nn.Linear(s.width, s.width)
        self.attn_norm = nn.LayerNorm(s.width, eps=s.eps)
        self.ff_in = nn.Linear(s.width, s.intermediate)
        self.ff_out = nn.Linear(s.intermediate, s.width)
        self.ff_norm = nn.LayerNorm(s.width, eps=s.eps)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape

        def split(t):  # [batch, seq, width] -> [batch, heads, seq, head_dim], a view
            return t.view(batch, seq, self.heads, -1).transpose(1, 2)

        a = attention(split(self.query(x)), split(self.key(x)), split(self.value(x)), bias, self.scale)
        x = self.attn_norm(x + self.attn_out(a.transpose(1, 2).reshape(batch, seq, width)))
        return self.ff_norm(x + self.ff_out(F.gelu(self.ff_in(x))))


class PostNormEncoder(Encoder):
    def __init__(self, s: PostNormSettings):
        super().__init__(s)
        self.tokens = nn.Embedding(s.vocab_size, s.embedding_width or s.width)
        self.projection = nn.Linear(s.embedding_width, s.width) if s.embedding_width else None
        # Learned positions with the token-type row 0 already added: the exported graph always uses
        # type 0, so one table does the work of two.
        self.positions = nn.Parameter(torch.zeros(s.max_positions, s.width))
        self.norm = nn.LayerNorm(s.width, eps=s.eps)
        self.layers = nn.ModuleList(PostNormLayer(s) for _ in range(s.layers))
        self.embeddings_frozen = s.freeze_embeddings

    @property
    def filler_id(self) -> int:  # RoBERTa's pad id keeps added padding on the padding position row
        return self.settings.position_pad_id or 0

    def position_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        s = self.settings
        if s.position_pad_id is None:
            return torch.arange(input_ids.shape[1], device=input_ids.device) + s.position_offset
        # RoBERTa counts only non-pad tokens and parks pad tokens on row padding_idx = offset - 1.
        real = input_ids.ne(s.position_pad_id).long()
        return torch.cumsum(real, dim=1) * real + (s.position_offset - 1)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        tokens = self.tokens(input_ids)
        if self.projection is not None:
            tokens = self.projection(tokens)
        return self.norm(tokens + self.positions[self.position_ids(input_ids)])

    def encode(self, x: torch.Tensor, attention_mask: torch.Tensor,
               states: list[torch.Tensor] | None = None) -> torch.Tensor:
        bias = score_bias(padding_keys(attention_mask), x.dtype)
        for layer in self.layers:
            x = layer(x, bias)
            if states is not None:
                states.append(x)
        return x


def weight_names(layers: int) -> dict[str, str]:
    """Our parameter name -> the Hugging Face name the graph uses (prefix removed); `positions` is read
    from two tables (see `from_graph`), so it has no name here."""
    names = {"tokens.weight": TOKENS, "norm.weight": "embeddings.LayerNorm.weight",
             "norm.bias": "embeddings.LayerNorm.bias"}
    parts = {"query": "attention.self.query", "key": "attention.self.key", "value": "attention.self.value",
             "attn_out": "attention.output.dense", "attn_norm": "attention.output.LayerNorm",
             "ff_in": "intermediate.dense", "ff_out": "output.dense", "ff_norm": "output.LayerNorm"}
    for i in range(layers):
        for ours, theirs in parts.items():
            for p in ("weight", "bias"):
                names[f"layers.{i}.{ours}.{p}"] = f"encoder.layer.{i}.{theirs}.{p}"
    return names


def position_scheme(graph: Graph, prefix: str) -> tuple[int, int | None]:
    """(offset, pad id) from how the graph computes the rows it gathers from the position table.

    BERT slices its registered buffer arange(max_positions): the offset is the buffer's value at the
    slice start (0). RoBERTa and XLM-R compute cumsum(ids != pad) * (ids != pad) + padding_idx (a
    `CumSum` feeding the gather): the pad id is the constant `input_ids` is compared with, and the
    offset is the constant added last, plus one (XLM-R: 1 + 1 = 2).
    """
    table = prefix + POSITIONS
    gather = next((n for n in graph.nodes if n.op_type == "Gather" and graph.resolve(n.input[0])
                   == graph.resolve(table)), None)
    if gather is None:
        raise GraphError(f"{graph.path}: no Gather reads {table}; cannot tell which positions the graph uses")
    cone = graph.upstream(gather.input[1])
    if any(n.op_type == "CumSum" for n in cone):
        pad = added = None
        for node in cone:
            if node.op_type == "Equal" and "input_ids" in node.input:
                other = [graph.constant(i) for i in node.input if i != "input_ids"]
                pad = int(other[0].reshape(())) if other and other[0] is not None else None
        last = graph.producer.get(gather.input[1])
        if last is not None and last.op_type == "Add":
            values = [graph.constant(i) for i in last.input]
            added = next((int(v.reshape(())) for v in values if v is not None and v.size == 1), None)
        if pad is None or added is None:
            raise GraphError(f"{graph.path}: positions are counted over non-pad tokens, but the pad id or "
                             "padding_idx constant was not found next to the CumSum")
        return added + 1, pad
    for node in cone:
        if node.op_type == "Slice":
            buffer, start = graph.constant(node.input[0]), graph.constant(node.input[1])
            if buffer is not None and start is not None and buffer.dtype.kind == "i":
                return int(buffer.reshape(-1)[int(start.reshape(-1)[0])]), None
    raise GraphError(f"{graph.path}: neither BERT's position buffer nor RoBERTa's counted positions feed "
                     f"the gather from {table}; cannot tell where positions start")


def from_graph(graph: Graph, weights: dict, prefix: str, config: dict, *, heads: int | None = None,
               freeze_embeddings: bool = True) -> PostNormEncoder:
    """Build the encoder from the graph's weights and constants (see `position_scheme`, `norm_epsilons`)."""
    check_graph_gelu(graph)
    if is_student(weights):
        return _from_student_graph(graph, weights, prefix, config, heads, freeze_embeddings)
    tokens = weights[TOKENS]
    layers = 1 + max(int(n.split(".")[2]) for n in weights if n.startswith("encoder.layer."))
    width = tokens.shape[1]
    epsilons = set(graph.norm_epsilons().values())
    if len(epsilons) != 1:
        raise GraphError(f"{graph.path}: expected one layer-norm epsilon, found {sorted(epsilons)}")
    offset, pad_id = position_scheme(graph, prefix)
    settings = PostNormSettings(
        width=width, layers=layers,
        heads=choose_heads(graph.path, width, heads, config, graph_head_dim(graph)),
        intermediate=weights["encoder.layer.0.intermediate.dense.weight"].shape[0],
        vocab_size=tokens.shape[0], max_positions=weights[POSITIONS].shape[0],
        eps=epsilons.pop(), position_offset=offset, position_pad_id=pad_id,
        freeze_embeddings=freeze_embeddings)
    encoder = PostNormEncoder(settings)
    copy_weights(encoder, weights, weight_names(layers), graph.path, also_used=(POSITIONS, TOKEN_TYPES))
    positions = torch.from_numpy(weights[POSITIONS].copy())
    if TOKEN_TYPES in weights:
        positions = positions + torch.from_numpy(weights[TOKEN_TYPES][0].copy())
    with torch.no_grad():
        encoder.positions.copy_(positions)
    return encoder


# -- the distilled student's layout: the one owner of its names --------------------------------------
# encoder_study.recipes.student.export writes this layout, `_from_student_graph` reads it, the family
# registry recognises it (families.student), and the writeback stage writes weights back into it with
# `student_names` and `student_linear`.

# The student's names (after the wrapper prefix), ours -> theirs; see encoder_study.recipes.student.export.
_STUDENT_PARTS = {"query": "attention.query", "key": "attention.key", "value": "attention.value",
                  "attn_out": "attention.output", "attn_norm": "attention.LayerNorm",
                  "ff_in": "intermediate", "ff_out": "output", "ff_norm": "output.LayerNorm"}
_STUDENT_LINEAR = ("projection", "query", "key", "value", "attn_out", "ff_in", "ff_out")


def student_names(layers: int) -> dict[str, str]:
    """Our parameter name -> the student graph's name (prefix removed), positions included."""
    names = {"tokens.weight": TOKENS, "projection.weight": PROJECTION,
             "projection.bias": "embeddings.projection.bias", "positions": POSITIONS,
             "norm.weight": "embeddings.LayerNorm.weight", "norm.bias": "embeddings.LayerNorm.bias"}
    for i in range(layers):
        for ours, theirs in _STUDENT_PARTS.items():
            for p in ("weight", "bias"):
                names[f"layers.{i}.{ours}.{p}"] = f"encoder.layer.{i}.{theirs}.{p}"
    return names


def student_linear(param: str) -> bool:
    """Whether the student graph stores this parameter transposed ([in, out]): every linear weight."""
    module, _, kind = param.rpartition(".")
    return kind == "weight" and module.rpartition(".")[2] in _STUDENT_LINEAR


def _from_student_graph(graph: Graph, weights: dict, prefix: str, config: dict, heads: int | None,
                        freeze_embeddings: bool) -> PostNormEncoder:
    """The distilled student: weights read by name, linear weights transposed from [in, out] to [out, in].

    The layout is known from the names, never guessed from shapes (a square [width, width] weight
    reads the same either way), so each linear weight must be a named initializer of exactly the
    [in, out] shape the settings give. The head count cannot be read from this graph with certainty,
    so it must be given or be in the config beside the graph.
    """
    if not heads and not config.get("num_attention_heads"):
        raise GraphError(f"{graph.path}: a distilled student's graph (it has {PROJECTION}) does not say its "
                         "head count; give heads= or put num_attention_heads in the <name>.config.json "
                         "beside the graph (the export writes it there)")
    tokens, projection = weights[TOKENS], weights[PROJECTION]
    layers = 1 + max((int(n.split(".")[2]) for n in weights if n.startswith("encoder.layer.")), default=-1)
    if layers < 1 or not {POSITIONS, "encoder.layer.0.intermediate.weight"} <= set(weights):
        raise GraphError(f"{graph.path}: has {PROJECTION} but not the student's layer names "
                         "(encoder.layer.N.attention.query.weight ...); it is another layout")
    width = projection.shape[1]
    epsilons = set(graph.norm_epsilons().values())
    if len(epsilons) != 1:
        raise GraphError(f"{graph.path}: expected one layer-norm epsilon, found {sorted(epsilons)}")
    settings = PostNormSettings(
        width=width, layers=layers, heads=choose_heads(graph.path, width, heads, config, None),
        intermediate=weights["encoder.layer.0.intermediate.weight"].shape[1], vocab_size=tokens.shape[0],
        max_positions=weights[POSITIONS].shape[0], eps=epsilons.pop(), position_offset=0,
        position_pad_id=None, freeze_embeddings=freeze_embeddings, embedding_width=tokens.shape[1])
    encoder = PostNormEncoder(settings)
    params = dict(encoder.named_parameters())
    names = student_names(layers)
    ours = dict(weights)
    for param, theirs in names.items():
        if not student_linear(param) or theirs not in weights:
            continue  # a missing name is reported by copy_weights
        stored = graph.resolve(prefix + theirs)
        if stored not in graph.initializers or stored.startswith(ANONYMOUS):
            raise GraphError(f"{graph.path}: {prefix + theirs} is not a named initializer; the student "
                             "layout stores every linear weight under its own name, [in, out], and an "
                             "unnamed one's layout cannot be told from its shape")
        out_features, in_features = params[param].shape
        if tuple(weights[theirs].shape) != (in_features, out_features):
            raise GraphError(f"{graph.path}: {prefix + theirs} has shape {tuple(weights[theirs].shape)}; the "
                             f"student layout stores it [in, out] = {(in_features, out_features)}")
        ours[theirs] = weights[theirs].T
    copy_weights(encoder, ours, names, graph.path)
    return encoder


def check_graph_gelu(graph: Graph) -> None:
    """Exact GELU shows as `Erf`; the tanh approximation would need another module."""
    ops = {n.op_type for n in graph.nodes}
    if "Erf" not in ops:
        raise GraphError(f"{graph.path}: the feed-forward activation is not exact (erf) GELU; the "
                         "trainable modules implement only that")


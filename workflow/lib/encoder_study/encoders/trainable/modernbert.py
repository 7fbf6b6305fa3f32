"""Family `modernbert`: ModernBERT (Warner et al. 2024, arXiv 2412.13663) and mmBERT (arXiv 2509.06888).

Token embedding and a norm, then pre-norm layers
    x = x + Wo(attention(rotary(Wqkv(norm(x)))))
    x = x + Wo2(gelu(a) * b),  [a, b] = Wi(norm(x))      (GeGLU, Shazeer 2020)
and a final norm. No biases anywhere, norms without shift, the first layer has no attention norm.
Layer i attends globally when i % global_every == 0; the others see keys with |i - j| <= window / 2.
Rotary embeddings (Su et al. 2021) pair coordinate i with i + d/2, with a base per layer kind.
The reference is transformers' modeling_modernbert.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..families.modernbert import TOKENS
from .common import (
    Encoder,
    attention,
    choose_heads,
    copy_weights,
    float_setting,
    graph_head_dim,
    padding_keys,
    score_bias,
)
from .graph import Graph, GraphError

# `trainable.load`'s options this family takes (its rotary bases, window and global period).
OPTIONS = ("global_rope_theta", "local_rope_theta", "window", "global_every")


@dataclass
class ModernBertSettings:
    width: int
    layers: int
    heads: int
    intermediate: int
    vocab_size: int
    eps: float
    window: int  # local layers see |i - j| <= window // 2 (ModernBERT's local_attention)
    global_every: int  # layer i is global when i % global_every == 0
    global_rope_theta: float
    local_rope_theta: float
    freeze_embeddings: bool = True
    family: str = "modernbert"


def inverse_frequencies(theta: float, head_dim: int) -> torch.Tensor:
    """theta^(-2i/d) for i < d/2, computed in float32 as transformers does, so the tables agree bitwise."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def rotary_tables(inv_freq: torch.Tensor, length: int, dtype: torch.dtype):
    """cos and sin [length, head_dim] for positions 0..length-1; both halves repeat the frequencies."""
    positions = torch.arange(length, device=inv_freq.device).float()
    freqs = positions[:, None] * inv_freq[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x_i, x_{i+d/2}) by its angle (the half-split layout, not interleaved pairs)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class ModernBertLayer(nn.Module):
    def __init__(self, s: ModernBertSettings, index: int):
        super().__init__()
        self.heads = s.heads
        self.head_dim = s.width // s.heads
        self.scale = self.head_dim ** -0.5
        self.is_global = index % s.global_every == 0
        # The embedding norm already normalised layer 0's input.
        self.attn_norm = nn.LayerNorm(s.width, eps=s.eps, bias=False) if index else nn.Identity()
        self.qkv = nn.Linear(s.width, 3 * s.width, bias=False)  # rows laid out [3, heads, head_dim]
        self.attn_out = nn.Linear(s.width, s.width, bias=False)
        self.mlp_norm = nn.LayerNorm(s.width, eps=s.eps, bias=False)
        self.mlp_in = nn.Linear(s.width, 2 * s.intermediate, bias=False)  # [GELU input; gate]
        self.mlp_out = nn.Linear(s.intermediate, s.width, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor):
        batch, seq, width = x.shape
        qkv = self.qkv(self.attn_norm(x)).view(batch, seq, 3, self.heads, self.head_dim)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(dim=2))  # each [batch, heads, seq, head_dim]
        a = attention(rotate(q, cos, sin), rotate(k, cos, sin), v, bias, self.scale)
        x = x + self.attn_out(a.transpose(1, 2).reshape(batch, seq, width))
        inputs, gate = self.mlp_in(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.mlp_out(F.gelu(inputs) * gate)


class ModernBertEncoder(Encoder):
    def __init__(self, s: ModernBertSettings):
        super().__init__(s)
        self.tokens = nn.Embedding(s.vocab_size, s.width)
        self.norm = nn.LayerNorm(s.width, eps=s.eps, bias=False)
        self.layers = nn.ModuleList(ModernBertLayer(s, i) for i in range(s.layers))
        self.final_norm = nn.LayerNorm(s.width, eps=s.eps, bias=False)
        head_dim = s.width // s.heads
        # Derived from the settings, so not saved.
        for kind, theta in (("global", s.global_rope_theta), ("local", s.local_rope_theta)):
            self.register_buffer(f"{kind}_inv_freq", inverse_frequencies(theta, head_dim), persistent=False)
        self.embeddings_frozen = s.freeze_embeddings

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.norm(self.tokens(input_ids))

    def encode(self, x: torch.Tensor, attention_mask: torch.Tensor,
               states: list[torch.Tensor] | None = None) -> torch.Tensor:
        seq = x.shape[1]
        tables = {True: rotary_tables(self.global_inv_freq, seq, x.dtype),
                  False: rotary_tables(self.local_inv_freq, seq, x.dtype)}
        keys = padding_keys(attention_mask)
        index = torch.arange(seq, device=x.device)
        near = (index[:, None] - index[None, :]).abs() <= self.settings.window // 2
        masks = {True: score_bias(keys, x.dtype), False: score_bias(keys & near, x.dtype)}
        for layer in self.layers:
            cos, sin = tables[layer.is_global]
            x = layer(x, cos, sin, masks[layer.is_global])
            if states is not None:
                states.append(x)
        return self.final_norm(x)


def weight_names(layers: int) -> dict[str, str]:
    """Our parameter name -> the Hugging Face name the graph uses (prefix removed)."""
    names = {"tokens.weight": TOKENS, "norm.weight": "embeddings.norm.weight",
             "final_norm.weight": "final_norm.weight"}
    parts = {"attn_norm": "attn_norm", "qkv": "attn.Wqkv", "attn_out": "attn.Wo", "mlp_norm": "mlp_norm",
             "mlp_in": "mlp.Wi", "mlp_out": "mlp.Wo"}
    for i in range(layers):
        for ours, theirs in parts.items():
            if i or ours != "attn_norm":
                names[f"layers.{i}.{ours}.weight"] = f"layers.{i}.{theirs}.weight"
    return names


def graph_rotary_bases(graph: Graph) -> tuple[list[float], int | None]:
    """(bases, head_dim) from the rotary inverse-frequency constants in the graph.

    Each rotary module's `inv_freq` buffer is a `Constant` [d/2] in a scope named rotary_emb:
    1, theta^(-2/d), theta^(-4/d), ... The base comes back from the last entry, rounded to six
    significant digits, and must reproduce the whole vector.
    """
    bases, head_dims = set(), set()
    for _, value in graph.float_constants("rotary"):
        v = value.reshape(-1).astype(np.float64)
        if value.ndim != 1 or v.size < 2 or v[0] != 1.0 or not np.all(np.diff(v) < 0) or v[-1] <= 0:
            continue
        head_dim = 2 * v.size
        theta = float(f"{v[-1] ** (-head_dim / (2 * (v.size - 1))):.6g}")
        if not np.allclose(inverse_frequencies(theta, head_dim).numpy(), v, rtol=1e-6, atol=0):
            raise GraphError(f"{graph.path}: a rotary table does not follow theta^(-2i/d) for any base "
                             f"(closest {theta}); give global_rope_theta= and local_rope_theta=")
        bases.add(theta)
        head_dims.add(head_dim)
    if len(head_dims) > 1:
        raise GraphError(f"{graph.path}: rotary tables of different sizes {sorted(head_dims)}")
    return sorted(bases), (head_dims.pop() if head_dims else None)


def graph_window(graph: Graph) -> int | None:
    """The local window from the mask `|q - k| <= window // 2`: an `Abs` compared by `LessOrEqual`."""
    halves = set()
    for node in graph.nodes:
        if node.op_type == "LessOrEqual" and graph.producer.get(node.input[0]) is not None \
                and graph.producer[node.input[0]].op_type == "Abs":
            value = graph.constant(node.input[1])
            if value is not None and value.size == 1:
                halves.add(int(value.reshape(())))
    return 2 * halves.pop() if len(halves) == 1 else None


def config_rope_bases(config: dict) -> tuple[float | None, float | None]:
    """transformers 5 writes rope_parameters per layer kind; older configs global/local_rope_theta."""
    params = config.get("rope_parameters") or {}
    full = (params.get("full_attention") or {}).get("rope_theta", config.get("global_rope_theta"))
    sliding = (params.get("sliding_attention") or {}).get("rope_theta", config.get("local_rope_theta"))
    return float_setting(full), float_setting(sliding)


def choose_rope_bases(graph: Graph, found: list[float], given: tuple, config: dict) -> tuple[float, float]:
    """Given > the config beside the graph > the graph's one base; two bases are never guessed."""
    glob, loc = given
    source = "given"
    if glob is None and loc is None:
        glob, loc = config_rope_bases(config)
        source = "model.config.json"
    if glob is None or loc is None:
        known = {b for b in (glob, loc) if b is not None}
        if len(found) == 1 and known <= set(found):
            glob = loc = found[0]
        elif len(found) == 2 and len(known) == 1 and known < set(found):
            other = (set(found) - known).pop()  # one named, so the other is the other: not a guess
            glob, loc = (glob, other) if glob is not None else (other, loc)
        elif len(found) == 2:
            raise GraphError(
                f"{graph.path}: the graph holds two rotary bases, {found[0]:g} and {found[1]:g}, and does "
                "not say which one the global layers use; give global_rope_theta= and local_rope_theta= "
                "(or put the model's config.json beside the graph as model.config.json)")
        else:
            raise GraphError(f"{graph.path}: found rotary bases {found or 'none'}; give global_rope_theta= "
                             "and local_rope_theta=")
    if found and {glob, loc} != set(found):
        raise GraphError(f"{graph.path}: the rotary bases {source} (global {glob:g}, local {loc:g}) are not "
                         f"the graph's ({', '.join(f'{b:g}' for b in found)})")
    return float(glob), float(loc)


def choose_global_every(graph: Graph, layers: int, given: int | None, config: dict) -> int:
    if given:
        return int(given)
    every = int(config.get("global_attn_every_n_layers") or 3)  # ModernBERT's and mmBERT's period
    kinds = config.get("layer_types")
    if kinds and list(kinds) != ["full_attention" if i % every == 0 else "sliding_attention"
                                 for i in range(layers)]:
        raise GraphError(f"{graph.path}: the config's layer_types {kinds} are not 'global every "
                         f"{every} layers', the only pattern the modernbert family implements")
    return every


def from_graph(graph: Graph, weights: dict, prefix: str, config: dict, *, heads: int | None = None,
               global_rope_theta: float | None = None, local_rope_theta: float | None = None,
               window: int | None = None, global_every: int | None = None,
               freeze_embeddings: bool = True) -> ModernBertEncoder:
    tokens = weights[TOKENS]
    width = tokens.shape[1]
    layers = 1 + max(int(n.split(".")[1]) for n in weights if n.startswith("layers."))
    epsilons = set(graph.norm_epsilons().values())
    if len(epsilons) != 1:
        raise GraphError(f"{graph.path}: expected one layer-norm epsilon, found {sorted(epsilons)}")
    found, rotary_head_dim = graph_rotary_bases(graph)
    heads = choose_heads(graph.path, width, heads, config, rotary_head_dim or graph_head_dim(graph))
    if rotary_head_dim and width // heads != rotary_head_dim:
        raise GraphError(f"{graph.path}: {heads} heads give head size {width // heads}, but the graph's "
                         f"rotary tables are for head size {rotary_head_dim}")
    glob, loc = choose_rope_bases(graph, found, (global_rope_theta, local_rope_theta), config)
    window = window or graph_window(graph) or config.get("local_attention")
    if not window:
        raise GraphError(f"{graph.path}: no local window in the graph or the config; give window=")
    settings = ModernBertSettings(
        width=width, layers=layers, heads=heads, intermediate=weights["layers.0.mlp.Wo.weight"].shape[1],
        vocab_size=tokens.shape[0], eps=epsilons.pop(), window=int(window),
        global_every=choose_global_every(graph, layers, global_every, config),
        global_rope_theta=glob, local_rope_theta=loc, freeze_embeddings=freeze_embeddings)
    encoder = ModernBertEncoder(settings)
    # Refuses biases and a layer-0 attention norm too: nothing here would read them.
    copy_weights(encoder, weights, weight_names(layers), graph.path)
    return encoder

"""Pieces both families share: the encoder base class (freezing, settings, checkpoints) and attention."""

from __future__ import annotations

import contextlib
import dataclasses
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from ...core import machine
from .graph import Graph, GraphError

# Sequences shorter than this are padded (with masked keys) before they run. PyTorch's CPU softmax sums
# a row shorter than one SIMD vector (8 or 16 floats) in another order than a longer row, and GEMM
# takes another path for a few rows, so without this a 5-token sentence alone would differ in the last
# bit from the same sentence in a padded batch. From 16 on, extra masked keys only add exact zeros.
MIN_LENGTH = 16


def use_deterministic_algorithms(mode: bool, *, warn_only: bool = False) -> None:
    """`torch.use_deterministic_algorithms`, without importing torch._inductor to set its flag.

    PyTorch's function imports torch._inductor.config (1.2 s of a job's start, measured: CHANGELOG.md)
    only to pass the flag on to compiled code; nothing here compiles. Where inductor is loaded (by
    transformers), its flag is set as PyTorch would.
    """
    inductor = sys.modules.get("torch._inductor.config")
    if inductor is not None:
        inductor.deterministic = mode
    torch._C._set_deterministic_algorithms(mode, warn_only=warn_only)


@contextlib.contextmanager
def determinism(threads: int):
    """Deterministic algorithms (warn-only) and a fixed thread count for the block; restored after.

    Training (tagging, distillation) runs inside it, so that equal inputs give equal weights.
    """
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    threads_before = torch.get_num_threads()
    use_deterministic_algorithms(True, warn_only=True)
    torch.set_num_threads(machine.usable_threads(threads))
    try:
        yield
    finally:
        use_deterministic_algorithms(enabled, warn_only=warn_only)
        torch.set_num_threads(threads_before)


def adamw(params: list[nn.Parameter], lr: float, weight_decay: float, *, matrices_only: bool = False,
          fused: bool | None = True) -> torch.optim.AdamW:
    """The AdamW that training steps with (tagging, "ours" in its step time, distillation).

    `fused` True: PyTorch's fused kernel, one pass over each parameter per step, where the default
    implementation on CPU makes about ten (several times faster; measured: CHANGELOG.md). The same
    update, but computed in another order, so weights drift from the default's in the last bits.
    Deterministic, and independent of the thread count.
    None: PyTorch's default choice (a loop over the parameters on the CPU, its foreach kernels on CUDA),
    which distillation keeps so that the student keeps its weights to the bit.

    `matrices_only`: weight decay on parameters of two or more dimensions only (linear weights, tables),
    not on biases and norms (two groups, the matrices first).
    """
    if matrices_only:
        params = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused)


def clip_gradients(params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """`torch.nn.utils.clip_grad_norm_(params, max_norm)`, bit for bit, without its second pass over
    every gradient when nothing is clipped; the total norm before clipping.

    torch multiplies each gradient by min(1, max_norm / (norm + 1e-6)) even when that is 1, so as not
    to wait for a GPU to say; on the CPU asking costs nothing, and a product with 1 changes no bit. A
    NaN norm still takes the multiplication, as in torch.
    """
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads)
    if norm.device.type != "cpu" or not bool(max_norm / (norm + 1e-6) >= 1.0):
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


class Encoder(nn.Module):
    """`forward(input_ids, attention_mask) -> hidden states [batch, sequence, width]`.

    Subclasses hold a `tokens` embedding table (frozen by default) and a dataclass `settings` with
    everything besides the weights that is needed to build the module again.
    """

    tokens: nn.Embedding
    filler_id = 0  # token id of the padding added up to MIN_LENGTH; it only reaches masked positions

    def __init__(self, settings):
        super().__init__()
        self.settings = settings

    def _padded(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The batch padded (keys masked) to at least MIN_LENGTH, so every length takes the same kernels."""
        seq = input_ids.shape[1]
        if seq < MIN_LENGTH:
            input_ids = F.pad(input_ids, (0, MIN_LENGTH - seq), value=self.filler_id)
            attention_mask = F.pad(attention_mask, (0, MIN_LENGTH - seq), value=0)
        return input_ids, attention_mask

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        seq = input_ids.shape[1]
        input_ids, attention_mask = self._padded(input_ids, attention_mask)
        return self.encode(self.embed(input_ids), attention_mask)[:, :seq]

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[torch.Tensor]:
        """[embeddings, layer 1, ..., layer N] outputs, each [batch, sequence, width]; the last is forward's.

        What distillation matches a student against, computed on the same path as `forward`.
        """
        seq = input_ids.shape[1]
        input_ids, attention_mask = self._padded(input_ids, attention_mask)
        x = self.embed(input_ids)
        states = [x]
        last = self.encode(x, attention_mask, states)
        states[-1] = last  # the final output (after a final norm, where the family has one)
        return [h[:, :seq] for h in states]

    @property
    def embeddings_frozen(self) -> bool:
        return self.settings.freeze_embeddings

    @embeddings_frozen.setter
    def embeddings_frozen(self, frozen: bool) -> None:
        # The table is most of a multilingual model (mmBERT: 197M of 307M values); a tagger barely moves
        # it, and training it would add a gradient and two AdamW moments of the same size.
        self.settings.freeze_embeddings = bool(frozen)
        self.tokens.weight.requires_grad_(not frozen)

    def settings_dict(self) -> dict:
        return dataclasses.asdict(self.settings)

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights a checkpoint holds: everything but the token table while it is frozen."""
        state = self.state_dict()
        if self.embeddings_frozen:
            state.pop("tokens.weight")
        return state

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]


# CPU: PyTorch's flash-attention kernel (one pass, no score tensor kept for backward, deterministic).
# CUDA: its flash kernel takes no mask and the memory-efficient one has a nondeterministic backward,
# so attention there is the plain (math) computation.
ATTENTION_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
# The flash kernel sums the last (length mod 16) scores of a row apart from its whole SIMD vectors, and
# multiplies a block of fewer query rows on another GEMM path, so a sequence's last bits would depend
# on how far its batch is padded. Attention therefore runs on sequences padded (and masked) to a
# multiple of this: every real query and key then takes the same path alone and in any batch.
ATTENTION_BLOCK = 16


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
              scale: float) -> torch.Tensor:
    """softmax(q·kᵀ · scale + bias)·v over [batch, heads, sequence, head_dim]; `bias` is `score_bias`'s.

    Any strides: the CPU kernel reads the heads' transposed views as they are and writes its output
    [batch, sequence, heads, head_dim] in memory, so merging the heads again is a view, not a copy.
    Padding keys add exact zeros (see `score_bias`), and the padding up to ATTENTION_BLOCK keeps the
    kernel's order of operations, so a sequence gets the same bits alone and in a padded batch.
    """
    seq = q.shape[-2]
    extra = -seq % ATTENTION_BLOCK
    if extra:  # `bias` masks the added keys; the added queries' rows are dropped
        q, k, v = (F.pad(t, (0, 0, 0, extra)) for t in (q, k, v))
    with sdpa_kernel(ATTENTION_BACKENDS):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
    return out[..., :seq, :] if extra else out


def score_bias(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool `allowed` [batch, 1, 1 or queries, keys] -> what `attention` adds to the scores: 0 where
    allowed, the dtype's minimum where not, padded (disallowed) to a multiple of ATTENTION_BLOCK.

    The minimum absorbs any score, so in a real row exp(minimum - max) is exactly 0 and padding keys
    add nothing. Not -inf: a padding query in a local layer can have every key disallowed, and -inf
    would turn its row into NaN, which backward spreads into the real rows' gradients (0 * NaN);
    with the minimum such a row is merely uniform.
    """
    queries, keys = allowed.shape[-2:]
    pad_queries = -queries % ATTENTION_BLOCK if queries > 1 else 0
    allowed = F.pad(allowed, (0, -keys % ATTENTION_BLOCK, 0, pad_queries), value=False)
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
        ~allowed, torch.finfo(dtype).min)


def padding_keys(attention_mask: torch.Tensor) -> torch.Tensor:
    """[batch, sequence] 0/1 -> bool [batch, 1, 1, sequence]: which keys every query may see."""
    return attention_mask.bool()[:, None, None, :]


def copy_weights(module: nn.Module, weights: dict[str, np.ndarray], names: dict[str, str], path,
                 also_used: tuple[str, ...] = ()) -> None:
    """Copy graph arrays into `module`'s parameters: `names` maps parameter name -> graph name.

    Copies, never views: the exporter stores equal tensors once, and weights that merely started
    equal (fresh norms, zero biases) must not stay tied while training. A graph weight that nothing
    reads means a variant these modules do not implement (relative positions, extra projections),
    whose output they would silently get wrong, so it is refused.
    """
    unused = sorted(set(weights) - set(names.values()) - set(also_used))
    unused = [n for n in unused if not n.startswith("pooler.")]  # pooled output, not hidden states
    if unused:
        raise GraphError(f"{path}: the graph has weights this family does not use ({', '.join(unused[:3])}"
                         f"{', ...' if len(unused) > 3 else ''}); it is another architecture or variant")
    params = dict(module.named_parameters())
    for param_name, graph_name in names.items():
        if graph_name not in weights:
            raise GraphError(f"{path}: the graph has no weight {graph_name!r} (needed for {param_name})")
        value = torch.from_numpy(np.array(weights[graph_name], dtype=np.float32, copy=True))
        target = params[param_name]
        if tuple(value.shape) != tuple(target.shape):
            raise GraphError(f"{path}: {graph_name!r} has shape {tuple(value.shape)}, expected "
                             f"{tuple(target.shape)} for {param_name}")
        with torch.no_grad():
            target.copy_(value)


def graph_head_dim(graph: Graph) -> int | None:
    """The head size the graph's attention scale says, or None.

    Eager attention multiplies q·kᵀ by the constant 1/sqrt(head_dim) (older code divides by
    sqrt(head_dim)); the weights alone cannot tell 12 heads of 32 from 6 of 64.
    """
    sizes = set()
    for node in graph.nodes:
        if node.op_type != "MatMul" or any(graph.resolve(i) in graph.initializers for i in node.input):
            continue
        for user in graph.consumers.get(node.output[0], []):
            if user.op_type not in ("Mul", "Div"):
                continue
            for name in user.input:
                value = graph.constant(name)
                if value is not None and value.size == 1 and value.dtype.kind == "f":
                    c = float(value.reshape(()))
                    if c > 0:
                        sizes.add(round(c ** -2) if user.op_type == "Mul" else round(c ** 2))
    return sizes.pop() if len(sizes) == 1 else None


def choose_heads(path, width: int, given: int | None, config: dict, head_dim_hint: int | None) -> int:
    """Given > num_attention_heads in the config beside the graph > the graph's hint > width / 64."""
    if given:
        heads = int(given)
    elif config.get("num_attention_heads"):
        heads = int(config["num_attention_heads"])
    elif head_dim_hint:
        heads = width // head_dim_hint
    else:
        heads = max(1, width // 64)
    if heads <= 0 or width % heads:
        raise GraphError(f"{path}: width {width} does not split into {heads} heads; give heads=")
    return heads


def float_setting(value) -> float | None:
    return None if value is None else float(value)

"""The student's independent reference: transformers' `BertModel` computing the student's function.

The student (architecture.py) is BERT's post-norm encoder with a factorised token table. `BertModel`
fed `inputs_embeds` = the lifted table rows (`table[ids] @ projection.T + bias`) computes exactly that:
positions from row 0 (BertEmbeddings slices its arange buffer from 0), token type 0 whose row is zero
(the student's position table already holds the type row it was built with), exact GELU
(`hidden_act="gelu"`), the student's epsilon. Attention is transformers' eager code (matmul, additive
mask, softmax), written apart from the trainable modules' scaled_dot_product_attention call. No
`transformers` class lifts a factorised table the student's way: ALBERT normalises the table's rows
before lifting them, the student after adding the positions.

    reference = load(encoder.state_dict(), encoder.settings_dict())
    states = reference(input_ids=ids, attention_mask=mask)     # [batch, sequence, width]

The weights are mapped here, by explicit names, on their own: each shape is checked, a student tensor
that no name maps is refused, and so is a BertModel tensor that nothing fills.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from ...encoders import families
from . import StudentError

# The lift, outside BertModel: the student's name -> this module's.
LIFT = {"tokens.weight": "table", "projection.weight": "lift_weight", "projection.bias": "lift_bias"}
# Student layer module -> BertModel's module under encoder.layer.N.
LAYER = {"query": "attention.self.query", "key": "attention.self.key", "value": "attention.self.value",
         "attn_out": "attention.output.dense", "attn_norm": "attention.output.LayerNorm",
         "ff_in": "intermediate.dense", "ff_out": "output.dense", "ff_norm": "output.LayerNorm"}
# BertModel tensors no student tensor fills: the one token-type row (zero: the student's positions hold
# it already) and the one-row word table (never read: the model is given inputs_embeds).
ZERO_ROWS = ("embeddings.token_type_embeddings.weight", "embeddings.word_embeddings.weight")


def bert_names(layers: int) -> dict[str, str]:
    """The student's tensor name -> BertModel's (the lifted table's three tensors excepted)."""
    layer_names = {f"layers.{i}.{ours}.{kind}": f"encoder.layer.{i}.{theirs}.{kind}"
                   for i in range(layers) for ours, theirs in LAYER.items() for kind in ("weight", "bias")}
    return {"positions": "embeddings.position_embeddings.weight",
            "norm.weight": "embeddings.LayerNorm.weight", "norm.bias": "embeddings.LayerNorm.bias",
            **layer_names}


def bert_config(settings: Mapping):
    """The BertConfig of the student's shape: one word row and one type row, no dropout, eager attention."""
    from transformers import BertConfig

    family, embedding = settings.get("family"), settings.get("embedding_width")
    if family != families.FAMILIES["student"].trainable or not embedding:
        raise StudentError("the transformers reference takes a student (post-norm, factorised table); got "
                           f"family {family}, embedding_width {embedding}")
    offset, pad = settings.get("position_offset"), settings.get("position_pad_id")
    if offset != 0 or pad is not None:
        raise StudentError("the transformers reference has BERT's positions (from row 0); the student's "
                           f"are offset {offset}, pad id {pad}")
    return BertConfig(
        vocab_size=1, hidden_size=int(settings["width"]), num_hidden_layers=int(settings["layers"]),
        num_attention_heads=int(settings["heads"]), intermediate_size=int(settings["intermediate"]),
        hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        max_position_embeddings=int(settings["max_positions"]), type_vocab_size=1,
        layer_norm_eps=float(settings["eps"]), pad_token_id=0, attn_implementation="eager")


class TransformersStudent(nn.Module):
    """`forward(input_ids, attention_mask) -> last_hidden_state`: the lifted rows through `bert`."""

    def __init__(self, bert: nn.Module, table: torch.Tensor, lift_weight: torch.Tensor,
                 lift_bias: torch.Tensor):
        super().__init__()
        self.bert = bert
        self.table = nn.Parameter(table, requires_grad=False)
        self.lift_weight = nn.Parameter(lift_weight, requires_grad=False)
        self.lift_bias = nn.Parameter(lift_bias, requires_grad=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        lifted = torch.matmul(self.table[input_ids], self.lift_weight.T) + self.lift_bias
        return self.bert(inputs_embeds=lifted, attention_mask=attention_mask).last_hidden_state


def _placed(source: Mapping[str, torch.Tensor], names: Mapping[str, str], shapes: Mapping[str, tuple],
            what: str) -> dict[str, torch.Tensor]:
    """{target name: a float32 copy of the source tensor}, each of the shape the target needs."""
    placed = {}
    for ours, theirs in names.items():
        if ours not in source:
            raise StudentError(f"the student has no tensor {ours} (for {what}'s {theirs})")
        value = source[ours].detach().to(torch.float32).clone()
        if tuple(value.shape) != tuple(shapes[theirs]):
            raise StudentError(f"the student's {ours} has shape {tuple(value.shape)}; {what}'s {theirs} "
                               f"needs {tuple(shapes[theirs])}")
        placed[theirs] = value
    return placed


def load(state: Mapping[str, torch.Tensor], settings: Mapping,
         names: Mapping[str, str] | None = None) -> TransformersStudent:
    """The reference holding the student's weights `state` (its state dict), in eval mode.

    `names`: the student -> BertModel map to use (default `bert_names`; tests pass a wrong one).
    """
    from transformers import BertModel

    config = bert_config(settings)
    names = bert_names(config.num_hidden_layers) if names is None else names
    unused = sorted(set(state) - set(names) - set(LIFT))
    if unused:
        raise StudentError(f"the student's tensors {unused} have no place in the transformers reference")
    with torch.random.fork_rng(devices=[]):  # BertModel initialises its weights from the global RNG
        bert = BertModel(config, add_pooling_layer=False)
    shapes = {k: tuple(v.shape) for k, v in bert.state_dict().items()}
    filled = _placed(state, names, shapes, "BertModel")
    filled.update({name: torch.zeros(shapes[name]) for name in ZERO_ROWS})
    unfilled = sorted(set(shapes) - set(filled))
    if unfilled or len(filled) != len(names) + len(ZERO_ROWS):
        raise StudentError(f"BertModel's tensors {unfilled} get no student weight (or one gets two)")
    bert.load_state_dict(filled, strict=True)
    width, embedding = config.hidden_size, int(settings["embedding_width"])
    lift = _placed(state, LIFT, {"table": (int(settings["vocab_size"]), embedding),
                                 "lift_weight": (width, embedding), "lift_bias": (width,)}, "the lift")
    return TransformersStudent(bert, lift["table"], lift["lift_weight"], lift["lift_bias"]).eval()

"""The writeback stage: a fine-tuned run's weights written into a copy of its encoder's graph, and checked.

A fine-tuned run's pipeline (results/tagging/<run>/pipeline.safetensors) keeps its weights inline: it is
the training reference. This stage writes its graph pipeline and checks it against that reference:

    weights = module_weights_to_graph(encoder, "results/models/bert-tiny")   # the graph's names, layout
    head = head_weights_to_graph(tagger.head)                                 # the head's, alike
    saved = save_with_graph(tagger, "results/writeback/R/pipeline.safetensors")  # + pipeline.encoder0.onnx
    write_pipeline(inline, out, threads)                    # the same from an inline pipeline file
    parity_rows(...), agreement_row(...), speed_rows(...)   # the three tables' rows

The written graph is the whole tagger (`tagging.graph`): the encoder with the run's word pooling, the
linear head and the tags appended, so that the graph path is one ONNX Runtime session from piece ids
(and the piece-to-word map) to tags, with no PyTorch between batches. It keeps the encoder's
`last_hidden_state` output, so it is the encoder-only graph too (parity reads the states from it).

Tables (each with a Markdown rendering beside it, one row per run and comparison or thread count):

| table | columns |
|---|---|
| parity.csv | run, encoder, comparison, tokens, max_abs, mean_abs, max_value, min_cos |
| agreement.csv | run, encoder, split, tokens, sentences, differing_tokens, upos, ci_low, ci_high, ... |
| speed.csv | run, encoder, threads, tokens, modules_tok_s, graph_tok_s, ratio, spreads, fraction_of_gemm |

`parity` compares, one text per run and every token, ONNX Runtime on the written graph with the
trainable modules the weights came from; the export's own graph against the same modules is the
control row (it shows how far fine-tuning moved the states); and the written pipeline's logits, every
word of the same texts (words split at whitespace), against the inline tagger's. `agreement` tags the
test split through both pipelines: the written graph's UPOS with its sentence-bootstrap interval
(`tagging.evaluate`) and how many tokens' tags differ. `speed` times tagging through both, the
graph's tokens/s against its own at 1 thread beside it (`graph_scaling`); it is indicative, and
excluded from the byte-identity promise.

The graph is written by `onnx.patch` (only the changed initializers' bytes differ, and the head's
nodes, inputs, outputs and weights are added after the export's) under the names `onnx.names` gives;
the distilled student's layout is `trainable.postnorm`'s.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ...core import files
from ...encoders.families import postnorm
from ...onnx import manifest, names, patch
from ...onnx.patch import WritebackError
from ..tagging import graph as tagging_graph
from ..tagging import pipeline


def _param(tensor, transpose: bool = False) -> np.ndarray:
    """A parameter's float32 values as a read-only view of its memory, [in, out] when `transpose`.

    Not a copy: the patcher writes a view a block of rows at a time, so writing a graph back costs no
    copy of its weights (a whole copy of every replaced tensor, held at once, was the peak; measured:
    CHANGELOG.md)."""
    value = tensor.detach().cpu().numpy()
    if value.dtype != np.float32:
        value = value.astype(np.float32)
    value = value.T if transpose else value.view()
    value.flags.writeable = False  # a view of the module's weights: writing to it would change them
    return value


def module_weights_to_graph(encoder, graph, include_tokens: bool | None = None) -> dict[str, np.ndarray]:
    """The encoder's current weights under the names `graph` reads them by, in the graph's layout.

    `graph`: the model.onnx (or its directory, or a `trainable.Graph`) the encoder was loaded from.
    Linear weights go back to [in, out] under the name their MatMul reads. The token table is included
    when it is trainable (or when `include_tokens` says so). For a BERT-family graph the module holds
    positions + token-type row 0 in one table, and the graph adds token-type row 0 to every position:
    a changed table is written with the row folded in and the token-type table zeroed (the same sums);
    an unchanged one is left out, so the graph keeps its own two tables.

    A distilled student's graph (`encoders.families.student`; see encoder_study.recipes.student.export)
    holds every weight as a named initializer, linear weights [in, out]: each goes back under its own
    name, transposed, the projection and the positions included (unchanged values leave the bytes as
    they were).

    The graph is never loaded whole: names come from the patcher's streaming index
    (`onnx.patch.StreamedGraph`), and the only values read are the BERT family's position and
    token-type tables; the arrays returned are read-only views of the encoder's parameters (linear
    weights transposed views), not copies, so memory stays near the encoder's own (the graphs of the
    study are over 1 GB). Write them before the encoder changes again, or copy them.
    """
    from ...encoders import families
    from ...encoders.trainable import FAMILIES
    from ...encoders.trainable.graph import Graph

    path = graph.path if isinstance(graph, Graph) else Path(graph)
    if path.is_dir():
        path = path / "model.onnx"
    with patch.StreamedGraph(path) as streamed:
        graph_names = names.weight_names(streamed.layout, streamed.value)
        prefix = names.table_prefix(path, [*graph_names.named, *graph_names.linear])
        held = [*graph_names.named, *graph_names.linear]
        family = families.detect(name[len(prefix):] for name in held if name.startswith(prefix))
        if family.trainable != encoder.settings.family:
            raise WritebackError(f"{path}: a {family.name} graph, but a {encoder.settings.family} encoder; "
                                 "it was not read from this graph")
        folded = _folded_positions(streamed, graph_names, prefix) if family.folded_positions else None

    if include_tokens is None:
        include_tokens = not encoder.embeddings_frozen
    params = dict(encoder.named_parameters())
    if family.named_layout:
        return _student_weights(path, encoder, params, prefix, include_tokens)
    module = FAMILIES[family.trainable][0]
    out = _family_weights(path, module.weight_names(encoder.settings.layers), params, graph_names, prefix,
                          include_tokens)
    if folded is not None:
        positions, types = folded
        mine = _param(params["positions"])
        if not patch.bitwise_equal(mine, positions):
            out[prefix + postnorm.POSITIONS] = mine
            if types is not None:
                out[prefix + postnorm.TOKEN_TYPES] = np.zeros_like(types)
    return out


def head_weights_to_graph(head) -> dict[str, np.ndarray]:
    """A tagger's linear head under the names a written pipeline graph reads it by (`onnx.names`), its
    weight [in, out] as the export's linear weights: read-only views, as `module_weights_to_graph`'s."""
    return {names.HEAD_WEIGHT: _param(head.weight, transpose=True), names.HEAD_BIAS: _param(head.bias)}


def head_appendix(width: int, tags: int, pooling: str) -> patch.Appendix:
    """What the patcher appends to an encoder's graph to make it the whole tagger (`tagging.graph`)."""
    return patch.Appendix(**tagging_graph.head(width, tags, pooling))


def _student_weights(path: Path, encoder, params: dict, prefix: str, include_tokens: bool
                     ) -> dict[str, np.ndarray]:
    """The student layout: names fixed by the export, layout known by name, no anonymous weights."""
    from ...encoders.trainable import postnorm as pn

    student_names = pn.student_names(encoder.settings.layers)
    extra = sorted(set(params) ^ set(student_names))
    if extra:
        raise WritebackError(f"{path}: a distilled student's graph, but the encoder's parameters "
                             f"do not match its names ({', '.join(extra[:3])}); it was not read from "
                             "this graph")
    return {prefix + theirs: _param(params[param], pn.student_linear(param))
            for param, theirs in student_names.items() if param != "tokens.weight" or include_tokens}


def _family_weights(path: Path, family_names: dict[str, str], params: dict, graph_names: names.WeightNames,
                    prefix: str, include_tokens: bool) -> dict[str, np.ndarray]:
    """A family's weights by their graph names: linear weights [in, out] under every name its MatMuls
    read, the others under their own (the BERT family's positions apart)."""
    missing = set(params) - set(family_names) - {"positions"}
    if missing:
        raise WritebackError(f"{path}: the encoder has parameters with no graph name "
                             f"({', '.join(sorted(missing)[:3])}); it was not read from this graph's family")
    out: dict[str, np.ndarray] = {}
    for param, theirs in family_names.items():
        if param == "tokens.weight" and not include_tokens:
            continue
        full = prefix + theirs
        if full in graph_names.linear:
            value = _param(params[param], transpose=True)
            for read in graph_names.linear[full]:
                out[read] = value  # one array for the names one module's MatMuls read
        else:
            out[full] = _param(params[param])
    return out


def _folded_positions(streamed: patch.StreamedGraph, graph_names: names.WeightNames, prefix: str
                      ) -> tuple[np.ndarray, np.ndarray | None]:
    """(the graph's positions + token-type row 0, its token-type table or None), what the BERT family's
    `positions` parameter was read as; the only weights read from the graph."""
    def read(theirs: str) -> np.ndarray | None:
        name = prefix + theirs
        stored = graph_names.named.get(name)
        if stored is None:
            return None
        names.check_float32(streamed.path, name, streamed.layout.dtypes[stored])
        return streamed.value(stored)

    positions, types = read(postnorm.POSITIONS), read(postnorm.TOKEN_TYPES)
    if positions is None:
        raise names.GraphError(f"{streamed.path}: no {prefix + postnorm.POSITIONS}; not a BERT-family graph")
    folded = positions + (types[0] if types is not None else np.float32(0))
    return np.ascontiguousarray(folded, dtype=np.float32), types


def save_with_graph(tagger, path: str | os.PathLike, training: dict | None = None) -> pipeline.Saved:
    """Save a fine-tuned tagger as a graph pipeline (format /3): its encoder's weights written into a copy
    of the graph they were read from, `<stem>.encoder0.onnx` beside `path`, with the word pooling and the
    head (its weights written as the encoder's) appended (see tagging.pipeline and tagging.graph).

    Equal weights and settings give equal bytes in both files. Other taggers are saved by
    `pipeline.save` (which copies the graph of a tagger loaded from a /2 file).
    """
    if not tagger.trainable_encoder:
        raise pipeline.PipelineError(f"{path}: a {tagger.kind!r} tagger has no fine-tuned weights to write "
                                     "into a graph; save it with tagging.pipeline.save")
    encoder = tagger.encoder
    source = encoder.model_dir / manifest.ONNX_FILE
    # The weights are placed by the graph's names and layout: it must be the graph they were read from.
    files.check_file(source, encoder.file_hashes[manifest.ONNX_FILE], what="the graph the encoder came from")

    def write_graph(target: Path) -> patch.PatchReport:
        weights = {**module_weights_to_graph(encoder.encoder, source), **head_weights_to_graph(tagger.head)}
        appended = head_appendix(encoder.width, len(tagger.tags), encoder.pooling)
        return patch.patch(source, target, weights, appended=appended)

    return pipeline.save_pair(tagger, path, write_graph, training, form=pipeline.TAGGER_FORMAT)


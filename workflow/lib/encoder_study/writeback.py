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
import sys
from pathlib import Path

import numpy as np

from . import files, machine, manifest, perf, plots, tables
from .data import conllu
from .onnx import names, patch
from .onnx.patch import WritebackError
from .tagging import graph as tagging_graph
from .tagging import pipeline

PARITY_COLUMNS = ["run", "encoder", "comparison", "tokens", "max_abs", "mean_abs", "max_value", "min_cos"]
COMPARISONS = ("written graph vs modules", "export graph vs modules", "written pipeline logits vs modules")
AGREEMENT_COLUMNS = ["run", "encoder", "split", "tokens", "sentences", "differing_tokens", "upos", "ci_low",
                     "ci_high", "upos_inline", "resamples", "seed"]
SPEED_COLUMNS = ["run", "encoder", "threads", "sentences", "tokens", "pieces", "padded_pieces",
                 "batch_pieces", "batches", "calls", "repeats", "modules_tok_s", "graph_tok_s", "ratio",
                 "modules_tok_s_min", "modules_tok_s_max", "graph_tok_s_min", "graph_tok_s_max",
                 "modules_repeats", "graph_repeats", "modules_seconds", "graph_seconds", "gflop",
                 "modules_gflops", "graph_gflops", "gemm_gflops", "modules_fraction_of_gemm",
                 "graph_fraction_of_gemm", "modules_scaling", "graph_scaling", "gemm_gflops_min",
                 "gemm_gflops_max", "gemm_probe", "peak_gflops", "limit_note"]
# The Markdown renderings' columns (tables.markdown): (key, title, format).
PARITY_MARKDOWN = (("run", "run", ""), ("encoder", "encoder", ""), ("comparison", "comparison", ""),
                   *tables.PARITY_COLUMNS)
SPEED_MARKDOWN = (("run", "run", ""), ("encoder", "encoder", ""), ("threads", "threads", "n"),
                  ("tokens", "tokens", "n"), ("modules_tok_s", "modules (tok/s)", ",.0f"),
                  ("graph_tok_s", "written graph (tok/s)", ",.0f"), ("ratio", "ratio", ".1f"),
                  ("modules_fraction_of_gemm", "modules of GEMM", ".2f"),
                  ("graph_fraction_of_gemm", "graph of GEMM", ".2f"),
                  ("graph_scaling", "graph vs 1 thread", ".2f"), ("batches", "batches a pass", "n"),
                  ("repeats", "passes", "n"))

__all__ = ["AGREEMENT_COLUMNS", "COMPARISONS", "PARITY_COLUMNS", "SPEED_COLUMNS", "WritebackError",
           "agreement_markdown", "agreement_row", "head_appendix", "head_weights_to_graph",
           "module_weights_to_graph",
           "parity_markdown",
           "parity_rows", "plot_speed", "save_with_graph", "speed_bar", "speed_markdown", "speed_rows",
           "write_pipeline"]


# -- the weights under the graph's names ----------------------------------------------------------------

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

    A distilled student's graph (`trainable.postnorm.is_student`; see encoder_study.student.export)
    holds every weight as a named initializer, linear weights [in, out]: each goes back under its own
    name, transposed, the projection and the positions included (unchanged values leave the bytes as
    they were).

    The graph is never loaded whole: names come from the patcher's streaming index
    (`onnx.patch.StreamedGraph`), and the only values read are the BERT family's position and
    token-type tables; the arrays returned are read-only views of the encoder's parameters (linear
    weights transposed views), not copies, so memory stays near the encoder's own (the graphs of the
    study are over 1 GB). Write them before the encoder changes again, or copy them.
    """
    from .trainable import FAMILIES
    from .trainable import postnorm as pn
    from .trainable.graph import Graph

    path = graph.path if isinstance(graph, Graph) else Path(graph)
    if path.is_dir():
        path = path / "model.onnx"
    with patch.StreamedGraph(path) as streamed:
        graph_names = names.weight_names(streamed.layout, streamed.value)
        prefix = names.table_prefix(path, [*graph_names.named, *graph_names.linear])
        family = encoder.settings.family
        student = family == "postnorm" and pn.is_student(graph_names, prefix)
        folded = None
        if family == "postnorm" and not student:
            folded = _folded_positions(streamed, graph_names, prefix)

    if include_tokens is None:
        include_tokens = not encoder.embeddings_frozen
    params = dict(encoder.named_parameters())
    if student:
        return _student_weights(path, encoder, params, prefix, include_tokens)
    module = FAMILIES[family][0]
    out = _family_weights(path, module.weight_names(encoder.settings.layers), params, graph_names, prefix,
                          include_tokens)
    if folded is not None:
        positions, types = folded
        mine = _param(params["positions"])
        if not patch.bitwise_equal(mine, positions):
            out[prefix + pn.POSITIONS] = mine
            if types is not None:
                out[prefix + pn.TOKEN_TYPES] = np.zeros_like(types)
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
    from .trainable import postnorm as pn

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
    from .trainable import postnorm as pn

    def read(theirs: str) -> np.ndarray | None:
        name = prefix + theirs
        stored = graph_names.named.get(name)
        if stored is None:
            return None
        names.check_float32(streamed.path, name, streamed.layout.dtypes[stored])
        return streamed.value(stored)

    positions, types = read(pn.POSITIONS), read(pn.TOKEN_TYPES)
    if positions is None:
        raise names.GraphError(f"{streamed.path}: no {prefix + pn.POSITIONS}; not a BERT-family graph")
    folded = positions + (types[0] if types is not None else np.float32(0))
    return np.ascontiguousarray(folded, dtype=np.float32), types


# -- the graph pipeline ---------------------------------------------------------------------------------

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


def _mib(kib: int) -> float:
    return kib / 1024.0


def pipeline_inputs(inline: str | os.PathLike) -> list:
    """The files `write_pipeline` reads: the inline pipeline and the export it references."""
    settings, _ = pipeline.read(inline)
    model_dir = Path(inline).parent / settings["encoder"]["model_dir"]
    return [inline, *(model_dir / n for n in manifest.EXPORT_FILES)]


def write_pipeline(inline: str | os.PathLike, out: str | os.PathLike, threads: int) -> dict:
    """Write `out` and its graph from a fine-tuned run's inline pipeline; what was done, and the memory."""
    start = machine.peak_resident_kib()
    tagger = pipeline.load(inline, threads=threads)
    if not tagger.trainable_encoder:
        raise pipeline.PipelineError(f"{inline}: a {tagger.kind!r} pipeline; only a fine-tuned run's "
                                     "(transformer-trainable) has weights to write into a graph")
    loaded = machine.peak_resident_kib()
    training = dict(pipeline.training_summary(inline) or {})
    training["inline_pipeline_sha256"] = files.sha256_file(inline)
    reset = machine.reset_peak()
    resident = machine.resident_kib()
    saved = save_with_graph(tagger, out, training=training)
    return {"saved": saved, "peak_start_kib": start, "peak_loaded_kib": loaded, "peak_reset": reset,
            "resident_before_write_kib": resident, "peak_write_kib": machine.peak_resident_kib(),
            "graph_bytes": saved.graph.stat().st_size,
            "source_bytes": (tagger.encoder.model_dir / manifest.ONNX_FILE).stat().st_size}


def patch_markdown(report: patch.PatchReport) -> str:
    """What the patch did, for the pipeline's fragment."""
    return tables.markdown_table(["what", "tensors"], [
        ("initializers rewritten", len(report.rewritten)),
        ("Identity names made initializers", len(report.materialized)),
        ("given, equal to the graph's (left as they were)", len(report.unchanged)),
        ("rewritten from float_data to raw_data", len(report.from_float_data)),
        ("appended: the head's initializers", len(report.appended)),
        ("appended: nodes (word pooling, head, tags)", report.appended_nodes),
        ("appended: graph inputs, outputs", f"{', '.join(report.appended_inputs) or '-'}; "
                                            f"{', '.join(report.appended_outputs) or '-'}"),
        ("bytes written", f"{report.bytes_written:,}")], "lr")


def memory_markdown(done: dict) -> str:
    """The resident set at each point of `write_pipeline` (its result), for the pipeline's fragment."""
    rows = [("before loading (Python and torch imported): peak", done["peak_start_kib"]),
            ("inline pipeline loaded (trainable modules): peak", done["peak_loaded_kib"]),
            ("resident when writing began", done["resident_before_write_kib"]),
            ("while writing the graph and the pipeline: peak" + ("" if done["peak_reset"] else
                                                                 " (since the start: no reset)"),
             done["peak_write_kib"])]
    return tables.markdown_table(["point", "MiB"], [(what, f"{_mib(kib):.1f}") for what, kib in rows]
                                 + [("written graph's size", f"{done['graph_bytes'] / 2**20:.1f}")], "lr")


def memory_notes(done: dict) -> list[str]:
    """The fragment's notes on the write's memory and the graph's size; the last is the one-line summary."""
    saved, size = done["saved"], done["graph_bytes"]
    peak, resident = done["peak_write_kib"], done["resident_before_write_kib"]
    added = max(0, peak - resident)
    report = saved.report
    return [
        f"peak memory of writing the {size / 2**20:.1f} MiB graph: {_mib(peak):.1f} MiB resident at most, "
        f"{_mib(added):.1f} MiB over the {_mib(resident):.1f} MiB resident when it began "
        f"({added * 1024 / size:.2f} x the file's size); the peak " + (
            "was reset (/proc/self/clear_refs) after loading, so loading is not in it"
            if done["peak_reset"] else "could not be reset, so it includes loading"),
        f"written graph {saved.graph.name}: {size:,} bytes, the export's model.onnx "
        f"{done['source_bytes']:,} bytes; only the rewritten initializers' values differ, and the head "
        f"is appended ({report.appended_nodes} nodes, {len(report.appended)} initializers)",
        f"{saved.path}: {len(report.rewritten)} initializers rewritten, {len(report.materialized)} "
        f"materialised; writing: peak {_mib(peak):.1f} MiB resident, {_mib(added):.1f} MiB added, graph "
        f"{size / 2**20:.1f} MiB"]


def run_inputs(inline: str | os.PathLike, written: str | os.PathLike) -> list[Path]:
    """The files a run's comparison reads: both pipelines and the written graph."""
    return [Path(inline), Path(written), Path(written).with_name(pipeline.graph_name(written))]


def _encoder_name(tagger) -> str:
    return tagger.encoder.manifest.get("model", Path(tagger.encoder.model_dir).name)


# -- parity ---------------------------------------------------------------------------------------------

def parity_rows(run: str, inline: str | os.PathLike, written: str | os.PathLike, texts: list[str],
                threads: int) -> list[dict]:
    """The written graph (ONNX Runtime) and the export's graph against the modules, every token; and the
    written pipeline's logits against the inline tagger's, every word (COMPARISONS, in order)."""
    import torch

    from . import compare, runtime, tokens
    from .machine import torch_threads

    tagger = pipeline.load(inline, threads=threads)
    graph = pipeline.load(written, threads=threads)
    torch_threads(threads)
    feeds_of = graph.encoder
    export = runtime.ort_session(feeds_of.model_dir / manifest.ONNX_FILE, graph.threads, graph.optimization)
    # The parity recipe's tokenisation: the tokenizer's special tokens, cut to the model's positions.
    reader = tokens.TextPieces(feeds_of.model_dir / manifest.TOKENIZER_FILE,
                               runtime.usable_positions(feeds_of.config), feeds_of.pad_id)
    rows, _ = reader.encode(texts)
    feeds = [runtime.pad_batch([row], feeds_of.pad_id) for row in rows]
    docs = [tokens.Doc.from_words(text.split()) for text in texts]
    # One runtime at a time: ONNX Runtime's idle threads spin, and would slow PyTorch beside them.
    with torch.no_grad():
        mine = [tagger.encoder.encoder(torch.from_numpy(ids), torch.from_numpy(mask))[0].numpy()
                for ids, mask in feeds]
        logits = tagger(docs).numpy()

    def export_states(ids, mask):
        return export.run([runtime.OUTPUT], {"input_ids": ids, "attention_mask": mask})[0]

    pairs = {name: compare.Accumulator() for name in COMPARISONS}
    for name, states in zip(COMPARISONS[:2], (graph.hidden_states, export_states), strict=True):
        for reference, (ids, mask) in zip(mine, feeds, strict=True):
            pairs[name].add(reference, states(ids, mask)[0])
    pairs[COMPARISONS[2]].add(logits, np.concatenate([np.zeros((0, len(graph.tags)), np.float32),
                                                      *graph.logits(docs)]))
    encoder = feeds_of.manifest.get("model", "")
    return [{"run": run, "encoder": encoder, "comparison": name,
             **{k: v for k, v in acc.row().items() if k in PARITY_COLUMNS}} for name, acc in pairs.items()]


def parity_markdown(rows: list[dict]) -> str:
    return tables.markdown(rows, PARITY_MARKDOWN)


# -- agreement ------------------------------------------------------------------------------------------

def agreement_row(run: str, inline: str | os.PathLike, written: str | os.PathLike, sentences, pred_out,
                  resamples: int, seed: int, threads: int) -> dict:
    """UPOS through the written graph (bootstrap interval) and its differences from the inline pipeline's."""
    from .tagging import evaluate

    docs = [s.doc() for s in sentences]
    graph = pipeline.load(written, threads=threads)
    ours = graph.predict(docs)
    theirs = pipeline.load(inline, threads=threads).predict(docs)
    differing = sum(a != b for p, q in zip(ours, theirs, strict=True) for a, b in zip(p, q, strict=True))
    conllu.write_predictions(sentences, ours, pred_out)
    gold = [s.upos for s in sentences]
    accuracy = evaluate.accuracy_interval(gold, ours, resamples=resamples, seed=seed)
    inline_upos = evaluate.accuracy_interval(gold, theirs, resamples=resamples, seed=seed).upos
    return {"run": run, "encoder": _encoder_name(graph), "split": "test", "tokens": accuracy.tokens,
            "sentences": accuracy.sentences, "differing_tokens": differing, "upos": accuracy.upos,
            "ci_low": accuracy.ci_low, "ci_high": accuracy.ci_high, "upos_inline": inline_upos,
            "resamples": resamples, "seed": seed}


def agreement_markdown(rows: list[dict]) -> str:
    # Not tables.markdown: the interval is two columns in one cell, and the count is printed as it is.
    return tables.markdown_table(
        ["run", "encoder", "split", "tokens", "differing tokens", "UPOS (written graph)", "95% CI",
         "UPOS (inline)"],
        [(r["run"], r["encoder"], r["split"], f"{int(r['tokens']):,}", r["differing_tokens"],
          f"{float(r['upos']):.2f}", f"[{float(r['ci_low']):.2f}, {float(r['ci_high']):.2f}]",
          f"{float(r['upos_inline']):.2f}") for r in rows], "lllrrrrr")


# -- speed ----------------------------------------------------------------------------------------------

def _tag_all(tagger, calls) -> None:
    """One pass: tag the documents of each call, nothing cached from an earlier pass."""
    if hasattr(tagger.encoder, "clear_cache"):
        tagger.encoder.clear_cache()  # a /2 file's frozen encoder keeps each document's vectors
    for docs in calls:
        tagger.predict_ids(docs, batch_words=sys.maxsize)  # every batch of the call: one forward (run) each


def speed_batches(graph, docs: list, batch_pieces: int) -> dict:
    """The batches both paths tag, as a pipeline tags a file: the documents cut as both encoders cut
    them, longest window first, each batch as many as fit `batch_pieces` padded pieces
    (`tagging.graph.piece_batches`); with the windows' lengths (the counted work) and the padding.

    `calls`: what a pass hands each path. All documents at once where both plan these batches
    themselves from the budget (every document one window, none over the budget: the modules'
    `trainable.words.plan_batches` then groups as `piece_batches`), so that each tokenises the whole
    set once and runs its batches back to back, as a pipeline tagging a file does; else one call per
    batch."""
    feeds = graph.encoder
    joined = feeds.tokenizer.prepare_joined(docs, feeds.max_length)
    longest, windows = tagging_graph.window_counts(joined)
    groups = tagging_graph.piece_batches(longest, windows, batch_pieces)
    lengths = [len(window) for window in joined.inputs]
    padded = [sum(windows[d] for d in g) * max(longest[d] for d in g) for g in groups]
    batches = [[docs[d] for d in g] for g in groups]
    whole = all(n == 1 for n in windows) and max(lengths, default=0) <= batch_pieces
    return {"batches": batches, "lengths": lengths, "padded": padded,
            "calls": [docs] if whole else batches, "budget": max([batch_pieces, *padded])}


def _budgets(modules, graph, planned: dict) -> None:
    """Both paths' budgets: the planned batches, one forward of the modules and one run of the graph
    each (a document over the budget is a batch alone, and sets the budget)."""
    modules.encoder.max_batch_pieces = planned["budget"]  # plans the same longest-first batches
    graph.encoder.batch_pieces = planned["budget"]


def speed_rows(run: str, inline: str | os.PathLike, written: str | os.PathLike, sentences, batch_pieces: int,
               thread_counts: list[int], warmup: int, repeats: int, min_seconds: float,
               probes: dict | None = None) -> list[dict]:
    """Tokens per second of the inline modules and the written graph at each thread count, on the same
    batches (`speed_batches`): the median pass of at least `repeats` passes and `min_seconds` of passes
    each, the two taking turns in blocks (`perf.measure`: each runtime's threads wind down before the
    other's are timed), with the slowest and fastest pass; the rate against the machine's
    matrix-multiply rate at those threads (counted on the windows the encoder runs, each at its own
    length: padding is not counted as work); and each rate over the same implementation's at 1 thread
    (`*_scaling`, when 1 is among `thread_counts`). The modules are loaded once, the graph once per
    thread count (a session's threads are fixed); `probes` (threads -> perf.Probe) are reused across
    calls, made here when missing."""
    from .machine import torch_threads

    probes = {} if probes is None else probes
    docs = [s.doc() for s in sentences]
    tokens = sum(len(d.words) for d in docs)
    modules = pipeline.load(inline, threads=max(thread_counts))
    graph = pipeline.load(written, threads=thread_counts[0])  # ONNX Runtime's intra-op threads
    planned = speed_batches(graph, docs, batch_pieces)
    calls = planned["calls"]
    flops = perf.encoder_flops(perf.Shape.from_config(graph.encoder.config), planned["lengths"])
    shape = {"run": run, "encoder": _encoder_name(graph), "sentences": len(docs), "tokens": tokens,
             "pieces": sum(planned["lengths"]), "padded_pieces": sum(planned["padded"]),
             "batch_pieces": batch_pieces, "batches": len(planned["batches"]), "calls": len(calls),
             "gflop": flops / 1e9}
    rows = []
    for threads in thread_counts:
        if graph.threads_requested != threads:
            graph = None  # one session at a time: the study's graphs are large
            graph = pipeline.load(written, threads=threads)
        _budgets(modules, graph, planned)
        torch_threads(threads)
        if threads not in probes:
            probes[threads] = perf.Probe.beside(threads, min_seconds)  # the limit, taking turns with the two
        probe = probes[threads]
        times = perf.measure({"modules": lambda: _tag_all(modules, calls),
                              "graph": lambda g=graph: _tag_all(g, calls)},
                             min_seconds, min_repeats=repeats, warmup=warmup,
                             block_seconds=perf.BLOCK_SECONDS, probe=probe)
        rows.append({**shape, "threads": threads, **_speed_cells(times, tokens, flops, probe.limit(times))})
    single = next((r for r in rows if r["threads"] == 1), None)
    for r in rows:
        for impl in ("modules", "graph"):
            r[f"{impl}_scaling"] = r[f"{impl}_tok_s"] / single[f"{impl}_tok_s"] if single else ""
    return rows


def _speed_cells(times: dict, tokens: int, flops: float, limit: perf.Limit) -> dict:
    """A row's timed columns from `perf.measure`'s seconds, read against the probe measured beside them."""
    mod, gra = perf.Spread.of(times["modules"]), perf.Spread.of(times["graph"])
    row = {"repeats": min(mod.repeats, gra.repeats),
           "modules_tok_s": tokens / mod.median, "graph_tok_s": tokens / gra.median,
           "ratio": mod.median / gra.median,
           "modules_tok_s_min": tokens / mod.max, "modules_tok_s_max": tokens / mod.min,
           "graph_tok_s_min": tokens / gra.max, "graph_tok_s_max": tokens / gra.min,
           "modules_repeats": mod.repeats, "graph_repeats": gra.repeats,
           "modules_seconds": mod.seconds, "graph_seconds": gra.seconds, **limit.columns()}
    notes = []
    for impl, spread in (("modules", mod), ("graph", gra)):
        rate = limit.rates(flops, spread.median)
        row[f"{impl}_gflops"], row[f"{impl}_fraction_of_gemm"] = rate["gflops"], rate["fraction_of_gemm"]
        notes += [f"{impl}: {rate['limit_note']}"] if rate["limit_note"] else []
    row["limit_note"] = "; ".join(notes)
    return row


def speed_markdown(rows: list[dict]) -> str:
    return tables.markdown(rows, SPEED_MARKDOWN)


def write_table(out: str | os.PathLike, rows: list[dict], columns: list[str], markdown: str) -> list[Path]:
    """The CSV and its Markdown beside it (same name, .md), each written atomically."""
    out = Path(out)
    files.write_text(out, tables.csv_text(rows, columns))
    files.write_text(out.with_suffix(".md"), markdown)
    return [out, out.with_suffix(".md")]


# The speed plot's bars: column of the median, its series' name in the legend.
SPEED_SERIES = (("modules_tok_s", "inline modules (PyTorch)"),
                ("graph_tok_s", "written graph (ONNX Runtime)"))


def speed_bar(row: dict, column: str) -> plots.Bar:
    """A bar at the row's median rate, its error bar from `<column>_min` to `<column>_max` when the table
    has both (an empty or missing cell: no error bar)."""
    low, high = row.get(f"{column}_min") or None, row.get(f"{column}_max") or None
    return plots.Bar(float(row[column]), *((float(low), float(high)) if low and high else ()))


def plot_speed(rows: list[dict], target: str | os.PathLike) -> None:
    """Bars of speed.csv (rows as read back): tokens per second per encoder and thread count (the run's
    name where two runs share an encoder), one bar for the inline modules and one for the written
    graph, each with its spread when the table has it (`plots.bars`)."""
    runs_of: dict[str, set] = {}
    for r in rows:
        runs_of.setdefault(r["encoder"], set()).add(r["run"])
    labels = [f"{r['encoder'] if len(runs_of[r['encoder']]) == 1 else r['run']}\n{r['threads']} thread"
              f"{'' if str(r['threads']) == '1' else 's'}" for r in rows]
    plots.bars(labels, {name: [speed_bar(r, column) for r in rows] for column, name in SPEED_SERIES},
               target, "tokens per second (median; bar: slowest to fastest pass)",
               "Write-back: tagging speed", log="auto")

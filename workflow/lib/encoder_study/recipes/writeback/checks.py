"""The rules writeback_parity and writeback_agreement: the written graph against the modules its
weights came from, state by state and tag by tag; and the tables' files."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ...core import files, tables
from ...data import conllu
from ...encoders import families
from ...onnx import manifest
from ..tagging import pipeline
from ..tagging.settings import Bootstrap

PARITY_COLUMNS = ["run", "encoder", "comparison", "tokens", "max_abs", "mean_abs", "max_value", "min_cos"]


COMPARISONS = ("written graph vs modules", "export graph vs modules", "written pipeline logits vs modules")


AGREEMENT_COLUMNS = ["run", "encoder", "split", "tokens", "sentences", "differing_tokens", "upos", "ci_low",
                     "ci_high", "upos_inline", "resamples", "seed"]


# The Markdown renderings' columns (tables.markdown): (key, title, format).
PARITY_MARKDOWN = (("run", "run", ""), ("encoder", "encoder", ""), ("comparison", "comparison", ""),
                   *tables.PARITY_COLUMNS)


def run_inputs(inline: str | os.PathLike, written: str | os.PathLike) -> list[Path]:
    """The files a run's comparison reads: both pipelines and the written graph."""
    return [Path(inline), Path(written), Path(written).with_name(pipeline.graph_name(written))]


def _encoder_name(tagger) -> str:
    return tagger.encoder.manifest.get("model", Path(tagger.encoder.model_dir).name)


def parity_rows(run: str, inline: str | os.PathLike, written: str | os.PathLike, texts: list[str],
                threads: int) -> list[dict]:
    """The written graph (ONNX Runtime) and the export's graph against the modules, every token; and the
    written pipeline's logits against the inline tagger's, every word (COMPARISONS, in order)."""
    import torch

    from ...core.machine import torch_threads
    from ...encoders import compare, tokens
    from ...onnx import runtime

    tagger = pipeline.load(inline, threads=threads)
    graph = pipeline.load(written, threads=threads)
    torch_threads(threads)
    feeds_of = graph.encoder
    export = runtime.ort_session(feeds_of.model_dir / manifest.ONNX_FILE, graph.threads, graph.optimization)
    # The parity recipe's tokenisation: the tokenizer's special tokens, cut to the model's positions.
    reader = tokens.TextPieces(feeds_of.model_dir / manifest.TOKENIZER_FILE,
                               families.usable_positions(feeds_of.config), feeds_of.pad_id)
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


def agreement_row(run: str, inline: str | os.PathLike, written: str | os.PathLike, sentences, pred_out,
                  bootstrap: Bootstrap, threads: int) -> dict:
    """UPOS through the written graph (bootstrap interval) and its differences from the inline pipeline's."""
    from ..tagging import evaluate

    docs = [s.doc() for s in sentences]
    graph = pipeline.load(written, threads=threads)
    ours = graph.predict(docs)
    theirs = pipeline.load(inline, threads=threads).predict(docs)
    differing = sum(a != b for p, q in zip(ours, theirs, strict=True) for a, b in zip(p, q, strict=True))
    conllu.write_predictions(sentences, ours, pred_out, graph.task)
    gold = [s.tags(graph.task) for s in sentences]  # the task the pipeline was trained for
    accuracy = evaluate.accuracy_interval(gold, ours, bootstrap)
    inline_upos = evaluate.accuracy_interval(gold, theirs, bootstrap).upos
    return {"run": run, "encoder": _encoder_name(graph), "split": "test", "tokens": accuracy.tokens,
            "sentences": accuracy.sentences, "differing_tokens": differing, "upos": accuracy.upos,
            "ci_low": accuracy.ci_low, "ci_high": accuracy.ci_high, "upos_inline": inline_upos,
            "resamples": bootstrap.resamples, "seed": bootstrap.seed}


def agreement_markdown(rows: list[dict]) -> str:
    # Not tables.markdown: the interval is two columns in one cell, and the count is printed as it is.
    return tables.markdown_table(
        ["run", "encoder", "split", "tokens", "differing tokens", "UPOS (written graph)", "95% CI",
         "UPOS (inline)"],
        [(r["run"], r["encoder"], r["split"], f"{int(r['tokens']):,}", r["differing_tokens"],
          f"{float(r['upos']):.2f}", f"[{float(r['ci_low']):.2f}, {float(r['ci_high']):.2f}]",
          f"{float(r['upos_inline']):.2f}") for r in rows], "lllrrrrr")


def write_table(out: str | os.PathLike, rows: list[dict], columns: list[str], markdown: str) -> list[Path]:
    """The CSV and its Markdown beside it (same name, .md), each written atomically."""
    out = Path(out)
    files.write_text(out, tables.csv_text(rows, columns))
    files.write_text(out.with_suffix(".md"), markdown)
    return [out, out.with_suffix(".md")]


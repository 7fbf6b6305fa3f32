"""`encoder-study written pipeline|parity|agreement|speed`: the writeback recipe's commands.

A fine-tuned run's pipeline (results/tagging/<run>/pipeline.safetensors) keeps its weights inline: it is
the training reference. These commands write its graph pipeline and check it against that reference:

    encoder-study written pipeline --inline results/tagging/R/pipeline.safetensors \\
        --out results/writeback/R/pipeline.safetensors --provenance provenance/writeback/...-R.md
    encoder-study written parity --run R INLINE WRITTEN [--run ...] \\
        --texts results/texts/parity_texts.jsonl --out results/writeback/parity.csv ...
    encoder-study written agreement --run R INLINE WRITTEN ... --test results/treebank/test.conllu \\
        --pred-dir results/writeback --out results/writeback/agreement.csv ...
    encoder-study written speed --run R INLINE WRITTEN ... --test ... --out results/writeback/speed.csv ...

Tables (each with a Markdown rendering beside it, one row per run and comparison or thread count):

| table | columns |
|---|---|
| parity.csv | run, encoder, comparison, tokens, max_abs, mean_abs, max_value, min_cos |
| agreement.csv | run, encoder, split, tokens, sentences, differing_tokens, upos, ci_low, ci_high, ... |
| speed.csv | run, encoder, threads, sentences, tokens, repeats, modules_tok_s, graph_tok_s, ratio |

`parity` compares, one text per run and every token, ONNX Runtime on the written graph with the
trainable modules the weights came from; the export's own graph against the same modules is the
control row (it shows how far fine-tuning moved the states). `agreement` tags the test split through
both pipelines: the written graph's UPOS with its sentence-bootstrap interval (`tagging.evaluate`)
and how many tokens' tags differ. `speed` times tagging through both; it is indicative, and excluded
from the byte-identity promise.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

from . import files, manifest, provenance, tables
from .data import conllu
from .tagging import pipeline

PARITY_COLUMNS = ["run", "encoder", "comparison", "tokens", "max_abs", "mean_abs", "max_value", "min_cos"]
COMPARISONS = ("written graph vs modules", "export graph vs modules")
AGREEMENT_COLUMNS = ["run", "encoder", "split", "tokens", "sentences", "differing_tokens", "upos", "ci_low",
                     "ci_high", "upos_inline", "resamples", "seed"]
SPEED_COLUMNS = ["run", "encoder", "threads", "sentences", "tokens", "repeats", "modules_tok_s",
                 "graph_tok_s", "ratio"]


def _threads(value: int) -> int:
    return max(1, min(value, os.cpu_count() or 1))


def _mib(kib: int) -> float:
    return kib / 1024.0  # ru_maxrss is in KiB on Linux


def _peak_kib() -> int:
    """The peak resident set (VmHWM, which _reset_peak resets); ru_maxrss where /proc is not there."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            return next(int(line.split()[1]) for line in handle if line.startswith("VmHWM:"))
    except (OSError, StopIteration, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _resident_kib() -> int:
    """The resident set now (VmRSS); 0 where /proc is not there."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            return next(int(line.split()[1]) for line in handle if line.startswith("VmRSS:"))
    except (OSError, StopIteration, ValueError):
        return 0


def _reset_peak() -> bool:
    """Reset the peak resident set to the current one (Linux: `5` to /proc/self/clear_refs), so that
    ru_maxrss afterwards is the peak of what follows and not of loading before it.

    Freed heap is first given back to the system (glibc's malloc_trim): otherwise pages freed after
    loading stay resident, the write reuses them, and its cost would not show in the peak."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: the peak may understate the write
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _write_table(out: str | os.PathLike, rows: list[dict], columns: list[str], markdown: str) -> list[Path]:
    """The CSV and its Markdown beside it (same name, .md), each written atomically."""
    out = Path(out)
    files.write_text(out, tables.csv_text(rows, columns))
    files.write_text(out.with_suffix(".md"), markdown)
    return [out, out.with_suffix(".md")]


def _run_inputs(inline: str, written: str) -> list[Path]:
    return [Path(inline), Path(written), Path(written).with_name(pipeline.graph_name(written))]


def _encoder_name(tagger) -> str:
    return tagger.encoder.manifest.get("model", Path(tagger.encoder.model_dir).name)


# -- pipeline -------------------------------------------------------------------------------------------

def write_pipeline(inline: str | os.PathLike, out: str | os.PathLike, threads: int = 1) -> dict:
    """Write `out` and its graph from a fine-tuned run's inline pipeline; what was done, and the memory."""
    start = _peak_kib()
    tagger = pipeline.load(inline, threads=threads)
    if not tagger.trainable_encoder:
        raise pipeline.PipelineError(f"{inline}: a {tagger.kind!r} pipeline; only a fine-tuned run's "
                                     "(transformer-trainable) has weights to write into a graph")
    loaded = _peak_kib()
    training = dict(pipeline.training_summary(inline) or {})
    training["inline_pipeline_sha256"] = files.sha256_file(inline)
    reset = _reset_peak()
    resident = _resident_kib()
    saved = pipeline.write(tagger, out, training=training, export_graphs=True)
    return {"saved": saved, "peak_start_kib": start, "peak_loaded_kib": loaded, "peak_reset": reset,
            "resident_before_write_kib": resident, "peak_write_kib": _peak_kib(),
            "graph_bytes": saved.graph.stat().st_size,
            "source_bytes": (tagger.encoder.model_dir / manifest.ONNX_FILE).stat().st_size}


def _pipeline(args, frag: provenance.Fragment) -> None:
    settings, _ = pipeline.read(args.inline)
    model_dir = Path(args.inline).parent / settings["encoder"]["model_dir"]
    frag.inputs += [args.inline, *(model_dir / n for n in (*manifest.MODEL_FILES, manifest.MANIFEST))]
    done = write_pipeline(args.inline, args.out, _threads(args.threads))
    saved, report = done["saved"], done["saved"].report
    frag.outputs += [saved.path, saved.graph]
    frag.table("Patch", provenance.markdown_table(["what", "tensors"], [
        ("initializers rewritten", len(report.rewritten)),
        ("Identity names made initializers", len(report.materialized)),
        ("given, equal to the graph's (left as they were)", len(report.unchanged)),
        ("rewritten from float_data to raw_data", len(report.from_float_data)),
        ("bytes written", f"{report.bytes_written:,}")], "lr"))
    size = done["graph_bytes"]
    peak, resident = done["peak_write_kib"], done["resident_before_write_kib"]
    rows = [("before loading (Python and torch imported): peak", done["peak_start_kib"]),
            ("inline pipeline loaded (trainable modules): peak", done["peak_loaded_kib"]),
            ("resident when writing began", resident),
            ("while writing the graph and the pipeline: peak" + ("" if done["peak_reset"] else
                                                                 " (since the start: no reset)"), peak)]
    frag.table("Memory (resident set: peak VmHWM, current VmRSS)", provenance.markdown_table(
        ["point", "MiB"], [(what, f"{_mib(kib):.1f}") for what, kib in rows]
        + [("written graph's size", f"{size / 2**20:.1f}")], "lr"))
    added = max(0, peak - resident)
    frag.note(f"peak memory of writing the {size / 2**20:.1f} MiB graph: {_mib(peak):.1f} MiB resident at "
              f"most, {_mib(added):.1f} MiB over the {_mib(resident):.1f} MiB resident when it began "
              f"({added * 1024 / size:.2f} x the file's size); the peak " + (
                  "was reset (/proc/self/clear_refs) after loading, so loading is not in it"
                  if done["peak_reset"] else "could not be reset, so it includes loading"))
    frag.note(f"written graph {saved.graph.name}: {size:,} bytes, the export's model.onnx "
              f"{done['source_bytes']:,} bytes; only the rewritten initializers' values differ")
    print(f"{args.out}: {len(report.rewritten)} initializers rewritten, {len(report.materialized)} "
          f"materialised; writing: peak {_mib(peak):.1f} MiB resident, {_mib(added):.1f} MiB added, graph "
          f"{size / 2**20:.1f} MiB")


# -- parity ---------------------------------------------------------------------------------------------

def parity_rows(run: str, inline: str | os.PathLike, written: str | os.PathLike, texts: list[str],
                threads: int) -> list[dict]:
    """The written graph (ONNX Runtime) and the export's graph against the modules, every token."""
    import torch

    from . import compare, runtime

    modules = pipeline.load(inline, threads=threads).encoder
    graph = pipeline.load(written, threads=threads).encoder
    torch.set_num_threads(threads)
    export = runtime.ort_session(graph.model_dir / manifest.ONNX_FILE, graph.threads, graph.optimization)
    # The parity recipe's tokenisation: the tokenizer's special tokens, cut to the model's positions.
    reader = compare.Model(graph.manifest.get("model", ""), graph.graph,
                          graph.model_dir / manifest.TOKENIZER_FILE, None,
                          runtime.usable_positions(graph.config), graph.pad_id)
    rows, _ = reader.encode(texts)
    feeds = [dict(zip(runtime.INPUTS, runtime.pad_batch([row], graph.pad_id), strict=True)) for row in rows]
    # One runtime at a time: ONNX Runtime's idle threads spin, and would slow PyTorch beside them.
    with torch.no_grad():
        mine = [modules.encoder(torch.from_numpy(f["input_ids"]), torch.from_numpy(f["attention_mask"]))[0]
                .numpy() for f in feeds]
    pairs = {}
    for name, session in zip(COMPARISONS, (graph.session, export), strict=True):
        pairs[name] = compare.Accumulator()
        for reference, f in zip(mine, feeds, strict=True):
            pairs[name].add(reference, session.run([runtime.OUTPUT], f)[0][0])
    encoder = graph.manifest.get("model", "")
    return [{"run": run, "encoder": encoder, "comparison": name,
             **{k: v for k, v in acc.row().items() if k in PARITY_COLUMNS}} for name, acc in pairs.items()]


def parity_markdown(rows: list[dict]) -> str:
    return provenance.markdown_table(
        ["run", "encoder", "comparison", "tokens", "max abs", "mean abs", "largest value", "min cosine"],
        [(r["run"], r["encoder"], r["comparison"], f"{int(r['tokens']):,}", f"{float(r['max_abs']):.2g}",
          f"{float(r['mean_abs']):.2g}", f"{float(r['max_value']):.3g}", f"{float(r['min_cos']):.8f}")
         for r in rows], "lllrrrrr")


def _parity(args, frag: provenance.Fragment) -> None:
    from .compare import read_texts

    threads = _threads(args.threads)
    frag.inputs.append(args.texts)
    texts = [r["text"] for r in read_texts(args.texts)]
    rows = []
    for run, inline, written in sorted(args.run):
        frag.inputs += _run_inputs(inline, written)
        rows += parity_rows(run, inline, written, texts, threads)
    markdown = parity_markdown(rows)
    frag.outputs += _write_table(args.out, rows, PARITY_COLUMNS, markdown)
    frag.table("Write-back parity", markdown)
    frag.note(f"{len(texts)} texts, one per run, every token; hidden states of ONNX Runtime "
              f"(optimisation as the pipeline runs it) against the trainable modules, {threads} thread(s)")


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
    return provenance.markdown_table(
        ["run", "encoder", "split", "tokens", "differing tokens", "UPOS (written graph)", "95% CI",
         "UPOS (inline)"],
        [(r["run"], r["encoder"], r["split"], f"{int(r['tokens']):,}", r["differing_tokens"],
          f"{float(r['upos']):.2f}", f"[{float(r['ci_low']):.2f}, {float(r['ci_high']):.2f}]",
          f"{float(r['upos_inline']):.2f}") for r in rows], "lllrrrrr")


def _agreement(args, frag: provenance.Fragment) -> None:
    threads = _threads(args.threads)
    frag.inputs.append(args.test)
    sentences = conllu.read_conllu(args.test)
    rows = []
    for run, inline, written in sorted(args.run):
        frag.inputs += _run_inputs(inline, written)
        pred = Path(args.pred_dir) / run / "test.pred.conllu"
        rows.append(agreement_row(run, inline, written, sentences, pred, args.resamples, args.seed, threads))
        frag.outputs.append(pred)
    markdown = agreement_markdown(rows)
    frag.outputs += _write_table(args.out, rows, AGREEMENT_COLUMNS, markdown)
    frag.table("Write-back agreement", markdown)
    frag.note(f"gold tokens of {args.test}; the interval resamples sentences ({args.resamples} resamples, "
              f"seed {args.seed}, percentile); differing tokens: tags the written graph's pipeline predicts "
              "otherwise than the inline pipeline the weights came from")
    if any(int(r["differing_tokens"]) for r in rows):
        frag.note("WARNING: some tokens are tagged differently through the written graph")


# -- speed ----------------------------------------------------------------------------------------------

def _time(tagger, batches, warmup: int, repeats: int) -> float:
    """Median seconds to tag every batch, after `warmup` untimed passes; nothing cached between passes."""
    seconds = []
    for rep in range(warmup + repeats):
        if hasattr(tagger.encoder, "clear_cache"):
            tagger.encoder.clear_cache()  # the frozen encoder keeps each document's vectors
        start = time.perf_counter()
        for batch in batches:
            tagger.predict_ids(batch, batch_words=sys.maxsize)  # one forward per batch of documents
        if rep >= warmup:
            seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def speed_rows(run: str, inline: str | os.PathLike, written: str | os.PathLike, sentences, batch: int,
               thread_counts: list[int], warmup: int, repeats: int) -> list[dict]:
    docs = [s.doc() for s in sentences]
    tokens = sum(len(d.words) for d in docs)
    batches = [docs[i:i + batch] for i in range(0, len(docs), batch)]
    rows = []
    for threads in thread_counts:
        modules = pipeline.load(inline, threads=threads)  # sets torch's threads
        graph = pipeline.load(written, threads=threads)  # ONNX Runtime's intra-op threads
        graph.encoder.batch_size = batch  # a batch's windows in one call, as the modules run them
        modules_s = _time(modules, batches, warmup, repeats)
        graph_s = _time(graph, batches, warmup, repeats)
        rows.append({"run": run, "encoder": _encoder_name(graph), "threads": threads,
                     "sentences": len(docs), "tokens": tokens, "repeats": repeats,
                     "modules_tok_s": tokens / modules_s, "graph_tok_s": tokens / graph_s,
                     "ratio": modules_s / graph_s})
    return rows


def speed_markdown(rows: list[dict]) -> str:
    return provenance.markdown_table(
        ["run", "encoder", "threads", "tokens", "modules (tok/s)", "written graph (tok/s)", "ratio"],
        [(r["run"], r["encoder"], r["threads"], f"{int(r['tokens']):,}", f"{float(r['modules_tok_s']):,.0f}",
          f"{float(r['graph_tok_s']):,.0f}", f"{float(r['ratio']):.1f}") for r in rows], "llrrrrr")


def _speed(args, frag: provenance.Fragment) -> None:
    from .machine import load_average

    threads = _threads(args.threads)
    counts = sorted({1, threads})
    frag.inputs.append(args.test)
    sentences = conllu.read_conllu(args.test)[:args.sentences]
    before = load_average()
    rows = []
    for run, inline, written in sorted(args.run):
        frag.inputs += _run_inputs(inline, written)
        rows += speed_rows(run, inline, written, sentences, args.batch, counts, args.warmup, args.repeats)
    markdown = speed_markdown(rows)
    frag.outputs += _write_table(args.out, rows, SPEED_COLUMNS, markdown)
    frag.table("Write-back speed", markdown)
    frag.note(f"tagging the first {len(sentences)} sentences of {args.test} (gold tokens), batches of "
              f"{args.batch} documents, median of {args.repeats} repetition(s) after {args.warmup} warm-up "
              f"pass(es); threads {', '.join(map(str, counts))}; load average (1, 5, 15 min) before: "
              f"{before}; after: {load_average()}. Indicative timings, not a gated result; excluded from "
              "byte identity.")


# -- command line ---------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """`encoder-study written pipeline|parity|agreement|speed ...`: fine-tuned weights in the graph."""
    from .compare import ParityError
    from .frozen import EncoderError

    parser = argparse.ArgumentParser(prog="encoder-study written", description=main.__doc__)
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("pipeline", help="a fine-tuned run's graph pipeline from its inline pipeline")
    provenance.add_arguments(p)
    p.add_argument("--inline", required=True, help="results/tagging/<run>/pipeline.safetensors")
    p.add_argument("--out", required=True, help="results/writeback/<run>/pipeline.safetensors (+ its graph)")
    p.add_argument("--threads", type=int, default=1)
    for action, help_ in (("parity", "hidden states: written graph vs modules"),
                          ("agreement", "UPOS through both pipelines, differing tags"),
                          ("speed", "tagging tokens/s through both pipelines")):
        p = sub.add_parser(action, help=help_)
        provenance.add_arguments(p)
        p.add_argument("--run", nargs=3, action="append", required=True,
                       metavar=("NAME", "INLINE", "WRITTEN"),
                       help="a run's name, its inline pipeline and its written pipeline; repeat")
        p.add_argument("--out", required=True, help=f"results/writeback/{action}.csv (a .md beside it)")
        p.add_argument("--threads", type=int, default=1)
        if action == "parity":
            p.add_argument("--texts", required=True, help="results/texts/parity_texts.jsonl")
        else:
            p.add_argument("--test", required=True, help="the test split, CoNLL-U")
        if action == "agreement":
            p.add_argument("--pred-dir", required=True, help="writes <pred-dir>/<run>/test.pred.conllu")
            p.add_argument("--resamples", type=int, default=10_000)
            p.add_argument("--seed", type=int, default=0)
        if action == "speed":
            p.add_argument("--sentences", type=int, default=400, help="the first N test sentences")
            p.add_argument("--batch", type=int, default=32, help="documents per forward")
            p.add_argument("--warmup", type=int, default=1)
            p.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    for name in ("sentences", "batch", "repeats", "resamples", "threads"):
        if getattr(args, name, 1) < 1:
            parser.error(f"--{name} must be positive")
    action = {"pipeline": _pipeline, "parity": _parity, "agreement": _agreement, "speed": _speed}[args.action]
    try:
        with provenance.Fragment(args.provenance, provenance.settings(args),
                                 threads=_threads(args.threads)) as frag:
            action(args, frag)
    except (ValueError, EncoderError, ParityError, pipeline.PipelineError, manifest.ManifestError,
            files.IntegrityError) as err:  # WritebackError is a ValueError
        print(f"encoder-study written {args.action}: error: {err}", file=sys.stderr)
        return 2
    return 0

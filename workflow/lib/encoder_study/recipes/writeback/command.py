"""`encoder-study writeback pipeline|parity|agreement|speed|speed-plot|quantisation|quantisation-speed`:
the writeback recipe's commands.

    encoder-study writeback pipeline --inline results/tagging/R/pipeline.safetensors \\
        --out results/writeback/R/pipeline.safetensors --threads 1 --provenance provenance/writeback/...-R.md
    encoder-study writeback parity --run R INLINE WRITTEN [--run ...] \\
        --texts results/texts/parity_texts.jsonl --threads 1 --out results/writeback/parity.csv ...
    encoder-study writeback agreement --run R INLINE WRITTEN ... --test results/treebank/test.conllu \\
        --pred-dir results/writeback --bootstrap-resamples 10000 --bootstrap-seed 0 \\
        --bootstrap-confidence 0.95 --bootstrap-method percentile --out results/writeback/agreement.csv ...
    encoder-study writeback speed --run R INLINE WRITTEN ... --test ... --sentences 200 \\
        --batch-pieces 512 --warmup 1 --repeats 2 --min-seconds 2 --out results/writeback/speed.csv ...
    encoder-study writeback speed-plot --table results/writeback/speed.csv \\
        --out results/writeback/speed.png ...
    encoder-study writeback quantisation --run R WRITTEN results/writeback/R/int8 [--run ...] \\
        --split dev results/treebank/dev.conllu [--split ...] --bootstrap-resamples 10000 ... \\
        --quantisation-no-per-channel --quantisation-max-upos-drop 0.3 \\
        --quantisation-max-differing-percent 1 --threads 1 --out results/writeback/quantisation.csv ...
    encoder-study writeback quantisation-speed --run R WRITTEN [--run ...] \\
        --table results/writeback/quantisation.csv --test ... --sentences 200 --batch-pieces 512 \\
        --warmup 1 --repeats 3 --min-seconds 2 --thread-counts 1 2 \\
        --out results/writeback/quantisation_speed.csv ...

Argparse and wiring only; the stage is `recipes.writeback`, the defaults are the config schema's.
"""

from __future__ import annotations

import argparse

from ... import provenance
from ...core import settings
from ..tagging.settings import Bootstrap
from ..tagging.variants import Quantisation


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _fragment(args):
    from ...core.machine import usable_threads

    threads = usable_threads(args.threads)
    recorded = settings.recorded(provenance.settings(args), Bootstrap, "bootstrap")
    return provenance.Fragment(args.provenance, recorded, threads=threads)


def pipeline(args) -> int:
    from ...core.machine import usable_threads
    from . import build

    with _fragment(args) as frag:
        frag.inputs += build.pipeline_inputs(args.inline)
        done = build.write_pipeline(args.inline, args.out, usable_threads(args.threads))
        saved = done["saved"]
        frag.outputs += [saved.path, saved.graph]
        frag.table("Patch", build.patch_markdown(saved.report))
        frag.table("Memory (resident set: peak VmHWM, current VmRSS)", build.memory_markdown(done))
        *notes, summary = build.memory_notes(done)
        for note in notes:
            frag.note(note)
    print(summary)
    return 0


def parity(args) -> int:
    from ...core.machine import usable_threads
    from ...encoders.compare import read_texts
    from . import checks

    threads = usable_threads(args.threads)
    with _fragment(args) as frag:
        frag.inputs.append(args.texts)
        texts = [r["text"] for r in read_texts(args.texts)]
        rows = []
        for run, inline, written in sorted(args.runs):
            frag.inputs += checks.run_inputs(inline, written)
            rows += checks.parity_rows(run, inline, written, texts, threads)
        markdown = checks.parity_markdown(rows)
        frag.outputs += checks.write_table(args.out, rows, checks.PARITY_COLUMNS, markdown)
        frag.table("Write-back parity", markdown)
        frag.note(f"{len(texts)} texts, one per run, every token; hidden states of ONNX Runtime "
                  "(optimisation as the pipeline runs it) against the trainable modules, "
                  f"{threads} thread(s); the written pipeline's logits (one session: the graph's word "
                  "pooling and head) against the inline tagger's, every word of the texts split at "
                  "whitespace")
    return 0


def agreement(args) -> int:
    from pathlib import Path

    from ...core.machine import usable_threads
    from ...data import conllu
    from . import checks

    threads = usable_threads(args.threads)
    with _fragment(args) as frag:
        frag.inputs.append(args.test)
        sentences = conllu.read_conllu(args.test)
        rows, boot = [], settings.from_args(Bootstrap, args, "bootstrap")
        for run, inline, written in sorted(args.runs):
            frag.inputs += checks.run_inputs(inline, written)
            pred = Path(args.pred_dir) / run / "test.pred.conllu"
            rows.append(checks.agreement_row(run, inline, written, sentences, pred, boot, threads))
            frag.outputs.append(pred)
        markdown = checks.agreement_markdown(rows)
        frag.outputs += checks.write_table(args.out, rows, checks.AGREEMENT_COLUMNS, markdown)
        frag.table("Write-back agreement", markdown)
        frag.note(f"gold tokens of {args.test}; the interval resamples sentences ({boot.resamples} "
                  f"resamples, seed {boot.seed}, {boot.method}); differing tokens: tags the written graph's "
                  "pipeline predicts otherwise than the inline pipeline the weights came from")
        if any(int(r["differing_tokens"]) for r in rows):
            frag.note("WARNING: some tokens are tagged differently through the written graph")
    return 0


def speed(args) -> int:
    from ...core.machine import load_average, usable_threads
    from ...data import conllu
    from . import checks, speed

    counts = sorted({1, usable_threads(args.threads)})
    with _fragment(args) as frag:
        frag.inputs.append(args.test)
        sentences = conllu.read_conllu(args.test)[:args.sentences]
        before = load_average()
        rows = []
        probes = {}  # one limit per thread count, shared by the runs: calibrated once
        for run, inline, written in sorted(args.runs):
            frag.inputs += checks.run_inputs(inline, written)
            rows += speed.speed_rows(run, inline, written, sentences, args.batch_pieces, counts,
                                         args.warmup, args.repeats, args.min_seconds, probes)
        markdown = speed.speed_markdown(rows)
        frag.outputs += checks.write_table(args.out, rows, speed.SPEED_COLUMNS, markdown)
        frag.table("Write-back speed", markdown)
        for probe in probes.values():
            for note in probe.notes():
                frag.note(note)
        frag.note(f"tagging the first {len(sentences)} sentences of {args.test} (gold tokens) as a "
                  "pipeline tags a file: documents longest first, in batches of at most "
                  f"{args.batch_pieces} padded pieces (rows x longest window; the same batches for both "
                  "paths: one forward of the modules, one ONNX Runtime run of the graph each, ids and "
                  "the piece-to-word map in, tags out; a pass hands each path every document in one "
                  "call where both plan those batches themselves (column calls: 1), so each tokenises "
                  "once and runs its batches back to back; tokenisation included), median of at least "
                  f"{args.repeats} passes and "
                  f"{args.min_seconds:g} s of passes per implementation (the two taking turns in blocks) "
                  f"after {args.warmup} warm-up pass(es); threads {', '.join(map(str, counts))}; load "
                  f"average (1, 5, 15 min) "
                  f"before: {before}; after: {load_average()}. Indicative timings, not a gated result; "
                  "excluded from byte identity.")
    return 0


def speed_plot(args) -> int:
    from ...core import tables
    from . import speed

    with provenance.Fragment(args.provenance, provenance.settings(args)) as frag:
        frag.inputs.append(args.table)
        speed.plot_speed(tables.read_csv(args.table), args.out)
        frag.outputs.append(args.out)
        frag.note("a plot of the table's numbers (median tokens/s, spread from the slowest to the fastest "
                  "pass where the table has it); its own job, so that a change to the plot times nothing "
                  "again")
    return 0


def _run(args, stage, threads: int | None = None) -> int:
    """Run a stage (a function returning `provenance.Done`) inside the job's fragment, record what it
    did, print its lines."""
    recorded = settings.recorded(provenance.settings(args), Bootstrap, "bootstrap")
    recorded = settings.recorded(recorded, Quantisation, "quantisation")
    with provenance.Fragment(args.provenance, recorded, threads=threads) as frag:
        done = frag.add(stage())
    for line in done.said:
        print(line)
    return 0


def quantisation(args) -> int:
    from ...core.machine import usable_threads
    from ...data import conllu
    from . import quantise

    threads = usable_threads(args.threads)

    def stage():
        splits = {name: conllu.read_conllu(path) for name, path in args.splits}
        done = quantise.quantisation(args.runs, splits, settings.from_args(Bootstrap, args, "bootstrap"),
                                     settings.from_args(Quantisation, args, "quantisation"), args.out,
                                     threads)
        done.inputs[:0] = [path for _, path in args.splits]
        return done

    return _run(args, stage, threads)


def quantisation_speed(args) -> int:
    from ...core.machine import usable_threads
    from ...data import conllu
    from . import quantise_speed

    counts = sorted({usable_threads(n) for n in args.thread_counts})

    def stage():
        sentences = conllu.read_conllu(args.test)[:args.sentences]
        done = quantise_speed.quantisation_speed(args.runs, args.table, sentences, args.batch_pieces, counts,
                                                 args.warmup, args.repeats, args.min_seconds, args.out)
        done.inputs.insert(0, args.test)
        return done

    return _run(args, stage, max(counts))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="encoder-study writeback",
                                description="Fine-tuned weights written into the graph, and checked.")
    sub = p.add_subparsers(dest="subcommand", required=True)

    s = sub.add_parser("pipeline", help="a fine-tuned run's graph pipeline from its inline pipeline")
    provenance.add_arguments(s)
    s.add_argument("--inline", required=True, help="results/tagging/<run>/pipeline.safetensors")
    s.add_argument("--out", required=True, help="results/writeback/<run>/pipeline.safetensors (+ its graph)")
    s.add_argument("--threads", type=_positive, required=True)
    s.set_defaults(run=pipeline)

    for name, function, help_ in (("parity", parity, "hidden states: written graph vs modules"),
                                  ("agreement", agreement, "UPOS through both pipelines, differing tags"),
                                  ("speed", speed, "tagging tokens/s through both pipelines")):
        s = sub.add_parser(name, help=help_)
        provenance.add_arguments(s)
        s.add_argument("--run", nargs=3, action="append", required=True, dest="runs",  # `run`: the function
                       metavar=("NAME", "INLINE", "WRITTEN"),
                       help="a run's name, its inline pipeline and its written pipeline; repeat")
        s.add_argument("--out", required=True, help=f"results/writeback/{name}.csv (a .md beside it)")
        s.add_argument("--threads", type=_positive, required=True)
        if name == "parity":
            s.add_argument("--texts", required=True, help="results/texts/parity_texts.jsonl")
        else:
            s.add_argument("--test", required=True, help="the test split, CoNLL-U")
        if name == "agreement":
            s.add_argument("--pred-dir", required=True, help="writes <pred-dir>/<run>/test.pred.conllu")
            settings.add_options(s.add_argument_group("bootstrap"), Bootstrap, "bootstrap")
        if name == "speed":
            s.add_argument("--sentences", type=_positive, required=True, help="the first N test sentences")
            s.add_argument("--batch-pieces", type=_positive, required=True,
                           help="padded pieces per forward (rows x longest window), documents longest first")
            s.add_argument("--warmup", type=int, required=True, help="untimed passes first")
            s.add_argument("--repeats", type=_positive, required=True, help="at least this many timed passes")
            s.add_argument("--min-seconds", type=float, required=True,
                           help="at least this many seconds of passes per implementation (and GEMM probe)")
        s.set_defaults(run=function)

    s = sub.add_parser("quantisation", help="int8 variants of the written graphs: measured, gated, published")
    provenance.add_arguments(s)
    s.add_argument("--run", nargs=3, action="append", required=True, dest="runs",
                   metavar=("NAME", "WRITTEN", "OUT_DIR"),
                   help="a run's name, its written pipeline and the variant's folder (<run>/int8); repeat")
    s.add_argument("--split", nargs=2, action="append", required=True, dest="splits",
                   metavar=("NAME", "PATH"),
                   help="a split measured (CoNLL-U with gold tags); repeat")
    settings.add_options(s.add_argument_group("bootstrap"), Bootstrap, "bootstrap")
    settings.add_options(s.add_argument_group("quantisation"), Quantisation, "quantisation")
    s.add_argument("--threads", type=_positive, required=True)
    s.add_argument("--out", required=True, help="results/writeback/quantisation.csv (a .md beside it)")
    s.set_defaults(run=quantisation)

    s = sub.add_parser("quantisation-speed", help="tagging tokens/s: float32 written graph vs int8 variant")
    provenance.add_arguments(s)
    s.add_argument("--run", nargs=2, action="append", required=True, dest="runs", metavar=("NAME", "WRITTEN"),
                   help="a run's name and its written pipeline; repeat")
    s.add_argument("--table", required=True, help="results/writeback/quantisation.csv (what was gated)")
    s.add_argument("--test", required=True, help="the test split, CoNLL-U")
    s.add_argument("--sentences", type=_positive, required=True, help="the first N test sentences")
    s.add_argument("--batch-pieces", type=_positive, required=True, help="padded pieces per forward")
    s.add_argument("--warmup", type=int, required=True, help="untimed passes first")
    s.add_argument("--repeats", type=_positive, required=True, help="at least this many timed passes")
    s.add_argument("--min-seconds", type=float, required=True,
                   help="at least this many seconds of passes per graph (and GEMM probe)")
    s.add_argument("--thread-counts", type=_positive, nargs="+", required=True,
                   help="thread counts timed (each capped to the cores)")
    s.add_argument("--out", required=True, help="results/writeback/quantisation_speed.csv (a .md beside it)")
    s.set_defaults(run=quantisation_speed)

    s = sub.add_parser("speed-plot", help="the speed table as bars with their spread (no timing)")
    provenance.add_arguments(s)
    s.add_argument("--table", required=True, help="results/writeback/speed.csv")
    s.add_argument("--out", required=True, help="results/writeback/speed.png")
    s.set_defaults(run=speed_plot)
    return p

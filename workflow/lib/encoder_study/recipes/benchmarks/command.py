"""`encoder-study benchmarks encoders|retrieval`: the encoders against the machine's matrix-multiply rate
and against their references, one table (library: encoder_study.recipes.benchmarks.benchmarks); the
retrieval graph, float32 and int8, in texts and tokens per second (benchmarks.retrieval).

    encoder-study benchmarks encoders --model-dir results/models/minilm \\
        --source results/sources/minilm/source.json --threads 2 --batch 8 --seq-len 128 --rows 24 \\
        --length 32 --docs 64 --seed 0 --min-seconds 2 --out results/benchmarks/encoders.csv \\
        --provenance provenance/benchmarks/benchmarks_encoders.md
    encoder-study benchmarks retrieval --model-dir results/retrieval/model \\
        --table results/retrieval/quantisation.csv --texts results/texts/parity_texts.jsonl --batch 8 \\
        --thread-counts 1 2 --min-seconds 2 --out results/benchmarks/retrieval.csv --provenance P
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ... import provenance


def encoders(args) -> int:
    from ...core import files, machine
    from ...core.tables import csv_text
    from ...onnx import manifest
    from . import benchmarks

    threads = machine.torch_threads(args.threads)
    out, markdown_path = Path(args.out), Path(args.out).with_suffix(".md")
    with provenance.Fragment(args.provenance, provenance.settings(args, ("run",)), threads=threads) as frag:
        frag.inputs += [args.source, *(Path(args.model_dir) / name for name in manifest.MODEL_FILES),
                        Path(args.model_dir) / manifest.MANIFEST]
        before = machine.load_average()
        rows = benchmarks.encoders(args.model_dir, args.source, threads, args.batch, args.seq_len, args.rows,
                                   args.length, args.docs, args.seed, args.min_seconds)
        files.write_text(out, csv_text(rows, benchmarks.COLUMNS))
        markdown = benchmarks.markdown(rows)
        summary = benchmarks.summary(rows)
        files.write_text(markdown_path,
                         markdown + "\n## Summary\n\n" + "".join(f"- {line}\n" for line in summary))
        frag.outputs += [out, markdown_path]
        frag.table("Encoder benchmarks", markdown)
        frag.note(f"{threads} thread(s); every cell the median of at least {args.min_seconds:g} s of calls, "
                  f"the paths of a part taking turns; load average (1, 5, 15 min) before: {before}, after: "
                  f"{machine.load_average()}. Timings are this machine's; each row reads its rate against "
                  "the GEMM probe measured beside it (gemm_gflops).")
        for line in summary:
            frag.note(line)
            print(f"benchmarks: {line}")
    return 0


def retrieval(args) -> int:
    from ...core import machine, tables
    from ...encoders.compare import read_texts
    from ...onnx.manifest import ONNX_FILE
    from . import retrieval as timing

    counts = sorted({machine.usable_threads(n) for n in args.thread_counts})
    recorded = provenance.settings(args, ("run",))
    with provenance.Fragment(args.provenance, recorded, threads=max(counts)) as frag:
        frag.inputs += [args.table, args.texts, Path(args.model_dir) / ONNX_FILE]
        gated = tables.read_csv(args.table)[0]  # the variant's columns repeat on every row
        texts = [r["text"] for r in read_texts(args.texts)]
        before = machine.load_average()
        rows = timing.retrieval_rows(args.model_dir, gated, texts, args.batch, counts, args.min_seconds)
        out, markdown_path, markdown = timing.write(rows, args.out)
        frag.outputs += [out, markdown_path]
        frag.table("Retrieval graph: float32 and int8", markdown)
        frag.note(f"{len(texts)} parity texts in batches of {args.batch}, all three outputs a run; threads "
                  f"{', '.join(map(str, counts))}; every cell the median of at least {args.min_seconds:g} s "
                  "of passes, the graphs taking turns beside the GEMM probe; the int8 graph made again and "
                  "checked "
                  f"against the SHA-256 {args.table} measured; load average (1, 5, 15 min) before: {before}, "
                  f"after: {machine.load_average()}. Counted work: the encoder's, no padding.")
        for r in rows:
            line = (f"retrieval at {r['threads']} thread(s): float32 {r['float32_tok_s']:,.0f} tok/s, int8 "
                    f"{r['int8_tok_s']:,.0f} tok/s ({r['ratio']:.2f}x)")
            frag.note(line)
            print(f"benchmarks: {line}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="encoder-study benchmarks", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="subcommand", required=True)
    e = sub.add_parser("encoders", help="time the encoders' paths against the GEMM probe")
    provenance.add_arguments(e)
    e.set_defaults(run=encoders)
    e.add_argument("--model-dir", required=True, help="results/models/<model>")
    e.add_argument("--source", required=True, help="results/sources/<model>/source.json")
    e.add_argument("--threads", type=int, required=True)
    e.add_argument("--batch", type=int, required=True, help="sequences of the fixed-shape part")
    e.add_argument("--seq-len", type=int, required=True, help="pieces per sequence of the fixed-shape part")
    e.add_argument("--rows", type=int, required=True, help="sequences of the step")
    e.add_argument("--length", type=int, required=True, help="pieces per sequence of the step")
    e.add_argument("--docs", type=int, required=True, help="synthetic sentences of the frozen and word parts")
    e.add_argument("--seed", type=int, required=True)
    e.add_argument("--min-seconds", type=float, required=True, help="at least this much work per cell")
    e.add_argument("--out", required=True, help="results/benchmarks/encoders.csv (a .md beside it)")

    r = sub.add_parser("retrieval", help="the retrieval graph, float32 and int8, against the GEMM probe")
    provenance.add_arguments(r)
    r.set_defaults(run=retrieval)
    r.add_argument("--model-dir", required=True, help="results/retrieval/model (the float32 graph)")
    r.add_argument("--table", required=True, help="results/retrieval/quantisation.csv (what was gated)")
    r.add_argument("--texts", required=True, help="results/texts/parity_texts.jsonl")
    r.add_argument("--batch", type=int, required=True, help="texts per run, padded to the longest")
    r.add_argument("--thread-counts", type=int, nargs="+", required=True, help="each capped to the cores")
    r.add_argument("--min-seconds", type=float, required=True, help="at least this much work per cell")
    r.add_argument("--out", required=True, help="results/benchmarks/retrieval.csv (a .md beside it)")
    return p

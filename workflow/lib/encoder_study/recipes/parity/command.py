"""`encoder-study parity fetch|select|compare|latency|table`: the parity recipe's commands.

    encoder-study parity fetch --url URL --sha256 HEX --timeout 60 --out results/texts/sources/udhr.zip ...
    encoder-study parity select --tatoeba T --tatoeba-sha256 '' --udhr U --udhr-sha256 '' --seed 0 \\
        --tatoeba-count 150 --udhr-count 50 --max-chars 400 --languages '' \\
        --out results/texts/parity_texts.jsonl --provenance provenance/parity/parity_select.md
    encoder-study parity compare --model-dir results/models/minilm \\
        --source results/sources/minilm/source.json --texts results/texts/parity_texts.jsonl --threads 2 \\
        --inference-out results/parity/inference/minilm.csv --diffs results/parity/inference/minilm.npy \\
        --trainable-out results/parity/trainable/minilm.csv ...
    encoder-study parity latency --model results/models/minilm results/sources/minilm/source.json \\
        --out results/parity/latency/minilm.csv --model D2 S2 --out O2 --threads 8 --batches 1,8 \\
        --seq-len 64 --warmup 3 --runs 20 --min-seconds 2 ...
    encoder-study parity table --kind inference --out results/parity/inference.csv \\
        --markdown results/parity/inference.md --plot results/parity/inference.png ... PARTS...

Every option is required (or, like --plot, only for the table that has it): the workflow's config
schema holds the defaults and the rules pass every value. The logic lives in
`encoder_study.data.texts` (fetch, select), `encoder_study.recipes.parity.parity` (one model's rows) and
`encoder_study.recipes.parity.parity_tables` (the tables, their Markdown and the plot).
"""

from __future__ import annotations

import argparse

from ... import provenance


def parser() -> argparse.ArgumentParser:
    """`encoder-study parity ...`: the parity texts, ONNX Runtime against PyTorch, latency, the tables."""
    top = argparse.ArgumentParser(prog="encoder-study parity", description=parser.__doc__)
    sub = top.add_subparsers(dest="subcommand", required=True)
    _add_text_commands(sub)
    _add_model_commands(sub)
    p = sub.add_parser("table", help="gather per-model rows into a table, its Markdown (and the plot)")
    provenance.add_arguments(p)
    p.set_defaults(run=table)
    p.add_argument("--kind", choices=["inference", "trainable", "latency"], required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--markdown", required=True)
    p.add_argument("--plot", help="PNG: inference, per-token differences; latency, bars with their spread")
    p.add_argument("parts", nargs="+", help="per-model CSVs (and, for inference, their .npy beside them)")
    return top


def _add_text_commands(sub) -> None:
    """fetch and select: the parity texts."""
    p = sub.add_parser("fetch", help="fetch a text source (URL, file:// URL or path) to a file")
    provenance.add_arguments(p)
    p.set_defaults(run=fetch)
    p.add_argument("--url", required=True, help="e.g. Tatoeba's sentences.tar.bz2 or the UDHR's udhr_xml.zip")
    p.add_argument("--sha256", required=True, help="pinned SHA-256; empty: record it instead")
    p.add_argument("--out", required=True, help="the local file to write")
    p.add_argument("--timeout", type=float, required=True, help="seconds without data, then give up")

    p = sub.add_parser("select", help="select the parity texts from Tatoeba and the UDHR")
    provenance.add_arguments(p)
    p.set_defaults(run=select)
    p.add_argument("--tatoeba", required=True,
                   help="sentences.tar.bz2 or sentences.csv (a path or file:// URL)")
    p.add_argument("--tatoeba-sha256", required=True, help="pinned SHA-256; empty: record it")
    p.add_argument("--udhr", required=True, help="udhr_xml.zip or a directory of udhr_<key>.xml files")
    p.add_argument("--udhr-sha256", required=True,
                   help="pinned SHA-256 (of a directory: files.tree_sha256); empty: record it")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--tatoeba-count", type=int, required=True)
    p.add_argument("--udhr-count", type=int, required=True)
    p.add_argument("--max-chars", type=int, required=True, help="cut texts to this many code points")
    p.add_argument("--languages", required=True,
                   help="comma-separated ISO 639-3 codes to draw from; empty: every registered language")
    p.add_argument("--out", required=True, help="results/texts/parity_texts.jsonl")


def _add_model_commands(sub) -> None:
    """compare: one model's rows of the inference and trainable tables; latency: each model's rows, in one
    process."""
    p = sub.add_parser("compare", help="ONNX Runtime and the trainable modules against PyTorch, one model, "
                                       "every token: the inference and trainable tables' rows")
    provenance.add_arguments(p)
    p.set_defaults(run=compare)
    p.add_argument("--model-dir", required=True, help="results/models/<model>")
    p.add_argument("--source", required=True, help="results/sources/<model>/source.json")
    p.add_argument("--texts", required=True, help="results/texts/parity_texts.jsonl")
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--inference-out", required=True, help="the model's CSV row of the inference table")
    p.add_argument("--diffs", required=True, help=".npy of per-token max abs differences")
    p.add_argument("--trainable-out", required=True, help="the model's CSV rows of the trainable table")
    # One process for every model: one start, one import of transformers, one GEMM probe calibration.
    p = sub.add_parser("latency", help="time both runtimes on the same inputs, each model in turn")
    provenance.add_arguments(p)
    p.set_defaults(run=latency)
    p.add_argument("--model", nargs=2, action="append", required=True, metavar=("MODEL_DIR", "SOURCE_JSON"),
                   help="results/models/<m> results/sources/<m>/source.json; repeat for more models")
    p.add_argument("--out", action="append", required=True,
                   help="each model's CSV rows, in the order of --model (one --out per --model)")
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--batches", required=True, help="comma-separated batch sizes, e.g. 1,8")
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--runs", type=int, required=True, help="at least this many calls per cell")
    p.add_argument("--min-seconds", type=float, required=True,
                   help="at least this many seconds of calls per cell (and for the GEMM probe)")


def fetch(args) -> int:
    from ...core import files
    from ...data import fetch as fetching

    with provenance.Fragment(args.provenance, provenance.settings(args)) as frag:
        path = files.local_path(args.url)
        if path is not None:
            frag.inputs.append(path)
        digest = fetching.text_source(args.url, args.out, args.sha256, args.timeout)
        frag.outputs.append(args.out)
        if files.pinned(args.sha256):  # a bad pin: refused by text_source above
            frag.note(f"{args.url}: SHA-256 {digest} (pinned and checked)")
        else:
            frag.note(f"{args.url}: SHA-256 {digest} (recorded, not pinned: put it in the config to make "
                      "the next run check it)")
    print(f"encoder-study parity fetch: {args.url} -> {args.out} (SHA-256 {digest})")
    return 0


def select(args) -> int:
    from . import selection

    languages = [c.strip() for c in args.languages.split(",") if c.strip()] or None
    chosen = selection.choose({"tatoeba": args.tatoeba, "udhr": args.udhr},
                              {"tatoeba": args.tatoeba_sha256, "udhr": args.udhr_sha256},
                              {"tatoeba": args.tatoeba_count, "udhr": args.udhr_count},
                              args.seed, args.max_chars, languages)
    records = chosen.selection.records
    with provenance.Fragment(args.provenance, provenance.settings(args)) as frag:
        frag.inputs += chosen.inputs
        selection.write_jsonl(args.out, records)
        frag.outputs.append(args.out)
        frag.table("Texts per language and script", selection.counts_table(records))
        frag.table("Texts per script", selection.scripts_table(records))
        # Odd source files are read or skipped, never fatal; this table says which and why.
        frag.table("Source anomalies", selection.anomalies_table(chosen.anomalies))
        for note in chosen.notes:
            frag.note(note)
    print(f"encoder-study parity select: wrote {len(records)} texts to {args.out}; "
          f"{len(chosen.anomalies)} source anomalies listed in {args.provenance}")
    return 0


def compare(args) -> int:
    from ...core import machine
    from . import parity

    threads = machine.usable_threads(args.threads)
    with provenance.Fragment(args.provenance, provenance.settings(args), threads=threads) as frag:
        frag.add(parity.compare_rows(args.model_dir, args.source, args.texts, threads,
                                          args.inference_out, args.diffs, args.trainable_out))
    return 0


def latency(args) -> int:
    from ...core import machine
    from ...core.errors import UserError
    from . import parity

    if len(args.out) != len(args.model):
        raise UserError(f"parity latency: {len(args.model)} --model but {len(args.out)} --out; give one "
                        "--out per --model, in the same order")
    threads = machine.usable_threads(args.threads)
    batches = tuple(int(b) for b in args.batches.split(","))
    models = [(model_dir, source, out) for (model_dir, source), out in zip(args.model, args.out, strict=True)]
    with provenance.Fragment(args.provenance, provenance.settings(args), threads=threads) as frag:
        frag.add(parity.latency_rows(models, threads, batches, args.seq_len, args.warmup, args.runs,
                                          args.min_seconds))
    return 0


def table(args) -> int:
    from . import parity_tables

    with provenance.Fragment(args.provenance, provenance.settings(args), threads=1) as frag:
        frag.add(parity_tables.gather(args.kind, args.parts, args.out, args.markdown, args.plot))
    return 0

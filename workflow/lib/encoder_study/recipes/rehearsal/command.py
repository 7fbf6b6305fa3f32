"""`encoder-study rehearsal streams|resources`: the rehearsal's commands (config/rehearsal.yaml).

    encoder-study rehearsal streams --documents 4 --words 300 --seed 0 \\
        --streams '[{"dataset": "HuggingFaceFW/fineweb-2", "local": "results/rehearsal/streams/...", ...}]' \\
        --provenance provenance/rehearsal/rehearsal_streams.md
    encoder-study rehearsal resources --requests '{"export_model": {"mem_mb": 24000, "runtime": 60}, ...}' \\
        --provenance-root provenance --benchmarks results/benchmarks --margin 1.5 --below-margin warn \\
        --config-name config/paper.yaml --out results/rehearsal/resources.csv \\
        --markdown results/rehearsal/resources.md --provenance provenance/rehearsal/rehearsal_resources.md

`resources` writes the table, then exits with status 2, naming each rule and the key to raise, when a
rule's mem_mb is below its measured peak. The logic lives in `encoder_study.recipes.rehearsal`.
"""

from __future__ import annotations

import argparse
import json
import sys

from ... import provenance


def parser() -> argparse.ArgumentParser:
    """`encoder-study rehearsal ...`: stand-in corpora, and resources from what the run measured."""
    top = argparse.ArgumentParser(prog="encoder-study rehearsal", description=parser.__doc__)
    sub = top.add_subparsers(dest="subcommand", required=True)

    p = sub.add_parser("streams", help="write the stand-ins of the streamed corpora (JSONL rows)")
    provenance.add_arguments(p)
    p.set_defaults(run=streams)
    p.add_argument("--streams", type=json.loads, required=True,
                   help="student.corpus.streams as JSON, each with its `local` directory")
    p.add_argument("--documents", type=int, required=True, help="documents per language")
    p.add_argument("--words", type=int, required=True, help="words per document")
    p.add_argument("--seed", type=int, required=True)

    p = sub.add_parser("resources", help="measured peaks and times beside the config's requests; check them")
    provenance.add_arguments(p)
    p.set_defaults(run=resources)
    p.add_argument("--requests", type=json.loads, required=True,
                   help="JSON: rule -> {mem_mb, runtime}, the config's resources with the default filled in")
    p.add_argument("--provenance-root", required=True, help="provenance/: the fragments' twins")
    p.add_argument("--benchmarks", required=True, help="results/benchmarks: Snakemake's benchmark files")
    p.add_argument("--margin", type=float, required=True, help="the suggested mem_mb is the peak times this")
    p.add_argument("--below-margin", choices=["warn", "fail"], required=True,
                   help="a request that holds its peak but not the margin: a warning, or a refusal")
    p.add_argument("--config-name", required=True, help="where the requests come from, for the messages")
    p.add_argument("--out", required=True, help="results/rehearsal/resources.csv")
    p.add_argument("--markdown", required=True, help="results/rehearsal/resources.md")
    return top


def streams(args) -> int:
    from .. import rehearsal

    with provenance.Fragment(args.provenance, provenance.settings(args)) as frag:
        frag.outputs += rehearsal.write_streams(args.streams, args.documents, args.words, args.seed)
    return 0


def resources(args) -> int:
    from .. import rehearsal
    from . import resources as measured

    with provenance.Fragment(args.provenance, provenance.settings(args, ("requests",))) as frag:
        rows = measured.resources(args.requests, args.provenance_root, args.benchmarks, args.margin)
        measured.write(rows, args.out, args.markdown, args.margin)
        frag.outputs += [args.out, args.markdown]
        text = measured.markdown(rows, args.margin)
        frag.table("Resources", text)
        print(text)
        problems = measured.check(rows, args.config_name)
        if problems:
            raise rehearsal.RehearsalError("requests below the measured peaks (the table is in "
                                           f"{args.out}):\n" + "\n".join(problems))
        short = measured.below_margin(rows, args.margin, args.config_name)
        if short and args.below_margin == "fail":
            raise rehearsal.RehearsalError("requests below the configured margin (rehearsal.below_margin: "
                                           f"fail; the table is in {args.out}):\n" + "\n".join(short))
        for line in short:
            print(f"WARNING: {line}", file=sys.stderr)
            frag.note(f"below the margin: {line}")
    return 0

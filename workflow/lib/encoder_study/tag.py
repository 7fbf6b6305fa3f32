"""`encoder-study tag train|baseline|step-time|gather`: the tagging rules' commands.

    encoder-study tag train --run minilm-frozen-mean --model-dir results/models/minilm --mode frozen \\
        --pooling mean --train T --dev D --test E --out-dir results/tagging/minilm-frozen-mean \\
        --provenance provenance/en-tagging/tag_train-minilm-frozen-mean.md
    encoder-study tag baseline --run baseline --train T --dev D --test E \\
        --out-dir results/tagging/baseline ...
    encoder-study tag step-time --model results/models/minilm results/sources/minilm/source.json \\
        --out results/tagging/step_time.csv ...
    encoder-study tag gather --run-dir results/tagging/a --run-dir results/tagging/b \\
        --gold dev=D --gold test=E --compare a:b --scores-out results/tagging/scores.csv \\
        --comparisons-out results/tagging/comparisons.csv --plot results/tagging/dev_curves.png ...

`train` in chunks: with `--chunk-steps K` a run stops after K steps, writes its checkpoint and exits
with status 75 (EX_TEMPFAIL, "try again"); running the same command again resumes it, and the run
that finishes gives exactly the outputs one uninterrupted run gives. See encoder_study.tagging.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from . import files, manifest, provenance
from .frozen import EncoderError
from .tagging import evaluate
from .tagging.pipeline import PipelineError
from .tagging.steptime import StepTimeError
from .tagging.train import CheckpointError

# Errors with a message meant for the user; anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, EncoderError, manifest.ManifestError, files.IntegrityError, PipelineError,
               StepTimeError, CheckpointError)

CHUNK_EXIT = 75  # EX_TEMPFAIL from sysexits.h: not finished, run again


def _threads(value: int) -> int:
    return max(1, min(value, os.cpu_count() or 1))


def _train_parser(sub) -> None:
    p = sub.add_parser("train", help="train a tagger (frozen or fine-tuned encoder), score dev and test once")
    provenance.add_arguments(p)
    p.add_argument("--run", required=True, help="the run's name in the tables")
    p.add_argument("--model-dir", required=True, help="results/models/<model> (an export)")
    p.add_argument("--mode", required=True, choices=["frozen", "finetuned"])
    p.add_argument("--pooling", default="mean", choices=["mean", "first"])
    for split in ("train", "dev", "test"):
        p.add_argument(f"--{split}", required=True, help=f"the {split} split, CoNLL-U")
    p.add_argument("--out-dir", required=True, help="results/tagging/<run>")
    p.add_argument("--checkpoint", help="where chunks are saved (default: <out-dir>/checkpoint.pt); "
                                        "keep it outside a directory the workflow deletes on failure")
    p.add_argument("--chunk-steps", "--max-steps-per-chunk", type=int, default=0,
                   help="stop after this many steps, save, exit 75; 0: run to the end")
    g = p.add_argument_group("training (defaults depend on --mode: see tagging.train.MODE_DEFAULTS)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--lr", type=float, help="frozen 1e-3, finetuned 5e-5")
    g.add_argument("--weight-decay", type=float, default=0.01)
    g.add_argument("--epochs", type=int, help="frozen 10, finetuned 1; 0: no limit by epochs")
    g.add_argument("--max-steps", type=int, help="default 0: no limit by steps; given without --epochs, "
                                                 "the steps alone decide")
    g.add_argument("--warmup", type=int, help="linear warm-up steps: frozen 0, finetuned 40")
    g.add_argument("--batch-words", type=int, default=500)
    g.add_argument("--eval-every", type=int, help="steps between dev evaluations; 0: every epoch "
                                                  "(frozen 0, finetuned 50)")
    g.add_argument("--eval-batch-words", type=int, default=2000)
    g.add_argument("--clip", type=float, default=1.0, help="gradient norm clip; 0: none")
    g.add_argument("--threads", type=int, default=1)
    e = p.add_argument_group("encoder")
    e.add_argument("--max-length", type=int, default=512, help="pieces per window, specials included")
    e.add_argument("--window-batch", type=int, default=8, help="frozen: windows per ONNX Runtime call")
    e.add_argument("--max-batch-pieces", type=int, default=8192, help="finetuned: padded pieces per batch")
    e.add_argument("--train-embeddings", action="store_true",
                   help="finetuned: train the token table too (it is then saved in the pipeline)")
    s = p.add_argument_group("scoring")
    s.add_argument("--resamples", type=int, default=evaluate.RESAMPLES)
    s.add_argument("--bootstrap-seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def _train(args) -> int:
    from .tagging import runs
    from .tagging.train import ChunkDone, TrainSettings

    threads = _threads(args.threads)
    settings = TrainSettings.for_mode(
        args.mode, seed=args.seed, lr=args.lr, weight_decay=args.weight_decay, epochs=args.epochs,
        max_steps=args.max_steps, warmup=args.warmup, batch_words=args.batch_words,
        eval_every=args.eval_every, eval_batch_words=args.eval_batch_words, clip=args.clip, threads=threads)
    options = runs.EncoderOptions(max_length=args.max_length, window_batch=args.window_batch,
                                  max_batch_pieces=args.max_batch_pieces,
                                  freeze_embeddings=not args.train_embeddings)
    paths = {"train": args.train, "dev": args.dev, "test": args.test}
    model_dir = Path(args.model_dir)
    # The settings table shows what training used: the mode's defaults replace the arguments not given.
    shown = {**provenance.settings(args, ("no_progress",)), **vars(settings)}
    try:
        with provenance.Fragment(args.provenance, shown, threads=threads) as frag:
            frag.inputs += [*paths.values(), *(model_dir / n for n in (
                manifest.ONNX_FILE, manifest.TOKENIZER_FILE, manifest.CONFIG_FILE, manifest.MANIFEST))]
            done = runs.train_run(args.run, model_dir, args.pooling, paths, args.out_dir, settings, options,
                                  checkpoint=args.checkpoint, chunk_steps=args.chunk_steps,
                                  resamples=args.resamples, bootstrap_seed=args.bootstrap_seed,
                                  progress=not args.no_progress)
            frag.outputs += done.outputs
            frag.table("Scores", evaluate.scores_markdown(done.rows))
            frag.table("Development history", provenance.markdown_table(
                ["step", "epoch", "train loss", "dev UPOS"],
                [(h["step"], f"{h['epoch']:.2f}", f"{h['train_loss']:.4f}", f"{h['dev_upos']:.2f}")
                 for h in done.result.history], "rrrr"))
            result = done.result
            frag.note(f"selected step {result.best_step} of {result.steps} (development UPOS "
                      f"{result.best_dev_upos:.2f}); the test split was scored once, with those weights")
            chunks = ", ".join(f"steps {c['first_step']}-{c['last_step']} in {c['seconds']:.1f} s"
                               for c in result.chunks)
            frag.note(f"trained in {len(result.chunks)} invocation(s): {chunks or 'none (resumed finished)'}")
            if not done.record["dev_upos_check"]:
                frag.note("WARNING: the development score of the written predictions differs from the one "
                          "that selected the weights")
    except ChunkDone as chunk:
        print(f"encoder-study tag train: {args.run}: {chunk}", file=sys.stderr)
        return CHUNK_EXIT
    for row in done.rows:
        print(f"{args.run}: {row['split']} UPOS {row['upos']:.2f} "
              f"[{row['ci_low']:.2f}, {row['ci_high']:.2f}]")
    return 0


def _baseline(args) -> int:
    from .tagging import runs

    paths = {"train": args.train, "dev": args.dev, "test": args.test}
    with provenance.Fragment(args.provenance, provenance.settings(args)) as frag:
        frag.inputs += list(paths.values())
        rows, outputs = runs.baseline_run(args.run, paths, args.out_dir, args.resamples, args.bootstrap_seed)
        frag.outputs += outputs
        frag.table("Scores", evaluate.scores_markdown(rows))
        frag.note("most frequent UPOS of each form in train; an unseen form gets the most frequent tag of "
                  "train (ties: the alphabetically first tag)")
    return 0


def _step_time(args) -> int:
    import torch

    from .tagging import steptime

    threads = _threads(args.threads)
    torch.set_num_threads(threads)
    with provenance.Fragment(args.provenance, provenance.settings(args), threads=threads) as frag:
        rows = []
        for model_dir, source in args.model:
            frag.inputs += [source, *(Path(model_dir) / n for n in (manifest.ONNX_FILE, manifest.MANIFEST))]
            rows += steptime.step_time(model_dir, source, batch=args.batch, length=args.length,
                                       warmup=args.warmup, steps=args.steps, lr=args.lr, seed=args.seed)
        from .parity import csv_text  # the parity tables' writer: repr floats, fixed columns

        files.write_text(args.out, csv_text(rows, steptime.COLUMNS))
        markdown = steptime.markdown(rows)
        files.write_text(Path(args.out).with_suffix(".md"), markdown)
        frag.outputs += [args.out, Path(args.out).with_suffix(".md")]
        frag.table("Fine-tuning step", markdown)
        frag.note(f"median of {args.steps} steps after {args.warmup} warm-up step(s); batch {args.batch} x "
                  f"{args.length} pieces; AdamW lr {args.lr}; token table frozen in both; indicative timings")
    return 0


def _pair(text: str) -> tuple[str, str]:
    a, sep, b = text.partition(":")
    if not sep or not a or not b:
        raise argparse.ArgumentTypeError(f"{text!r}: give a comparison as RUN_A:RUN_B")
    return a, b


def _gold(text: str) -> tuple[str, str]:
    split, sep, path = text.partition("=")
    if not sep or not split or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: give a gold file as SPLIT=PATH")
    return split, path


def _gather(args) -> int:
    from .tagging import runs

    with provenance.Fragment(args.provenance, provenance.settings(args)) as frag:
        gathered = runs.gather(args.run_dir, dict(args.gold), args.compare, args.scores_out,
                               args.comparisons_out, args.plot, args.reference, args.resamples, args.seed)
        frag.inputs += gathered.inputs
        frag.outputs += gathered.outputs
        frag.table("Scores", evaluate.scores_markdown(gathered.scores))
        if gathered.comparisons:
            frag.table("Comparisons (a - b, paired bootstrap over sentences)",
                       evaluate.comparisons_markdown(gathered.comparisons))
    return 0


def main(argv: list[str] | None = None) -> int:
    """`encoder-study tag train|baseline|step-time|gather ...`: UPOS tagging runs and their tables."""
    parser = argparse.ArgumentParser(prog="encoder-study tag", description=main.__doc__)
    sub = parser.add_subparsers(dest="action", required=True)
    _train_parser(sub)

    p = sub.add_parser("baseline", help="the most-frequent-tag baseline: dev and test predictions and scores")
    provenance.add_arguments(p)
    p.add_argument("--run", default="baseline")
    for split in ("train", "dev", "test"):
        p.add_argument(f"--{split}", required=True)
    p.add_argument("--out-dir", required=True, help="results/tagging/<run>")
    p.add_argument("--resamples", type=int, default=evaluate.RESAMPLES)
    p.add_argument("--bootstrap-seed", type=int, default=0)

    p = sub.add_parser("step-time", help="one fine-tuning step in parts: ours against transformers")
    provenance.add_arguments(p)
    p.add_argument("--model", nargs=2, action="append", required=True, metavar=("MODEL_DIR", "SOURCE_JSON"),
                   help="results/models/<m> results/sources/<m>/source.json; repeat for more models")
    p.add_argument("--out", required=True, help="results/tagging/step_time.csv (a .md is written beside it)")
    p.add_argument("--batch", type=int, default=24)
    p.add_argument("--length", type=int, default=32)
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--steps", type=int, default=5, help="timed steps (medians are reported)")
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)

    p = sub.add_parser("gather", help="joined scores, paired comparisons and the development plot")
    provenance.add_arguments(p)
    p.add_argument("--run-dir", action="append", required=True, help="results/tagging/<run>; repeat")
    p.add_argument("--gold", type=_gold, action="append", default=[],
                   help="SPLIT=PATH of a gold file; repeat")
    p.add_argument("--compare", type=_pair, action="append", default=[], help="RUN_A:RUN_B (a - b); repeat")
    p.add_argument("--reference", action="append", default=[],
                   help="a run whose dev score the plot draws as a dashed line; repeat")
    p.add_argument("--scores-out", required=True, help="results/tagging/scores.csv (+ .md)")
    p.add_argument("--comparisons-out", help="results/tagging/comparisons.csv (+ .md)")
    p.add_argument("--plot", help="PNG of development UPOS against step")
    p.add_argument("--resamples", type=int, default=evaluate.RESAMPLES)
    p.add_argument("--seed", type=int, default=0)

    args = parser.parse_args(argv)
    action = {"train": _train, "baseline": _baseline, "step-time": _step_time, "gather": _gather}[args.action]
    try:
        return action(args)
    except USER_ERRORS as err:
        print(f"encoder-study tag {args.action}: error: {err}", file=sys.stderr)
        return 2

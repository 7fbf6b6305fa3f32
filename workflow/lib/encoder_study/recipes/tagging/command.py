"""`encoder-study tagging treebank|ood|fetch|train|baseline|spacy-fetch|spacy|tables|per-tag|step-time|
predict`.

    encoder-study tagging treebank --seed 0 --train 1500 --dev 300 --test 300 --out-dir results/treebank ...
    encoder-study tagging ood --name ood --seed 0 --sentences 200 --out results/treebank/ood.conllu ...
    encoder-study tagging fetch --split dev --url URL --sha256 HEX --timeout 60 \\
        --out results/treebank/dev.conllu ...
    encoder-study tagging train --run minilm-frozen-mean --model-dir results/models/minilm --mode frozen \\
        --pooling mean --train T --dev D --test E [--extra pud=P ...] \\
        --out-dir results/tagging/minilm-frozen-mean \\
        --checkpoint results/tagging/checkpoints/minilm-frozen-mean.pt --chunk-steps 0 --optimizer lbfgs \\
        --lr 1 --patience 10 --device auto --precision fp32 ... \\
        --provenance provenance/tagging/tagging_train-minilm-frozen-mean.md
    encoder-study tagging baseline --run baseline --train T --dev D --test E \\
        --out-dir results/tagging/baseline ...
    encoder-study tagging spacy-fetch --url URL --sha256 HEX --timeout 60 \\
        --out results/tagging/spacy-packages/spacy-en-core-web-sm.whl ...
    encoder-study tagging spacy --run spacy --source train --config config/spacy/tagger.cfg --seed 0 \\
        --train T --dev D --test E [--extra ood=O ...] --out-dir results/tagging/spacy --batch-size 256 ...
    encoder-study tagging spacy --run spacy-en-core-web-sm --source package --wheel W \\
        --package en_core_web_sm --version 3.8.0 --dev D --test E ... --out-dir ... ...
    encoder-study tagging tables --run-dir results/tagging/a --run-dir results/tagging/b \\
        --gold dev=D --gold test=E --compare a:b --scores-out results/tagging/scores.csv \\
        --comparisons-out results/tagging/comparisons.csv --plot results/tagging/dev_upos.png \\
        --scores-plot results/tagging/scores.png --comparisons-plot results/tagging/comparisons.png ...
    encoder-study tagging per-tag --run-dir results/tagging/a ... --scores results/tagging/scores.csv \\
        --split test --gold results/treebank/test.conllu --out results/tagging/per_tag.csv \\
        --plot results/tagging/per_tag.png ...
    encoder-study tagging step-time --model results/models/minilm results/sources/minilm/source.json \\
        --out results/tagging/step_time.csv --device auto ...
    encoder-study tagging predict --pipeline results/tagging/minilm-finetuned-mean/pipeline.safetensors \
        --input new.conllu --out new.pred.conllu [--format text] [--score]

Every option is required (or a flag): the workflow's config schema holds the defaults and the rules
pass every value. `predict` is the exception: no rule calls it, it is for users tagging their own
files, so its conveniences (batch size, threads, resamples) have defaults, stated in its help.
`train` saves its checkpoint every `--chunk-steps` steps and resumes from it when
it exists, so rerunning the same command after a crash (Snakemake's `retries`) goes on from the last
save and ends bit for bit where an uninterrupted run ends. The logic lives in `encoder_study.recipes.tagging`
(runs, training, scoring, step time) and `encoder_study.data` (the treebanks).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from ... import provenance
from ...core import files, settings
from ...core.errors import UserError
from ...data import SPLITS
from . import options
from .options import extras
from .settings import Bootstrap, Training


def _settings(args, *skip: str) -> dict:
    """The fragment's settings table: the arguments, without the subcommand's function; a group of
    settings (the bootstrap) under its one name."""
    return settings.recorded(provenance.settings(args, ("run", *skip)), Bootstrap, "bootstrap")


def _bootstrap(args) -> Bootstrap:
    return settings.from_args(Bootstrap, args, "bootstrap")


def parser() -> argparse.ArgumentParser:
    """`encoder-study tagging ...`: the treebank, UPOS tagging runs, their tables and the step time."""
    top = argparse.ArgumentParser(prog="encoder-study tagging", description=parser.__doc__)
    options.add_subcommands(top.add_subparsers(dest="subcommand", required=True), {
        "treebank": treebank, "ood": ood, "fetch": fetch, "train": train, "baseline": baseline,
        "spacy-fetch": spacy_fetch, "spacy": spacy, "tables": tables, "per-tag": per_tag,
        "step-time": step_time, "predict": predict})
    return top



def _run(args, stage, threads: int | None = None) -> int:
    """Run a stage (a function returning `provenance.Done`) inside the job's fragment, record what it
    did, print its lines."""
    with provenance.Fragment(args.provenance, _settings(args), threads=threads) as frag:
        done = frag.add(stage())
    for line in done.said:
        print(line)
    return 0


def treebank(args) -> int:
    from . import treebanks

    sizes = {"train": args.train, "dev": args.dev, "test": args.test}
    return _run(args, lambda: treebanks.synthetic(args.out_dir, args.seed, sizes))


def ood(args) -> int:
    from . import treebanks

    return _run(args, lambda: treebanks.ood(args.out, args.seed, args.sentences, args.name))


def fetch(args) -> int:
    from . import treebanks

    return _run(args, lambda: treebanks.fetch(args.split, args.url, args.out, args.sha256, args.timeout))


def train(args) -> int:
    from ...core import machine
    from ...encoders.trainable.harness import resolve_device
    from ...onnx import manifest
    from . import runs
    from .train import TrainSettings

    threads = machine.usable_threads(args.threads)
    device = resolve_device(args.device).type  # before anything starts CUDA
    given = dataclasses.asdict(settings.from_args(Training, args))
    train_settings = TrainSettings(**{**given, "threads": threads, "device": device})
    options = runs.EncoderOptions(max_length=args.max_length, window_batch=args.window_batch,
                                  max_batch_pieces=args.max_batch_pieces,
                                  freeze_embeddings=not args.train_embeddings)
    paths = {**{split: getattr(args, split) for split in SPLITS}, **extras(args.extra)}
    model_dir = Path(args.model_dir)
    inputs = [*paths.values(), *(model_dir / n for n in manifest.EXPORT_FILES)]

    def stage():
        done = runs.train_run(args.run_name, model_dir, args.pooling, paths, args.out_dir, train_settings,
                              options, checkpoint=args.checkpoint, chunk_steps=args.chunk_steps,
                              bootstrap=_bootstrap(args), progress=True, task=args.task)
        _report_device(device, train_settings.precision)
        return runs.recorded(args.run_name, done, inputs, device)

    return _run(args, stage, threads)


def _report_device(device: str, precision: str | None = None) -> None:
    """Tell the fragment's device facts (provenance.device) which torch device (and precision) ran."""
    from ...encoders.trainable.harness import describe_device

    provenance.used("torch device", describe_device(device))
    if precision is not None:
        provenance.used("torch precision", precision)


def baseline(args) -> int:
    from . import baseline as baseline_tagger

    paths = {**{split: getattr(args, split) for split in SPLITS}, **extras(args.extra)}
    return _run(args, lambda: baseline_tagger.baseline_run(args.run_name, paths, args.out_dir,
                                                           _bootstrap(args), args.task))


def spacy_fetch(args) -> int:
    from . import spacy_fetch as fetching
    from . import treebanks

    def stage():
        path = files.local_path(args.url)
        sha256, pinned = fetching.fetch_package(args.url, args.sha256, args.out, args.timeout)
        return provenance.Done(inputs=[path] if path is not None else [], outputs=[args.out],
                               notes=[treebanks.download_note(args.url, sha256, pinned)],
                               said=[f"encoder-study tagging spacy-fetch: {args.url} -> {args.out} (SHA-256 "
                                     f"{sha256})"])

    return _run(args, stage)


def _spacy_source(args):
    from . import spacy as spacy_tagger

    needed = {"train": ("config", "seed", "train"), "package": ("wheel", "package", "version")}[args.source]
    if missing := [f"--{name}" for name in needed if getattr(args, name) is None]:
        raise UserError(f"--source {args.source} needs {', '.join(missing)}")
    if args.source == "train":
        settings = {key: value for key, value in (("training.max_steps", args.max_steps),
                                                  ("training.eval_frequency", args.eval_every))
                    if value is not None}
        return spacy_tagger.Source("train", config=args.config, settings=settings)
    return spacy_tagger.Source("package", wheel=args.wheel, package=args.package, version=args.version)


def spacy(args) -> int:
    import sys

    from . import spacy as spacy_tagger

    source = _spacy_source(args)
    paths = {**({"train": args.train} if args.source == "train" else {}), "dev": args.dev, "test": args.test,
             **extras(args.extra)}
    inputs = [*paths.values(), *(p for p in (args.config, args.wheel) if p is not None)]
    return _run(args, lambda: spacy_tagger.recorded(
        args.run_name, source, spacy_tagger.run(args.run_name, source, paths, args.out_dir, args.seed,
                                                args.batch_size, _bootstrap(args), log=sys.stdout),
        inputs, args.seed))


def tables(args) -> int:
    from . import gather

    return _run(args, lambda: gather.gather(args.run_dir, dict(args.gold), args.compare, args.scores_out,
                                            args.comparisons_out, args.plot, args.reference, _bootstrap(args),
                                            args.caption, scores_plot=args.scores_plot,
                                            comparisons_plot=args.comparisons_plot, task=args.task).done)


def per_tag(args) -> int:
    from . import gather

    return _run(args, lambda: gather.per_tag(args.run_dir, args.scores, args.gold, args.split, args.out,
                                             args.plot, args.caption).done)


def step_time(args) -> int:
    from ...core import machine
    from ...encoders.trainable.harness import resolve_device
    from . import steptime

    threads = machine.torch_threads(args.threads)
    device = resolve_device(args.device).type  # before anything starts CUDA

    def stage():
        done = steptime.table(args.model, args.out, batch=args.batch, length=args.length, warmup=args.warmup,
                              steps=args.steps, lr=args.lr, seed=args.seed, min_seconds=args.min_seconds,
                              threads=threads, device=device)
        _report_device(device)
        return done

    return _run(args, stage, threads)


def predict(args) -> int:
    from .predict import predict as tag_file
    from .variants import resolve

    done = tag_file(resolve(args.pipeline, args.variant), args.input, args.out, input_format=args.format,
                    batch_sentences=args.batch_sentences, threads=args.threads,
                    score=_bootstrap(args) if args.score else None)
    rate = done.words / done.seconds if done.seconds > 0 else float("inf")
    print(f"encoder-study tagging predict: {done.sentences} sentences, {done.words} words -> {done.out} "
          f"({rate:.0f} words/s on {done.threads} thread(s), groups of {done.batch_words} words)")
    if done.accuracy is not None:
        a = done.accuracy
        print(f"UPOS {a.upos:.2f} [{a.ci_low:.2f}, {a.ci_high:.2f}] over {a.tokens} words, {a.sentences} "
              f"sentences ({a.resamples} resamples, {a.method})")
    return 0

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
from pathlib import Path

from ... import provenance
from ...core import files, settings
from ...core.errors import UserError
from ...data import SPLITS
from .settings import Bootstrap

# predict is run by hand: its bootstrap has defaults (the tables' come from the config).
PREDICT_BOOTSTRAP = Bootstrap(resamples=1000, seed=0, confidence=0.95, method="percentile")


def _settings(args, *skip: str) -> dict:
    """The fragment's settings table: the arguments, without the subcommand's function; a group of
    settings (the bootstrap) under its one name."""
    return settings.recorded(provenance.settings(args, ("run", *skip)), Bootstrap, "bootstrap")


def _bootstrap(args) -> Bootstrap:
    return settings.from_args(Bootstrap, args, "bootstrap")


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


def _extra(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: give an extra test set as NAME=PATH")
    if name in SPLITS:
        raise argparse.ArgumentTypeError(f"{text!r}: an extra test set cannot be named {name!r}; "
                                         f"{', '.join(SPLITS)} are the treebank's own splits")
    return name, path


def _extras(pairs: list[tuple[str, str]]) -> dict[str, str]:
    """--extra NAME=PATH options as a mapping, in the order given."""
    names = [name for name, _ in pairs]
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise UserError(f"--extra: {', '.join(twice)} given more than once; give each test set once")
    return dict(pairs)


def parser() -> argparse.ArgumentParser:
    """`encoder-study tagging ...`: the treebank, UPOS tagging runs, their tables and the step time."""
    top = argparse.ArgumentParser(prog="encoder-study tagging", description=parser.__doc__)
    sub = top.add_subparsers(dest="subcommand", required=True)
    _add_treebank_commands(sub)
    _add_train(sub)
    _add_baseline(sub)
    _add_spacy(sub)
    _add_table_commands(sub)
    _add_step_time(sub)
    _add_predict(sub)
    return top


def _rule_command(sub, name: str, help_: str, run) -> argparse.ArgumentParser:
    """A subcommand a rule runs: it writes a fragment (--provenance) and calls `run`."""
    p = sub.add_parser(name, help=help_)
    provenance.add_arguments(p)
    p.set_defaults(run=run)
    return p


def _add_split_arguments(p: argparse.ArgumentParser, split_help: str | None, extra_help: str) -> None:
    """--train/--dev/--test (CoNLL-U files; `split_help` formatted with {split}) and repeatable --extra."""
    for split in SPLITS:
        p.add_argument(f"--{split}", required=True, help=split_help and split_help.format(split=split))
    p.add_argument("--extra", type=_extra, action="append", default=[], help=extra_help)


def _add_treebank_commands(sub) -> None:
    """treebank, ood, fetch: the treebank's files."""
    p = _rule_command(sub, "treebank", "write the synthetic treebank's train/dev/test CoNLL-U files",
                      treebank)
    p.add_argument("--seed", type=int, required=True)
    for split in SPLITS:
        p.add_argument(f"--{split}", type=int, required=True, help=f"sentences in {split}")
    p.add_argument("--out-dir", required=True, help="writes <out-dir>/{train,dev,test}.conllu")

    p = _rule_command(sub, "ood", "write a small synthetic out-of-domain test set (other templates, words)",
                      ood)
    p.add_argument("--name", required=True, help="the set's name (its sentence ids start with it)")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--sentences", type=int, required=True)
    p.add_argument("--out", required=True, help="the CoNLL-U file to write")

    p = _rule_command(sub, "fetch", "download one split of a UD treebank (URL, file:// URL, path), check it",
                      fetch)
    p.add_argument("--split", required=True, help="train, dev, test, or an extra test set's name")
    p.add_argument("--url", required=True)
    p.add_argument("--sha256", required=True, help="pinned SHA-256; empty: record it instead")
    p.add_argument("--out", required=True, help="the local .conllu file to write")
    p.add_argument("--timeout", type=float, required=True, help="seconds without data, then give up")


def _add_train(sub) -> None:
    p = _rule_command(sub, "train", "train a tagger (frozen or fine-tuned encoder), score dev and test once",
                      train)
    p.add_argument("--run", dest="run_name", required=True, help="the run's name in the tables")
    p.add_argument("--model-dir", required=True, help="results/models/<model> (an export)")
    p.add_argument("--mode", required=True, choices=["frozen", "finetuned"])
    p.add_argument("--pooling", required=True, choices=["mean", "first"])
    _add_split_arguments(p, "the {split} split, CoNLL-U",
                         "NAME=PATH: an extra test set, scored once like test (never trains or selects); "
                         "repeat")
    p.add_argument("--out-dir", required=True, help="results/tagging/<run>")
    p.add_argument("--checkpoint", required=True, help="saved every --chunk-steps steps, resumed when it "
                   "exists, removed at the end; keep it outside a directory the workflow deletes on failure")
    p.add_argument("--chunk-steps", type=int, required=True,
                   help="save the checkpoint every this many steps; 0: only when training ends")
    _add_training_options(p.add_argument_group("training"))
    e = p.add_argument_group("encoder")
    e.add_argument("--max-length", type=int, required=True, help="pieces per window, specials included")
    e.add_argument("--window-batch", type=int, required=True, help="frozen: windows per ONNX Runtime call")
    e.add_argument("--max-batch-pieces", type=int, required=True, help="finetuned: padded pieces per batch")
    e.add_argument("--train-embeddings", action="store_true",
                   help="finetuned: train the token table too (it is then saved in the pipeline)")
    settings.add_options(p.add_argument_group("bootstrap"), Bootstrap, "bootstrap")


def _add_training_options(g) -> None:
    """train's optimiser, stopping, batching and device options."""
    g.add_argument("--optimizer", required=True, choices=["adamw", "lbfgs"],
                   help="adamw: minibatches (the fine-tune); lbfgs: the frozen probe solved on its cached "
                   "vectors, a step being one full-batch L-BFGS iteration")
    g.add_argument("--seed", type=int, required=True)
    g.add_argument("--lr", type=float, required=True, help="adamw: the rate; lbfgs: the first trial step")
    g.add_argument("--weight-decay", type=float, required=True,
                   help="adamw: decoupled weight decay; lbfgs: the L2 penalty (weight_decay/2 |head|^2)")
    g.add_argument("--epochs", type=int, required=True, help="0: no limit by epochs (stop: maximum)")
    g.add_argument("--max-steps", type=int, required=True, help="0: no limit by steps (stop: max_steps)")
    g.add_argument("--patience", type=int, required=True,
                   help="stop after this many dev evaluations without a new best (stop: plateau); 0: never")
    g.add_argument("--warmup", type=int, required=True, help="adamw: linear warm-up steps")
    g.add_argument("--batch-words", type=int, required=True, help="adamw: words per batch")
    g.add_argument("--eval-every", type=int, required=True,
                   help="steps between dev evaluations; 0: at the end of each epoch (lbfgs: every step)")
    g.add_argument("--eval-batch-words", type=int, required=True)
    g.add_argument("--clip", type=float, required=True, help="adamw: gradient norm clip; 0: none")
    g.add_argument("--threads", type=int, required=True)
    g.add_argument("--device", required=True, choices=["auto", "cpu", "cuda"],
                   help="where the tagger trains: auto is cuda when torch sees a GPU, else cpu")
    g.add_argument("--precision", required=True, choices=["fp32", "bf16"],
                   help="finetuned: bf16 runs forward passes under bfloat16 autocast")


def _add_baseline(sub) -> None:
    p = _rule_command(sub, "baseline", "the most-frequent-tag baseline: dev and test predictions and scores",
                      baseline)
    p.add_argument("--run", dest="run_name", required=True, help="the run's name in the tables")
    _add_split_arguments(p, None, "NAME=PATH: an extra test set; repeat")
    p.add_argument("--out-dir", required=True, help="results/tagging/<run>")
    settings.add_options(p.add_argument_group("bootstrap"), Bootstrap, "bootstrap")


def _add_spacy(sub) -> None:
    """spacy-fetch and spacy: the external baseline, a spaCy pipeline on the treebank's words."""
    p = _rule_command(sub, "spacy-fetch", "download a published spaCy pipeline's wheel (URL or path), check "
                      "it", spacy_fetch)
    p.add_argument("--url", required=True, help="the wheel: release asset URL, file:// URL or path")
    p.add_argument("--sha256", required=True, help="pinned SHA-256; empty: record it instead")
    p.add_argument("--out", required=True, help="the local .whl file to write")
    p.add_argument("--timeout", type=float, required=True, help="seconds without data, then give up")

    p = _rule_command(sub, "spacy", "tag the gold words of dev and test with a spaCy pipeline, score them",
                      spacy)
    p.add_argument("--run", dest="run_name", required=True, help="the run's name in the tables")
    p.add_argument("--source", required=True, choices=["train", "package"],
                   help="train: a pipeline trained on --train from --config; package: --wheel's pipeline")
    p.add_argument("--config", help="train: the spaCy training config (config/spacy/tagger.cfg)")
    p.add_argument("--seed", type=int, help="train: the config's [system] seed")
    p.add_argument("--max-steps", type=int, help="train: the config's training.max_steps instead")
    p.add_argument("--eval-every", type=int, help="train: the config's training.eval_frequency instead")
    p.add_argument("--wheel", help="package: the downloaded wheel (spacy-fetch)")
    p.add_argument("--package", help="package: the pipeline's name in the wheel, e.g. en_core_web_sm")
    p.add_argument("--version", help="package: its version, e.g. 3.8.0")
    p.add_argument("--train", help="train: the train split, CoNLL-U")
    for split in SPLITS[1:]:
        p.add_argument(f"--{split}", required=True, help=f"the {split} split, CoNLL-U")
    p.add_argument("--extra", type=_extra, action="append", default=[],
                   help="NAME=PATH: an extra test set, scored once like test; repeat")
    p.add_argument("--out-dir", required=True, help="results/tagging/<run>")
    p.add_argument("--batch-size", type=int, required=True, help="documents per spaCy batch when tagging")
    settings.add_options(p.add_argument_group("bootstrap"), Bootstrap, "bootstrap")


def _add_table_commands(sub) -> None:
    """tables and per-tag: what the runs' predictions and scores add up to."""
    p = _rule_command(sub, "tables", "joined scores, paired comparisons and the development plot", tables)
    p.add_argument("--run-dir", action="append", required=True, help="results/tagging/<run>; repeat")
    p.add_argument("--gold", type=_gold, action="append", default=[], help="SPLIT=PATH (gold file); repeat")
    p.add_argument("--compare", type=_pair, action="append", default=[], help="RUN_A:RUN_B (a - b); repeat")
    p.add_argument("--reference", action="append", default=[],
                   help="a run whose dev score the plot draws as a dashed line; repeat")
    p.add_argument("--scores-out", required=True, help="results/tagging/scores.csv (+ .md)")
    p.add_argument("--comparisons-out", help="results/tagging/comparisons.csv (+ .md)")
    p.add_argument("--plot", help="PNG of development UPOS against step")
    p.add_argument("--scores-plot", help="PNG: the scores as a forest plot (UPOS, interval per run)")
    p.add_argument("--comparisons-plot", help="PNG: the paired differences as a forest plot")
    settings.add_options(p.add_argument_group("bootstrap"), Bootstrap, "bootstrap")
    p.add_argument("--caption", required=True, help="what treebank the numbers are on (under the .md tables)")

    p = _rule_command(sub, "per-tag", "per-tag accuracy of the best frozen and the best fine-tuned run",
                      per_tag)
    p.add_argument("--run-dir", action="append", required=True, help="results/tagging/<run>; repeat")
    p.add_argument("--scores", required=True, help="results/tagging/scores.csv: picks the best runs")
    p.add_argument("--split", required=True, help="the split scored per tag (a run dir's SPLIT.pred.conllu)")
    p.add_argument("--gold", required=True, help="that split's gold CoNLL-U file")
    p.add_argument("--out", required=True, help="results/tagging/per_tag.csv (+ .md)")
    p.add_argument("--plot", required=True, help="PNG: grouped bars per tag")
    p.add_argument("--caption", required=True, help="what treebank the numbers are on (under the .md table)")


def _add_step_time(sub) -> None:
    p = _rule_command(sub, "step-time", "one fine-tuning step in parts: ours against transformers", step_time)
    p.add_argument("--model", nargs=2, action="append", required=True, metavar=("MODEL_DIR", "SOURCE_JSON"),
                   help="results/models/<m> results/sources/<m>/source.json; repeat for more models")
    p.add_argument("--out", required=True, help="results/tagging/step_time.csv (a .md is written beside it)")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--length", type=int, required=True)
    p.add_argument("--warmup", type=int, required=True, help="untimed steps first")
    p.add_argument("--steps", type=int, required=True, help="at least this many timed steps (medians)")
    p.add_argument("--min-seconds", type=float, required=True,
                   help="at least this many seconds of steps per implementation (and the GEMM probe)")
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--device", required=True, choices=["auto", "cpu", "cuda"],
                   help="where both implementations step: auto is cuda when torch sees a GPU, else cpu")


def _add_predict(sub) -> None:
    """predict: for users tagging their own files (no rule runs it), so it writes no fragment."""
    p = sub.add_parser("predict", help="tag a CoNLL-U or pre-tokenized text file with a saved pipeline",
                       description="Tag a file with any saved pipeline (a tagging run's, weights inline, or "
                       "the writeback recipe's, with its graph beside it). CoNLL-U output differs from the "
                       "input only in UPOS; plain text (one pre-tokenized sentence a line) becomes CoNLL-U. "
                       "The input is streamed in batches; the output appears only when complete. The "
                       "predictions equal the run's own .pred.conllu on the same input.")
    p.set_defaults(run=predict)
    p.add_argument("--pipeline", required=True, help="a pipeline.safetensors")
    p.add_argument("--input", required=True, help="the file to tag")
    p.add_argument("--out", required=True, help="the CoNLL-U file to write")
    p.add_argument("--format", default="conllu", choices=["conllu", "text"],
                   help="conllu (default), or text: one sentence a line, tokens separated by spaces")
    p.add_argument("--batch-sentences", type=int, default=1000,
                   help="sentences read, tagged and written at a time (default 1000); it does not change "
                   "the predictions")
    p.add_argument("--threads", type=int, default=None,
                   help="threads (default: the run's, as its pipeline records them, else 1)")
    p.add_argument("--score", action="store_true",
                   help="print UPOS accuracy against the input's own tags (CoNLL-U with gold tags)")
    settings.add_options(p.add_argument_group("--score's bootstrap"), Bootstrap, "bootstrap",
                         PREDICT_BOOTSTRAP)


def treebank(args) -> int:
    from ...core.tables import markdown_table
    from ...data.conllu import most_frequent_tag_accuracy, read_conllu, splits_table, upos_table
    from ...data.synthetic import TEMPLATES, write_synthetic

    sizes = {"train": args.train, "dev": args.dev, "test": args.test}
    with provenance.Fragment(args.provenance, _settings(args)) as frag:
        paths = write_synthetic(args.out_dir, args.seed, sizes)
        frag.outputs.extend(paths[s] for s in SPLITS)
        by_split = {split: read_conllu(paths[split]) for split in SPLITS}  # the reader EWT goes through
        frag.table("Splits", splits_table(by_split))
        frag.table("UPOS", upos_table(by_split))
        train_split = by_split["train"]
        baseline_rows = [(split, f"{100 * most_frequent_tag_accuracy(train_split, by_split[split]):.2f}")
                         for split in ("dev", "test")]
        frag.table("Most-frequent-tag baseline (trained on train)",
                   markdown_table(["split", "UPOS accuracy %"], baseline_rows, "lr"))
        frag.note(f"synthetic treebank: {len(TEMPLATES)} templates; split k of {list(SPLITS)} is drawn from "
                  f"numpy SeedSequence([{args.seed}, k]), so a split does not depend on the others' sizes")
        frag.note("the HEAD and DEPREL columns hold a flat tree (every word attached to the root): valid "
                  "for the UD evaluation script, not a real analysis; only UPOS is meant to be learned")
    words = sum(len(s.words) for v in by_split.values() for s in v)
    print(f"encoder-study tagging treebank: {words} words in {args.out_dir}/{{{','.join(SPLITS)}}}.conllu")
    return 0


def ood(args) -> int:
    from ...data.conllu import read_conllu, splits_table, upos_table
    from ...data.synthetic import OOD_STREAM, OOD_TEMPLATES, write_ood

    with provenance.Fragment(args.provenance, _settings(args)) as frag:
        path = write_ood(args.out, args.seed, args.sentences, args.name)
        frag.outputs.append(path)
        by_split = {args.name: read_conllu(path)}
        frag.table("Split", splits_table(by_split))
        frag.table("UPOS", upos_table(by_split))
        frag.note(f"synthetic out-of-domain test set: {len(OOD_TEMPLATES)} templates and word lists of its "
                  f"own (encoder_study.data.synthetic.OOD_*), drawn from numpy SeedSequence([{args.seed}, "
                  f"{OOD_STREAM}]); scored only, never trained on or used for selection")
    print(f"encoder-study tagging ood: {args.sentences} sentences -> {args.out}")
    return 0


def fetch(args) -> int:
    from ...data import conllu
    from ...data import fetch as fetching

    with provenance.Fragment(args.provenance, _settings(args)) as frag:
        path = conllu.local_path(args.url)
        if path is not None:
            frag.inputs.append(path)
        fetched = fetching.treebank(args.url, args.out, args.sha256, timeout=args.timeout)
        frag.outputs.append(args.out)
        by_split = {args.split: fetched.sentences}
        frag.table("Split", conllu.splits_table(by_split))
        frag.table("UPOS", conllu.upos_table(by_split))
        _note_download(frag, args.url, fetched.sha256, fetched.pinned)
    print(f"encoder-study tagging fetch: {args.url} -> {args.out} ({len(fetched.sentences)} sentences, "
          f"SHA-256 {fetched.sha256})")
    return 0


def _note_download(frag, url: str, sha256: str, pinned: bool) -> None:
    """The fragment's line on a download: its SHA-256, checked against the pin or recorded to be pinned."""
    if pinned:
        frag.note(f"{url}: SHA-256 {sha256} (pinned and checked)")
    else:
        frag.note(f"{url}: SHA-256 {sha256}: recorded on first download, not pinned; put it in the config to "
                  "make the next run check it")


def train(args) -> int:
    from ...core import machine
    from ...core.tables import markdown_table
    from ...encoders.trainable.harness import resolve_device
    from ...onnx import manifest
    from . import evaluate, runs
    from .train import TrainSettings

    threads = machine.usable_threads(args.threads)
    device = resolve_device(args.device).type  # before anything starts CUDA
    settings = TrainSettings(
        mode=args.mode, optimizer=args.optimizer, seed=args.seed, lr=args.lr, weight_decay=args.weight_decay,
        epochs=args.epochs, max_steps=args.max_steps, warmup=args.warmup, batch_words=args.batch_words,
        eval_every=args.eval_every, eval_batch_words=args.eval_batch_words, clip=args.clip,
        patience=args.patience, threads=threads, device=device, precision=args.precision)
    options = runs.EncoderOptions(max_length=args.max_length, window_batch=args.window_batch,
                                  max_batch_pieces=args.max_batch_pieces,
                                  freeze_embeddings=not args.train_embeddings)
    paths = {**{split: getattr(args, split) for split in SPLITS}, **_extras(args.extra)}
    model_dir = Path(args.model_dir)
    with provenance.Fragment(args.provenance, _settings(args), threads=threads) as frag:
        frag.inputs += [*paths.values(), *(model_dir / n for n in manifest.EXPORT_FILES)]
        done = runs.train_run(args.run_name, model_dir, args.pooling, paths, args.out_dir, settings, options,
                              checkpoint=args.checkpoint, chunk_steps=args.chunk_steps,
                              bootstrap=_bootstrap(args), progress=True)
        frag.outputs += done.outputs
        _report_device(device, settings.precision)
        frag.table("Scores", evaluate.scores_markdown(done.rows))
        frag.table("Development history", markdown_table(
            ["step", "epoch", "train loss", "dev UPOS"],
            [(h["step"], f"{h['epoch']:.2f}", f"{h['train_loss']:.4f}", f"{h['dev_upos']:.2f}")
             for h in done.result.history], "rrrr"))
        result = done.result
        frag.note(f"selected step {result.best_step} of {result.steps} (development UPOS "
                  f"{result.best_dev_upos:.2f}); the test split and any extra test set were scored once, "
                  "with those weights")
        frag.note(f"stopped: {result.stopped} ({_STOPPED[result.stopped]})")
        chunks = ", ".join(f"steps {c['first_step']}-{c['last_step']} in {c['seconds']:.1f} s"
                           for c in result.chunks)
        frag.note(f"trained in {len(result.chunks)} invocation(s): {chunks or 'none (resumed finished)'}")
        if not done.record["dev_upos_check"]:
            frag.note("WARNING: the development score of the written predictions differs from the one "
                      "that selected the weights")
    print(f"{args.run_name}: on {device}; stopped at step {result.steps} ({result.stopped}), selected step "
          f"{result.best_step}")
    for row in done.rows:
        print(f"{args.run_name}: {row['split']} UPOS {row['upos']:.2f} "
              f"[{row['ci_low']:.2f}, {row['ci_high']:.2f}]")
    return 0


_STOPPED = {"plateau": "--patience development evaluations without a new best",
            "maximum": "the --epochs limit", "max_steps": "the --max-steps limit"}


def _report_device(device: str, precision: str | None = None) -> None:
    """Tell the fragment's device facts (provenance.device) which torch device (and precision) ran."""
    from ...encoders.trainable.harness import describe_device

    provenance.used("torch device", describe_device(device))
    if precision is not None:
        provenance.used("torch precision", precision)


def baseline(args) -> int:
    from . import baseline as baseline_tagger
    from . import evaluate

    paths = {**{split: getattr(args, split) for split in SPLITS}, **_extras(args.extra)}
    with provenance.Fragment(args.provenance, _settings(args)) as frag:
        frag.inputs += list(paths.values())
        rows, outputs = baseline_tagger.baseline_run(args.run_name, paths, args.out_dir, _bootstrap(args))
        frag.outputs += outputs
        frag.table("Scores", evaluate.scores_markdown(rows))
        frag.note("most frequent UPOS of each form in train; an unseen form gets the most frequent tag of "
                  "train (ties: the alphabetically first tag)")
    return 0


def spacy_fetch(args) -> int:
    from . import spacy_fetch as fetching

    with provenance.Fragment(args.provenance, _settings(args)) as frag:
        path = files.local_path(args.url)
        if path is not None:
            frag.inputs.append(path)
        sha256, pinned = fetching.fetch_package(args.url, args.sha256, args.out, args.timeout)
        frag.outputs.append(args.out)
        _note_download(frag, args.url, sha256, pinned)
    print(f"encoder-study tagging spacy-fetch: {args.url} -> {args.out} (SHA-256 {sha256})")
    return 0


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

    from . import evaluate
    from . import spacy as spacy_tagger

    source = _spacy_source(args)
    paths = {**({"train": args.train} if args.source == "train" else {}), "dev": args.dev, "test": args.test,
             **_extras(args.extra)}
    with provenance.Fragment(args.provenance, _settings(args)) as frag:
        frag.inputs += [*paths.values(), *(p for p in (args.config, args.wheel) if p is not None)]
        done = spacy_tagger.run(args.run_name, source, paths, args.out_dir, args.seed, args.batch_size,
                                _bootstrap(args), log=sys.stdout)
        frag.outputs += done.outputs
        provenance.used("spaCy pipeline", f"{source.encoder}: {', '.join(done.record['components'])}")
        frag.table("Scores", evaluate.scores_markdown(done.rows))
        _spacy_notes(frag, args, done)
    for row in done.rows:
        print(f"{args.run_name}: {row['split']} UPOS {row['upos']:.2f} "
              f"[{row['ci_low']:.2f}, {row['ci_high']:.2f}]")
    return 0


def _spacy_notes(frag, args, done) -> None:
    """The spaCy run's fragment: its training history or its package, and how the words were tagged."""
    from ...core.tables import markdown_table
    from . import spacy as spacy_tagger

    trained = done.trained
    if trained is not None:
        frag.table("Development history", markdown_table(
            ["step", "epoch", "train loss", "dev UPOS"],
            [(h["step"], h["epoch"], f"{h['train_loss']:.4f}", f"{h['dev_upos']:.2f}")
             for h in trained.history], "rrrr"))
        frag.note(f"trained from {args.config} (seed {args.seed}) on the train split; selected step "
                  f"{trained.best_step} (development UPOS {trained.best_dev_upos:.2f}), spaCy's model-best; "
                  "every split tagged by the saved pipeline, reloaded")
        if not done.record["dev_upos_check"]:
            frag.note("WARNING: the saved pipeline's development score differs from the one that selected "
                      "it")
    else:
        frag.note(f"published pipeline {done.record['encoder']}, unpacked from {args.wheel} (SHA-256 "
                  f"{done.record['source']['wheel_sha256']})")
    frag.note("each sentence's gold words (a multiword token's words, not its surface form) as one spaCy "
              "Doc through every component; UPOS from token.pos_")
    for split, counts in done.record["not_ud"].items():
        if counts:
            frag.note(f"{split}: spaCy POS outside UD's tags, scored as {spacy_tagger.NOT_UD}: {counts}")


def tables(args) -> int:
    from . import evaluate, gather

    with provenance.Fragment(args.provenance, _settings(args)) as frag:
        gathered = gather.gather(args.run_dir, dict(args.gold), args.compare, args.scores_out,
                                 args.comparisons_out, args.plot, args.reference, _bootstrap(args),
                                 args.caption, scores_plot=args.scores_plot,
                                 comparisons_plot=args.comparisons_plot)
        frag.inputs += gathered.inputs
        frag.outputs += gathered.outputs
        frag.table("Scores", evaluate.scores_markdown(gathered.scores))
        if gathered.comparisons:
            frag.table("Comparisons (a - b, paired bootstrap over sentences)",
                       evaluate.comparisons_markdown(gathered.comparisons))
    return 0


def per_tag(args) -> int:
    from ...core import tables
    from . import evaluate, gather

    with provenance.Fragment(args.provenance, _settings(args)) as frag:
        done = gather.per_tag(args.run_dir, args.scores, args.gold, args.split, args.out, args.plot,
                              args.caption)
        frag.inputs += done.inputs
        frag.outputs += done.outputs
        frag.table(f"Per-tag accuracy ({args.split})", tables.markdown(done.rows, evaluate.PER_TAG_MARKDOWN))
        for note in done.notes:
            frag.note(note)
    return 0


def step_time(args) -> int:
    from ...core import files, machine
    from ...core.tables import csv_text
    from ...encoders import perf
    from ...encoders.trainable.harness import resolve_device
    from ...onnx import manifest
    from . import steptime

    threads = machine.torch_threads(args.threads)
    device = resolve_device(args.device).type  # before anything starts CUDA
    out, markdown_path = Path(args.out), Path(args.out).with_suffix(".md")
    with provenance.Fragment(args.provenance, _settings(args), threads=threads) as frag:
        rows, before = [], machine.load_average()
        # One GEMM probe for every model's steps (the same threads): one calibration. None on a GPU.
        probe = perf.Probe.beside(threads, args.min_seconds) if device == "cpu" else None
        for model_dir, source in args.model:
            frag.inputs += [source, *(Path(model_dir) / n for n in (manifest.ONNX_FILE, manifest.MANIFEST))]
            rows += steptime.step_time(model_dir, source, batch=args.batch, length=args.length,
                                       warmup=args.warmup, steps=args.steps, lr=args.lr, seed=args.seed,
                                       min_seconds=args.min_seconds, device=device, probe=probe)
        files.write_text(out, csv_text(rows, steptime.COLUMNS))  # repr floats, fixed columns
        markdown = steptime.markdown(rows)
        files.write_text(markdown_path, markdown)
        frag.outputs += [out, markdown_path]
        _report_device(device)
        frag.table("Fine-tuning step", markdown)
        frag.note(f"medians of at least {args.steps} steps and {args.min_seconds:g} s of steps per "
                  f"implementation (the two taking turns) after {args.warmup} warm-up step(s); batch "
                  f"{args.batch} x {args.length} pieces; AdamW lr {args.lr}; token table frozen in both; "
                  f"load average before: {before}, after: {machine.load_average()}; indicative timings")
        for note in probe.notes() if probe else []:
            frag.note(note)
    return 0


def predict(args) -> int:
    from .predict import predict as tag_file

    done = tag_file(args.pipeline, args.input, args.out, input_format=args.format,
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

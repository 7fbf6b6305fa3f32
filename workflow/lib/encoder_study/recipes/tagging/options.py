"""The options of `encoder-study tagging`'s subcommands (argparse), built for `command.parser`, which
hands each subcommand its function (`run`, by subcommand name). Every option of a rule's subcommand is
required: the config schema holds the defaults and the rules pass every value; groups of settings
(`settings.Training`, `settings.Bootstrap`) are generated from their dataclasses."""

from __future__ import annotations

import argparse

from ... import provenance
from ...core import settings
from ...core.errors import UserError
from ...data import SPLITS
from ...data.tasks import TASKS
from .settings import Bootstrap, Training

# predict is run by hand: its bootstrap has defaults (the tables' come from the config).
PREDICT_BOOTSTRAP = Bootstrap(resamples=1000, seed=0, confidence=0.95, method="percentile")


def add_subcommands(sub, run) -> None:
    """Every subcommand, each calling `run[its name]`."""
    for add in (_add_treebank_commands, _add_train, _add_baseline, _add_spacy, _add_table_commands,
                _add_step_time, _add_predict):
        add(sub, run)


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


def extras(pairs: list[tuple[str, str]]) -> dict[str, str]:
    """--extra NAME=PATH options as a mapping, in the order given."""
    names = [name for name, _ in pairs]
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise UserError(f"--extra: {', '.join(twice)} given more than once; give each test set once")
    return dict(pairs)


def _rule_command(sub, name: str, help_: str, run) -> argparse.ArgumentParser:
    """A subcommand a rule runs: it writes a fragment (--provenance) and calls `run`."""
    p = sub.add_parser(name, help=help_)
    provenance.add_arguments(p)
    p.set_defaults(run=run)
    return p


def _add_task(p) -> None:
    p.add_argument("--task", required=True, choices=list(TASKS),
                   help="the column learned and scored (data.tasks): upos, or xpos (the treebank's own tags)")


def _add_split_arguments(p: argparse.ArgumentParser, split_help: str | None, extra_help: str) -> None:
    """--train/--dev/--test (CoNLL-U files; `split_help` formatted with {split}) and repeatable --extra."""
    for split in SPLITS:
        p.add_argument(f"--{split}", required=True, help=split_help and split_help.format(split=split))
    p.add_argument("--extra", type=_extra, action="append", default=[], help=extra_help)


def _add_download(p, url_help: str | None, out_help: str) -> None:
    """A download's options (data.fetch, tagging.spacy_fetch): what, the pin, where to, the timeout."""
    p.add_argument("--url", required=True, help=url_help)
    p.add_argument("--sha256", required=True, help="pinned SHA-256; empty: record it instead")
    p.add_argument("--out", required=True, help=out_help)
    p.add_argument("--timeout", type=float, required=True, help="seconds without data, then give up")


def _add_treebank_commands(sub, run) -> None:
    """treebank, ood, fetch: the treebank's files."""
    p = _rule_command(sub, "treebank", "write the synthetic treebank's train/dev/test CoNLL-U files",
                      run["treebank"])
    p.add_argument("--seed", type=int, required=True)
    for split in SPLITS:
        p.add_argument(f"--{split}", type=int, required=True, help=f"sentences in {split}")
    p.add_argument("--out-dir", required=True, help="writes <out-dir>/{train,dev,test}.conllu")

    p = _rule_command(sub, "ood", "write a small synthetic out-of-domain test set (other templates, words)",
                      run["ood"])
    p.add_argument("--name", required=True, help="the set's name (its sentence ids start with it)")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--sentences", type=int, required=True)
    p.add_argument("--out", required=True, help="the CoNLL-U file to write")

    p = _rule_command(sub, "fetch", "download one split of a UD treebank (URL, file:// URL, path), check it",
                      run["fetch"])
    p.add_argument("--split", required=True, help="train, dev, test, or an extra test set's name")
    _add_download(p, None, "the local .conllu file to write")


def _add_train(sub, run) -> None:
    p = _rule_command(sub, "train", "train a tagger (frozen or fine-tuned encoder), score dev and test once",
                      run["train"])
    p.add_argument("--run", dest="run_name", required=True, help="the run's name in the tables")
    p.add_argument("--model-dir", required=True, help="results/models/<model> (an export)")
    p.add_argument("--pooling", required=True, choices=["mean", "first"])
    _add_task(p)
    _add_split_arguments(p, "the {split} split, CoNLL-U",
                         "NAME=PATH: an extra test set, scored once like test (never trains or selects); "
                         "repeat")
    p.add_argument("--out-dir", required=True, help="results/tagging/<run>")
    p.add_argument("--checkpoint", required=True, help="saved every --chunk-steps steps, resumed when it "
                   "exists, removed at the end; keep it outside a directory the workflow deletes on failure")
    p.add_argument("--chunk-steps", type=int, required=True,
                   help="save the checkpoint every this many steps; 0: only when training ends")
    settings.add_options(p.add_argument_group("training"), Training)
    e = p.add_argument_group("encoder")
    e.add_argument("--max-length", type=int, required=True, help="pieces per window, specials included")
    e.add_argument("--window-batch", type=int, required=True, help="frozen: windows per ONNX Runtime call")
    e.add_argument("--max-batch-pieces", type=int, required=True, help="finetuned: padded pieces per batch")
    e.add_argument("--train-embeddings", action="store_true",
                   help="finetuned: train the token table too (it is then saved in the pipeline)")
    settings.add_options(p.add_argument_group("bootstrap"), Bootstrap, "bootstrap")


def _add_baseline(sub, run) -> None:
    p = _rule_command(sub, "baseline", "the most-frequent-tag baseline: dev and test predictions and scores",
                      run["baseline"])
    p.add_argument("--run", dest="run_name", required=True, help="the run's name in the tables")
    _add_task(p)
    _add_split_arguments(p, None, "NAME=PATH: an extra test set; repeat")
    p.add_argument("--out-dir", required=True, help="results/tagging/<run>")
    settings.add_options(p.add_argument_group("bootstrap"), Bootstrap, "bootstrap")


def _add_spacy(sub, run) -> None:
    """spacy-fetch and spacy: the external baseline, a spaCy pipeline on the treebank's words."""
    p = _rule_command(sub, "spacy-fetch", "download a published spaCy pipeline's wheel (URL or path), check "
                      "it", run["spacy-fetch"])
    _add_download(p, "the wheel: release asset URL, file:// URL or path", "the local .whl file to write")

    p = _rule_command(sub, "spacy", "tag the gold words of dev and test with a spaCy pipeline, score them",
                      run["spacy"])
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


def _add_table_commands(sub, run) -> None:
    """tables and per-tag: what the runs' predictions and scores add up to."""
    p = _rule_command(sub, "tables", "joined scores, paired comparisons and the development plot",
                      run["tables"])
    p.add_argument("--run-dir", action="append", required=True, help="results/tagging/<run>; repeat")
    _add_task(p)
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
                      run["per-tag"])
    p.add_argument("--run-dir", action="append", required=True, help="results/tagging/<run>; repeat")
    p.add_argument("--scores", required=True, help="results/tagging/scores.csv: picks the best runs")
    p.add_argument("--split", required=True, help="the split scored per tag (a run dir's SPLIT.pred.conllu)")
    p.add_argument("--gold", required=True, help="that split's gold CoNLL-U file")
    p.add_argument("--out", required=True, help="results/tagging/per_tag.csv (+ .md)")
    p.add_argument("--plot", required=True, help="PNG: grouped bars per tag")
    p.add_argument("--caption", required=True, help="what treebank the numbers are on (under the .md table)")


def _add_step_time(sub, run) -> None:
    p = _rule_command(sub, "step-time", "one fine-tuning step in parts: ours against transformers",
                      run["step-time"])
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


def _add_predict(sub, run) -> None:
    """predict: for users tagging their own files (no rule runs it), so it writes no fragment."""
    p = sub.add_parser("predict", help="tag a CoNLL-U or pre-tokenized text file with a saved pipeline",
                       description="Tag a file with any saved pipeline (a tagging run's, weights inline, or "
                       "the writeback recipe's, with its graph beside it). CoNLL-U output differs from the "
                       "input only in UPOS; plain text (one pre-tokenized sentence a line) becomes CoNLL-U. "
                       "The input is streamed in batches; the output appears only when complete. The "
                       "predictions equal the run's own .pred.conllu on the same input.")
    p.set_defaults(run=run["predict"])
    p.add_argument("--pipeline", required=True, help="a pipeline.safetensors")
    p.add_argument("--variant", default=None, choices=["float32", "int8"],
                   help="a written pipeline's published variant beside it (<folder>/int8/, made by "
                   "`writeback quantisation`); default: the pipeline itself")
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

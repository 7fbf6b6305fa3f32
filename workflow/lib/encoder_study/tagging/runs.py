"""Whole runs, as the workflow's rules make them: train and score, the baseline, and the gathered tables.

A run directory (results/tagging/<run>/) holds:

| file | what |
|---|---|
| `pipeline.safetensors` | the saved tagger (trained runs; see `pipeline`) |
| `dev.pred.conllu`, `test.pred.conllu` | the gold files with only the UPOS column predicted |
| `<name>.pred.conllu` | the same for each extra test set (treebank.extra_tests, e.g. `pud`, `ood`) |
| `scores.csv`, `scores.md` | the run's rows of the scores table (dev, test and each extra test set) |
| `history.csv` | step, epoch, train_loss, dev_upos at every development evaluation (trained runs) |
| `run.json` | run, encoder, mode, pooling, the settings, the selected step and why training stopped |

What every kind of run does with its splits (which it scores, the predictions file and its score, the
record of each split read) is `splits`'s, which the spaCy runs share.

`gather` reads run directories and writes the combined scores, the paired comparisons and the plot.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from .. import files, tables
from ..data import conllu
from ..data.conllu import Sentence
from ..errors import UserError
from ..frozen import FrozenEncoder
from ..trainable.words import TrainableEncoder
from . import evaluate, pipeline
from .splits import RUN_JSON, SCORES, pred_path, read_splits, score_split, scored_splits, split_record
from .tagger import Tagger
from .train import TrainResult, TrainSettings, autocast, settled, train

HISTORY = "history.csv"
HISTORY_COLUMNS = ["step", "epoch", "train_loss", "dev_upos"]


class RunError(UserError, ValueError):
    """A run directory, predictions file or comparison that does not fit the others given."""


@dataclasses.dataclass(frozen=True)
class EncoderOptions:
    """How the encoder is built (besides the model and the pooling); the config schema holds the defaults."""

    max_length: int                  # pieces per window, specials included
    window_batch: int                # frozen: windows per ONNX Runtime call
    max_batch_pieces: int            # fine-tuned: padded pieces per forward batch
    freeze_embeddings: bool          # fine-tuned: keep the token table out of training


def build_tagger(model_dir: str | os.PathLike, mode: str, pooling: str, seed: int, options: EncoderOptions,
                 threads: int) -> Tagger:
    """A fresh tagger (seeded head) over the frozen or the trainable encoder of an exported model."""
    if mode == "frozen":
        encoder = FrozenEncoder(model_dir, pooling=pooling, max_length=options.max_length,
                                batch_size=options.window_batch, threads=threads)
    elif mode == "finetuned":
        encoder = TrainableEncoder(model_dir, pooling=pooling, max_length=options.max_length,
                                   max_batch_pieces=options.max_batch_pieces,
                                   freeze_embeddings=options.freeze_embeddings, threads=threads)
    else:
        raise ValueError(f"mode must be 'frozen' or 'finetuned', got {mode!r}")
    return Tagger(encoder, seed=seed)


def history_csv(history: Sequence[dict]) -> str:
    """history.csv text: the floats (epoch, train_loss, dev_upos) as repr, the shortest exact text."""
    return tables.csv_text(history, HISTORY_COLUMNS)


def read_history(path: str | os.PathLike) -> list[tuple[int, float]]:
    """(step, dev_upos) points of a history.csv."""
    return [(int(r["step"]), float(r["dev_upos"])) for r in tables.read_csv(path)]


@dataclasses.dataclass
class TrainedRun:
    """What `train_run` wrote and measured."""

    rows: list[dict]
    result: TrainResult
    outputs: list[Path]
    record: dict


def train_run(run: str, model_dir: str | os.PathLike, pooling: str, paths: dict[str, str | os.PathLike],
              out_dir: str | os.PathLike, settings: TrainSettings, options: EncoderOptions,
              checkpoint: str | os.PathLike, chunk_steps: int, resamples: int, bootstrap_seed: int,
              progress: bool) -> TrainedRun:
    """Train on paths["train"], select on paths["dev"], score dev and test once with the selected weights.

    Any other name in `paths` is an extra test set (out-of-domain, say): scored once too, like test.

    The training state is saved to `checkpoint` every `chunk_steps` steps (0: only when training ends)
    and resumed from it when it exists, so a rerun after a crash goes on where the last save left off
    and ends where an uninterrupted run ends. The checkpoint is removed once every output is written.
    """
    out_dir = Path(out_dir)
    checkpoint = Path(checkpoint)
    scored = scored_splits(paths)
    sentences = read_splits({split: paths[split] for split in ("train", *scored)})
    # The thread count, device and precision of training hold for the final predictions too, so that
    # the development predictions written are exactly the ones that selected the weights.
    with settled(settings):
        tagger = build_tagger(model_dir, settings.mode, pooling, settings.seed, options, settings.threads)
        result = train(tagger, sentences["train"], sentences["dev"], settings, checkpoint=checkpoint,
                       chunk_steps=chunk_steps, progress=progress, desc=run)
        with autocast(settings):
            # Each split on its own: an extra test set leaves the dev and test predictions as they were.
            predicted = {split: tagger.predict([s.doc() for s in sentences[split]], settings.eval_batch_words)
                         for split in scored}
    tagger.to("cpu")  # the pipeline file holds CPU tensors whatever the device was

    encoder = tagger.encoder.manifest.get("model", Path(model_dir).name)
    rows, scores = [], {}
    for split in scored:
        scores[split] = score_split(sentences[split], predicted[split], pred_path(out_dir, split), resamples,
                                    bootstrap_seed)
        rows.append(evaluate.score_row(run, encoder, settings.mode, pooling, split, scores[split]))
    record = {
        "run": run, "encoder": encoder, "mode": settings.mode, "pooling": pooling, "kind": tagger.kind,
        "pipeline": pipeline.FILE_NAME, "settings": dataclasses.asdict(settings),
        "encoder_options": dataclasses.asdict(options),
        "selected": {"step": result.best_step, "dev_upos": result.best_dev_upos},
        "stopped": result.stopped, "steps": result.steps, "epochs": result.epochs,
        "splits": {split: split_record(paths[split]) for split in ("train", *scored)},
    }
    # The development score of the selected weights, recomputed from the written file, must be the
    # one that selected them; a difference would mean the weights put back are not the ones scored.
    record["dev_upos_check"] = scores["dev"].upos == result.best_dev_upos
    # Inline: the run's pipeline is the training reference (it can train further); the writeback recipe
    # writes the graph pipelines from it.
    pipeline.save(tagger, out_dir / pipeline.FILE_NAME, training={
        k: record[k] for k in ("run", "mode", "settings", "encoder_options", "selected", "stopped", "steps",
                               "epochs")})
    evaluate.write_scores(out_dir / SCORES, rows)
    files.write_text(out_dir / HISTORY, history_csv(result.history))
    files.write_json(out_dir / RUN_JSON, record)
    checkpoint.unlink(missing_ok=True)
    outputs = [out_dir / name for name in (pipeline.FILE_NAME, SCORES, "scores.md", HISTORY, RUN_JSON)]
    outputs += [pred_path(out_dir, split) for split in scored]
    return TrainedRun(rows=rows, result=result, outputs=outputs, record=record)


def baseline_run(run: str, paths: dict[str, str | os.PathLike], out_dir: str | os.PathLike,
                 resamples: int, bootstrap_seed: int) -> tuple[list[dict], list[Path]]:
    """The most-frequent-tag baseline from train: dev, test (and extra test sets) predictions and scores."""
    out_dir = Path(out_dir)
    scored = scored_splits(paths)
    sentences = read_splits({split: paths[split] for split in ("train", *scored)})
    baseline = evaluate.most_frequent_tag_baseline(([w.form for w in s.words], s.upos)
                                                   for s in sentences["train"])
    rows = []
    for split in scored:
        predicted = baseline([[w.form for w in s.words] for s in sentences[split]])
        accuracy = score_split(sentences[split], predicted, pred_path(out_dir, split), resamples,
                               bootstrap_seed)
        rows.append(evaluate.score_row(run, "none", "baseline", "none", split, accuracy))
    evaluate.write_scores(out_dir / SCORES, rows)
    files.write_json(out_dir / RUN_JSON, {
        "run": run, "encoder": "none", "mode": "baseline", "pooling": "none",
        "splits": {split: split_record(paths[split]) for split in ("train", *scored)}})
    outputs = [pred_path(out_dir, split) for split in scored]
    outputs += [out_dir / name for name in (SCORES, "scores.md", RUN_JSON)]
    return rows, outputs


# ---------------------------------------------------------------------------------------------------------
# Gathering


def predicted_tags(gold: Sequence[Sentence], path: str | os.PathLike) -> list[tuple[str, ...]]:
    """The UPOS of a predictions file, checked to be the gold file's sentences and words."""
    predicted = conllu.read_conllu(path)
    if [s.sent_id for s in predicted] != [s.sent_id for s in gold]:
        raise RunError(f"{path}: not the predictions of the gold file given for its split (other "
                         "sentences or another order); give the gold file the run was scored on")
    for p, g in zip(predicted, gold, strict=True):
        if [w.form for w in p.words] != [w.form for w in g.words]:
            raise RunError(f"{path}: sentence {p.sent_id!r} has other words than the gold file's")
    return [s.upos for s in predicted]


@dataclasses.dataclass
class Gathered:
    scores: list[dict]
    comparisons: list[dict]
    inputs: list[Path]
    outputs: list[Path]


def gather(run_dirs: Sequence[str | os.PathLike], gold: dict[str, str | os.PathLike],
           compare: Sequence[tuple[str, str]], scores_out: str | os.PathLike,
           comparisons_out: str | os.PathLike | None, plot: str | os.PathLike | None,
           references: Sequence[str], resamples: int, seed: int, caption: str = "",
           scores_plot: str | os.PathLike | None = None,
           comparisons_plot: str | os.PathLike | None = None) -> Gathered:
    """Join the runs' scores, compare runs pairwise on every split of `gold`, plot the dev curves.

    `caption` follows both Markdown tables: what treebank the numbers are on. `scores_plot` and
    `comparisons_plot`, when given, are the two tables as forest plots (`evaluate.plot_scores`,
    `evaluate.plot_comparisons`).
    `compare` holds (a, b) run names: each gives a row a - b per split with a paired bootstrap interval
    (same resampled sentences for both). `references` are runs whose development score the plot draws
    as a dashed line (the baseline, say). Runs are named by their run.json.
    """
    runs, scores, inputs = _read_runs(run_dirs)
    for a, b in compare:
        for name in (a, b):
            if name not in runs:
                raise RunError(f"comparison {a} - {b}: no run {name!r} among {sorted(runs)}")
    outputs = list(evaluate.write_scores(scores_out, scores, caption))
    if scores_plot is not None:
        evaluate.plot_scores(scores, scores_plot)
        outputs.append(Path(scores_plot))

    comparisons = []
    if compare:
        if comparisons_out is None:
            raise RunError("comparisons asked for without a comparisons file to write")
        comparisons = _compare(runs, gold, compare, resamples, seed, inputs)
        outputs += list(evaluate.write_comparisons(comparisons_out, comparisons, caption))
        if comparisons_plot is not None:
            # A panel per encoder of run a: a random model's differences do not set the others' scale.
            evaluate.plot_comparisons(comparisons, comparisons_plot, {r["run"]: r["encoder"] for r in scores})
            outputs.append(Path(comparisons_plot))
    elif comparisons_plot is not None:
        raise RunError("a comparisons plot asked for without comparisons (--compare)")

    if plot is not None:
        _plot_dev_curves(runs, scores, references, plot, inputs)
        outputs.append(Path(plot))
    return Gathered(scores=scores, comparisons=comparisons, inputs=inputs, outputs=outputs)


def _read_runs(run_dirs: Sequence[str | os.PathLike]) -> tuple[dict[str, Path], list[dict], list[Path]]:
    """(run name -> its directory, every run's score rows, the files read), in the order given."""
    runs: dict[str, Path] = {}
    inputs: list[Path] = []
    scores: list[dict] = []
    for run_dir in run_dirs:
        run_dir = Path(run_dir)
        record = read_record(run_dir / RUN_JSON)
        name = record["run"]
        if name in runs:
            raise RunError(f"run {name!r} is in both {runs[name]} and {run_dir}")
        runs[name] = run_dir
        scores += tables.read_csv(run_dir / SCORES)
        inputs += [run_dir / RUN_JSON, run_dir / SCORES]
    return runs, scores, inputs


def _compare(runs: dict[str, Path], gold: dict[str, str | os.PathLike], compare: Sequence[tuple[str, str]],
             resamples: int, seed: int, inputs: list[Path]) -> list[dict]:
    """A row a - b per pair and split of `gold`, with its paired bootstrap interval; the files read are
    added to `inputs`."""
    comparisons = []
    for split, gold_path in sorted(gold.items()):
        gold_sentences = conllu.read_conllu(gold_path)
        inputs.append(Path(gold_path))
        gold_tags = [s.upos for s in gold_sentences]
        tags = {}
        for name in sorted({n for pair in compare for n in pair}):
            tags[name] = predicted_tags(gold_sentences, pred_path(runs[name], split))
            inputs.append(pred_path(runs[name], split))
        for a, b in compare:
            difference = evaluate.paired_difference(gold_tags, tags[a], tags[b], resamples=resamples,
                                                    seed=seed)
            comparisons.append(evaluate.comparison_row(a, b, split, difference))
    return comparisons


def _plot_dev_curves(runs: dict[str, Path], scores: list[dict], references: Sequence[str],
                     plot: str | os.PathLike, inputs: list[Path]) -> None:
    """The development curves of the runs that have a history, the references' dev scores dashed; the
    histories read are added to `inputs`."""
    curves = {}
    for name, run_dir in sorted(runs.items()):
        if (run_dir / HISTORY).is_file() and (points := read_history(run_dir / HISTORY)):
            curves[name] = points
            inputs.append(run_dir / HISTORY)
    dev = {r["run"]: float(r["upos"]) for r in scores if r["split"] == "dev"}
    missing = [r for r in references if r not in dev]
    if missing:
        raise RunError(f"reference runs {missing} have no development score")
    if not curves:
        raise RunError("no run has a development history to plot")
    evaluate.plot_dev_curves(curves, plot, references={r: dev[r] for r in references})


# ---------------------------------------------------------------------------------------------------------
# Per-tag accuracy of the best runs

MODES = ("frozen", "finetuned")


def best_runs(scores: Sequence[dict]) -> dict[str, tuple[str, float]]:
    """mode -> (run, development UPOS) of the best run of each mode of MODES among scores.csv rows: the
    highest development UPOS, a tie going to the run whose name sorts first. A mode without a run with
    a development score is left out."""
    best: dict[str, tuple[float, str]] = {}
    for r in scores:
        if r["split"] == "dev" and r["mode"] in MODES:
            key = (-float(r["upos"]), r["run"])
            best[r["mode"]] = min(best.get(r["mode"], key), key)
    return {mode: (best[mode][1], -best[mode][0]) for mode in MODES if mode in best}


@dataclasses.dataclass
class PerTag:
    rows: list[dict]
    best: dict[str, tuple[str, float]]
    notes: list[str]
    inputs: list[Path]
    outputs: list[Path]


def per_tag(run_dirs: Sequence[str | os.PathLike], scores_path: str | os.PathLike,
            gold_path: str | os.PathLike, split: str, out: str | os.PathLike, plot: str | os.PathLike,
            caption: str) -> PerTag:
    """Per-tag accuracy on `split` of the best frozen and the best fine-tuned run (`best_runs` over
    scores.csv, among the runs of `run_dirs`): per_tag.csv, per_tag.md (`caption` under it, after which
    runs were chosen and why) and the bar plot `plot`.

    The predictions are read against the gold file as every score is (`predicted_tags`,
    `evaluate.per_tag_counts`); each run's counts must add up to its `split` UPOS in scores.csv, exactly.
    """
    runs: dict[str, Path] = {}
    for run_dir in map(Path, run_dirs):
        name = read_record(run_dir / RUN_JSON)["run"]
        if name in runs:
            raise RunError(f"run {name!r} is in both {runs[name]} and {run_dir}")
        runs[name] = run_dir
    scores = [r for r in tables.read_csv(scores_path) if r["run"] in runs]
    best = best_runs(scores)
    if not best:
        raise RunError(f"{scores_path}: none of the runs {sorted(runs)} is a {' or '.join(MODES)} run with a "
                       "development score; give the run directories of trained runs")
    gold = conllu.read_conllu(gold_path)
    gold_tags = [s.upos for s in gold]
    order = evaluate.tag_order(Counter(tag for tags in gold_tags for tag in tags))
    # Every run.json was read (to name the runs), and each chosen run's predictions.
    inputs, rows = [Path(scores_path), Path(gold_path), *(d / RUN_JSON for d in runs.values())], []
    for mode, (name, _) in best.items():
        path = pred_path(runs[name], split)
        counts = evaluate.per_tag_counts(gold_tags, predicted_tags(gold, path))
        inputs.append(path)
        recorded = [float(r["upos"]) for r in scores if r["run"] == name and r["split"] == split]
        total = 100.0 * sum(right for _, right in counts.values()) / sum(n for n, _ in counts.values())
        if recorded != [total]:
            raise RunError(f"{path}: its per-tag counts give UPOS {total!r} on {split}, but {scores_path} "
                           f"records {recorded or 'no score'} for run {name!r}; rebuild the tables from the "
                           "same run directories and gold file")
        rows += evaluate.per_tag_rows(name, mode, split, counts, order)
    chosen = "; ".join(f"best {mode}: {name} (development UPOS {dev:.2f})"
                       for mode, (name, dev) in best.items())
    notes = [f"{chosen}. Best: the highest development UPOS of its mode, a tie going to the run name that "
             f"sorts first. Tags in order of their {split} frequency.", *([caption] if caption else [])]
    outputs = list(evaluate.write_per_tag(out, rows, notes))
    evaluate.plot_per_tag(rows, plot)
    outputs.append(Path(plot))
    return PerTag(rows=rows, best=best, notes=notes, inputs=inputs, outputs=outputs)


def read_record(path: Path) -> dict:
    return files.read_json(path, "a tagging run's record", "give a run directory the tagging recipe wrote",
                           kind=dict, error=RunError)

"""The tagging tables gathered from run directories: the scores, the paired comparisons and the development
curves (`gather`), and the per-tag accuracy of the best frozen and fine-tuned runs (`per_tag`).

They read what the runs wrote (run.json, scores.csv, history.csv, the predictions) and import none of the
encoders' code, so a change to that code reruns the runs, and the tables only through their inputs.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from ... import provenance
from ...core import files, tables
from ...data import conllu
from ...data.conllu import Sentence
from ...data.tasks import DEFAULT as DEFAULT_TASK
from . import evaluate, figures
from .settings import Bootstrap
from .splits import HISTORY, RUN_JSON, SCORES, RunError, pred_path, read_history


def predicted_tags(gold: Sequence[Sentence], path: str | os.PathLike, task: str = DEFAULT_TASK
                   ) -> list[tuple[str, ...]]:
    """The tags of a predictions file (the task's column), checked to be the gold file's sentences and
    words."""
    predicted = conllu.read_conllu(path)
    if [s.sent_id for s in predicted] != [s.sent_id for s in gold]:
        raise RunError(f"{path}: not the predictions of the gold file given for its split (other "
                         "sentences or another order); give the gold file the run was scored on")
    for p, g in zip(predicted, gold, strict=True):
        if [w.form for w in p.words] != [w.form for w in g.words]:
            raise RunError(f"{path}: sentence {p.sent_id!r} has other words than the gold file's")
    return [s.tags(task) for s in predicted]


@dataclasses.dataclass
class Gathered:
    scores: list[dict]
    comparisons: list[dict]
    inputs: list[Path]
    outputs: list[Path]
    task: str = DEFAULT_TASK

    @property
    def done(self) -> provenance.Done:
        """For the fragment: the files, the scores and the comparisons."""
        done = provenance.Done(inputs=list(self.inputs), outputs=list(self.outputs))
        done.table("Scores", evaluate.scores_markdown(self.scores, self.task))
        if self.comparisons:
            done.table("Comparisons (a - b, paired bootstrap over sentences)",
                       evaluate.comparisons_markdown(self.comparisons, self.task))
        return done


def gather(run_dirs: Sequence[str | os.PathLike], gold: dict[str, str | os.PathLike],
           compare: Sequence[tuple[str, str]], scores_out: str | os.PathLike,
           comparisons_out: str | os.PathLike | None, plot: str | os.PathLike | None,
           references: Sequence[str], bootstrap: Bootstrap, caption: str = "",
           scores_plot: str | os.PathLike | None = None,
           comparisons_plot: str | os.PathLike | None = None, task: str = DEFAULT_TASK) -> Gathered:
    """Join the runs' scores, compare runs pairwise on every split of `gold`, plot the dev curves.

    `caption` follows both Markdown tables: what treebank the numbers are on. `scores_plot` and
    `comparisons_plot`, when given, are the two tables as forest plots (`figures.plot_scores`,
    `figures.plot_comparisons`).
    `compare` holds (a, b) run names: each gives a row a - b per split with a paired bootstrap interval
    (same resampled sentences for both). `references` are runs whose development score the plot draws
    as a dashed line (the baseline, say). Runs are named by their run.json. Every run is of `task`
    (data.tasks); its tables name their accuracy columns for it. With `comparisons_out` and no pair to
    compare, the comparisons table is written with its header only.
    """
    runs, scores, inputs = _read_runs(run_dirs, task)
    for a, b in compare:
        for name in (a, b):
            if name not in runs:
                raise RunError(f"comparison {a} - {b}: no run {name!r} among {sorted(runs)}")
    outputs = list(evaluate.write_scores(scores_out, scores, caption, task))
    if scores_plot is not None:
        figures.plot_scores(scores, scores_plot)
        outputs.append(Path(scores_plot))

    comparisons = []
    if compare:
        if comparisons_out is None:
            raise RunError("comparisons asked for without a comparisons file to write")
        comparisons = _compare(runs, gold, compare, bootstrap, inputs, task)
        outputs += list(evaluate.write_comparisons(comparisons_out, comparisons, caption, task))
        if comparisons_plot is not None:
            # A panel per encoder of run a: a random model's differences do not set the others' scale.
            figures.plot_comparisons(comparisons, comparisons_plot, {r["run"]: r["encoder"] for r in scores})
            outputs.append(Path(comparisons_plot))
    elif comparisons_plot is not None:
        raise RunError("a comparisons plot asked for without comparisons (--compare)")
    elif comparisons_out is not None:
        outputs += list(evaluate.write_comparisons(comparisons_out, [], caption, task))

    if plot is not None:
        _plot_dev_curves(runs, scores, references, plot, inputs)
        outputs.append(Path(plot))
    return Gathered(scores=scores, comparisons=comparisons, inputs=inputs, outputs=outputs, task=task)


def _read_runs(run_dirs: Sequence[str | os.PathLike], task: str = DEFAULT_TASK
               ) -> tuple[dict[str, Path], list[dict], list[Path]]:
    """(run name -> its directory, every run's score rows, the files read), in the order given; each run
    must be of `task`."""
    runs: dict[str, Path] = {}
    inputs: list[Path] = []
    scores: list[dict] = []
    for run_dir in run_dirs:
        run_dir = Path(run_dir)
        record = read_record(run_dir / RUN_JSON)
        name = record["run"]
        if record.get("task", DEFAULT_TASK) != task:
            raise RunError(f"{run_dir}: run {name!r} is a run of task {record.get('task', DEFAULT_TASK)}; a "
                           f"{task} table joins the runs of one task (give --task, or leave the run out)")
        if name in runs:
            raise RunError(f"run {name!r} is in both {runs[name]} and {run_dir}")
        runs[name] = run_dir
        scores += tables.read_csv(run_dir / SCORES)
        inputs += [run_dir / RUN_JSON, run_dir / SCORES]
    return runs, scores, inputs


def _compare(runs: dict[str, Path], gold: dict[str, str | os.PathLike], compare: Sequence[tuple[str, str]],
             bootstrap: Bootstrap, inputs: list[Path], task: str = DEFAULT_TASK) -> list[dict]:
    """A row a - b per pair and split of `gold`, with its paired bootstrap interval; the files read are
    added to `inputs`."""
    comparisons = []
    for split, gold_path in sorted(gold.items()):
        gold_sentences = conllu.read_conllu(gold_path)
        inputs.append(Path(gold_path))
        gold_tags = [s.tags(task) for s in gold_sentences]
        tags = {}
        for name in sorted({n for pair in compare for n in pair}):
            tags[name] = predicted_tags(gold_sentences, pred_path(runs[name], split), task)
            inputs.append(pred_path(runs[name], split))
        for a, b in compare:
            difference = evaluate.paired_difference(gold_tags, tags[a], tags[b], bootstrap)
            comparisons.append(evaluate.comparison_row(a, b, split, difference, task))
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
    figures.plot_dev_curves(curves, plot, references={r: dev[r] for r in references})


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
    split: str

    @property
    def done(self) -> provenance.Done:
        """For the fragment: the files, the table and how the runs were chosen."""
        done = provenance.Done(inputs=list(self.inputs), outputs=list(self.outputs), notes=list(self.notes))
        done.table(f"Per-tag accuracy ({self.split})", tables.markdown(self.rows, evaluate.PER_TAG_MARKDOWN))
        return done


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
    figures.plot_per_tag(rows, plot)
    outputs.append(Path(plot))
    return PerTag(rows=rows, best=best, notes=notes, inputs=inputs, outputs=outputs, split=split)


def read_record(path: Path) -> dict:
    return files.read_json(path, "a tagging run's record", "give a run directory the tagging recipe wrote",
                           kind=dict, error=RunError)

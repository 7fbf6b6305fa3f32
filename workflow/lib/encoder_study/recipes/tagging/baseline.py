"""The most-frequent-tag baseline run: each form's most frequent tag in train (UPOS, or the task's), scored
as every run is."""

from __future__ import annotations

import os
from pathlib import Path

from ... import provenance
from ...core import files
from ...data.tasks import DEFAULT as DEFAULT_TASK
from ...data.tasks import TASKS
from . import evaluate
from .settings import Bootstrap
from .splits import RUN_JSON, SCORES, pred_path, read_splits, score_split, scored_splits, split_record


def baseline_run(run: str, paths: dict[str, str | os.PathLike], out_dir: str | os.PathLike,
                 bootstrap: Bootstrap, task: str = DEFAULT_TASK) -> provenance.Done:
    """The most-frequent-tag baseline from train: dev, test (and extra test sets) predictions and scores;
    what it read and wrote, its scores and how it tags, for the fragment."""
    out_dir = Path(out_dir)
    scored = scored_splits(paths)
    sentences = read_splits({split: paths[split] for split in ("train", *scored)})
    baseline = evaluate.most_frequent_tag_baseline(([w.form for w in s.words], s.tags(task))
                                                   for s in sentences["train"])
    rows = []
    for split in scored:
        predicted = baseline([[w.form for w in s.words] for s in sentences[split]])
        accuracy = score_split(sentences[split], predicted, pred_path(out_dir, split), bootstrap, task)
        rows.append(evaluate.score_row(run, "none", "baseline", "none", split, accuracy, task))
    evaluate.write_scores(out_dir / SCORES, rows, task=task)
    files.write_json(out_dir / RUN_JSON, {
        "run": run, "encoder": "none", "mode": "baseline", "pooling": "none",
        "splits": {split: split_record(paths[split]) for split in ("train", *scored)},
        **({} if task == DEFAULT_TASK else {"task": task})})
    outputs = [pred_path(out_dir, split) for split in scored]
    outputs += [out_dir / name for name in (SCORES, "scores.md", RUN_JSON)]
    done = provenance.Done(inputs=list(paths.values()), outputs=outputs)
    done.table("Scores", evaluate.scores_markdown(rows, task))
    done.note(f"most frequent {TASKS[task].label} of each form in train; an unseen form gets the most "
              "frequent tag of train (ties: the alphabetically first tag)")
    return done

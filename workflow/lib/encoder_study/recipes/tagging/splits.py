"""What every kind of run (trained, baseline, spaCy) does with the treebank's splits and its directory.

The splits a run scores, their reading, the predictions file and its score, the record of a split
read, the names of a run directory's scores table, history and run record (the directory's layout:
`runs`), and the error for a run directory that does not fit.
Kept apart from `runs` so that a run that trains no encoder (spaCy) imports none of the encoders'
code, and a change to that code does not rerun it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ...core import files, tables
from ...core.errors import UserError
from ...data import SPLITS, conllu
from ...data.conllu import Sentence
from ...data.tasks import TASKS
from . import evaluate
from .settings import Bootstrap

RUN_JSON = "run.json"
SCORES = "scores.csv"
SCORED = SPLITS[1:]  # dev and test: every run scores them
HISTORY = "history.csv"
HISTORY_COLUMNS = ["step", "epoch", "train_loss", "dev_upos"]


class RunError(UserError, ValueError):
    """A run directory, predictions file or comparison that does not fit the others given."""


def history_csv(history: Sequence[dict]) -> str:
    """history.csv text: the floats (epoch, train_loss, dev_upos) as repr, the shortest exact text."""
    return tables.csv_text(history, HISTORY_COLUMNS)


def read_history(path: str | os.PathLike) -> list[tuple[int, float]]:
    """(step, dev_upos) points of a history.csv."""
    return [(int(r["step"]), float(r["dev_upos"])) for r in tables.read_csv(path)]


def scored_splits(paths: dict[str, str | os.PathLike]) -> tuple[str, ...]:
    """The splits a run scores: dev, test, then every other name of `paths` but train (the extra test
    sets, in the order given). Only train trains and only dev selects; the others are scored once."""
    return (*SCORED, *(name for name in paths if name not in SPLITS))


def pred_path(out_dir: str | os.PathLike, split: str) -> Path:
    return Path(out_dir) / f"{split}.pred.conllu"


def read_splits(paths: dict[str, str | os.PathLike]) -> dict[str, list[Sentence]]:
    return {split: conllu.read_conllu(path) for split, path in paths.items()}


def score_split(sentences: Sequence[Sentence], predicted: Sequence[Sequence[str]], path: str | os.PathLike,
                bootstrap: Bootstrap, task: str = "upos") -> evaluate.Accuracy:
    """Write the predictions file (the task's column predicted) and score it against the task's gold
    tags: accuracy with its sentence-bootstrap interval."""
    conllu.write_predictions(sentences, predicted, path, task)
    return evaluate.accuracy_interval([s.tags(task) for s in sentences], predicted, bootstrap)


def split_record(path: str | os.PathLike) -> dict:
    return {"path": Path(path).as_posix(), "sha256": files.sha256_file(path)}


def scores_said(name: str, rows: list[dict], task: str = "upos") -> list[str]:
    """A run's scores as its log prints them."""
    label = TASKS[task].label
    return [f"{name}: {row['split']} {label} {row[task]:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}]"
            for row in rows]

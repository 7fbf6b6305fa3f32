"""The tagging tasks: which column of a treebank's word rows a tagger learns and is scored on.

    task = TASKS["xpos"]
    gold = sentence.tags(task.name)          # one tag per word, from the task's column

`upos`: UD's 17 universal tags (the 4th column), a closed set in `conllu.UPOS` order. `xpos`: the
treebank's language-specific tags (the 5th column; EWT's Penn Treebank tags), an open set: a tagger
predicts the tags of its train split, in sorted order, and a gold tag it never saw counts as an error.
The task's name is the scores' column (`upos`, `xpos`) and its label the tables' and report's word.
"""

from __future__ import annotations

from dataclasses import dataclass

from .conllu import UPOS


@dataclass(frozen=True)
class Task:
    name: str  # the config's `task`, the scores' column
    column: str  # the CoNLL-U column it reads and predicts
    label: str  # how tables and the report name it
    tags: tuple[str, ...] | None  # a closed tag set in its order; None: the train split's tags, sorted


TASKS = {"upos": Task("upos", "UPOS", "UPOS", UPOS),
         "xpos": Task("xpos", "XPOS", "XPOS", None)}
DEFAULT = "upos"


def tag_set(task: str, train_tags) -> tuple[str, ...]:
    """The tags a tagger of `task` predicts: the task's closed set, or the train split's tags sorted."""
    known = TASKS[task].tags
    return known if known is not None else tuple(sorted(set(train_tags)))


def check_tags(task: str, tags) -> None:
    """Refuse a tagger's tags that its task cannot have: another order of a closed set, repeats, none."""
    if task not in TASKS:
        raise ValueError(f"unknown tagging task {task!r}; the tasks are {', '.join(TASKS)}")
    tags = tuple(tags)
    known = TASKS[task].tags
    if known is not None and tags != known:
        raise ValueError(f"a {task} tagger predicts the tags {' '.join(known)} in that order, got "
                         f"{list(tags)}")
    if not tags or len(set(tags)) != len(tags):
        raise ValueError(f"a {task} tagger's tags must be distinct and at least one, got {list(tags)}")

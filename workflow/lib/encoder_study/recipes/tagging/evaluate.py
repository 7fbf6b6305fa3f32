"""UPOS accuracy with sentence-level bootstrap intervals, paired comparisons and a baseline.

Inputs are per-sentence: for each sentence the gold UPOS tags and the predicted tags. The sentence is
the resampling unit, because a tagger's errors cluster within sentences (a hard sentence has several);
resampling tokens would treat them as independent and give intervals that are too narrow. The
statistic is token-weighted: 100 * (correct tokens) / (tokens) summed over the resampled sentences,
the same accuracy the point estimate reports. `scipy.stats.bootstrap` resamples the two per-sentence
arrays (correct counts, token counts) jointly (`paired=True`), with a vectorized statistic, in
batches of `BATCH` resamples so memory stays O(BATCH x sentences), and a `numpy.random.Generator`
seeded from `seed` (`rng=`; scipy 1.17 takes `rng`, `random_state` is the legacy name). The batch
size does not change the numbers: the resamples are drawn from the generator in the same order.

Interval method (`settings.Bootstrap`, config `tagging.bootstrap`): percentile, or BCa (`method="bca"`).
BCa's jackknife is n evaluations over n - 1 sentences: O(n^2) time, and O(n^2) memory unless batched
(n x (n - 1) values per array); batching keeps either method's memory small. On the treebank's sizes
BCa costs more time and moves the interval's ends by less than one unit of the two decimals the tables
print (measured: CHANGELOG.md). Percentile is kept because (1) at these sizes the bootstrap distribution
of a ratio of sums is close to normal, so BCa's corrections are negligible; (2) it gives the exact degenerate
answers, [100, 100] for a tagger that is always right and [0, 0] for a system compared with itself,
where BCa's acceleration is 0/0 and scipy returns NaN (`method="bca"` falls back to the percentile
interval when every resample gives the same value); (3) it depends only on the bootstrap
distribution and fixed quantile levels, so equal inputs give equal bytes in the tables with the
pinned numpy and scipy.

Tables (`scores.csv`, `comparisons.csv`) write floats with Python's shortest round-trip repr and sort
rows by their key columns, so equal results give equal bytes; each has a Markdown rendering beside it.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...core import files, tables
from ...core.errors import UserError
from ...data.conllu import UPOS
from ...data.tasks import TASKS
from .settings import METHODS, Bootstrap

BATCH = 500  # resamples per vectorized call: 500 x 2,000 sentences x 8 bytes = 8 MB per array

SCORE_KEYS = ["run", "encoder", "mode", "pooling", "split"]
SCORE_COLUMNS = [*SCORE_KEYS, "upos", "ci_low", "ci_high", "tokens", "sentences",
                 "resamples", "seed", "method", "confidence"]
COMPARISON_KEYS = ["split", "a", "b"]
COMPARISON_COLUMNS = ["a", "b", "diff", "ci_low", "ci_high", "split", "upos_a", "upos_b", "tokens",
                      "sentences", "resamples", "seed", "method", "confidence"]

Tags = Sequence[str]


class EvaluationError(UserError, ValueError):
    """Predictions or data that cannot be scored (mismatched sentences, no tokens), or an unknown method."""


@dataclass(frozen=True)
class Accuracy:
    """UPOS accuracy in percent with its bootstrap interval, and how the interval was made."""

    upos: float
    ci_low: float
    ci_high: float
    tokens: int
    sentences: int
    resamples: int
    seed: int
    method: str
    confidence: float


@dataclass(frozen=True)
class Difference:
    """accuracy(a) - accuracy(b) in points, with a paired bootstrap interval."""

    diff: float
    ci_low: float
    ci_high: float
    upos_a: float
    upos_b: float
    tokens: int
    sentences: int
    resamples: int
    seed: int
    method: str
    confidence: float


def aligned(gold: Sequence[Tags], pred: Sequence[Tags]) -> Iterator[tuple[Tags, Tags]]:
    """(gold tags, predicted tags) of each sentence, word i against word i; refuses misaligned or empty
    sentences. Every score here (accuracy, differences, per-tag counts) reads the tags through this."""
    if len(gold) != len(pred):
        raise EvaluationError(f"{len(gold)} gold sentences but {len(pred)} predicted ones")
    for i, (g, p) in enumerate(zip(gold, pred, strict=True)):
        if len(g) != len(p):
            raise EvaluationError(f"sentence {i}: {len(g)} gold tags but {len(p)} predicted")
        if not g:
            raise EvaluationError(f"sentence {i} has no tokens")
        yield g, p


def sentence_counts(gold: Sequence[Tags], pred: Sequence[Tags]) -> tuple[np.ndarray, np.ndarray]:
    """Per sentence: (correct tokens, tokens) as int64 arrays; refuses misaligned or empty sentences."""
    correct = np.zeros(len(gold), dtype=np.int64)
    tokens = np.zeros(len(gold), dtype=np.int64)
    for i, (g, p) in enumerate(aligned(gold, pred)):
        tokens[i] = len(g)
        correct[i] = sum(a == b for a, b in zip(g, p, strict=True))
    return correct, tokens


def per_tag_counts(gold: Sequence[Tags], pred: Sequence[Tags]) -> dict[str, tuple[int, int]]:
    """gold UPOS -> (gold words with that tag, those of them predicted right), over every sentence.

    The words are the ones `accuracy_interval` scores, so the counts add up to its tokens and correct
    words: sum(correct) / sum(gold) is the accuracy."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for g, p in aligned(gold, pred):
        for a, b in zip(g, p, strict=True):
            counts[a][0] += 1
            counts[a][1] += a == b
    return {tag: (n, right) for tag, (n, right) in counts.items()}


def _percent(numerator: np.ndarray, tokens: np.ndarray, axis: int = -1) -> np.ndarray:
    # Integer sums are exact and 100 * sum stays an exact float, so the division is the only rounding:
    # equal ratios give bit-identical values whatever the order of the sentences.
    return 100.0 * np.sum(numerator, axis=axis) / np.sum(tokens, axis=axis)


def _checked(bootstrap: Bootstrap) -> Bootstrap:
    """The settings with the method's name in lower case; refuses an unknown method."""
    name = bootstrap.method.lower()
    if name not in METHODS:
        raise EvaluationError(f"interval method {bootstrap.method!r}: choose one of {', '.join(METHODS)}")
    return dataclasses.replace(bootstrap, method=name)


def _interval(numerator: np.ndarray, tokens: np.ndarray, bootstrap: Bootstrap) -> tuple[float, float]:
    """Bootstrap interval of `_percent` over sentences, numerator and tokens resampled together."""
    from scipy import stats  # here: most importers of this module never resample (0.6 s of a job's start)

    if len(tokens) < 2:
        raise EvaluationError(f"a bootstrap interval needs at least two sentences, got {len(tokens)}")
    common = dict(statistic=_percent, paired=True, vectorized=True, confidence_level=bootstrap.confidence,
                  batch=BATCH)
    result = stats.bootstrap((numerator, tokens), n_resamples=bootstrap.resamples, method="percentile",
                             rng=np.random.default_rng(bootstrap.seed), **common)
    # BCa reuses the same distribution; with no spread it is 0/0, and the percentile answer is exact.
    if bootstrap.method == "bca" and np.ptp(result.bootstrap_distribution) > 0:
        result = stats.bootstrap((numerator, tokens), n_resamples=0, bootstrap_result=result,
                                 method="BCa", **common)
    low, high = result.confidence_interval
    return float(low), float(high)


def accuracy_interval(gold: Sequence[Tags], pred: Sequence[Tags], bootstrap: Bootstrap) -> Accuracy:
    """UPOS accuracy in percent and its bootstrap interval over resampled sentences.

    `gold` and `pred` hold one list of tags per sentence. The interval resamples whole sentences and
    takes the token-weighted ratio of each resample; see the module docstring for the method.
    """
    b = _checked(bootstrap)
    correct, tokens = sentence_counts(gold, pred)
    low, high = _interval(correct, tokens, b)
    return Accuracy(upos=float(_percent(correct, tokens)), ci_low=low, ci_high=high,
                    tokens=int(tokens.sum()), sentences=len(tokens), resamples=b.resamples, seed=b.seed,
                    method=b.method, confidence=b.confidence)


def paired_difference(gold: Sequence[Tags], pred_a: Sequence[Tags], pred_b: Sequence[Tags],
                      bootstrap: Bootstrap) -> Difference:
    """accuracy(a) - accuracy(b) in points, with an interval from the same resampled sentences for both.

    Pairing removes the variation the systems share (the hard sentences are hard for both), so the
    interval is much narrower than one built from two independent intervals. The statistic is
    100 * (correct_a - correct_b) / tokens over the resampled sentences; `diff` is that on all of them,
    which equals `upos_a - upos_b` up to the last bit of rounding. With the same seed and the same
    sentences, the resamples are the ones `accuracy_interval` draws for each system alone.
    """
    b = _checked(bootstrap)
    correct_a, tokens = sentence_counts(gold, pred_a)
    correct_b, _ = sentence_counts(gold, pred_b)
    delta = correct_a - correct_b
    low, high = _interval(delta, tokens, b)
    return Difference(diff=float(_percent(delta, tokens)), ci_low=low, ci_high=high,
                      upos_a=float(_percent(correct_a, tokens)), upos_b=float(_percent(correct_b, tokens)),
                      tokens=int(tokens.sum()), sentences=len(tokens), resamples=b.resamples, seed=b.seed,
                      method=b.method, confidence=b.confidence)


# --- the most-frequent-tag baseline -------------------------------------------------------------

def _most_frequent(counts: Counter) -> str:
    # Highest count, ties to the alphabetically first tag: independent of the order of the train set.
    return min(counts.items(), key=lambda item: (-item[1], item[0]))[0]


class MostFrequentTagBaseline:
    """Tags each word with its most frequent UPOS in train.

    A form seen in train gets its own most frequent tag; an unseen form gets the most frequent tag of
    the whole train set (the classic baseline, and what `treebank.most_frequent_tag_accuracy` computes).
    With `lowercase_backoff`, an unseen form first tries its lowercased form, so an unseen "THE" is
    tagged like "the". Ties go to the tag whose name sorts first.
    """

    def __init__(self, by_form: Mapping[str, str], by_lower: Mapping[str, str], default: str):
        self.by_form = dict(by_form)
        self.by_lower = dict(by_lower)
        self.default = default

    def tag(self, forms: Sequence[str]) -> list[str]:
        return [self.by_form.get(f) or self.by_lower.get(f.lower()) or self.default for f in forms]

    def __call__(self, sentences: Iterable[Sequence[str]]) -> list[list[str]]:
        """Predicted tags for each sentence, given as a list of word forms."""
        return [self.tag(forms) for forms in sentences]


def most_frequent_tag_baseline(train_sentences: Iterable[tuple[Sequence[str], Tags]],
                               lowercase_backoff: bool = False) -> MostFrequentTagBaseline:
    """Count (form, UPOS) over train sentences given as (forms, tags) pairs; see MostFrequentTagBaseline.

    From treebank sentences: `most_frequent_tag_baseline(([w.form for w in s.words], s.upos) for s in train)`.
    """
    by_form: dict[str, Counter] = defaultdict(Counter)
    by_lower: dict[str, Counter] = defaultdict(Counter)
    overall: Counter = Counter()
    for number, (forms, tags) in enumerate(train_sentences):
        if len(forms) != len(tags):
            raise EvaluationError(f"train sentence {number}: {len(forms)} forms but {len(tags)} tags")
        for form, tag in zip(forms, tags, strict=True):
            by_form[form][tag] += 1
            by_lower[form.lower()][tag] += 1
            overall[tag] += 1
    if not overall:
        raise EvaluationError("the train set has no tokens")
    return MostFrequentTagBaseline(
        {form: _most_frequent(c) for form, c in by_form.items()},
        {form: _most_frequent(c) for form, c in by_lower.items()} if lowercase_backoff else {},
        _most_frequent(overall))


# --- tables ----------------------------------------------------------------------------------------

def columns(names: list[str], task: str) -> list[str]:
    """A table's columns for `task` (data.tasks): its accuracy columns are named for it (`upos`,
    `upos_a`, ... become `xpos`, `xpos_a`, ... for the xpos task)."""
    return [task + name[4:] if name.startswith("upos") else name for name in names]


def score_row(run: str, encoder: str, mode: str, pooling: str, split: str, accuracy: Accuracy,
              task: str = "upos") -> dict:
    """One row of scores.csv (use e.g. encoder "none", pooling "none" for the baseline); the accuracy
    under the task's name."""
    return {"run": run, "encoder": encoder, "mode": mode, "pooling": pooling, "split": split,
            task: accuracy.upos, "ci_low": accuracy.ci_low, "ci_high": accuracy.ci_high,
            "tokens": accuracy.tokens, "sentences": accuracy.sentences, "resamples": accuracy.resamples,
            "seed": accuracy.seed, "method": accuracy.method, "confidence": accuracy.confidence}


def comparison_row(a: str, b: str, split: str, difference: Difference, task: str = "upos") -> dict:
    """One row of comparisons.csv: run `a` against run `b` on `split`."""
    d = difference
    return {"a": a, "b": b, "diff": d.diff, "ci_low": d.ci_low, "ci_high": d.ci_high, "split": split,
            f"{task}_a": d.upos_a, f"{task}_b": d.upos_b, "tokens": d.tokens, "sentences": d.sentences,
            "resamples": d.resamples, "seed": d.seed, "method": d.method, "confidence": d.confidence}


def _ordered(rows: Iterable[Mapping], columns: list[str], keys: list[str]) -> list[dict[str, str]]:
    """Rows as text, checked against the columns and sorted by their keys (then by every cell)."""
    out = []
    for row in rows:
        missing = [c for c in columns if c not in row]
        extra = [c for c in row if c not in columns]
        if missing or extra:
            raise ValueError(f"table row {dict(row)}: missing columns {missing}, unknown columns {extra}")
        out.append({c: tables.cell(row[c]) for c in columns})
    out.sort(key=lambda r: ([r[k] for k in keys], [r[c] for c in columns]))
    seen = set()
    for r in out:
        key = tuple(r[k] for k in keys)
        if key in seen:
            raise ValueError(f"two table rows share the key {dict(zip(keys, key, strict=True))}")
        seen.add(key)
    return out


def scores_csv(rows: Iterable[Mapping], task: str = "upos") -> str:
    """scores.csv text: SCORE_COLUMNS (for the task), one row per (run, encoder, mode, pooling, split),
    sorted."""
    names = columns(SCORE_COLUMNS, task)
    return tables.csv_text(_ordered(rows, names, SCORE_KEYS), names)


def comparisons_csv(rows: Iterable[Mapping], task: str = "upos") -> str:
    """comparisons.csv text: COMPARISON_COLUMNS (for the task), one row per (split, a, b), sorted."""
    names = columns(COMPARISON_COLUMNS, task)
    return tables.csv_text(_ordered(rows, names, COMPARISON_KEYS), names)


def _ci_header(rows: list[dict[str, str]]) -> str:
    levels = {float(r["confidence"]) for r in rows}
    return f"{100 * levels.pop():g}% CI" if len(levels) == 1 else "CI"


def scores_markdown(rows: Iterable[Mapping], task: str = "upos") -> str:
    """The scores table in Markdown, two decimals; accepts rows as built or as read back from the CSV."""
    rows = _ordered(rows, columns(SCORE_COLUMNS, task), SCORE_KEYS)
    return tables.markdown_table(
        ["run", "encoder", "mode", "pooling", "split", TASKS[task].label, _ci_header(rows), "tokens",
         "sentences"],
        [(r["run"], r["encoder"], r["mode"], r["pooling"], r["split"], f"{float(r[task]):.2f}",
          f"[{float(r['ci_low']):.2f}, {float(r['ci_high']):.2f}]", f"{int(r['tokens']):,}",
          f"{int(r['sentences']):,}") for r in rows], "lllllrrrr")


def comparisons_markdown(rows: Iterable[Mapping], task: str = "upos") -> str:
    """The comparisons table in Markdown: a - b in points with its paired interval."""
    rows = _ordered(rows, columns(COMPARISON_COLUMNS, task), COMPARISON_KEYS)
    label = TASKS[task].label
    return tables.markdown_table(
        ["a", "b", "split", f"{label} a", f"{label} b", "a - b", _ci_header(rows), "sentences"],
        [(r["a"], r["b"], r["split"], f"{float(r[task + '_a']):.2f}", f"{float(r[task + '_b']):.2f}",
          f"{float(r['diff']):+.2f}", f"[{float(r['ci_low']):+.2f}, {float(r['ci_high']):+.2f}]",
          f"{int(r['sentences']):,}") for r in rows], "lllrrrrr")


def _write_table(target: str | os.PathLike, rows: Iterable[Mapping], to_csv, to_markdown, caption: str
                 ) -> tuple[Path, Path]:
    """Write a CSV and its Markdown rendering beside it (same name, .md), each atomically; a non-empty
    `caption` (what the table's treebank is, say) follows the Markdown table."""
    rows = list(rows)
    target = Path(target)
    markdown = target.with_suffix(".md")
    files.write_text(target, to_csv(rows))
    files.write_text(markdown, to_markdown(rows) + (f"\n{caption}\n" if caption else ""))
    return target, markdown


def write_scores(target: str | os.PathLike, rows: Iterable[Mapping], caption: str = "", task: str = "upos"
                 ) -> tuple[Path, Path]:
    """scores.csv and scores.md."""
    return _write_table(target, rows, lambda r: scores_csv(r, task), lambda r: scores_markdown(r, task),
                        caption)


def write_comparisons(target: str | os.PathLike, rows: Iterable[Mapping], caption: str = "",
                      task: str = "upos") -> tuple[Path, Path]:
    """comparisons.csv and comparisons.md."""
    return _write_table(target, rows, lambda r: comparisons_csv(r, task),
                        lambda r: comparisons_markdown(r, task), caption)


# --- per-tag accuracy ------------------------------------------------------------------------------

PER_TAG_COLUMNS = ["run", "mode", "split", "upos", "gold", "correct", "accuracy"]
PER_TAG_MARKDOWN = (("run", "run", ""), ("mode", "mode", ""), ("split", "split", ""), ("upos", "UPOS", ""),
                    ("gold", "gold words", "n"), ("correct", "correct", "n"),
                    ("accuracy", "accuracy (%)", ".2f"))


def tag_order(counts: Mapping[str, int], task: str = "upos") -> list[str]:
    """The tags of `counts` (tag -> gold words), most frequent first, ties in the task's tag order (UD's
    UPOS list; an open set such as XPOS: by name)."""
    known = TASKS[task].tags
    if known is None:
        return sorted(counts, key=lambda tag: (-counts[tag], tag))
    rank = {tag: i for i, tag in enumerate(known)}
    unknown = sorted(set(counts) - set(rank))
    if unknown:
        raise EvaluationError(f"tags {unknown} are not UD UPOS tags ({' '.join(UPOS)})")
    return sorted(counts, key=lambda tag: (-counts[tag], rank[tag]))


def per_tag_rows(run: str, mode: str, split: str, counts: Mapping[str, tuple[int, int]],
                 order: Sequence[str]) -> list[dict]:
    """Rows of per_tag.csv for one run: one per tag of `order` (each a key of `counts`), in that order;
    accuracy in percent, as the scores are."""
    return [{"run": run, "mode": mode, "split": split, "upos": tag, "gold": counts[tag][0],
             "correct": counts[tag][1], "accuracy": 100.0 * counts[tag][1] / counts[tag][0]} for tag in order]


def write_per_tag(target: str | os.PathLike, rows: Sequence[Mapping], notes: Sequence[str]
                  ) -> tuple[Path, Path]:
    """per_tag.csv (rows in the order given) and per_tag.md beside it, `notes` (one paragraph each) under
    the Markdown table."""
    target = Path(target)
    markdown = target.with_suffix(".md")
    files.write_text(target, tables.csv_text(rows, PER_TAG_COLUMNS))
    text = tables.markdown(rows, PER_TAG_MARKDOWN) + "".join(f"\n{note}\n" for note in notes)
    files.write_text(markdown, text)
    return target, markdown


def split_order(splits: Iterable[str]) -> list[str]:
    """The splits as the forest plots group them: test first, then every extra test set (by name), dev
    last (the split that selected the runs' weights)."""
    names = set(splits)
    return [*(["test"] if "test" in names else []), *sorted(names - {"test", "dev"}),
            *(["dev"] if "dev" in names else [])]



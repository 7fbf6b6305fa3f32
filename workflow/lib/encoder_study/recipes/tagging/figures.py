"""The tagging recipe's plots: development curves, scores and comparisons as forest plots, per-tag
accuracy. Apart from `evaluate`, which every job that scores imports, so that a change to a plot
redraws the plots and retrains nothing."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence

from ...core import plots
from .evaluate import (
    COMPARISON_COLUMNS,
    COMPARISON_KEYS,
    SCORE_COLUMNS,
    SCORE_KEYS,
    EvaluationError,
    _ordered,
    split_order,
)


def plot_dev_curves(curves: Mapping[str, Iterable[tuple[int, float]]], target: str | os.PathLike,
                    references: Mapping[str, float] | None = None,
                    title: str = "Development UPOS during training") -> None:
    """PNG of development UPOS against training step, one line per run, written atomically.

    `curves` maps a run name to its (step, dev UPOS) points; `references` draws dashed horizontal lines
    (e.g. the frozen encoder's development score). Style and PNG writer: `plots` (equal bytes for equal
    inputs).
    """
    for name in sorted(curves):
        if not list(curves[name]):
            raise EvaluationError(f"run {name!r} has no development scores to plot")
    with plots.figure(target, 7, 4) as fig:
        ax = fig.add_subplot()
        for name in sorted(curves):
            steps, scores = zip(*sorted(curves[name]), strict=True)
            ax.plot(steps, scores, marker="o", markersize=3, linewidth=1.2, label=name)
        for name, value in sorted((references or {}).items()):
            ax.axhline(value, linestyle="--", linewidth=1, color="0.4", label=f"{name} ({value:.2f})")
        ax.set_xlabel("training step")
        ax.set_ylabel("development UPOS (%)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)


def _interval_label(rows: Sequence[Mapping]) -> str:
    """`95% percentile interval, 10000 resamples` from the rows' own columns (one value each)."""
    seen = {(float(r["confidence"]), r["method"], int(r["resamples"])) for r in rows}
    if len(seen) != 1:
        return "bootstrap intervals of several settings (see the table)"
    confidence, method, resamples = seen.pop()
    return f"{100 * confidence:g}% {method} interval, {resamples:,} sentence resamples"


def _panels(rows: Sequence[Mapping], encoder_of) -> list[tuple[str, str, list[Mapping]]]:
    """(split, encoder, rows) of each forest panel: the splits in `split_order`, within each the encoders
    in the order their rows come (the rows' own order kept inside a panel)."""
    encoders = list(dict.fromkeys(encoder_of(r) for r in rows))
    panels = []
    for split in split_order(r["split"] for r in rows):
        for encoder in encoders:
            picked = [r for r in rows if r["split"] == split and encoder_of(r) == encoder]
            if picked:
                panels.append((split, encoder, picked))
    return panels


def plot_scores(rows: Iterable[Mapping], target: str | os.PathLike) -> None:
    """Forest plot of scores.csv: UPOS with its interval, one panel per split (`split_order`) and encoder
    (the baseline's own), each on its own scale, one row per run (by name), the baseline included."""
    rows = _ordered(rows, SCORE_COLUMNS, SCORE_KEYS)
    groups = [(f"{split}: {'baseline' if encoder == 'none' else encoder}",
               [plots.Interval(r["run"], float(r["upos"]), float(r["ci_low"]), float(r["ci_high"]))
                for r in picked])
              for split, encoder, picked in _panels(rows, lambda r: r["encoder"])]
    plots.forest(groups, target, f"UPOS accuracy (%)\nbars: {_interval_label(rows)}", "UPOS by run and split")


def plot_comparisons(rows: Iterable[Mapping], target: str | os.PathLike,
                     encoders: Mapping[str, str] | None = None) -> None:
    """Forest plot of comparisons.csv: a - b in points with its paired interval, a dashed line at 0, one
    row per pair (in the table's order); one panel per split (`split_order`) and, given `encoders` (run
    -> encoder), per encoder of run a, each on its own scale, so that a random model's large differences
    do not flatten the others' small ones."""
    rows = _ordered(rows, COMPARISON_COLUMNS, COMPARISON_KEYS)
    encoders = encoders or {}
    groups = [(f"{split}: {encoder or 'every pair'}" if encoders else f"split: {split}",
               [plots.Interval(f"{r['a']} - {r['b']}", float(r["diff"]), float(r["ci_low"]),
                               float(r["ci_high"])) for r in picked])
              for split, encoder, picked in _panels(rows, lambda r: encoders.get(r["a"], ""))]
    plots.forest(groups, target, f"UPOS difference a - b (points)\nbars: paired {_interval_label(rows)}",
                 "Paired differences in UPOS", zero=True, value_format="+.2f")


def plot_per_tag(rows: Sequence[Mapping], target: str | os.PathLike) -> None:
    """Grouped bars of per_tag.csv: accuracy per gold tag (left to right in the rows' order, each with
    its gold count), one bar per run (in the rows' order)."""
    runs: dict[str, dict[str, float]] = {}
    labels: dict[str, str] = {}
    for r in rows:
        runs.setdefault(f"{r['run']} ({r['mode']})", {})[r["upos"]] = float(r["accuracy"])
        labels.setdefault(r["upos"], f"{r['upos']}\n{int(r['gold']):,}")
    tags = list(labels)
    plots.bars([labels[t] for t in tags],
               {name: [plots.Bar(acc[t]) if t in acc else None for t in tags] for name, acc in runs.items()},
               target, "accuracy (%)", "UPOS accuracy per gold tag (gold words under each tag)", log=False)


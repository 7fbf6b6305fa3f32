"""The study's plots: one style and one PNG writer, so that equal inputs give byte-identical files.

Every plot of the workflow is drawn inside `figure(target, width, height)`, which holds the conventions:

- Agg on a bare `Figure` (no pyplot: no global backend switch, no figure kept alive between plots);
- the pinned matplotlib's own defaults (style "default", so a user's matplotlibrc changes nothing), then
  `STYLE`; its fonts are the DejaVu fonts matplotlib ships;
- a fixed size and `DPI`, `tight_layout`, and PNG metadata without "Software" (the one entry Agg writes,
  which names the matplotlib version; a PNG gets no date), written atomically on leaving the block.

Two kinds of plot are shared by the stages: `forest` (a value and its interval per row, one panel per
group, each on its own scale) and `bars` (grouped bars, optionally with an error bar each). Matplotlib is
imported inside the functions, so importing this module stays cheap.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from . import files

DPI = 100
# On top of matplotlib's defaults. Empty for now: the defaults of the pinned version are the style, and
# the plots made before this module keep their bytes; a key added here changes every plot, deterministically.
STYLE: dict = {}
# Beyond this ratio of the largest to the smallest positive value, `bars(log="auto")` uses a log axis.
LOG_RATIO = 100.0
MAX_WIDTH = 16.0  # inches: a bar plot's widest figure
# A forest plot's panel: inches per row, and per panel for its heading and its axis' tick labels; the
# margin on each side of its x range, as a fraction of the range.
ROW_INCHES = 0.24
PANEL_INCHES = 0.75
PANEL_MARGIN = 0.06


@contextmanager
def figure(target: str | os.PathLike, width: float = 7.0, height: float = 4.0) -> Iterator:
    """A matplotlib Figure in the fixed style; written to `target` as PNG when the block ends without error.

        with plots.figure("results/x.png", 7, 4) as fig:
            ax = fig.add_subplot()
            ax.plot(...)
    """
    import matplotlib.style
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # Inside the style for drawing and saving alike: some settings are read only when the figure is drawn.
    with matplotlib.style.context(["default", STYLE]):
        fig = Figure(figsize=(width, height), dpi=DPI)
        FigureCanvasAgg(fig)
        yield fig
        fig.tight_layout()
        with files.atomic_path(target) as tmp:
            fig.savefig(tmp, format="png", dpi=DPI, metadata={"Software": None})


@dataclass(frozen=True)
class Interval:
    """One row of a forest plot: a label, the value and its interval [low, high]."""

    label: str
    value: float
    low: float
    high: float


def panel_limits(items: Sequence[Interval], zero: bool = False) -> tuple[float, float]:
    """The x range of one forest panel: its rows' intervals (and 0 when `zero`), with a margin of
    PANEL_MARGIN of the span on each side (half a unit around a single point)."""
    low = min(item.low for item in items)
    high = max(item.high for item in items)
    if zero:
        low, high = min(low, 0.0), max(high, 0.0)
    margin = (high - low) * PANEL_MARGIN if high > low else 0.5
    return low - margin, high + margin


def forest(groups: Sequence[tuple[str, Sequence[Interval]]], target: str | os.PathLike, xlabel: str,
           title: str, zero: bool = False, value_format: str = ".2f") -> None:
    """A forest plot: one panel per group, under its heading, each on its own x scale (`panel_limits`), so
    that a group of large values (a random model's, say) never flattens another's small intervals; in
    each, one row per Interval, top to bottom in the order given, a point at its value and a bar from low
    to high, its numbers printed at the right as `value [low, high]`. `zero` draws a dashed line at 0 in
    every panel (for differences)."""
    groups = [(heading, items) for heading, items in groups if items]
    if not groups:
        raise ValueError(f"{target}: a forest plot needs at least one row")
    # Room for the longest label at the left and the numbers at the right (about 0.6 em a character).
    longest = max(len(text) for heading, items in groups for text in (heading, *(i.label for i in items)))
    width = 4.5 + (longest + 24) * 0.6 * 10 / 72
    # Each panel: its rows, plus its heading and its own axis' tick labels; the figure: title and xlabel.
    height = 1.1 + sum(ROW_INCHES * len(items) + PANEL_INCHES for _, items in groups)
    with figure(target, width, height) as fig:
        axes = fig.subplots(len(groups), 1, squeeze=False,
                            gridspec_kw={"height_ratios": [len(items) + 1 for _, items in groups]})[:, 0]
        for ax, (heading, items) in zip(axes, groups, strict=True):
            _forest_panel(ax, heading, items, zero, value_format)
        axes[-1].set_xlabel(xlabel)
        # Near the top edge: at matplotlib's default height, a tall figure's title overlaps the first
        # panel's heading (tight_layout keeps the heading a fixed distance below the figure's top).
        fig.suptitle(title, y=1 - 0.06 / height)


def _forest_panel(ax, heading: str, items: Sequence[Interval], zero: bool, value_format: str) -> None:
    for y, item in enumerate(items):
        ax.errorbar([item.value], [-y], xerr=[[item.value - item.low], [item.high - item.value]],
                    fmt="o", color="C0", markersize=4, capsize=3, linewidth=1.2)
        number = f"{item.value:{value_format}} [{item.low:{value_format}}, {item.high:{value_format}}]"
        ax.text(1.01, -y, number, transform=ax.get_yaxis_transform(), va="center", fontsize=8)
    ax.set_yticks([-y for y in range(len(items))], [item.label for item in items])
    ax.tick_params(axis="y", length=0)
    ax.set_ylim(-len(items) + 0.5, 0.5)
    ax.set_xlim(*panel_limits(items, zero))
    if zero:
        ax.axvline(0.0, color="0.3", linewidth=1, linestyle="--")
    ax.set_title(heading, loc="left", fontsize=10, fontweight="bold")
    ax.grid(axis="x", alpha=0.3)


@dataclass(frozen=True)
class Bar:
    """One bar: its height and, when both are given, an error bar from low to high."""

    value: float
    low: float | None = None
    high: float | None = None


def log_axis(series: Mapping[str, Sequence[Bar | None]]) -> bool:
    """Whether `bars(log="auto")` takes a log axis: every value and bound positive, the largest at least
    LOG_RATIO times the smallest."""
    values = [v for bars_ in series.values() for b in bars_ if b is not None
              for v in (b.value, b.low, b.high) if v is not None]
    if not values or min(values) <= 0:
        return False
    return max(values) / min(values) >= LOG_RATIO


def bars(categories: Sequence[str], series: Mapping[str, Sequence[Bar | None]], target: str | os.PathLike,
         ylabel: str, title: str, log: bool | str = "auto", xlabel: str = "") -> None:
    """Grouped bars: one group per category (left to right in the order given), one bar per series in
    each (the mapping's order, a colour each, a legend); `None` leaves a bar out. A Bar with low and high
    gets an error bar; one without gets none. `log="auto"` takes a log axis when the values span more
    than LOG_RATIO (and are all positive)."""
    for name, values in series.items():
        if len(values) != len(categories):
            raise ValueError(f"{target}: series {name!r} has {len(values)} values for {len(categories)} "
                             "categories")
    if not categories or not series:
        raise ValueError(f"{target}: a bar plot needs at least one category and one series")
    use_log = log_axis(series) if log == "auto" else bool(log)
    width = 0.8 / len(series)
    # Each group as wide as its bars or its label's longest line (about 0.6 em a character at the default
    # 10 pt), the figure at most MAX_WIDTH inches; beyond that the labels turn 45 degrees.
    longest = max(len(line) for label in categories for line in label.split("\n"))
    group = max(0.3 * len(series), longest * 0.6 * 10 / 72 + 0.15)
    inches = min(MAX_WIDTH, max(6.0, 2.5 + group * len(categories)))
    turn = 2.5 + group * len(categories) > MAX_WIDTH
    with figure(target, inches, 4.5) as fig:
        ax = fig.add_subplot()
        for k, (name, values) in enumerate(series.items()):
            xs = [i + (k - (len(series) - 1) / 2) * width for i, b in enumerate(values) if b is not None]
            shown = [b for b in values if b is not None]
            ax.bar(xs, [b.value for b in shown], width=width, label=name, color=f"C{k}")
            spread = [(x, b) for x, b in zip(xs, shown, strict=True)
                      if b.low is not None and b.high is not None]
            if spread:
                below = [b.value - b.low for _, b in spread]
                above = [b.high - b.value for _, b in spread]
                ax.errorbar([x for x, _ in spread], [b.value for _, b in spread], yerr=[below, above],
                            fmt="none", ecolor="0.2", capsize=2, linewidth=1)
        ax.set_xticks(range(len(categories)), categories)
        if turn:
            for label in ax.get_xticklabels():
                label.set_rotation(45)
                label.set_horizontalalignment("right")
        if use_log:
            ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        if xlabel:
            ax.set_xlabel(xlabel)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
        # Right of the axes, so that no bar or label hides under it.
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)

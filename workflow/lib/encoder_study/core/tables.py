"""Tables: CSV that gives equal bytes for equal numbers, and their Markdown renderings.

A float is written as `repr(float(value))`, the shortest string that reads back as the same float.
`float()` comes first because numpy's floating scalars print as `np.float64(0.1)` under numpy 2
(`np.float64` is a `float` subclass, so `repr` alone is not enough), and `np.float32` is not a
`float` at all; numpy registers both as `numbers.Real`, which is how they are recognized here
without importing numpy. Standard library only, so any command can import it cheaply.
"""

from __future__ import annotations

import csv
import io
import numbers
import os
from collections.abc import Iterable, Mapping, Sequence


def cell(value) -> str:
    """The text of one value: a float (numpy's too) as repr(float(value)); None as an empty cell (as
    the csv module writes it); anything else, ints and numpy ints included, as str(value)."""
    if value is None:
        return ""
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Rational):  # float, np.floating
        return repr(float(value))
    return str(value)


def csv_text(rows: Iterable[Mapping], columns: Sequence[str]) -> str:
    """CSV text: a header of `columns`, then one line per row in the given order, "\\n" line ends.

    A row may leave columns out (empty cells); a key that is not a column raises ValueError.
    """
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: cell(v) for k, v in row.items()})
    return out.getvalue()


def read_csv(path: str | os.PathLike) -> list[dict[str, str]]:
    """The rows of a CSV file with a header, as dicts of strings."""
    with open(path, encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def _md(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(header: list[str], rows: Iterable[Iterable], align: str | None = None) -> str:
    """A GitHub Markdown table; `align` is one of 'l'/'r' per column."""
    align = align or "l" * len(header)
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(_md(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def formatted(value, spec: str) -> str:
    """One Markdown cell: `spec` "" as text, "n" an integer with thousands separators, "yes" a flag
    ("yes" for True or "True", else "NO"), anything else a float format such as ".2g". A value the row
    does not have (None, or a CSV's empty cell) stays an empty cell."""
    if value is None or (value == "" and spec not in ("", "yes")):
        return ""
    if spec == "":
        return str(value)
    if spec == "n":
        return f"{int(value):,}"
    if spec == "yes":
        return "yes" if str(value) == "True" else "NO"
    return format(float(value), spec)


def markdown(rows: Iterable[Mapping], columns: Sequence[tuple[str, str, str]]) -> str:
    """A Markdown table of `rows` (dicts, or a CSV's strings) by `columns` of (key, title, spec).

    Text columns align left, formatted ones right (flags left); see `formatted` for the specs.
    """
    align = "".join("l" if spec in ("", "yes") else "r" for _, _, spec in columns)
    return markdown_table([title for _, title, _ in columns],
                          [[formatted(row[key], spec) for key, _, spec in columns] for row in rows], align)


# The columns every parity table shares: tokens compared and how far apart they are.
PARITY_COLUMNS = (("tokens", "tokens", "n"), ("max_abs", "max abs", ".2g"), ("mean_abs", "mean abs", ".2g"),
                  ("max_value", "largest value", ".3g"), ("min_cos", "min cosine", ".8f"))

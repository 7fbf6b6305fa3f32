"""CSV tables that give equal bytes for equal numbers.

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

"""The parity recipe's tables: their columns and Markdown, and the gather of the per-model rows into
results/parity/{inference,trainable,latency}.{csv,md} (with the plot of per-token differences).

No torch and no models here: `encoder-study parity table` runs only this, so that editing the plot
or a column's format reruns the three gathers and nothing that compares or times a model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ... import provenance
from ...core import files, plots, tables

INFERENCE_COLUMNS = ["model", "tokens", "texts", "truncated", "max_abs", "mean_abs", "min_cos", "mean_cos",
                     "max_value", "batch_max_abs"]
TRAINABLE_COLUMNS = ["model", "family", "comparison", "tokens", "max_abs", "mean_abs", "min_cos", "max_value",
                     "batch_equal"]
LATENCY_COLUMNS = ["model", "runtime", "threads", "batch", "seq_len", "median_ms", "min_ms", "max_ms", "runs",
                   "q1_ms", "q3_ms", "seconds", "gflop", "gflops", "gemm_gflops", "fraction_of_gemm",
                   "load_before", "load_after", "gemm_gflops_min", "gemm_gflops_max", "gemm_probe",
                   "peak_gflops", "limit_note"]

_SHARED = {column[0]: column for column in tables.PARITY_COLUMNS}
# Markdown columns (key, title, spec) as tables.markdown takes them. Counts a table shows as they are
# (threads, batch, seq len) are ".0f": right-aligned like the numbers, and without thousands separators.
INFERENCE_MARKDOWN = (("model", "model", ""), _SHARED["tokens"], _SHARED["max_abs"], _SHARED["mean_abs"],
                      _SHARED["min_cos"], ("mean_cos", "mean cosine", ".8f"), _SHARED["max_value"],
                      ("batch_max_abs", "batch of 8 vs alone", ".2g"))
TRAINABLE_MARKDOWN = (("model", "model", ""), ("family", "family", ""), ("comparison", "comparison", ""),
                      _SHARED["tokens"], _SHARED["max_abs"], _SHARED["mean_abs"], _SHARED["min_cos"],
                      _SHARED["max_value"], ("batch_equal", "batches of 8 = alone", "yes"))
LATENCY_MARKDOWN = (("model", "model", ""), ("runtime", "runtime", ""), ("threads", "threads", ".0f"),
                    ("batch", "batch", ".0f"), ("seq_len", "seq len", ".0f"),
                    ("median_ms", "median ms", ".3g"), ("min_ms", "min ms", ".3g"),
                    ("max_ms", "max ms", ".3g"), ("runs", "calls", ".0f"), ("gflops", "GFLOP/s", ".3g"),
                    ("fraction_of_gemm", "of GEMM", ".2f"))


@dataclass(frozen=True)
class Table:
    title: str
    columns: list[str]
    markdown: tuple[tuple[str, str, str], ...]


TABLES = {
    "inference": Table("Inference parity", INFERENCE_COLUMNS, INFERENCE_MARKDOWN),
    "trainable": Table("Trainable parity", TRAINABLE_COLUMNS, TRAINABLE_MARKDOWN),
    "latency": Table("Latency", LATENCY_COLUMNS, LATENCY_MARKDOWN),
}


def markdown(kind: str, rows: list[dict]) -> str:
    """The Markdown of table `kind` (a key of TABLES) for `rows` (dicts, or a CSV's strings)."""
    return tables.markdown(rows, TABLES[kind].markdown)


def write_rows(kind: str, rows: list[dict], out: str | os.PathLike) -> str:
    """Write one model's rows of table `kind` to `out` (CSV); return their Markdown."""
    files.write_text(out, tables.csv_text(rows, TABLES[kind].columns))
    return markdown(kind, rows)


def plot_differences(per_model: dict[str, np.ndarray], target: str | os.PathLike) -> None:
    """Histogram of per-token max abs differences (log scale), one line per model."""
    with plots.figure(target, 7, 4) as fig:
        ax = fig.add_subplot()
        bins = np.logspace(-10, 0, 61)
        for name in sorted(per_model):
            values = np.clip(per_model[name], 1e-10, None)
            ax.hist(values, bins=bins, histtype="step", label=f"{name} ({values.size:,} tokens)")
        ax.set_xscale("log")
        ax.set_xlabel("largest |ONNX Runtime - PyTorch| over a token's hidden state")
        ax.set_ylabel("tokens")
        ax.set_title("Inference parity, one text per run")
        ax.legend(fontsize=8)


def plot_latency(rows: list[dict], target: str | os.PathLike) -> None:
    """Bars of the latency table: the median per model and batch (left to right as the rows come), one
    bar per runtime, an error bar from the fastest to the slowest call; a log axis when the times span
    orders of magnitude (`plots.bars`). The thread count joins the label when the table has several."""
    several = len({r["threads"] for r in rows}) > 1
    cells: dict[str, dict[str, plots.Bar]] = {}
    runtimes: list[str] = []
    for r in rows:
        label = f"{r['model']}\nbatch {r['batch']}" + (f", {r['threads']} threads" if several else "")
        cells.setdefault(label, {})[r["runtime"]] = plots.Bar(float(r["median_ms"]), float(r["min_ms"]),
                                                               float(r["max_ms"]))
        if r["runtime"] not in runtimes:
            runtimes.append(r["runtime"])
    seq = sorted({r["seq_len"] for r in rows})
    plots.bars(list(cells), {rt: [cells[c].get(rt) for c in cells] for rt in runtimes}, target,
               "ms per forward pass (median; bar: min to max)",
               f"Latency, sequence length {', '.join(seq)}")


def gather(kind: str, parts: list[str | os.PathLike], out: str | os.PathLike,
           markdown_path: str | os.PathLike, plot: str | os.PathLike | None) -> provenance.Done:
    """Concatenate per-model CSVs (sorted by model) into table `kind`, its Markdown and, given `plot`,
    its plot: for inference the per-token differences (each part's .npy beside it), for latency the
    bars of `plot_latency`."""
    table = TABLES[kind]
    report = provenance.Done()
    rows = []
    for part in sorted(map(str, parts)):
        rows += tables.read_csv(part)  # within a part, rows keep the order the command wrote them in
        report.inputs.append(part)
    rows.sort(key=lambda r: r["model"])  # stable: runtimes, batches and comparisons keep their order
    files.write_text(out, tables.csv_text(rows, table.columns))
    report.table(table.title, markdown(kind, rows))
    files.write_text(markdown_path, markdown(kind, rows))
    report.outputs += [out, markdown_path]
    if plot and kind == "latency":
        plot_latency(rows, plot)
        report.outputs.append(plot)
    elif plot and kind != "inference":
        raise ValueError(f"the {kind} table has no plot")
    elif plot:
        per_model = {}
        for part in sorted(map(str, parts)):
            diffs = Path(part).with_suffix(".npy")
            per_model[tables.read_csv(part)[0]["model"]] = np.load(diffs)
            report.inputs.append(diffs)
        plot_differences(per_model, plot)
        report.outputs.append(plot)
    return report

"""The rules writeback_speed and writeback_speed_plot: tagging through the modules and through the
written graph, timed against the machine's limit, and the plot."""

from __future__ import annotations

import os
import sys

from ...core import plots, tables
from ...encoders import perf
from ..tagging import graph as tagging_graph
from ..tagging import pipeline
from .checks import _encoder_name

SPEED_COLUMNS = ["run", "encoder", "threads", "sentences", "tokens", "pieces", "padded_pieces",
                 "batch_pieces", "batches", "calls", "repeats", "modules_tok_s", "graph_tok_s", "ratio",
                 "modules_tok_s_min", "modules_tok_s_max", "graph_tok_s_min", "graph_tok_s_max",
                 "modules_repeats", "graph_repeats", "modules_seconds", "graph_seconds", "gflop",
                 "modules_gflops", "graph_gflops", "gemm_gflops", "modules_fraction_of_gemm",
                 "graph_fraction_of_gemm", "modules_scaling", "graph_scaling", "gemm_gflops_min",
                 "gemm_gflops_max", "gemm_probe", "peak_gflops", "limit_note"]


SPEED_MARKDOWN = (("run", "run", ""), ("encoder", "encoder", ""), ("threads", "threads", "n"),
                  ("tokens", "tokens", "n"), ("modules_tok_s", "modules (tok/s)", ",.0f"),
                  ("graph_tok_s", "written graph (tok/s)", ",.0f"), ("ratio", "ratio", ".1f"),
                  ("modules_fraction_of_gemm", "modules of GEMM", ".2f"),
                  ("graph_fraction_of_gemm", "graph of GEMM", ".2f"),
                  ("graph_scaling", "graph vs 1 thread", ".2f"), ("batches", "batches a pass", "n"),
                  ("repeats", "passes", "n"))


def _tag_all(tagger, calls) -> None:
    """One pass: tag the documents of each call, nothing cached from an earlier pass."""
    if hasattr(tagger.encoder, "clear_cache"):
        tagger.encoder.clear_cache()  # a /2 file's frozen encoder keeps each document's vectors
    for docs in calls:
        tagger.predict_ids(docs, batch_words=sys.maxsize)  # every batch of the call: one forward (run) each


def speed_batches(graph, docs: list, batch_pieces: int) -> dict:
    """The batches both paths tag, as a pipeline tags a file: the documents cut as both encoders cut
    them, longest window first, each batch as many as fit `batch_pieces` padded pieces
    (`tagging.graph.piece_batches`); with the windows' lengths (the counted work) and the padding.

    `calls`: what a pass hands each path. All documents at once where both plan these batches
    themselves from the budget (every document one window, none over the budget: the modules'
    `trainable.words.plan_batches` then groups as `piece_batches`), so that each tokenises the whole
    set once and runs its batches back to back, as a pipeline tagging a file does; else one call per
    batch."""
    feeds = graph.encoder
    joined = feeds.tokenizer.prepare_joined(docs, feeds.max_length)
    longest, windows = tagging_graph.window_counts(joined)
    groups = tagging_graph.piece_batches(longest, windows, batch_pieces)
    lengths = [len(window) for window in joined.inputs]
    padded = [sum(windows[d] for d in g) * max(longest[d] for d in g) for g in groups]
    batches = [[docs[d] for d in g] for g in groups]
    whole = all(n == 1 for n in windows) and max(lengths, default=0) <= batch_pieces
    return {"batches": batches, "lengths": lengths, "padded": padded,
            "calls": [docs] if whole else batches, "budget": max([batch_pieces, *padded])}


def _budgets(modules, graph, planned: dict) -> None:
    """Both paths' budgets: the planned batches, one forward of the modules and one run of the graph
    each (a document over the budget is a batch alone, and sets the budget)."""
    modules.encoder.max_batch_pieces = planned["budget"]  # plans the same longest-first batches
    graph.encoder.batch_pieces = planned["budget"]


def speed_rows(run: str, inline: str | os.PathLike, written: str | os.PathLike, sentences, batch_pieces: int,
               thread_counts: list[int], warmup: int, repeats: int, min_seconds: float,
               probes: dict | None = None) -> list[dict]:
    """Tokens per second of the inline modules and the written graph at each thread count, on the same
    batches (`speed_batches`): the median pass of at least `repeats` passes and `min_seconds` of passes
    each, the two taking turns in blocks (`perf.measure`: each runtime's threads wind down before the
    other's are timed), with the slowest and fastest pass; the rate against the machine's
    matrix-multiply rate at those threads (counted on the windows the encoder runs, each at its own
    length: padding is not counted as work); and each rate over the same implementation's at 1 thread
    (`*_scaling`, when 1 is among `thread_counts`). The modules are loaded once, the graph once per
    thread count (a session's threads are fixed); `probes` (threads -> perf.Probe) are reused across
    calls, made here when missing."""
    from ...core.machine import torch_threads

    probes = {} if probes is None else probes
    docs = [s.doc() for s in sentences]
    tokens = sum(len(d.words) for d in docs)
    modules = pipeline.load(inline, threads=max(thread_counts))
    graph = pipeline.load(written, threads=thread_counts[0])  # ONNX Runtime's intra-op threads
    planned = speed_batches(graph, docs, batch_pieces)
    calls = planned["calls"]
    flops = perf.encoder_flops(perf.Shape.from_config(graph.encoder.config), planned["lengths"])
    shape = {"run": run, "encoder": _encoder_name(graph), "sentences": len(docs), "tokens": tokens,
             "pieces": sum(planned["lengths"]), "padded_pieces": sum(planned["padded"]),
             "batch_pieces": batch_pieces, "batches": len(planned["batches"]), "calls": len(calls),
             "gflop": flops / 1e9}
    rows = []
    for threads in thread_counts:
        if graph.threads_requested != threads:
            graph = None  # one session at a time: the study's graphs are large
            graph = pipeline.load(written, threads=threads)
        _budgets(modules, graph, planned)
        torch_threads(threads)
        if threads not in probes:
            probes[threads] = perf.Probe.beside(threads, min_seconds)  # the limit, taking turns with the two
        probe = probes[threads]
        times = perf.measure({"modules": lambda: _tag_all(modules, calls),
                              "graph": lambda g=graph: _tag_all(g, calls)},
                             min_seconds, min_repeats=repeats, warmup=warmup,
                             block_seconds=perf.BLOCK_SECONDS, probe=probe)
        rows.append({**shape, "threads": threads, **_speed_cells(times, tokens, flops, probe.limit(times))})
    single = next((r for r in rows if r["threads"] == 1), None)
    for r in rows:
        for impl in ("modules", "graph"):
            r[f"{impl}_scaling"] = r[f"{impl}_tok_s"] / single[f"{impl}_tok_s"] if single else ""
    return rows


def _speed_cells(times: dict, tokens: int, flops: float, limit: perf.Limit) -> dict:
    """A row's timed columns from `perf.measure`'s seconds, read against the probe measured beside them."""
    mod, gra = perf.Spread.of(times["modules"]), perf.Spread.of(times["graph"])
    row = {"repeats": min(mod.repeats, gra.repeats),
           "modules_tok_s": tokens / mod.median, "graph_tok_s": tokens / gra.median,
           "ratio": mod.median / gra.median,
           "modules_tok_s_min": tokens / mod.max, "modules_tok_s_max": tokens / mod.min,
           "graph_tok_s_min": tokens / gra.max, "graph_tok_s_max": tokens / gra.min,
           "modules_repeats": mod.repeats, "graph_repeats": gra.repeats,
           "modules_seconds": mod.seconds, "graph_seconds": gra.seconds, **limit.columns()}
    notes = []
    for impl, spread in (("modules", mod), ("graph", gra)):
        rate = limit.rates(flops, spread.median)
        row[f"{impl}_gflops"], row[f"{impl}_fraction_of_gemm"] = rate["gflops"], rate["fraction_of_gemm"]
        notes += [f"{impl}: {rate['limit_note']}"] if rate["limit_note"] else []
    row["limit_note"] = "; ".join(notes)
    return row


def speed_markdown(rows: list[dict]) -> str:
    return tables.markdown(rows, SPEED_MARKDOWN)


# The speed plot's bars: column of the median, its series' name in the legend.
SPEED_SERIES = (("modules_tok_s", "inline modules (PyTorch)"),
                ("graph_tok_s", "written graph (ONNX Runtime)"))


def speed_bar(row: dict, column: str) -> plots.Bar:
    """A bar at the row's median rate, its error bar from `<column>_min` to `<column>_max` when the table
    has both (an empty or missing cell: no error bar)."""
    low, high = row.get(f"{column}_min") or None, row.get(f"{column}_max") or None
    return plots.Bar(float(row[column]), *((float(low), float(high)) if low and high else ()))


def plot_speed(rows: list[dict], target: str | os.PathLike) -> None:
    """Bars of speed.csv (rows as read back): tokens per second per encoder and thread count (the run's
    name where two runs share an encoder), one bar for the inline modules and one for the written
    graph, each with its spread when the table has it (`plots.bars`)."""
    runs_of: dict[str, set] = {}
    for r in rows:
        runs_of.setdefault(r["encoder"], set()).add(r["run"])
    labels = [f"{r['encoder'] if len(runs_of[r['encoder']]) == 1 else r['run']}\n{r['threads']} thread"
              f"{'' if str(r['threads']) == '1' else 's'}" for r in rows]
    plots.bars(labels, {name: [speed_bar(r, column) for r in rows] for column, name in SPEED_SERIES},
               target, "tokens per second (median; bar: slowest to fastest pass)",
               "Write-back: tagging speed", log="auto")


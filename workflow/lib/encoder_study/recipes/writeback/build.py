"""The rule writeback_pipeline's work: a run's inline pipeline written with its graph, and the
patcher's and memory's reports."""

from __future__ import annotations

import os
from pathlib import Path

from ...core import files, machine, tables
from ...onnx import manifest, patch
from ..tagging import pipeline
from . import save_with_graph


def _mib(kib: int) -> float:
    return kib / 1024.0


def pipeline_inputs(inline: str | os.PathLike) -> list:
    """The files `write_pipeline` reads: the inline pipeline and the export it references."""
    settings, _ = pipeline.read(inline)
    model_dir = Path(inline).parent / settings["encoder"]["model_dir"]
    return [inline, *(model_dir / n for n in manifest.EXPORT_FILES)]


def write_pipeline(inline: str | os.PathLike, out: str | os.PathLike, threads: int) -> dict:
    """Write `out` and its graph from a fine-tuned run's inline pipeline; what was done, and the memory."""
    start = machine.peak_resident_kib()
    tagger = pipeline.load(inline, threads=threads)
    if not tagger.trainable_encoder:
        raise pipeline.PipelineError(f"{inline}: a {tagger.kind!r} pipeline; only a fine-tuned run's "
                                     "(transformer-trainable) has weights to write into a graph")
    loaded = machine.peak_resident_kib()
    training = dict(pipeline.training_summary(inline) or {})
    training["inline_pipeline_sha256"] = files.sha256_file(inline)
    reset = machine.reset_peak()
    resident = machine.resident_kib()
    saved = save_with_graph(tagger, out, training=training)
    return {"saved": saved, "peak_start_kib": start, "peak_loaded_kib": loaded, "peak_reset": reset,
            "resident_before_write_kib": resident, "peak_write_kib": machine.peak_resident_kib(),
            "graph_bytes": saved.graph.stat().st_size,
            "source_bytes": (tagger.encoder.model_dir / manifest.ONNX_FILE).stat().st_size}


def patch_markdown(report: patch.PatchReport) -> str:
    """What the patch did, for the pipeline's fragment."""
    return tables.markdown_table(["what", "tensors"], [
        ("initializers rewritten", len(report.rewritten)),
        ("Identity names made initializers", len(report.materialized)),
        ("given, equal to the graph's (left as they were)", len(report.unchanged)),
        ("rewritten from float_data to raw_data", len(report.from_float_data)),
        ("appended: the head's initializers", len(report.appended)),
        ("appended: nodes (word pooling, head, tags)", report.appended_nodes),
        ("appended: graph inputs, outputs", f"{', '.join(report.appended_inputs) or '-'}; "
                                            f"{', '.join(report.appended_outputs) or '-'}"),
        ("bytes written", f"{report.bytes_written:,}")], "lr")


def memory_markdown(done: dict) -> str:
    """The resident set at each point of `write_pipeline` (its result), for the pipeline's fragment."""
    rows = [("before loading (Python and torch imported): peak", done["peak_start_kib"]),
            ("inline pipeline loaded (trainable modules): peak", done["peak_loaded_kib"]),
            ("resident when writing began", done["resident_before_write_kib"]),
            ("while writing the graph and the pipeline: peak" + ("" if done["peak_reset"] else
                                                                 " (since the start: no reset)"),
             done["peak_write_kib"])]
    return tables.markdown_table(["point", "MiB"], [(what, f"{_mib(kib):.1f}") for what, kib in rows]
                                 + [("written graph's size", f"{done['graph_bytes'] / 2**20:.1f}")], "lr")


def memory_notes(done: dict) -> list[str]:
    """The fragment's notes on the write's memory and the graph's size; the last is the one-line summary."""
    saved, size = done["saved"], done["graph_bytes"]
    peak, resident = done["peak_write_kib"], done["resident_before_write_kib"]
    added = max(0, peak - resident)
    report = saved.report
    return [
        f"peak memory of writing the {size / 2**20:.1f} MiB graph: {_mib(peak):.1f} MiB resident at most, "
        f"{_mib(added):.1f} MiB over the {_mib(resident):.1f} MiB resident when it began "
        f"({added * 1024 / size:.2f} x the file's size); the peak " + (
            "was reset (/proc/self/clear_refs) after loading, so loading is not in it"
            if done["peak_reset"] else "could not be reset, so it includes loading"),
        f"written graph {saved.graph.name}: {size:,} bytes, the export's model.onnx "
        f"{done['source_bytes']:,} bytes; only the rewritten initializers' values differ, and the head "
        f"is appended ({report.appended_nodes} nodes, {len(report.appended)} initializers)",
        f"{saved.path}: {len(report.rewritten)} initializers rewritten, {len(report.materialized)} "
        f"materialised; writing: peak {_mib(peak):.1f} MiB resident, {_mib(added):.1f} MiB added, graph "
        f"{size / 2**20:.1f} MiB"]


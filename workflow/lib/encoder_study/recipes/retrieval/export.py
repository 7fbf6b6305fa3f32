"""Export, optimise and check the three-head graph, and publish it with its manifest `retrieval.json`.

Memory. A model of BGE-M3's shape is held by FlagEmbedding, by the project's reference and by ONNX
Runtime in turn, never two at once: FlagEmbedding's outputs for every case come first and its model is
freed; then the project's model gives its reference for every case, is traced, and is freed before ONNX
Runtime loads the graph. The references are small beside a model (at most tens of MiB: the longest case's
ColBERT vectors). Each phase's peak resident set is measured (`machine.peak_resident_kib`) and reported
against the graph's size on disk.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ... import provenance
from ...core import files, machine, tables
from ...encoders.reference import load_pytorch, source_dir
from ...onnx import checked_export, runtime
from ...onnx.manifest import CONFIG_FILE, ONNX_FILE, TOKENIZER_FILE
from ...onnx.runtime import ort_session
from . import OUTPUTS, RetrievalError, flagembedding
from .cases import Case, max_length, parity_cases
from .check import PROJECT, compare, parity_markdown, reference
from .graph import (
    COMPACT_AXES,
    COMPACT_OUTPUTS,
    MIN_OPSET,
    OUTPUT_AXES,
    PER_HEAD_ATTENTION,
    REFERENCE_ATTENTION,
    RetrievalModel,
    attention,
)
from .heads import Heads, ignored_ids, load_heads

MANIFEST = "retrieval.json"
DATA_FILE = ONNX_FILE + ".data"
# Protobuf cannot hold a message of 2 GiB; leave room for the graph itself beside the weights.
EXTERNAL_DATA_BYTES = 2**31 - 2**26
OFFLINE_OPTIMIZATIONS = ("disable", "basic", "extended")
CHECK_OPTIMIZATION = "all"  # ONNX Runtime's default: what a consumer of the file gets
EXTERNAL_DATA = ("auto", "always", "never")
MEMORY_MARKDOWN = (("phase", "phase", ""), ("resident_before_mib", "resident before (MiB)", ".1f"),
                   ("peak_mib", "peak (MiB)", ".1f"), ("seconds", "seconds", ".1f"))


@dataclass
class Memory:
    """The peak resident set of each phase of `export_graph` (VmHWM, reset at each phase's start), its
    time, and the published graph's size on disk (model.onnx and its external data). Not in the
    manifest: it varies from run to run."""

    phases: list[dict] = field(default_factory=list)
    reset: bool = True  # False: a peak could not be reset, so each is the peak since the process began
    model_bytes: int = 0

    @contextlib.contextmanager
    def phase(self, name: str):
        self.reset = machine.reset_peak() and self.reset
        before, start = machine.resident_kib(), time.perf_counter()
        yield
        self.phases.append({"phase": name, "resident_before_mib": before / 1024,
                            "peak_mib": machine.peak_resident_kib() / 1024,
                            "seconds": time.perf_counter() - start})

    @property
    def peak(self) -> dict:
        return max(self.phases, key=lambda p: p["peak_mib"])

    def markdown(self) -> str:
        return tables.markdown(self.phases, MEMORY_MARKDOWN)

    def note(self) -> str:
        """One line for the fragment: the peak, where it was, and its ratio to the graph's size."""
        peak = self.peak
        mib, size_mib = peak["peak_mib"], self.model_bytes / 2**20
        reset = ("each phase's peak was reset at its start (/proc/self/clear_refs)" if self.reset
                 else "the peak could not be reset: each is the peak since the process began")
        return (f"peak memory of the export: {mib:.1f} MiB resident at most (in \"{peak['phase']}\"), "
                f"{mib / size_mib:.2f} x the graph's {self.model_bytes:,} bytes ({size_mib:.1f} MiB) on disk "
                "(model.onnx and any external data); the whole process, Python and its libraries included; "
                + reset)


@dataclass(frozen=True)
class Settings:
    """The recipe's settings (config `retrieval`; the schema holds their defaults)."""

    opset: int
    tolerance: float  # allclose(rtol=0, atol=tolerance) on every element of every output
    threads: int
    ort_optimization: str  # applied offline (OFFLINE_OPTIMIZATIONS); the published graph is the optimised one
    external_data: str  # auto: only graphs too large for one protobuf; always; never
    sparse_top_k: int = 0  # > 0: the compact sparse outputs too (graph.COMPACT_OUTPUTS)


def _declare_outputs(path: Path, shapes: dict[str, list]) -> None:
    """Name or fix every output dimension; the exporter cannot infer the custom scatter's."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)  # the weights stay where they are
    for output in model.graph.output:
        dims = output.type.tensor_type.shape.dim
        for dim, value in zip(dims, shapes[output.name], strict=True):
            if isinstance(value, int):
                dim.dim_value = value
            else:
                dim.dim_param = value
    onnx.save_model(model, str(path))


def _drop_unused_domains(path: Path) -> None:
    """Keep only the operator sets the graph uses.

    ONNX Runtime saves an import of each of its own domains (com.microsoft, ...) even when no node
    uses them; a runtime without those domains need not be asked to know them.
    """
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    used = {"", "ai.onnx"}
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            used.add(node.domain)
            for attribute in node.attribute:
                graphs += ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs)
    keep = [o for o in model.opset_import if o.domain in used]
    if len(keep) < len(model.opset_import):
        del model.opset_import[:]
        model.opset_import.extend(keep)
        onnx.save_model(model, str(path))


def _external(raw_dir: Path, setting: str) -> bool:
    size = sum(p.stat().st_size for p in files.list_files(raw_dir))
    return setting == "always" or (setting == "auto" and size >= EXTERNAL_DATA_BYTES)


def _write_graph(raw: Path, target: Path, level: str, external: bool, threads: int) -> None:
    """Save the graph `raw` as `target` after ONNX Runtime's offline optimisation at `level`.

    With external data every initializer of 1 KiB or more goes to one file, DATA_FILE, beside it.
    """
    import onnx
    import onnxruntime as ort

    if level == "disable":
        model = onnx.load(str(raw))
        onnx.save_model(model, str(target), save_as_external_data=external, all_tensors_to_one_file=True,
                        location=DATA_FILE, size_threshold=1024)
        return
    options = runtime.session_options(threads, level)
    options.optimized_model_filepath = str(target)
    if external:
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", DATA_FILE)
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes",
                                         "1024")
    ort.InferenceSession(str(raw), options, providers=["CPUExecutionProvider"])


def _check_settings(settings: Settings) -> None:
    if settings.opset < MIN_OPSET:
        raise RetrievalError(f"opset {settings.opset}: ScatterElements has reduction 'max' only from opset "
                             f"{MIN_OPSET}; use --opset {MIN_OPSET} or later")
    if settings.ort_optimization not in OFFLINE_OPTIMIZATIONS:
        raise RetrievalError(f"offline optimisation {settings.ort_optimization!r}: use one of "
                             f"{', '.join(OFFLINE_OPTIMIZATIONS)} (a graph saved after 'all' is tied to the "
                             "machine that made it)")
    if settings.sparse_top_k < 0:
        raise RetrievalError(f"sparse_top_k {settings.sparse_top_k}: 0 (no compact output) or a positive k")
    if settings.external_data not in EXTERNAL_DATA:
        raise RetrievalError(f"external data {settings.external_data!r}: use one of "
                             f"{', '.join(EXTERNAL_DATA)}")




def _trace(encoder: torch.nn.Module, heads: Heads, ignored: list[int], case: Case, raw: Path, opset: int,
           top_k: int = 0) -> None:
    """The three-head graph, traced on `case` with attention one head at a time, as `raw` (and, over
    2 GiB, its weights as files beside it, one per tensor; `_write_graph` gathers them)."""
    graph = RetrievalModel(encoder, heads, encoder.config.vocab_size, ignored, top_k).eval()
    axes = {**OUTPUT_AXES, **(COMPACT_AXES if top_k else {})}
    with attention(encoder, PER_HEAD_ATTENTION):
        checked_export.trace(graph, (case.input_ids, case.attention_mask), raw, opset, axes,
                             external_data=True)


def _optimise(raw: Path, target: Path, shapes: dict[str, list], settings: Settings, threads: int) -> bool:
    """Check the traced graph `raw`, save it optimised offline as `target` (with external data when
    the setting asks for it) and check that; remove `raw`'s directory; return whether it has external
    data."""
    _declare_outputs(raw, shapes)
    checked_export.check_graph(raw)
    external = _external(raw.parent, settings.external_data)
    _write_graph(raw, target, settings.ort_optimization, external, threads)
    shutil.rmtree(raw.parent)
    _drop_unused_domains(target)
    if settings.ort_optimization != "extended":  # extended adds ONNX Runtime's own operators
        checked_export.check_graph(target)
    return external


def _check_cases(path: Path, cases: list[Case], wants: list, tolerance: float, threads: int, model: str
                 ) -> list[dict]:
    """The parity rows of the graph `path` of `model` in ONNX Runtime against each case's references in
    `wants` (reference name -> outputs; freed one by one as they are used); RetrievalError unless every
    row is within `tolerance`."""
    session = ort_session(path, threads, CHECK_OPTIMIZATION)
    rows = []
    for index, case in enumerate(cases):
        run = session.run(list(OUTPUTS), {"input_ids": case.input_ids, "attention_mask": case.attention_mask})
        got = dict(zip(OUTPUTS, run, strict=True))
        want = wants[index]
        rows += compare(case, flagembedding.NAME, flagembedding.graph_view(got, case.attention_mask),
                        want[flagembedding.NAME], tolerance)
        rows += compare(case, PROJECT, got, want[PROJECT], tolerance)
        wants[index] = want = got = run = None  # freed before the next case
    failed = [r for r in rows if not r["allclose"]]
    if failed:
        raise RetrievalError(f"model '{model}': the graph differs from its references beyond {tolerance} in "
                             f"{len(failed)} of {len(rows)} comparisons; nothing was written:\n"
                             + parity_markdown(rows))
    return rows


def check_compact(path: Path, cases: list[Case], top_k: int, threads: int) -> dict:
    """The compact outputs against the graph's own vocabulary-wide row, every case: the weights are the
    row's k largest, in order, and each id's weight in the row is the weight given beside it (ties may
    list other ids of an equal weight); RetrievalError otherwise. Its record for the manifest."""
    import numpy as np

    session = ort_session(path, threads, CHECK_OPTIMIZATION)
    for case in cases:
        feeds = {"input_ids": case.input_ids, "attention_mask": case.attention_mask}
        sparse, ids, weights = session.run(["sparse", *COMPACT_OUTPUTS], feeds)
        expected = -np.sort(-sparse, axis=-1)[:, :top_k]
        at_ids = np.take_along_axis(sparse, ids, axis=-1)
        if ids.shape != (sparse.shape[0], top_k) or not (np.array_equal(weights, expected)
                                                          and np.array_equal(at_ids, weights)):
            raise RetrievalError(f"case {case.name}: the compact sparse output is not the row's top {top_k} "
                                 "(ids and weights); nothing was written")
    return {"outputs": list(COMPACT_OUTPUTS), "top_k": top_k, "operator": "TopK over the sparse row",
            "check": "on every case: weights equal the row's k largest, and the row at each id equals its "
                     "weight"}


@dataclass
class Parts:
    """What the export is made of: the encoder's config, its heads, the ids the sparse head ignores,
    and the validation cases."""

    config: object
    heads: Heads
    ignored: dict[str, int]
    cases: list[Case]


def _parts(model_dir: Path, heads_dir: str | os.PathLike | None) -> Parts:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    heads = load_heads(heads_dir if heads_dir is not None else model_dir, int(config.hidden_size))
    return Parts(config, heads, ignored_ids(model_dir, config), parity_cases(model_dir / "tokenizer.json",
                                                                             config))


def export_graph(source_json: str | os.PathLike, heads_dir: str | os.PathLike | None,
                 out_dir: str | os.PathLike, settings: Settings) -> tuple[dict, list[dict], Memory]:
    """Export, optimise and check the three-head graph; publish `out_dir`; return (manifest, parity rows,
    the memory of each phase).

    `heads_dir` holds colbert_linear.pt and sparse_linear.pt; None reads them from the model's directory
    (where the Hub snapshot of BGE-M3 keeps them, hashed in source.json). Nothing reaches `out_dir`
    unless every case passes against both references.
    """
    _check_settings(settings)
    threads = machine.torch_threads(settings.threads)
    memory = Memory()
    model_dir, source = source_dir(source_json)
    parts = _parts(model_dir, heads_dir)
    config, heads, ids = parts.config, parts.heads, list(parts.ignored.values())
    with memory.phase("FlagEmbedding's outputs for every case"):
        theirs = flagembedding.reference(model_dir, heads.files, parts.ignored, parts.cases,
                                         max_length(config), int(config.vocab_size))
        gc.collect()  # FlagEmbedding's copy of the model
    with memory.phase("load the PyTorch model; the project's reference of every case"):
        encoder = load_pytorch(model_dir)
        wants = [{flagembedding.NAME: want, PROJECT: reference(encoder, heads, ids, c.input_ids,
                                                               c.attention_mask)}
                 for c, want in zip(parts.cases, theirs, strict=True)]
        theirs = None
    width, dim, vocab = int(config.hidden_size), int(heads.colbert.out_features), int(config.vocab_size)
    shapes = {"dense": ["batch", width], "sparse": ["batch", vocab], "colbert": ["batch", "sequence", dim]}
    if settings.sparse_top_k:
        shapes |= dict.fromkeys(COMPACT_OUTPUTS, ["batch", settings.sparse_top_k])
    with files.staging_dir(out_dir) as stage:
        raw, publish = stage / "raw" / ONNX_FILE, stage / "model"
        raw.parent.mkdir()
        publish.mkdir()
        with memory.phase("export to ONNX (TorchScript tracer)"):
            batch = next(c for c in parts.cases if c.name == "batch")
            _trace(encoder, heads, ids, batch, raw, settings.opset, settings.sparse_top_k)
            del encoder  # the heads stay (small; their shapes go into the manifest)
            gc.collect()
        with memory.phase("optimise, check and save the graph"):
            external = _optimise(raw, publish / ONNX_FILE, shapes, settings, threads)
        memory.model_bytes = sum(p.stat().st_size for p in files.list_files(publish))
        with memory.phase("check the graph in ONNX Runtime, case by case"):
            rows = _check_cases(publish / ONNX_FILE, parts.cases, wants, settings.tolerance, threads,
                                source["model"])
            compact = (check_compact(publish / ONNX_FILE, parts.cases, settings.sparse_top_k, threads)
                       if settings.sparse_top_k else None)
        shutil.copyfile(model_dir / "tokenizer.json", publish / TOKENIZER_FILE)
        shutil.copyfile(model_dir / "config.json", publish / CONFIG_FILE)
        record = _record(source, parts, heads_dir, shapes, settings, external, rows)
        if compact is not None:  # only then: the default graph's manifest stays as it was
            record["compact_sparse"] = compact
            record["exporter"]["outputs"][COMPACT_OUTPUTS[0]]["dtype"] = "int64"
        record["files"] = [files.file_record(p, publish) for p in files.list_files(publish)]
        files.write_json(publish / MANIFEST, record)
        files.replace_dir(publish, out_dir)
    return record, rows, memory


def _record(source: dict, parts: Parts, heads_dir: str | os.PathLike | None, shapes: dict[str, list],
            settings: Settings, external: bool, rows: list[dict]) -> dict:
    """retrieval.json, less its file list."""
    references = [flagembedding.NAME, PROJECT]
    return {
        "model": source["model"],
        "source": source["source"],
        "source_tree_sha256": source["tree_sha256"],
        "libraries": provenance.library_versions(
            ["torch", "transformers", "tokenizers", "onnx", "onnxruntime", flagembedding.DISTRIBUTION]),
        "heads": {
            "from": "model directory" if heads_dir is None else "heads directory",
            **{name: {**files.file_record(path), "shape": list(getattr(parts.heads, name).weight.shape)}
               for name, path in parts.heads.files.items()},
        },
        "exporter": checked_export.exporter_record(
            settings.opset, shapes,
            attention=f"{PER_HEAD_ATTENTION}: transformers' eager attention, one head at a time"),
        "heads_semantics": {
            "dense": "hidden[:, 0], L2-normalised",
            "sparse": "relu(sparse_linear(hidden)) * mask, max over tokens per vocabulary id "
                      "(ScatterElements reduction max), ignored ids zeroed",
            "sparse_ignored_ids": parts.ignored,
            "colbert": "colbert_linear(hidden), L2-normalised, * mask; first position kept",
        },
        "optimization": {"offline": settings.ort_optimization, "external_data": external,
                         "check_session": CHECK_OPTIMIZATION},
        "check": {
            "cases": [{"name": c.name, "purpose": c.purpose, "rows": int(c.input_ids.shape[0]),
                       "tokens": int(c.attention_mask.sum())} for c in parts.cases],
            "tolerance": settings.tolerance,
            "references": {flagembedding.NAME: flagembedding.record(),
                           PROJECT: {"code": "encoder_study.retrieval.check.reference",
                                     "attention": REFERENCE_ATTENTION}},
            "criterion": "numpy.allclose(graph, reference, rtol=0, atol=tolerance) on every element",
            "max_abs": {ref: {o: max(r["max_abs"] for r in rows if r["output"] == o and r["reference"] == ref)
                              for o in OUTPUTS} for ref in references},
        },
    }
